// The engine's internal C++ API: what bindings/c wraps and what tools (moeinfer-cli,
// tests, benchmarks) call directly. Failures throw moe::Error (src/core/status.h).
//
//   ModelLoadParams mp;                       // mmap on, all devices
//   auto model = Model::load("qwen3moe.gguf", mp);
//   ContextParams cp;  cp.n_ctx = 4096;  cp.kv_type = KvType::F16;
//   auto ctx = Context::create(*model, cp);
//   std::vector<BatchToken> batch = {{tok, pos, /*seq*/0, /*logits*/true}};
//   ctx->decode(batch.data(), batch.size());   // throws Error(ContextFull) when no cell is free
//   const float *logits = ctx->logits(0);      // n_vocab floats, raw
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/gpu_tuning.h"
#include "core/status.h"

namespace moe {

class GgufFile;
class Vocab;
struct Hparams;
struct MemoryReport;

// Where a model's weights live and so where each part of the graph runs (the reference
// engine's -ot / --cpu-moe / --n-cpu-moe / -ts / -ngl / --fit). Resolved once at load into
// a tensor -> device map (src/placement/placement.h); every context over the model follows
// it (a context that names one device instead runs wholly there).
struct PlacementParams {
  bool cpu_moe = false;                    // routed experts of every layer on the CPU
  int n_cpu_moe = -1;                      // routed experts of layers [0, N) on the CPU; -1 = unset
  int n_gpu_layers = -1;                   // the last N layers on GPUs, the rest on the CPU; -1 = unset (all)
  std::vector<float> tensor_split;         // layer share per GPU of `devices` (in order); empty = unset
  std::vector<std::string> overrides;      // "REGEX=DEVICE", first match wins (regex searched in the name)
  std::string main_device;                 // output head (output_norm, output); empty = the last layer's device
  bool allow_fallback = false;             // an op a device cannot run may run on the CPU instead of failing
  int zero_copy = -1;                      // GPU weights used in place from host memory: -1 auto (integrated GPUs), 0 off, 1 force
  // Fit: choose the unset values above so each device's plan fits its budget.
  bool fit = false;
  std::vector<std::string> budgets;        // "DEVICE=BYTES" (K/M/G/T suffixes, binary); unset GPUs: free memory - fit_margin
  uint64_t fit_margin = 1024ull << 20;     // bytes kept free per GPU when its budget comes from free memory
  // The contexts the fit must leave room for (KV cache, activations).
  uint32_t fit_n_ctx = 4096;
  uint32_t fit_n_ubatch = 512;
  uint32_t fit_n_seq_max = 1;
  int fit_kv_type = 1;                     // KvType: 0 f32, 1 f16, 2 q8_0
  bool fit_shrink_ctx = false;             // the fit may lower fit_n_ctx (reported in the plan) when nothing else fits
  GpuTuning fit_gpu_tuning;                // the contexts' ContextParams::gpu_tuning (GPU scratch sizes depend on it)
  // Tests: present this device ("cpu", "cuda0") a second time as "<name>_twin" (own buffers and
  // executor), so multi-device placements run on one device.
  std::string twin_device;
};

struct ModelLoadParams {
  bool use_mmap = true;                     // map weights read-only (false: read into huge-page memory)
  // A mapped model's first CPU context copies the weights once into 2 MiB huge pages:
  // decode streams every weight byte per token, and 4 KiB file pages cost it 24-34% on
  // the x86 dev VM (docs/perf/cpu_engine.md). false: CPU contexts read the mapped pages.
  bool cpu_weight_copy = true;
  bool vocab_only = false;                  // load metadata + tokenizer only, no weights
  std::vector<std::string> kv_overrides;    // "key=type:value", applied before anything reads metadata
  std::vector<std::string> devices;         // device names to use ("cpu", "cuda0"); empty = all
  PlacementParams placement;
  // Called with progress in [0,1]; return false to cancel the load (throws Aborted).
  std::function<bool(float)> progress;
};

class Model {
public:
  static std::unique_ptr<Model> load(const std::string &path, const ModelLoadParams &params);
  // Metadata, tensor table and placement only: no fit, no weight upload, no context may be
  // created from it (the fit's dry run, `moeinfer-cli info --fit`).
  static std::unique_ptr<Model> load_metadata(const std::string &path, const ModelLoadParams &params);
  ~Model();

  const GgufFile &gguf() const;
  const Hparams &hparams() const;
  // Before the model's first CPU context: copy mapped weights into huge pages (default) or
  // read the mapped pages in place. False once the copy exists (the call then changes nothing).
  bool set_cpu_weight_copy(bool on);
  const Vocab *vocab() const;               // nullptr when the file has no tokenizer
  const std::string &arch_name() const;     // general.architecture
  int32_t n_vocab() const;
  uint64_t n_params() const;                // total weight elements
  uint64_t weight_bytes() const;            // total weight bytes as stored
  // Weight bytes one decoded token reads: every tensor, the experts' at n_expert_used of
  // n_expert, the token embedding one row (all of it when it is also the LM head). The
  // numerator of the decode roofline (`moeinfer-cli bench`).
  uint64_t decode_read_bytes() const;

  struct Impl;
  Impl &impl() const { return *impl_; }

private:
  Model();
  static std::unique_ptr<Model> create_empty();
  friend std::unique_ptr<Model> open_model(const std::string &, const ModelLoadParams &, bool);
  std::unique_ptr<Impl> impl_;
};

enum class KvType : int { F32 = 0, F16 = 1, Q8_0 = 2 };
const char *kv_type_name(KvType t);
bool kv_type_from_name(const std::string &s, KvType *out);

// Limits of ContextParams; Context::create fails with InvalidArgument naming the field and
// its limit (they bound what a context allocates up front: n_batch costs 8 bytes per token
// of bookkeeping, n_ubatch a compiled plan and its arena, n_ctx the KV cache).
constexpr uint32_t kMaxContextCells = 1u << 24;  // n_ctx
constexpr uint32_t kMaxBatchTokens = 1u << 20;   // n_batch
constexpr uint32_t kMaxUbatchTokens = 1u << 16;  // n_ubatch
constexpr uint32_t kMaxSequences = 64;           // n_seq_max
constexpr int kMaxThreads = 1024;                // n_threads

struct ContextParams {
  uint32_t n_ctx = 0;          // KV cells shared by all sequences, at most kMaxContextCells; 0 = min(model context, 4096)
  uint32_t n_batch = 512;      // most tokens one decode() call may take, at most kMaxBatchTokens; 0 = 512
  uint32_t n_ubatch = 512;     // tokens per compiled graph run (a decode() is split into these), at most
                               // kMaxUbatchTokens; 0 or > n_batch = min(n_batch, 512)
  uint32_t n_seq_max = 1;      // distinct sequence ids (0 .. n_seq_max-1), 1 .. kMaxSequences
  KvType kv_type = KvType::F16;
  int n_threads = 0;           // CPU worker threads, at most kMaxThreads; 0 (or negative) = physical cores
  std::string device = "auto"; // "cpu", "cuda", "cuda0", or "auto" (CUDA when present)
  bool flash_attn = true;      // fused attention kernel (always on for a Q8_0 cache)
  bool gpu_graphs = true;      // GPU: capture a repeated decode step once, then replay it
  bool cpu_float_order = false; // GPU: 2..128-token batches in the CPU's float order (Graph::cpu_float_order)
  // Placed models with weights on the CPU and a GPU: ubatches of at least this many tokens
  // copy the CPU-resident matrices of each layer to the GPU and multiply there (the weights
  // stream over the bus once per ubatch) instead of computing on the CPU; -1 = auto (64,
  // docs/perf/placement.md), 0 = never.
  int stream_min_tokens = -1;
  // Placed models with a layer's experts on the CPU and a GPU that reads page-locked host
  // memory in place: in a one-token step, this many of each token's routed experts are
  // computed by the layer's GPU over the bus while the CPU computes the others; 0 = off (the
  // default: on the H200 host the bus reads slowed the cores' own reads 2-3x instead of
  // adding bandwidth, docs/perf/placement.md). Clamped to n_expert_used - 1.
  int direct_expert_slots = 0;
  // GPU kernel and launch options of this context (core/gpu_tuning.h; defaults: the fastest
  // measured). Internal: benchmarks and tests set them, the C ABI does not. A fitted model
  // plans with PlacementParams::fit_gpu_tuning: give it the same values.
  GpuTuning gpu_tuning;
};

struct BatchToken {
  int32_t token;
  int32_t pos;
  int32_t seq_id;
  bool logits;                 // produce logits for this position
};

// Polled on the decoding thread between graph segments (layers) and, on the CPU, after
// every operation (node); return true to abort the decode.
using AbortCallback = bool (*)(void *user_data);

class Context {
public:
  static std::unique_ptr<Context> create(const Model &model, const ContextParams &params);
  ~Context();

  // Evaluate a batch. Throws InvalidArgument (bad token id, seq id, empty/too-large batch),
  // ContextFull (not enough free KV cells; nothing is evicted), Aborted, OutOfMemory,
  // NumericError (a requested row of logits holds NaN or infinity), DeviceError, Internal
  // (any other exception is mapped to OutOfMemory or Internal; nothing else escapes).
  // On failure the KV cache, the compiled plans and their arenas are as before the call (a
  // retry may succeed), and the logits are unavailable until a decode succeeds.
  void decode(const BatchToken *tokens, size_t n_tokens);

  // Logits of batch entry i of the last decode (negative i counts from the end of the
  // entries that asked for logits). Throws InvalidArgument if i asked for none, or when the
  // last decode failed ("the last decode failed: <its error>").
  const float *logits(int32_t i) const;
  // A decode request failed before reaching decode() (the C ABI's own checks): the logits
  // become unavailable as after a failed decode, with this reason.
  void invalidate_logits(const std::string &why);
  int32_t n_vocab() const;
  const ContextParams &params() const;
  const Model &model() const;

  // KV cache: positions [p0, p1) (p1 < 0: to the end; p0 < 0: from 0); seq < 0 = all sequences.
  void kv_clear();
  bool kv_seq_rm(int32_t seq, int32_t p0, int32_t p1);
  void kv_seq_cp(int32_t seq_src, int32_t seq_dst, int32_t p0, int32_t p1);
  void kv_seq_keep(int32_t seq);
  int32_t kv_seq_pos_max(int32_t seq) const;  // -1 when empty
  uint32_t kv_used_cells() const;

  void set_abort_callback(AbortCallback cb, void *user_data);
  // A flag that, once true, stops the decode like the abort callback, read by every CPU thread
  // (not only the decoding one); nullptr: none. Set only while no decode runs.
  void set_cancel_flag(const std::atomic<bool> *flag);
  // GPU: replay captured CUDA graphs (default) or launch eagerly; from the next decode on.
  void set_gpu_graphs(bool on);
  const MemoryReport &memory_report() const;

  // Whether a sticky device error made this context unusable (and why).
  bool unusable(std::string *why) const;

  struct Impl;
  Impl &impl() const { return *impl_; }

private:
  Context();
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe
