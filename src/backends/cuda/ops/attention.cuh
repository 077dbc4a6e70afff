// Shared by the attention kernels (attention.cu: KV store, decode and per-token paths,
// combine; attention_tiled.cu: tiled prefill on f32 FMA; attention_mma.cu: tiled prefill
// on f16 tensor cores): the launch arguments, the reference mask rule, q rounded to the
// cache's dot type, and the split-cell partials layout.
#pragma once
#include <cuda_fp16.h>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/quant.cuh"

namespace moe {

struct AttnArgs {
  const uint8_t *kbase, *vbase;
  size_t krb, vrb, khb, vhb;  // row bytes and per-head bytes
  int hd_k, hd_v, group, kt;
  float scale;
  int window;           // sliding window (0 = off): hidden once pos - cell_pos >= window
  const float *sinks;   // per-head sink logits or null
};

// The reference mask: a cell is seen by a query (pos, sequence bit) when it is used, holds
// that sequence, is not in the future and is inside the sliding window.
__device__ __forceinline__ bool attn_visible(int cell_pos, unsigned long long cell_seq, unsigned long long seq_bit, int pos,
                                             int window) {
  return cell_pos >= 0 && (cell_seq & seq_bit) && cell_pos <= pos && (window <= 0 || pos - cell_pos < window);
}

// The cells [lo, hi) of [0, n_kv) outside which a token at pos (window 0 = off) sees no
// cell: where the ubatch's cells are in position order (DevUbatch::cell_pos_base B), a
// visible cell c has pos - window < c + B <= pos; otherwise all n_kv cells. Host data only.
struct CellSpan {
  int lo, hi;
};
__device__ __forceinline__ CellSpan attn_visible_span(const DevUbatch &ub, int n_kv, int pos, int window) {
  const int base = ub.cell_pos_base ? *ub.cell_pos_base : kNoCellPosBase;
  if (base == kNoCellPosBase) return {0, n_kv};
  const long long hi = static_cast<long long>(pos) - base + 1;
  const long long lo = window > 0 ? hi - window : 0;
  const int l = static_cast<int>(min(max(lo, 0ll), static_cast<long long>(n_kv)));
  return {l, static_cast<int>(min(max(hi, static_cast<long long>(l)), static_cast<long long>(n_kv)))};
}

// q in the cache's dot type, like the reference: f16 cache -> rounded to f16, Q8_0 cache ->
// quantized to Q8_0 and dequantized (f32 cache: unchanged). For Q8_0 the whole warp must
// call it with its lanes on the 32 elements of one block (lane l = element 32b + l).
__device__ __forceinline__ float attn_round_q(float v, int kt) {
  if (kt == static_cast<int>(DType::F16)) return __half2float(__float2half_rn(v));
  if (kt == static_cast<int>(DType::Q8_0)) {
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    return roundf(v * id) * __half2float(__float2half_rn(d));
  }
  return v;
}

// Element i of a cache row (K or V head) as f32.
__device__ __forceinline__ float attn_elem(const uint8_t *row, int i, int kt) {
  if (kt == static_cast<int>(DType::F32)) return reinterpret_cast<const float *>(row)[i];
  if (kt == static_cast<int>(DType::F16)) return __half2float(reinterpret_cast<const __half *>(row)[i]);
  const uint8_t *blk = row + (i / 32) * 34;
  return static_cast<int8_t>(blk[2 + (i % 32)]) * h2f(blk);
}

// Split-cell partials: for (token t, head h, split z) the running max, the sum and the
// unnormalised accumulators: part[((t * n_head + h) * n_split + z) * (hd_v + 2) + {0, 1, 2 + d}].
__device__ __forceinline__ float *attn_partial(float *part, int t, int h, int z, int n_head, int n_split, int hd_v) {
  return part + ((static_cast<int64_t>(t) * n_head + h) * n_split + z) * (hd_v + 2);
}

// Output row of (token t, head h).
__device__ __forceinline__ float *attn_out_row(const TView &out, int t, int h) {
  return reinterpret_cast<float *>(static_cast<uint8_t *>(out.data) + h * out.nb[1] + t * out.nb[2]);
}

// The cells [begin, end) of split z when n_kv cells are cut into n_split chunks that are
// multiples of the kernel's tile (so a tile never straddles two splits).
__device__ __forceinline__ void attn_split_range(int n_kv, int n_split, int z, int tile, int &begin, int &end) {
  const int per = (n_kv + n_split - 1) / n_split;
  const int chunk = (per + tile - 1) / tile * tile;
  begin = min(n_kv, z * chunk);
  end = min(n_kv, begin + chunk);
}

// Final scale of a row: the sink (one more logit with a zero value vector) folded into the
// running (max M, sum S); the output is acc * return value.
__device__ __forceinline__ float attn_final_scale(float M, float S, const float *sinks, int h) {
  float ms = 1.0f;
  if (sinks) {
    const float sk = sinks[h];
    if (sk > M) {
      ms = expf(M - sk);
      S = S * ms + 1.0f;
    } else {
      S += expf(sk - M);
    }
  }
  return S > 0.0f ? ms / S : 0.0f;
}

// Where a tiled kernel's finished row (token t, head h) goes: with partials, its split's slot
// (the lane that is `writer` also stores the running max M and sum S; factor 1), else the
// output row, with the final softmax factor (sinks folded in) returned in f.
__device__ __forceinline__ float *attn_row_dst(const TView &out, float *part, const float *sinks, int t, int h, int z,
                                               int n_head, int n_split, int hd_v, float M, float S, bool writer, float &f) {
  if (!part) {
    f = attn_final_scale(M, S, sinks, h);
    return attn_out_row(out, t, h);
  }
  f = 1.0f;
  float *dst = attn_partial(part, t, h, z, n_head, n_split, hd_v) + 2;
  if (writer) {
    dst[-2] = M;
    dst[-1] = S;
  }
  return dst;
}

// Merges the partials z < n_used (of n_split laid out) of (head h, token t) into the output
// row, the block's threads over the dims. Loads bypass L1: attn_split_kernel's last block
// reads partials that other blocks wrote in the same launch.
__device__ __forceinline__ void attn_combine_row(const TView &out, const AttnArgs &a, const float *part, int n_split, int h, int t, int n_head,
                                                 int n_used) {
  const float *src = attn_partial(const_cast<float *>(part), t, h, 0, n_head, n_split, a.hd_v);
  float M = -INFINITY;
  for (int z = 0; z < n_used; ++z) M = fmaxf(M, __ldcg(src + z * (a.hd_v + 2)));
  float S = 0.0f;
  for (int z = 0; z < n_used; ++z) {
    const float mz = __ldcg(src + z * (a.hd_v + 2));
    if (mz != -INFINITY) S += __ldcg(src + z * (a.hd_v + 2) + 1) * expf(mz - M);
  }
  const float f = attn_final_scale(M, S, a.sinks, h);
  float *o = attn_out_row(out, t, h);
  for (int d = threadIdx.x; d < a.hd_v; d += blockDim.x) {
    float v = 0.0f;
    for (int z = 0; z < n_used; ++z) {
      const float mz = __ldcg(src + z * (a.hd_v + 2));
      if (mz != -INFINITY) v += __ldcg(src + z * (a.hd_v + 2) + 2 + d) * expf(mz - M);
    }
    o[d] = v * f;
  }
}

// Tiled prefill (many query tokens): a block owns a tile of (token, head) rows of one KV
// head. part == nullptr: final output; else the split-cell partials (grid z = split).
struct AttnTiledLaunch {
  TView q, out;
  AttnArgs a;
  DevUbatch ub;
  int T, n_head_kv, n_split;
  float *part;
  cudaStream_t stream;
};
constexpr int kAttnTiledRowsFma = 32;  // rows per block, f32 FMA kernel (any cache type)
constexpr int kAttnTiledRowsMma = 64;  // rows per block, f16 tensor-core kernel (F16 cache)
void attn_tiled_fma_launch(const AttnTiledLaunch &l);
void attn_tiled_mma_launch(const AttnTiledLaunch &l);
void attn_combine_launch(const TView &out, const AttnArgs &a, const float *part, int T, int n_head, int n_split,
                         const LaunchStream &stream);

}  // namespace moe
