// Context internals: the pimpl behind moe::Context (and so behind moe_context).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "engine/engine.h"
#include "engine/weight_upload.h"
#include "graph/compiler.h"
#include "kv/kv_cache.h"
#include "memory/memory_report.h"

namespace moe {

// ContextParams::stream_min_tokens = -1: prompt ubatches from this size stream CPU-resident
// weights to the GPU. Measured on the H200 host (Qwen3-30B-A3B Q4_K_M, experts on the CPU,
// 15 threads): CPU 137 / 198 / 231 t/s at pp32 / pp128 / pp512, streaming 85 / 332 / 1310;
// the crossover lies near 64 (docs/perf/placement.md).
constexpr int kStreamMinTokensAuto = 64;

struct Context::Impl {
  const Model *model = nullptr;
  ContextParams params;
  std::unique_ptr<BackendRegistry> registry;        // this context's streams and executors
  std::vector<Backend *> devices;                   // index = Node::device
  std::vector<std::unique_ptr<Executor>> executors;
  // Placement: the model's (device "auto"), or every weight and layer on devices[0].
  bool model_placement = false;
  std::vector<int> model_dev;                       // devices[d] -> index in the model's placement
  std::unique_ptr<DeviceWeights> dev_weights;       // own GPU copy when one device was named and the model's are elsewhere
  uint64_t step = 0;                                // ExecEnv::step
  std::unique_ptr<KvCache> kv;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<CompiledPlan>> plans;  // (n_tokens, n_outputs)
  std::vector<std::unique_ptr<DeviceBuffer>> arenas;  // per device
  std::vector<size_t> arena_bytes;
  MemoryReport report;

  // Logits of the last decode: rows in output order; batch index -> row.
  std::vector<float> logits;
  std::vector<int32_t> logit_row;  // n_batch entries, -1 = none
  int32_t n_outputs = 0;
  // The last decode failed (logits() then refuses, quoting why).
  bool last_failed = false;
  std::string last_failure;

  // Preallocated ubatch staging (no allocation per decode).
  std::vector<int32_t> ub_tokens, ub_pos, ub_seq, ub_cells, ub_out_ids, claimed;

  AbortCallback abort_cb = nullptr;
  void *abort_data = nullptr;
  const std::atomic<bool> *cancel_flag = nullptr;  // AsyncDecoder's cancel, read by every CPU thread
  bool broken = false;
  std::string broken_why;

  // The cached plan for a ubatch shape, compiled on first use. Arena growth is all or
  // nothing: on any failure the arenas, their sizes and the cached plans are unchanged.
  CompiledPlan &plan_for(int64_t n_tokens, int64_t n_outputs);
  void decode_batch(const BatchToken *toks, size_t n_tokens);
  // After a failed decode: release this call's cells, drop the logits, remember why.
  void fail_decode(Status code, const char *why) noexcept;
  void bind(CompiledPlan &plan);  // resolve its addresses in the current arenas
  void rebind_all();
  void *weight_addr(const Node &n) const;  // device copy for GPU nodes, else the host mapping
  void run_ubatch(const BatchToken *toks, int32_t n, int32_t out_base, size_t batch_base);
  void update_report();
  CompileOptions compile_options(int64_t n_tokens) const;  // for a ubatch of n_tokens
  void run_segments(const CompiledPlan &plan, const ExecEnv &env);
  std::unique_ptr<DeviceBuffer> alloc_arena(size_t d, size_t bytes);
  int kv_device_of(int layer) const;
  std::vector<bool> pending;  // run_segments: GPU executors with work since the host last waited
  bool mixed = false;         // host and GPU devices both run parts of the plan
  int stream_gpu = -1;        // a GPU the host weights stream to for big ubatches (they are pinned for it), or -1
  int pinned_gpu = -1;        // the GPU the host weights are page-locked for, or -1
  std::vector<int> direct_slots;  // per layer: Graph::moe_direct_slots_by_layer of one-token plans
  std::vector<bool> marked;   // run_segments: GPU executors whose host wait stops at their mark
  void wait_pending();
  void wait_for_host_segment();  // before a CPU segment: the GPU work it may read is done
  void plan_direct_slots();      // direct_slots from the placement and ContextParams
};

}  // namespace moe
