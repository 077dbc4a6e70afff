// Shared between the attention kernels: the per-call cache geometry, and the decode path
// for a few query tokens with common head sizes (attention_decode.cu).
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cuda/cuda_ops.h"

namespace moe {

struct AttnArgs {
  const uint8_t *kbase, *vbase;
  size_t krb, vrb, khb, vhb;  // row bytes and per-head bytes
  int hd_k, hd_v, group, kt;
  float scale;
  int window;           // sliding window (0 = off): hidden once pos - cell_pos >= window
  const float *sinks;   // per-head sink logits or null
};

// True when the grouped decode kernel handles this call (few tokens, head size 64/128/256,
// separate V of the same size); then attn_decode_work_size bytes of scratch are needed.
bool attn_decode_applies(int64_t T, int64_t hd_k, int64_t hd_v, bool v_from_k);
size_t attn_decode_work_size(int64_t T, int64_t n_head, int64_t hd_v);
// part: per (token, head, range) the partial (max, sum, acc[hd_v]); folded with the sink.
void attn_combine_launch(cudaStream_t s, TView out, const AttnArgs &a, const float *part, int n_head, int T, int n_split);
void attn_decode_launch(cudaStream_t s, TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *work);

}  // namespace moe
