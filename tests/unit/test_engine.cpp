// End to end on self-made fixtures (no shared data needed): the engine against the naive
// float64 forward, KV cache semantics, error statuses, and allocation-free decode.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>

#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "support/reference_qwen3moe.h"
#include "support/tiny_model.h"

using namespace moe;

// Counting allocator hook: every operator new in the process bumps the counter while
// counting is on (all threads: the CPU pool's workers included).
static std::atomic<bool> g_count_allocs{false};
static std::atomic<long> g_allocs{0};
// Every plain/array/nothrow form is replaced together so allocation and release always pair
// up (sanitizers check that); the aligned forms are left to the runtime, also in pairs.
// GCC cannot see that these news come from malloc, so it flags free() in the deletes.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
static void *counted_alloc(size_t n) {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1);
  return std::malloc(n ? n : 1);
}
void *operator new(size_t n) {
  if (void *p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void *operator new[](size_t n) {
  if (void *p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void *operator new(size_t n, const std::nothrow_t &) noexcept { return counted_alloc(n); }
void *operator new[](size_t n, const std::nothrow_t &) noexcept { return counted_alloc(n); }
void operator delete(void *p) noexcept { std::free(p); }
void operator delete[](void *p) noexcept { std::free(p); }
void operator delete(void *p, size_t) noexcept { std::free(p); }
void operator delete[](void *p, size_t) noexcept { std::free(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { std::free(p); }

namespace {

std::unique_ptr<Context> make_ctx(const Model &m, KvType kv = KvType::F32, uint32_t n_ctx = 64, uint32_t n_seq = 1, int threads = 2) {
  ContextParams cp;
  cp.n_ctx = n_ctx;
  cp.n_seq_max = n_seq;
  cp.kv_type = kv;
  cp.n_threads = threads;
  cp.device = "cpu";
  return Context::create(m, cp);
}

void feed(Context &c, const std::vector<int32_t> &ids, int32_t pos0 = 0, int32_t seq = 0) {
  std::vector<BatchToken> b;
  for (size_t i = 0; i < ids.size(); ++i) b.push_back({ids[i], pos0 + static_cast<int32_t>(i), seq, i + 1 == ids.size()});
  c.decode(b.data(), b.size());
}

}  // namespace

TEST_CASE("engine: tiny qwen3moe matches the float64 reference forward", "[engine]") {
  const std::string path = moe_test::tiny_model("f32");
  auto model = Model::load(path, {});
  auto f = GgufFile::open(path);
  const std::vector<int32_t> ids = {5, 77, 300, 12, 9, 401, 260};
  for (int threads : {1, 2, 3}) {
    auto ctx = make_ctx(*model, KvType::F32, 64, 1, threads);
    feed(*ctx, ids);  // whole prompt in one batch
    auto want = moe_ref::qwen3moe_last_logits(*f, ids);
    const float *got = ctx->logits(-1);
    double md = 0, mx = 0;
    for (int32_t v = 0; v < model->n_vocab(); ++v) {
      md = std::max(md, std::fabs(got[v] - want[static_cast<size_t>(v)]));
      mx = std::max(mx, std::fabs(want[static_cast<size_t>(v)]));
    }
    INFO("threads " << threads << " max |diff| " << md << " max |logit| " << mx);
    CHECK(md < 1e-3 * std::max(1.0, mx));
  }
  // Token by token must equal the batched prompt (same math, different batch buckets).
  auto a = make_ctx(*model), b = make_ctx(*model);
  feed(*a, ids);
  for (size_t i = 0; i < ids.size(); ++i) feed(*b, {ids[i]}, static_cast<int32_t>(i));
  for (int32_t v = 0; v < model->n_vocab(); ++v) CHECK(a->logits(-1)[v] == Approx(b->logits(-1)[v]).margin(1e-3));
}

TEST_CASE("engine: sequences share the cache without seeing each other", "[engine][kv]") {
  auto model = Model::load(moe_test::tiny_model("f32"), {});
  auto solo = make_ctx(*model);
  feed(*solo, {11, 22, 33});
  std::vector<float> want(solo->logits(-1), solo->logits(-1) + model->n_vocab());
  auto multi = make_ctx(*model, KvType::F32, 64, 3);
  feed(*multi, {99, 98, 97, 96}, 0, 1);  // another sequence first
  feed(*multi, {11, 22, 33}, 0, 2);
  for (int32_t v = 0; v < model->n_vocab(); ++v) REQUIRE(multi->logits(-1)[v] == Approx(want[static_cast<size_t>(v)]).margin(1e-4));
  // A shared prefix copied to a new sequence continues like the original.
  multi->kv_seq_cp(2, 0, -1, -1);
  feed(*multi, {44}, 3, 0);
  feed(*solo, {44}, 3, 0);
  for (int32_t v = 0; v < model->n_vocab(); ++v) REQUIRE(multi->logits(-1)[v] == Approx(solo->logits(-1)[v]).margin(1e-4));
  CHECK(multi->kv_seq_pos_max(1) == 3);
  multi->kv_seq_rm(1, -1, -1);
  CHECK(multi->kv_seq_pos_max(1) == -1);
  multi->kv_seq_keep(0);
  CHECK(multi->kv_seq_pos_max(2) == -1);
  CHECK(multi->kv_seq_pos_max(0) == 3);
}

TEST_CASE("engine: full context, bad ids and bad batches are statuses that leave the cache intact", "[engine][errors]") {
  auto model = Model::load(moe_test::tiny_model("f32"), {});
  auto ctx = make_ctx(*model, KvType::F16, 8);
  feed(*ctx, {1, 2, 3, 4, 5, 6});
  const uint32_t used = ctx->kv_used_cells();
  std::vector<BatchToken> three = {{7, 6, 0, false}, {8, 7, 0, false}, {9, 8, 0, true}};
  try {
    ctx->decode(three.data(), three.size());
    FAIL("expected ContextFull");
  } catch (const Error &e) {
    CHECK(e.code() == Status::ContextFull);
  }
  CHECK(ctx->kv_used_cells() == used);
  BatchToken bad{model->n_vocab(), 6, 0, true};
  try {
    ctx->decode(&bad, 1);
    FAIL("expected InvalidArgument");
  } catch (const Error &e) {
    CHECK(e.code() == Status::InvalidArgument);
  }
  BatchToken badseq{1, 6, 5, true};
  CHECK_THROWS_AS(ctx->decode(&badseq, 1), Error);
  CHECK_THROWS_AS(ctx->decode(nullptr, 0), Error);
  CHECK(ctx->kv_used_cells() == used);
  // Still usable: two more tokens fit exactly.
  std::vector<BatchToken> two = {{7, 6, 0, false}, {8, 7, 0, true}};
  ctx->decode(two.data(), two.size());
  CHECK(ctx->kv_used_cells() == 8);
  CHECK_THROWS_AS(ctx->logits(0), Error);  // entry 0 asked for no logits
  CHECK(std::isfinite(ctx->logits(1)[0]));
}

TEST_CASE("engine: abort callback stops a decode between layers and keeps the cache", "[engine][errors]") {
  auto model = Model::load(moe_test::tiny_model("f32"), {});
  auto ctx = make_ctx(*model);
  static int calls;
  calls = 0;
  ctx->set_abort_callback([](void *) { return ++calls > 2; }, nullptr);
  try {
    feed(*ctx, {1, 2, 3});
    FAIL("expected Aborted");
  } catch (const Error &e) {
    CHECK(e.code() == Status::Aborted);
  }
  CHECK(ctx->kv_used_cells() == 0);
  ctx->set_abort_callback(nullptr, nullptr);
  feed(*ctx, {1, 2, 3});
  CHECK(ctx->kv_used_cells() == 3);
}

TEST_CASE("engine: steady-state decode performs no heap allocation", "[engine][alloc]") {
  auto model = Model::load(moe_test::tiny_model("q8_0"), {});
  for (KvType kv : {KvType::F16, KvType::Q8_0}) {
    auto ctx = make_ctx(*model, kv, 128, 1, 2);
    feed(*ctx, {3, 4, 5, 6});
    int32_t pos = 4;
    feed(*ctx, {7}, pos++);  // warm: first use of the 1-token plan
    g_allocs = 0;
    g_count_allocs = true;
    for (int i = 0; i < 16; ++i) {
      BatchToken t{static_cast<int32_t>(10 + i), pos++, 0, true};
      ctx->decode(&t, 1);
      (void)ctx->logits(0);
    }
    g_count_allocs = false;
    INFO("kv " << kv_type_name(kv));
    CHECK(g_allocs.load() == 0);
  }
}

TEST_CASE("engine: the CPU huge-page weight copy gives the mapped weights' logits bit for bit", "[engine]") {
  const std::string path = moe_test::tiny_model("q8_0");
  ModelLoadParams in_place, copied;
  in_place.cpu_weight_copy = false;
  auto m_map = Model::load(path, in_place), m_copy = Model::load(path, copied);
  auto a = make_ctx(*m_map), b = make_ctx(*m_copy), b2 = make_ctx(*m_copy);  // b2: shares the one copy
  const std::vector<int32_t> ids = {5, 77, 300, 12, 9};
  feed(*a, ids);
  feed(*b, ids);
  feed(*b2, ids);
  int diff = 0;
  for (int32_t v = 0; v < m_map->n_vocab(); ++v) diff += a->logits(-1)[v] != b->logits(-1)[v] || b->logits(-1)[v] != b2->logits(-1)[v];
  CHECK(diff == 0);
}
