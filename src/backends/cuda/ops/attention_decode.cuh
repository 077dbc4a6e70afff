// Decode attention for a few query tokens with common head sizes (attention_decode.cu):
// one block per KV head reads each K/V row once for all the query heads of its group.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cuda/ops/attention.cuh"

namespace moe {

// Cell ranges per launch at most: the partials of attn_decode_work_size hold this many per
// (token, head), for both decode kernels.
constexpr int kAttnDecodeMaxRanges = 64;

// Cell ranges: n cells cut into chunks of at least min_chunk cells, at most max_ranges (<=
// kAttnDecodeMaxRanges) of them. Every range below n_used holds at least one cell (n == 0:
// range 0, empty).
struct DecodeRanges {
  int chunk, n_used;
};
__device__ __forceinline__ DecodeRanges decode_ranges(int n, int max_ranges, int min_chunk) {
  const int chunk = max(min_chunk, (n + max_ranges - 1) / max_ranges);
  return {chunk, max(1, (n + chunk - 1) / chunk)};
}

// The merge's first pass, one warp per (token t, head h) row: the (max, sum) headers of its
// n_used ranges give each range's weight w[z] (0 for a range that saw no cell) and the row's
// final scale (attn_final_scale), returned to every lane. Both decode kernels' last blocks.
// n_split: the partials' range stride (<= kAttnDecodeMaxRanges; the launch's grid.z).
template <int HD>
__device__ __forceinline__ float decode_range_weights(float *part, int t, int h, int n_used, int n_head, int n_split, const float *sinks,
                                                      float *w, int lane) {
  constexpr int kR = kAttnDecodeMaxRanges;
  float2 ms[kR / 32];  // (max, sum) of a range: one 8-byte load (HD + 2 is even)
  float M = -INFINITY;
#pragma unroll
  for (int i = 0; i < kR / 32; ++i) {
    const int z = lane + 32 * i;
    ms[i] = z < n_used ? __ldcg(reinterpret_cast<const float2 *>(attn_partial(part, t, h, z, n_head, n_split, HD))) : make_float2(-INFINITY, 0.0f);
    M = fmaxf(M, ms[i].x);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  float S = 0.0f;
#pragma unroll
  for (int i = 0; i < kR / 32; ++i) {
    const float wz = ms[i].x == -INFINITY ? 0.0f : expf(ms[i].x - M);
    if (wz != 0.0f) S += ms[i].y * wz;
    w[lane + 32 * i] = wz;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) S += __shfl_xor_sync(0xffffffffu, S, o);
  return attn_final_scale(M, S, sinks, h);
}

// True when the grouped decode kernel handles this call (few tokens, head size 64/128/256,
// separate V of the same size); then attn_decode_work_size bytes of scratch are needed.
bool attn_decode_applies(int64_t T, int64_t hd_k, int64_t hd_v, bool v_from_k);
size_t attn_decode_work_size(int64_t T, int64_t n_head, int64_t hd_v);
void attn_decode_launch(const LaunchStream &s, TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *work, const GpuTuning &tuning);

// Several sequences decoding one token each (DevUbatch::seq_cells set), up to
// kAttnDecodeSeqsMaxTokens tokens: their cells lie interleaved in the cache (a step appends
// one cell per sequence), so every 64-cell tile of the tiled prompt kernels holds a cell that
// some row of a tile can see and none is skipped. The grouped decode kernel walks each token's
// own cell list instead (its ranges cut the list, not the cache). It runs with at most
// as many cell ranges as the node's scratch holds partials for (the tiled path's planned
// scratch: T x heads x splits x (hd + 2) floats); false (nothing launched) where it does not
// apply (MLA's V from K: the caller's check) or not even one range fits.
constexpr int64_t kAttnDecodeSeqsMaxTokens = 64;
// Scratch planned for it where the prompt kernels plan less (5..7 tokens: none): kSeqsRanges
// ranges' partials (0 outside 5..64 tokens or the kernel's head sizes).
size_t attn_decode_seqs_work_size(int64_t T, int64_t n_head, int64_t hd_k, int64_t hd_v);
bool attn_decode_seqs_launch(const LaunchStream &s, TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *work, size_t work_size,
                             const GpuTuning &tuning);

// The tensor-core variant (attention_decode_tc.cu; GpuTuning::tc_decode_attention, sm_80 code):
// F16 cache with 16-byte aligned rows and heads, head size 128 / 256, up to 4 tokens. Same
// scratch (attn_decode_work_size), ranges, masks and merge as the grouped kernel.
bool attn_decode_tc_applies(int64_t T, int64_t hd_k, int64_t hd_v, bool v_from_k, const AttnArgs &a);
void attn_decode_tc_launch(const LaunchStream &s, TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *work, const GpuTuning &tuning);

}  // namespace moe
