// Runs the header-only C++ API against the shared library on the fixture model. Built twice:
// with exceptions (default) and with -fno-exceptions -DMOEINFER_NO_EXCEPTIONS (Result<T>).
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>

#include "moeinfer/moeinfer.hpp"

static int g_fail = 0;
#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      g_fail = 1;                                                    \
    }                                                                \
  } while (0)

static int slow(void *) {
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return 0;
}

#ifdef MOEINFER_NO_EXCEPTIONS
template <class T>
static T take(moeinfer::Result<T> r) {
  if (!r) std::fprintf(stderr, "unexpected failure: %s (%s)\n", moe_status_string(r.status()), r.message().c_str());
  CHECK(r.ok());
  return std::move(r).value();
}
#define TAKE(expr) take(expr)
#define OK(expr) CHECK((expr).ok())
#else
#define TAKE(expr) (expr)
#define OK(expr) (expr)
#endif

int main(int argc, char **argv) {
  using namespace std::chrono_literals;
  if (argc < 2) return 2;
  CHECK(moeinfer::abi_version() == MOE_ABI_VERSION);

  // A failing call reports its status either way.
#ifdef MOEINFER_NO_EXCEPTIONS
  auto bad = moeinfer::Model::load("/nonexistent/x.gguf");
  CHECK(!bad && bad.status() == MOE_STATUS_IO_ERROR && !bad.message().empty());
#else
  try {
    moeinfer::Model::load("/nonexistent/x.gguf");
    CHECK(false);
  } catch (const moeinfer::Error &e) {
    CHECK(e.status() == MOE_STATUS_IO_ERROR);
  }
#endif

  // Placement: a bad argument is INVALID_ARGUMENT with the library's message, from load and
  // from the dry run alike.
  {
    auto mp = moeinfer::Model::default_params();
    CHECK(mp.n_cpu_moe == -1 && mp.n_gpu_layers == -1 && mp.fit_n_ctx == 4096);
    mp.n_tensor_split = 2;  // tensor_split NULL
#ifdef MOEINFER_NO_EXCEPTIONS
    auto l = moeinfer::Model::load(argv[1], mp);
    CHECK(l.status() == MOE_STATUS_INVALID_ARGUMENT && l.message().find("tensor_split") != std::string::npos);
    auto f = moeinfer::Model::fit(argv[1], mp);
    CHECK(f.status() == MOE_STATUS_INVALID_ARGUMENT && f.message().find("tensor_split") != std::string::npos);
    auto none = moeinfer::Model::fit("/nonexistent/x.gguf");
    CHECK(!none && !none.message().empty());
#else
    try {
      moeinfer::Model::load(argv[1], mp);
      CHECK(false);
    } catch (const moeinfer::Error &e) {
      CHECK(e.status() == MOE_STATUS_INVALID_ARGUMENT && std::string(e.what()).find("tensor_split") != std::string::npos);
    }
    try {
      moeinfer::Model::fit(argv[1], mp);
      CHECK(false);
    } catch (const moeinfer::Error &e) {
      CHECK(e.status() == MOE_STATUS_INVALID_ARGUMENT && std::string(e.what()).find("tensor_split") != std::string::npos);
    }
    try {
      moeinfer::Model::fit("/nonexistent/x.gguf");
      CHECK(false);
    } catch (const moeinfer::Error &e) {
      CHECK(e.status() != MOE_STATUS_OK);
    }
#endif
  }

  moeinfer::Model model = TAKE(moeinfer::Model::load(argv[1]));
  CHECK(static_cast<bool>(model));
  moeinfer::Model moved = std::move(model);
  CHECK(!model && moved);  // move leaves the source empty
  auto info = TAKE(moved.info());
  CHECK(info.n_vocab > 0);
  std::string arch = TAKE(moved.meta("general.architecture"));
  CHECK(arch == info.arch);

  const std::string text = "hello world, the quick brown fox";
  auto toks = TAKE(moved.tokenize(text, 0));
  CHECK(!toks.empty());
  CHECK(TAKE(moved.detokenize(toks)) == text);
  {
    moeinfer::Detokenizer dt = TAKE(moeinfer::Detokenizer::create(moved));
    std::string streamed;
    for (int32_t t : toks) streamed += TAKE(dt.push(t));
    streamed += TAKE(dt.flush());
    CHECK(streamed == text);
  }

  auto params = moeinfer::Context::default_params();
  params.n_ctx = 128;
  moeinfer::Context ctx = TAKE(moeinfer::Context::create(moved, params));
  moeinfer::Batch batch = TAKE(moeinfer::Batch::create(64));
  OK(batch.add_sequence(toks, 0, 0, true));
  OK(ctx.set_abort_callback(slow, nullptr));
  OK(ctx.submit(batch));
  CHECK(ctx.poll() == MOE_ASYNC_RUNNING);
  bool done = TAKE(ctx.wait(1ms));
  CHECK(!done);  // each layer sleeps 10 ms: still running
  while (!TAKE(ctx.wait(5ms))) {
  }
  CHECK(ctx.poll() == MOE_ASYNC_IDLE);
  OK(ctx.set_abort_callback(nullptr, nullptr));

  moeinfer::LogitsView lv = TAKE(ctx.logits(-1));
  CHECK(lv.data && lv.n_vocab == info.n_vocab);
  moeinfer::Sampler greedy = TAKE(moeinfer::Sampler::create());
  OK(greedy.add_greedy());
  int32_t best = 0;
  for (int32_t i = 1; i < lv.n_vocab; ++i)
    if (lv[i] > lv[best]) best = i;
  CHECK(TAKE(greedy.sample(ctx)) == best);
  CHECK(TAKE(ctx.kv_seq_pos_max(0)) == static_cast<int32_t>(toks.size()) - 1);

  // Context full is a status, not a silent shift: fill every cell, then ask for one more.
  int32_t pos = static_cast<int32_t>(toks.size());
  const int32_t n_ctx = static_cast<int32_t>(ctx.n_ctx());
  while (pos < n_ctx) {
    OK(batch.clear());
    for (int i = 0; i < 64 && pos < n_ctx; ++i) OK(batch.add(best, pos++, 0, true));
    OK(ctx.decode(batch));
  }
  OK(batch.clear());
  OK(batch.add(best, pos, 0, true));
#ifdef MOEINFER_NO_EXCEPTIONS
  auto r = ctx.decode(batch);
  CHECK(r.status() == MOE_STATUS_CONTEXT_FULL);
#else
  try {
    ctx.decode(batch);
    CHECK(false);
  } catch (const moeinfer::Error &e) {
    CHECK(e.status() == MOE_STATUS_CONTEXT_FULL);
  }
#endif
  CHECK(TAKE(ctx.kv_seq_pos_max(0)) == n_ctx - 1);  // nothing was dropped
  std::printf("%s\n", g_fail ? "FAILED" : "all passed");
  return g_fail;
}
