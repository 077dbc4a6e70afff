// Synthetic models: GGUF files with random weights but the exact tensor names, shapes,
// metadata keys and tokenizer layout of real MoE models (benchmarks, tests, load checks).
//
//   SynthSpec s;  s.preset = "tiny";  s.type_mix = "q8_0";  s.seed = 7;
//   write_synthetic_model(s, "/tmp/tiny.gguf");                 // throws moe::Error
//   s.split_max_bytes = 1 << 20;  write_synthetic_model(s, "/tmp/tiny.gguf");  // tiny-00001-of-0000N.gguf ...
//   uint64_t bytes = synthetic_model_size(s);                  // dry run, writes nothing
//   for (auto &t : synthetic_model_plan(s)) ...                 // names, types, shapes
//
// Weights are deterministic per (seed, tensor name): normal * 1/sqrt(fan_in) for matrices,
// ~1 for norms, quantized row by row with the reference quantizers (every block valid).
// Tensors of 4M+ elements in "fast" mode are tiled from a pool of pre-quantized random
// blocks chosen by a hash of (row, block), which makes multi-GB files I/O-bound.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "quant/dtype.h"

namespace moe {

struct SynthSpec {
  std::string preset;              // see synthetic_presets()
  std::string type_mix = "f16";    // f32 f16 bf16 q8_0 q4_0 q4_k_m q5_k_m q6_k
  uint64_t seed = 1;
  std::string vocab_json;          // Hugging Face tokenizer.json; empty: synthetic vocab
  bool synthetic_vocab = true;     // used when vocab_json is empty
  bool fast = true;                // pool-of-blocks fill for big tensors (see above)
  uint64_t pool_min_elements = uint64_t(1) << 22;  // "big" for fast mode (tests lower it)
  int n_threads = 0;               // quantization threads; 0 = hardware concurrency
  uint32_t n_layer = 0;            // > 0: this many layers instead of the preset's (per-layer
                                   // profiles of a big shape without writing the whole file)
  uint64_t split_max_bytes = 0;    // > 0: write a split model, parts of at most this much tensor
                                   // data (GgufWriter::write_split; named from the path less ".gguf")
};

struct SynthTensorInfo {
  std::string name;
  DType type;
  std::vector<int64_t> ne;
  uint64_t nbytes;
  uint64_t n_elements() const;
};

std::vector<std::string> synthetic_presets();
bool is_synthetic_preset(const std::string &name);
std::vector<std::string> synthetic_type_mixes();

// Tensor list with the types the mix assigns (no weights generated).
std::vector<SynthTensorInfo> synthetic_model_plan(const SynthSpec &spec);

// progress(done_bytes, total_bytes); return false to cancel (throws Error(Aborted)).
// Returns the files written: `path`, or the parts of a split model (the first loads it).
std::vector<std::string> write_synthetic_model(const SynthSpec &spec, const std::string &path,
                                               const std::function<bool(uint64_t, uint64_t)> &progress = nullptr);
uint64_t synthetic_model_size(const SynthSpec &spec);  // exact file size, no writing
// Metadata keys the file will carry, in file order.
std::vector<std::string> synthetic_model_keys(const SynthSpec &spec);

}  // namespace moe
