// Decode attention for a few query tokens with common head sizes (attention_decode.cu):
// one block per KV head reads each K/V row once for all the query heads of its group.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cuda/ops/attention.cuh"

namespace moe {

// True when the grouped decode kernel handles this call (few tokens, head size 64/128/256,
// separate V of the same size); then attn_decode_work_size bytes of scratch are needed.
bool attn_decode_applies(int64_t T, int64_t hd_k, int64_t hd_v, bool v_from_k);
size_t attn_decode_work_size(int64_t T, int64_t n_head, int64_t hd_v);
void attn_decode_launch(const LaunchStream &s, TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *work, const GpuTuning &tuning);

}  // namespace moe
