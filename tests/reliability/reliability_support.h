// Shared pieces of the reliability tests (issue 19): a C ABI context over a synthetic model,
// the synthetic models themselves, and whether a sanitizer slows this build down.
#pragma once
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "engine/engine.h"
#include "model/synth/synth_model.h"
#include "moeinfer/moeinfer.h"
#include "support/tiny_model.h"

#include <catch2/catch.hpp>

namespace moe_rel {

// An abort callback that holds the first decode inside it until go is set: another thread
// then calls into the context while the decode is certainly running.
struct Gate {
  std::atomic<int> entered{0};
  std::atomic<bool> go{false};
};
inline int gate_abort(void *p) {
  auto *g = static_cast<Gate *>(p);
  if (g->entered.fetch_add(1) == 0)
    while (!g->go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return 0;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// The synthetic "small" preset (4 layers, 16 experts of 256x256, n_embd 256) in F32: the
// largest model the tests build; a 256-token batch takes long enough per node to measure
// cancel latency. Written once per process.
inline std::string small_model() {
  const std::string path = moe_test::temp_name("small-f32.gguf");
  if (access(path.c_str(), R_OK) != 0) {
    moe::SynthSpec s;
    s.preset = "small";
    s.type_mix = "f32";
    s.seed = 11;
    moe::write_synthetic_model(s, path);
    moe_test::remove_at_exit(path);
  }
  return path;
}

// Batch entries: n tokens of sequence 0 from position pos0, spread over the vocabulary.
inline std::vector<moe::BatchToken> tokens(int n, int pos0, bool all_logits, int32_t tok0 = 3) {
  std::vector<moe::BatchToken> b;
  for (int i = 0; i < n; ++i) b.push_back({(tok0 + 37 * i) % 500, pos0 + i, 0, all_logits || i + 1 == n});
  return b;
}

// A C ABI model + CPU context + batch.
struct CModel {
  moe_model *m = nullptr;
  moe_context *c = nullptr;
  moe_batch *b = nullptr;
  explicit CModel(const std::string &path, uint32_t n_ctx = 256, uint32_t n_batch = 512, uint32_t n_ubatch = 512,
                  int32_t threads = 2) {
    REQUIRE(moe_model_load(path.c_str(), nullptr, &m) == MOE_STATUS_OK);
    moe_context_params cp = moe_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_ubatch;
    cp.n_threads = threads;
    cp.kv_type = MOE_KV_TYPE_F32;
    cp.device = "cpu";
    REQUIRE(moe_context_create(m, &cp, &c) == MOE_STATUS_OK);
    REQUIRE(moe_batch_create(1024, &b) == MOE_STATUS_OK);
  }
  ~CModel() {
    moe_batch_free(b);
    moe_context_free(c);
    moe_model_free(m);
  }
  CModel(const CModel &) = delete;
  CModel &operator=(const CModel &) = delete;
  void fill(int n, int pos0, bool all_logits, int32_t tok0 = 3) {
    moe_batch_clear(b);
    for (const moe::BatchToken &t : tokens(n, pos0, all_logits, tok0)) moe_batch_add(b, t.token, t.pos, t.seq_id, t.logits);
  }
  uint32_t used() {
    uint32_t n = 0;
    REQUIRE(moe_kv_used_cells(c, &n) == MOE_STATUS_OK);
    return n;
  }
};

inline bool contains(const char *s, const char *part) { return s && std::strstr(s, part) != nullptr; }

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace moe_rel
