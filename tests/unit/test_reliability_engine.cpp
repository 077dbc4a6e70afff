// Reliability of the engine and its C ABI (issue 19, engine items): failed allocations
// leave a context unchanged and can be retried, failed decodes leave no stale logits,
// non-finite logits are an error, context sizes have limits, a context in use by another
// thread answers BUSY, exceptions inside CPU pool threads come back to the caller, and the
// abort callback is polled after every CPU node. Each case failed before its fix.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "backends/cpu/thread_pool.h"
#include "core/alloc_test_hook.h"
#include "engine/context_impl.h"
#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "moeinfer/moeinfer.h"
#include "reliability/reliability_support.h"
#include "support/tiny_model.h"
#include "support/temp_files.h"

using namespace moe;
using moe_rel::CModel;
using moe_rel::contains;
using moe_rel::tokens;

namespace {

// Turns the allocation hook off when a test case ends, however it ends.
struct HookOff {
  ~HookOff() { test_fail_allocation_after(-1); }
};

std::unique_ptr<Context> cpu_ctx(const Model &m, uint32_t n_ctx = 256, int threads = 2, uint32_t n_ubatch = 512) {
  ContextParams cp;
  cp.n_ctx = n_ctx;
  cp.n_ubatch = n_ubatch;
  cp.kv_type = KvType::F32;
  cp.n_threads = threads;
  cp.device = "cpu";
  return Context::create(m, cp);
}

Status decode_status(Context &c, const std::vector<BatchToken> &b) {
  try {
    c.decode(b.data(), b.size());
  } catch (const Error &e) {
    return e.code();
  }
  return Status::Ok;
}

// Every arena is at least as large as the size the context recorded for it (plans are
// bound to those sizes).
bool arenas_cover_sizes(const Context &c) {
  const Context::Impl &im = c.impl();
  for (size_t d = 0; d < im.arenas.size(); ++d)
    if (im.arena_bytes[d] > (im.arenas[d] ? im.arenas[d]->size() : 0)) return false;
  return true;
}

std::string copy_file(const std::string &from, const std::string &tag) {
  const std::string to = moe_test::temp_path("rel-" + tag + ".gguf");
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary);
  out << in.rdbuf();
  return to;
}

// The tiny f32 model with the embedding row of `token` set to NaN: a batch that asks for
// logits at (or after) that token gets NaN logits, every other batch is fine.
std::string nan_token_model(int32_t token) {
  const std::string path = copy_file(moe_test::tiny_model("f32"), "nan");
  size_t off = 0, row = 0;
  {
    auto f = GgufFile::open(path);
    for (const GgufTensorInfo &t : f->tensors())
      if (t.name == "token_embd.weight") {
        REQUIRE(t.type == DType::F32);
        row = static_cast<size_t>(t.ne[0]) * 4;
        off = f->data_offset() + t.offset + static_cast<size_t>(token) * row;
      }
  }
  REQUIRE(row > 0);
  std::vector<float> nans(row / 4, std::numeric_limits<float>::quiet_NaN());
  std::fstream io(path, std::ios::binary | std::ios::in | std::ios::out);
  io.seekp(static_cast<std::streamoff>(off));
  io.write(reinterpret_cast<const char *>(nans.data()), static_cast<std::streamsize>(row));
  return path;
}

}  // namespace

// ---- 1. out of memory while a decode grows its arena

TEST_CASE("reliability: every allocation a decode makes may fail; the context is unchanged and the retry works",
          "[reliability][engine]") {
  HookOff off;
  auto model = Model::load(moe_test::tiny_model("f32"), {});
  const int32_t nv = model->n_vocab();
  // 200 tokens that all want logits, in ubatches of 64: the (64, 64) plan needs a larger
  // arena than the (64, 1) plan compiled at creation (the tiny model's logits are what
  // make it larger), and the logits buffer grows.
  const std::vector<BatchToken> batch = tokens(200, 0, true);
  auto ref = cpu_ctx(*model, 256, 2, 64);
  ref->decode(batch.data(), batch.size());
  for (const bool bad_alloc : {false, true}) {
    INFO((bad_alloc ? "std::bad_alloc" : "Error(OutOfMemory)"));
    auto ctx = cpu_ctx(*model, 256, 2, 64);
    const size_t arena0 = ctx->impl().arena_bytes[0];
    int failures = 0;
    for (int64_t n = 0; n < 32; ++n) {
      const Context::Impl &im = ctx->impl();
      const size_t plans = im.plans.size(), logits = im.logits.size();
      const std::vector<size_t> sizes = im.arena_bytes;
      test_fail_allocation_after(n, bad_alloc);
      const Status st = decode_status(*ctx, batch);  // a std::bad_alloc escaping fails the test here
      test_fail_allocation_after(-1);
      if (st == Status::Ok) break;
      INFO("allocation point " << n);
      REQUIRE(st == Status::OutOfMemory);
      ++failures;
      CHECK(ctx->kv_used_cells() == 0);
      CHECK(im.plans.size() == plans);
      CHECK(im.arena_bytes == sizes);
      // The logits buffer is unchanged when its own growth failed; a later failure may leave
      // it grown (capacity only: it holds no readable logits, and the retry reuses it).
      if (n == 0) CHECK(im.logits.size() == logits);
      else CHECK((im.logits.size() == logits || im.logits.size() == 200 * static_cast<size_t>(nv)));
      CHECK(arenas_cover_sizes(*ctx));
      CHECK_THROWS_AS(ctx->logits(-1), Error);
    }
    CHECK(failures >= 2);  // the logits buffer, then the larger arena
    CHECK(ctx->impl().arena_bytes[0] > arena0);
    REQUIRE(ctx->kv_used_cells() == 200);
    CHECK(arenas_cover_sizes(*ctx));
    int diff = 0;
    for (int32_t i = 0; i < 200; ++i)
      for (int32_t v = 0; v < nv; ++v) diff += ctx->logits(i)[v] != Approx(ref->logits(i)[v]).margin(1e-4);
    CHECK(diff == 0);
  }
}

TEST_CASE("reliability: moe_decode after MOE_STATUS_OUT_OF_MEMORY retries the same batch", "[reliability][engine]") {
  HookOff off;
  CModel cm(moe_test::tiny_model("f32"), 256, 512, 64);
  cm.fill(200, 0, true);
  int failures = 0;
  moe_status st = MOE_STATUS_OK;
  for (int64_t n = 0; n < 32; ++n) {
    test_fail_allocation_after(n);
    st = moe_decode(cm.c, cm.b);
    test_fail_allocation_after(-1);
    if (st == MOE_STATUS_OK) break;
    REQUIRE(st == MOE_STATUS_OUT_OF_MEMORY);
    CHECK(contains(moe_last_error(), "cannot allocate"));
    CHECK(cm.used() == 0);
    ++failures;
  }
  CHECK(failures >= 2);
  REQUIRE(st == MOE_STATUS_OK);
  CHECK(cm.used() == 200);
  const float *lg = nullptr;
  CHECK(moe_get_logits(cm.c, 199, &lg, nullptr) == MOE_STATUS_OK);
  // And the context goes on: a second batch of the same shape reuses the plan.
  cm.fill(50, 200, true);
  CHECK(moe_decode(cm.c, cm.b) == MOE_STATUS_OK);
}

// ---- 2. no stale logits after a failed decode

TEST_CASE("reliability: after a failed decode the logits are unavailable, with the reason", "[reliability][engine]") {
  CModel cm(moe_test::tiny_model("f32"), 8, 4);
  moe_sampler *smp = nullptr;
  REQUIRE(moe_sampler_create(nullptr, &smp) == MOE_STATUS_OK);
  REQUIRE(moe_sampler_add_greedy(smp) == MOE_STATUS_OK);
  const float *lg = nullptr;
  int32_t tok = 0;
  auto expect_no_logits = [&](const char *why) {
    INFO(why);
    CHECK(moe_get_logits(cm.c, -1, &lg, nullptr) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(lg == nullptr);
    CHECK(contains(moe_last_error(), "the last decode failed"));
    CHECK(contains(moe_last_error(), why));
    CHECK(moe_get_logits(cm.c, 0, &lg, nullptr) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(moe_sampler_sample_context(smp, cm.c, -1, &tok) == MOE_STATUS_INVALID_ARGUMENT);
  };
  auto good_step = [&](int pos) {
    cm.fill(1, pos, true);
    REQUIRE(moe_decode(cm.c, cm.b) == MOE_STATUS_OK);
    REQUIRE(moe_get_logits(cm.c, -1, &lg, nullptr) == MOE_STATUS_OK);
  };
  cm.fill(4, 0, false);
  REQUIRE(moe_decode(cm.c, cm.b) == MOE_STATUS_OK);
  good_step(4);
  good_step(5);
  // CONTEXT_FULL: 6 of 8 cells used, 3 more asked.
  moe_batch_clear(cm.b);
  for (int i = 0; i < 3; ++i) moe_batch_add(cm.b, 5, 6 + i, 0, 1);
  CHECK(moe_decode(cm.c, cm.b) == MOE_STATUS_CONTEXT_FULL);
  expect_no_logits("context full");
  good_step(6);
  // INVALID_ARGUMENT from the engine (token outside the vocabulary).
  moe_batch_clear(cm.b);
  moe_batch_add(cm.b, moe_context_n_vocab(cm.c), 7, 0, 1);
  CHECK(moe_decode(cm.c, cm.b) == MOE_STATUS_INVALID_ARGUMENT);
  expect_no_logits("outside the vocabulary");
  CHECK(cm.used() == 7);
  good_step(7);
  // INVALID_ARGUMENT from the C ABI's own checks (NULL batch, more than n_batch tokens).
  CHECK(moe_decode(cm.c, nullptr) == MOE_STATUS_INVALID_ARGUMENT);
  expect_no_logits("batch is NULL");
  REQUIRE(moe_kv_seq_rm(cm.c, 0, 7, -1) == MOE_STATUS_OK);
  good_step(7);
  cm.fill(5, 8, true);
  CHECK(moe_decode(cm.c, cm.b) == MOE_STATUS_INVALID_ARGUMENT);
  expect_no_logits("exceeds n_batch");
  // The engine API says the same.
  auto model = Model::load(moe_test::tiny_model("f32"), {});
  auto ctx = cpu_ctx(*model, 4);
  auto b = tokens(3, 0, true);
  ctx->decode(b.data(), b.size());
  CHECK(std::isfinite(ctx->logits(-1)[0]));
  auto more = tokens(2, 3, true);
  CHECK(decode_status(*ctx, more) == Status::ContextFull);
  try {
    (void)ctx->logits(-1);
    FAIL("logits after a failed decode");
  } catch (const Error &e) {
    CHECK(e.code() == Status::InvalidArgument);
    CHECK(contains(e.what(), "the last decode failed: context full"));
  }
  moe_sampler_free(smp);
}

// ---- 3. non-finite logits are an error

TEST_CASE("reliability: a decode whose requested logits are NaN fails with NUMERIC_ERROR and keeps nothing",
          "[reliability][engine]") {
  const std::string path = nan_token_model(7);
  {
    auto model = Model::load(path, {});
    auto ctx = cpu_ctx(*model);
    auto p = tokens(3, 0, false, 1);
    ctx->decode(p.data(), p.size());
    REQUIRE(ctx->kv_used_cells() == 3);
    std::vector<BatchToken> bad = {{7, 3, 0, true}};
    try {
      ctx->decode(bad.data(), bad.size());
      FAIL("expected NumericError");
    } catch (const Error &e) {
      CHECK(e.code() == Status::NumericError);
      CHECK(contains(e.what(), "non-finite logits"));
      CHECK(contains(e.what(), "token 7"));
    }
    CHECK(ctx->kv_used_cells() == 3);
    CHECK_THROWS_AS(ctx->logits(-1), Error);
    // Only rows that were asked for are checked: a NaN position without logits passes.
    std::vector<BatchToken> quiet = {{7, 3, 0, false}};
    ctx->decode(quiet.data(), quiet.size());
    CHECK(ctx->kv_used_cells() == 4);
    ctx->kv_seq_rm(0, 3, -1);
    std::vector<BatchToken> good = {{4, 3, 0, true}};
    ctx->decode(good.data(), good.size());
    for (int32_t v = 0; v < model->n_vocab(); ++v) REQUIRE(std::isfinite(ctx->logits(-1)[v]));
  }
  {
    CModel cm(path);
    moe_batch_add(cm.b, 7, 0, 0, 1);
    CHECK(moe_decode(cm.c, cm.b) == MOE_STATUS_NUMERIC_ERROR);
    CHECK(std::strcmp(moe_status_string(MOE_STATUS_NUMERIC_ERROR), "numeric error") == 0);
    CHECK(contains(moe_last_error(), "non-finite"));
    CHECK(cm.used() == 0);
  }
  std::remove(path.c_str());
}

// ---- 4. limits of the context sizes

TEST_CASE("reliability: context sizes beyond their limits are INVALID_ARGUMENT naming the field and the limit",
          "[reliability][engine]") {
  auto model = Model::load(moe_test::tiny_model("f32"), {});
  struct Case {
    const char *field;
    const char *limit;
    void (*set)(ContextParams &);
  };
  const Case cases[] = {
      {"n_batch", "1048576", [](ContextParams &p) { p.n_batch = 1u << 28; }},
      {"n_batch", "1048576", [](ContextParams &p) { p.n_batch = UINT32_MAX; }},
      {"n_ubatch", "65536", [](ContextParams &p) { p.n_batch = 1u << 20; p.n_ubatch = (1u << 16) + 1; }},
      {"n_ctx", "16777216", [](ContextParams &p) { p.n_ctx = (1u << 24) + 1; }},
      {"n_seq_max", "64", [](ContextParams &p) { p.n_seq_max = 65; }},
      {"n_threads", "1024", [](ContextParams &p) { p.n_threads = 1025; }},
  };
  for (const Case &c : cases) {
    ContextParams cp;
    cp.n_ctx = 64;
    cp.device = "cpu";
    cp.n_threads = 1;
    c.set(cp);
    INFO(c.field);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      Context::create(*model, cp);
      FAIL("expected InvalidArgument");
    } catch (const Error &e) {
      CHECK(e.code() == Status::InvalidArgument);
      CHECK(contains(e.what(), c.field));
      CHECK(contains(e.what(), c.limit));
    }
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));  // refused up front
  }
  // The limits themselves are accepted.
  ContextParams cp;
  cp.n_ctx = 64;
  cp.n_batch = kMaxBatchTokens;
  cp.n_threads = 1;
  cp.device = "cpu";
  CHECK(Context::create(*model, cp)->params().n_batch == kMaxBatchTokens);
  // Through the C ABI.
  moe_model *m = nullptr;
  REQUIRE(moe_model_load(moe_test::tiny_model("f32").c_str(), nullptr, &m) == MOE_STATUS_OK);
  moe_context_params p = moe_context_default_params();
  p.device = "cpu";
  p.n_batch = 1u << 28;
  moe_context *c = nullptr;
  CHECK(moe_context_create(m, &p, &c) == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(c == nullptr);
  CHECK(contains(moe_last_error(), "n_batch 268435456 exceeds the limit 1048576"));
  moe_model_free(m);
}

// ---- 5. threads

namespace {
// Blocks the decoding thread inside its first abort poll until the test says go.
using moe_rel::Gate;
using moe_rel::gate_abort;
}  // namespace

TEST_CASE("reliability: while a synchronous decode runs, every other call on the context is BUSY",
          "[reliability][engine]") {
  CModel cm(moe_test::tiny_model("f32"));
  Gate gate;
  REQUIRE(moe_context_set_abort_callback(cm.c, gate_abort, &gate) == MOE_STATUS_OK);
  cm.fill(16, 0, true);
  moe_batch *other = nullptr;
  REQUIRE(moe_batch_create(4, &other) == MOE_STATUS_OK);
  moe_batch_add(other, 1, 100, 0, 1);
  moe_sampler *smp = nullptr;
  REQUIRE(moe_sampler_create(nullptr, &smp) == MOE_STATUS_OK);
  moe_status decoded = MOE_STATUS_INTERNAL;
  std::thread t([&] { decoded = moe_decode(cm.c, cm.b); });
  while (gate.entered.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The decode is inside the context now (blocked in its abort callback).
  const float *lg = nullptr;
  int32_t pos = 0, tok = 0;
  uint32_t cells = 0;
  CHECK(moe_kv_seq_rm(cm.c, 0, -1, -1) == MOE_STATUS_BUSY);
  CHECK(contains(moe_last_error(), "in use"));
  CHECK(moe_kv_clear(cm.c) == MOE_STATUS_BUSY);
  CHECK(moe_kv_seq_cp(cm.c, 0, 0, -1, -1) == MOE_STATUS_BUSY);
  CHECK(moe_kv_seq_keep(cm.c, 0) == MOE_STATUS_BUSY);
  CHECK(moe_kv_seq_pos_max(cm.c, 0, &pos) == MOE_STATUS_BUSY);
  CHECK(moe_kv_used_cells(cm.c, &cells) == MOE_STATUS_BUSY);
  CHECK(moe_get_logits(cm.c, -1, &lg, nullptr) == MOE_STATUS_BUSY);
  CHECK(moe_sampler_sample_context(smp, cm.c, -1, &tok) == MOE_STATUS_BUSY);
  CHECK(moe_context_set_abort_callback(cm.c, nullptr, nullptr) == MOE_STATUS_BUSY);
  CHECK(moe_context_set_gpu_graphs(cm.c, 0) == MOE_STATUS_BUSY);
  CHECK(moe_context_check(cm.c) == MOE_STATUS_BUSY);
  CHECK(moe_decode(cm.c, other) == MOE_STATUS_BUSY);
  CHECK(moe_decode_submit(cm.c, other) == MOE_STATUS_BUSY);
  int32_t st = -1;
  CHECK(moe_decode_poll(cm.c, &st) == MOE_STATUS_OK);  // poll, wait and cancel are the exceptions
  gate.go = true;
  t.join();
  CHECK(decoded == MOE_STATUS_OK);
  CHECK(cm.used() == 16);  // the racing kv_seq_rm / kv_clear changed nothing
  CHECK(moe_get_logits(cm.c, -1, &lg, nullptr) == MOE_STATUS_OK);
  CHECK(moe_context_set_abort_callback(cm.c, nullptr, nullptr) == MOE_STATUS_OK);
  moe_sampler_free(smp);
  moe_batch_free(other);
}

TEST_CASE("reliability: an exception on a CPU pool thread ends the job on every thread and reaches the caller",
          "[reliability][engine]") {
  ThreadPool pool(4);
  for (int thrower : {2, 0, 3}) {
    INFO("thrower " << thrower);
    std::atomic<int> after{0};
    try {
      pool.run([&](int ith, int) {
        pool.barrier();
        if (ith == thrower) throw Error(Status::Internal, "kernel failed on thread " + std::to_string(ith));
        pool.barrier();  // the others wait here for the thrower: they must be let go
        pool.barrier();
        after.fetch_add(1);
      });
      FAIL("expected the thread's exception");
    } catch (const Error &e) {
      CHECK(e.code() == Status::Internal);
      CHECK(std::string(e.what()) == "kernel failed on thread " + std::to_string(thrower));
    }
    CHECK(after.load() == 0);
    // Every thread threw: the first one is reported, once.
    CHECK_THROWS_AS(pool.run([](int, int) { throw std::bad_alloc(); }), std::bad_alloc);
    // The pool goes on: barriers and work sharing as before.
    std::atomic<int64_t> sum{0};
    pool.run([&](int, int) {
      for (int r = 0; r < 50; ++r) {
        for (int64_t i; (i = pool.take_items()) < 100;) sum.fetch_add(i);
        pool.barrier();
      }
    });
    CHECK(sum.load() == 50 * 4950);
  }
}

TEST_CASE("reliability: an exception thrown inside a CPU decode job is a status and releases the cells",
          "[reliability][engine]") {
  auto model = Model::load(moe_test::tiny_model("f32"), {});
  for (int threads : {1, 4}) {
    INFO("threads " << threads);
    auto ctx = cpu_ctx(*model, 256, threads);
    static std::atomic<int> polls;
    polls = 0;
    // Thrown on the decoding thread inside the pool job, while the other threads wait at
    // the node's barrier (the C ABI's callbacks cannot throw; a kernel could).
    ctx->set_abort_callback([](void *) -> bool {
      if (++polls == 12) throw std::runtime_error("kernel exploded");
      return false;
    }, nullptr);
    const auto b = tokens(32, 0, false);
    try {
      ctx->decode(b.data(), b.size());
      FAIL("expected Internal");
    } catch (const Error &e) {
      CHECK(e.code() == Status::Internal);
      CHECK(contains(e.what(), "kernel exploded"));
    }
    CHECK(ctx->kv_used_cells() == 0);
    ctx->set_abort_callback(nullptr, nullptr);
    ctx->decode(b.data(), b.size());
    CHECK(ctx->kv_used_cells() == 32);
  }
}

// ---- 6. the abort callback is polled after every CPU node

TEST_CASE("reliability: the abort callback is polled after every CPU operation and stops at once", "[reliability][engine]") {
  auto model = Model::load(moe_test::tiny_model("f32"), {});
  for (int threads : {1, 3}) {
    INFO("threads " << threads);
    auto ctx = cpu_ctx(*model, 256, threads);
    static std::atomic<int> calls, stop_at;
    calls = 0;
    stop_at = -1;
    ctx->set_abort_callback([](void *) { return ++calls == stop_at.load(); }, nullptr);
    const auto b = tokens(64, 0, false);
    ctx->decode(b.data(), b.size());
    const CompiledPlan &plan = *ctx->impl().plans.at({64, 1});
    int ops = 0;
    for (const Node &n : plan.graph.nodes()) ops += n.op != Op::Leaf && n.op != Op::View;
    INFO(calls.load() << " polls for " << ops << " operations in " << plan.segments.size() << " segments");
    CHECK(calls.load() >= ops);
    // Stop in the middle of a segment: the decode ends at that very poll.
    ctx->kv_clear();
    calls = 0;
    stop_at = ops / 2 + 1;
    try {
      ctx->decode(b.data(), b.size());
      FAIL("expected Aborted");
    } catch (const Error &e) {
      CHECK(e.code() == Status::Aborted);
    }
    CHECK(calls.load() == stop_at.load());
    CHECK(ctx->kv_used_cells() == 0);
  }
}

TEST_CASE("reliability: moe_decode_cancel stops an asynchronous CPU decode at the next poll", "[reliability][engine]") {
  CModel cm(moe_test::tiny_model("f32"));
  static std::atomic<int> polls, polls_after;
  static std::atomic<bool> cancelled;
  polls = 0;
  polls_after = 0;
  cancelled = false;
  // A slow host callback (1 ms per poll) keeps the decode running until the cancel; it is
  // consulted only while the engine has not yet seen the cancel flag.
  REQUIRE(moe_context_set_abort_callback(cm.c, [](void *) {
            ++polls;
            if (cancelled.load()) ++polls_after;
            else std::this_thread::sleep_for(std::chrono::milliseconds(1));
            return 0;
          }, nullptr) == MOE_STATUS_OK);
  cm.fill(256, 0, false);
  REQUIRE(moe_decode_submit(cm.c, cm.b) == MOE_STATUS_OK);
  while (polls.load() < 10) std::this_thread::yield();
  REQUIRE(moe_decode_cancel(cm.c) == MOE_STATUS_OK);
  cancelled = true;
  CHECK(moe_decode_wait(cm.c, -1) == MOE_STATUS_ABORTED);
  CHECK(polls_after.load() <= 1);  // at most the poll that was running when the cancel came
  CHECK(cm.used() == 0);
  REQUIRE(moe_context_set_abort_callback(cm.c, nullptr, nullptr) == MOE_STATUS_OK);
}
