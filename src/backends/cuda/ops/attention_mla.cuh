// Attention for MLA (deepseek2 / GLM-4.7-Flash) on an F16 cache, any number of query tokens:
// one latent KV head whose K row is [latent 512 | rope 64] and whose V is the latent
// (attention_mla.cu). Every K row is read once per block for all the q heads.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cuda/ops/attention.cuh"

namespace moe {

// Work buffer bytes an MLA attention node of T query tokens may need (split-cell partials,
// sized for 132 SMs); 0 when the MLA prefill kernel does not apply to its shape.
size_t attn_mla_work_size(int64_t T, int64_t n_head, int64_t n_head_kv, int64_t hd_k, int64_t hd_v);

// Runs the MLA kernel (and the split combine) when the head dims, the cache type and layout
// and the shared memory per block (stream.smem_optin) allow; false (nothing launched) otherwise. The cell splits
// are lowered until their partials fit in work_size (no buffer: unsplit); a split takes at
// least split_cells cells (GpuTuning::mla_split_cells).
bool attn_mla_launch(const LaunchStream &stream, const TView &q, const TView &out, const AttnArgs &a, const DevUbatch &ub, int T,
                      int n_head_kv, bool v_from_k, float *work, size_t work_size, int n_sm, int split_cells);

}  // namespace moe
