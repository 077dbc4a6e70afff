// Tensor plan of a synthetic model: names and shapes per architecture (llama.cpp naming),
// the type each tensor gets under a type mix (llama.cpp's quantization rules), and how its
// random values are drawn.
//
//   std::vector<PlannedTensor> t = plan_tensors(synth_preset("medium"), "q4_k_m", 151936);
//   t[0].info.name == "token_embd.weight";  t[0].init == SynthInit::Matrix;
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/synth/synth_model.h"
#include "model/synth/synth_preset.h"

namespace moe {

enum class SynthInit { Matrix, Norm, Bias, Uniform };

struct PlannedTensor {
  SynthTensorInfo info;
  SynthInit init = SynthInit::Matrix;
  float scale = 1.0f;  // Matrix/Bias: stddev; Norm: 1 + scale * N(0,1)
  float lo = 0.0f, hi = 0.0f;  // Uniform: U(lo, hi)
};

// n_vocab: rows of token_embd/output (the vocabulary's size, >= preset n_vocab).
std::vector<PlannedTensor> plan_tensors(const SynthPreset &p, const std::string &mix, uint32_t n_vocab);

// general.file_type (llama_ftype) of a mix; throws InvalidArgument for an unknown mix.
uint32_t mix_file_type(const std::string &mix);

}  // namespace moe
