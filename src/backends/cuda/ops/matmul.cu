// MatMul and MatMulId (MoE) on CUDA. Activations are first rounded through the weight
// type's activation format exactly as the CPU reference does (Q8_0 / Q8_K / F16 / BF16),
// into f32 scratch. Then one kernel computes every (row, column tile): a warp owns a
// weight row, dequantizes 32-weight sub-blocks straight from the GGUF blocks in device
// memory and dots them with up to NT activation columns, so each weight byte is read once
// per tile. For MatMulId the routing (count per expert, scan, tiles of <= NT tokens per
// expert) is computed on the device; all active experts run in the same launch and the
// host never learns which experts were chosen.
#include "backends/cuda/cuda_ops.h"
#include "backends/backend.h"
#include "backends/cuda/cuda_blas.h"
#include "backends/cuda/ops/act_round_warp.cuh"
#include "backends/cuda/ops/kernel_error.cuh"
#include "backends/cuda/ops/matmul_blas.h"
#include "backends/cuda/ops/matmul_f32.h"
#include "backends/cuda/ops/matmul_heads.h"
#include "backends/cuda/ops/matmul_mma.h"
#include "backends/cuda/ops/matmul_ref_order.h"
#include "backends/cuda/ops/matmul_route.h"
#include "backends/cuda/ops/matvec.h"
#include "backends/cuda/ops/matvec_cols.h"
#include "backends/cuda/ops/mma_common.cuh"
#include "backends/cuda/ops/matvec_ref_order.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/quant.cuh"

#include <algorithm>

namespace moe {

namespace {

constexpr int kWarps = 4;  // weight rows per block

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- activation rounding -------------------------------------------------------------

// One block of 256 threads per (row, 256-element chunk). vdt: the weight's vec_dot_type other
// than Q8_K (act_round_q8k_kernel below takes that one).
// q_out == nullptr: the rounded values into out[r * K + i] (f32, or f16 with out_f16). Otherwise (Q8_0, the MMQ
// path) each value as int8 * block scale c: the integer into q_out[r * K + i] (int8_t if
// q_int8, else f16 bits as uint16_t) and, per 16 elements, (c, their integer sum) into
// s_out[r * K / 16 + i / 16]. Launched with launch_pdl; it reads and writes only after
// pdl_wait, and lets the product that follows be scheduled (its weight prefetch overlaps).
__global__ void act_round_kernel(TView x, int64_t K, int vdt, void *out, bool out_f16, void *q_out, bool q_int8, float2 *s_out) {
  pdl_wait();
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * 256 + threadIdx.x;
  const int64_t i1 = r % x.ne[1], i2 = (r / x.ne[1]) % x.ne[2], i3 = r / (x.ne[1] * x.ne[2]);
  const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + i1 * x.nb[1] + i2 * x.nb[2] + i3 * x.nb[3]);
  const bool in = i < K;
  const float v = in ? src[i] : 0.0f;
  float y = v;
  float qv = 0.0f, c = 0.0f;  // y = qv * c for the Q8 formats
  if (vdt == static_cast<int>(DType::F16)) {
    y = __half2float(__float2half_rn(v));
  } else if (vdt == static_cast<int>(DType::BF16)) {
    y = __bfloat162float(__float2bfloat16_rn(v));
  } else if (vdt == static_cast<int>(DType::Q8_0)) {
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float dh = __half2float(__float2half_rn(d));
    qv = roundf(v * id);
    c = dh;
    y = qv * dh;
  }
  if (q_out == nullptr) {
    if (in && out_f16) static_cast<__half *>(out)[r * K + i] = __float2half_rn(y);
    else if (in) static_cast<float *>(out)[r * K + i] = y;
    return;
  }
  // 16 consecutive threads (aligned in the warp) hold a group; K is a multiple of 32.
  float sum = qv;
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (!in) return;
  if (q_int8)
    static_cast<int8_t *>(q_out)[r * K + i] = static_cast<int8_t>(__float2int_rn(qv));  // |qv| <= 127
  else
    static_cast<uint16_t *>(q_out)[r * K + i] = __half_as_ushort(__float2half_rn(qv));
  if ((i & 15) == 0) s_out[r * (K / 16) + i / 16] = make_float2(c, sum);
}

// Q8_K (K % 256 == 0, as every K-quant row is): the outputs act_round_kernel describes, a warp
// per 256-element block and 4 blocks per launch block. Why: act_round_kernel's Q8_K branch (256
// threads per block, a barrier and a second load of the largest value) took 17.7 us per launch
// on the prompt products' inputs (2026-11-30, pp512) for a few MB of traffic; this takes 4.8.
constexpr int kRoundWarps = 4;
__global__ void __launch_bounds__(kRoundWarps * 32) act_round_q8k_kernel(TView x, int K, int64_t units, void *out, bool out_f16,
                                                                         void *q_out, bool q_int8, float2 *s_out) {
  pdl_wait();
  pdl_trigger();
  const int64_t u = static_cast<int64_t>(blockIdx.x) * kRoundWarps + (threadIdx.x >> 5);
  if (u >= units) return;  // whole warps
  const int lane = threadIdx.x & 31, nb = K / 256;
  const int64_t r = u / nb;
  const int i0 = static_cast<int>(u % nb) * 256 + lane * 8;
  const int64_t i1 = r % x.ne[1], i2 = (r / x.ne[1]) % x.ne[2], i3 = r / (x.ne[1] * x.ne[2]);
  const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + i1 * x.nb[1] + i2 * x.nb[2] + i3 * x.nb[3]);
  float v[8];
  load8_floats(src, i0, true, v);
  int q[8];
  const float c = q8k_round_warp(v, q);
  if (q_out == nullptr && out_f16) {
    uint32_t h[4];
#pragma unroll
    for (int l = 0; l < 4; ++l) h[l] = mma_tile::pack2<false>(q[2 * l] * c, q[2 * l + 1] * c);
    *reinterpret_cast<uint4 *>(static_cast<__half *>(out) + r * K + i0) = make_uint4(h[0], h[1], h[2], h[3]);
    return;
  }
  if (q_out == nullptr) {
    float4 *o = reinterpret_cast<float4 *>(static_cast<float *>(out) + r * K + i0);
    o[0] = make_float4(q[0] * c, q[1] * c, q[2] * c, q[3] * c);
    o[1] = make_float4(q[4] * c, q[5] * c, q[6] * c, q[7] * c);
    return;
  }
  const int half = half_block_sum(q);
  if (q_int8) {
    *reinterpret_cast<uint2 *>(static_cast<int8_t *>(q_out) + r * K + i0) = pack_int8x8(q);
  } else {
    uint32_t h[4];
#pragma unroll
    for (int l = 0; l < 4; ++l)
      h[l] = __half_as_ushort(__int2half_rn(q[2 * l])) | (static_cast<uint32_t>(__half_as_ushort(__int2half_rn(q[2 * l + 1]))) << 16);
    *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(q_out) + r * K + i0) = make_uint4(h[0], h[1], h[2], h[3]);
  }
  if ((lane & 1) == 0) s_out[r * (K / 16) + i0 / 16] = make_float2(c, static_cast<float>(half));
}

// ---- routing -------------------------------------------------------------------------

struct RouteTables {
  int2 *entries;  // (activation row, output row), grouped by expert
  int4 *tiles;    // (expert, first entry, count, 0); count 0 = idle block
};

// route_kernel: one block of kRouteThreads threads (>= E, checked by placement), thread e owns
// expert slot e in the scans. Entry i = t n_used + j of ids is (token t, slot j): a thread keeps
// one slot and steps over tokens (tokens_per_round = kRouteThreads / n_used per round, kRouteIds
// rounds' loads in flight together), so no entry needs a division. Why this shape: the 2026-11-30
// profile of the previous kernel (11.4 us at pp512) counted 1,750 dependent instructions per
// warp, most of them a 9-round Hillis-Steele scan over 512 slots (two barriers a round) and two
// divisions per entry; the scans are now warp shuffles plus one pass over 16 warp totals.
constexpr int kRouteThreads = kCudaMaxExperts, kRouteWarps = kRouteThreads / 32;
constexpr int kRouteIds = 8;

struct RouteSlot {
  bool active;  // this thread reads ids (threads past tokens_per_round * n_used do not)
  int j, t0, step;
};
__device__ __forceinline__ RouteSlot route_slot(int n_used) {
  const int tpr = kRouteThreads / n_used, tid = static_cast<int>(threadIdx.x);
  return {tid < tpr * n_used, tid % n_used, tid / n_used, tpr};
}

// The expert ids of this thread's kRouteIds tokens from token tb on (token tb + t0 + u step).
__device__ __forceinline__ void load_route_ids(const int32_t *ids, int64_t ids_nb1, int T, int tb, const RouteSlot &sl, int (&e)[kRouteIds]) {
#pragma unroll
  for (int u = 0; u < kRouteIds; ++u) {
    const int t = tb + sl.t0 + u * sl.step;
    e[u] = sl.active && t < T ? ids[t * ids_nb1 + sl.j] : 0;
  }
}

// f(t, e) for each of this thread's entries (token t, expert id e as read, possibly invalid),
// a round of kRouteIds loads in flight at a time.
template <typename F>
__device__ __forceinline__ void for_route_ids(const int32_t *ids, int64_t ids_nb1, int T, const RouteSlot &sl, F &&f) {
  for (int tb = 0; tb < T; tb += sl.step * kRouteIds) {
    int ev[kRouteIds];
    load_route_ids(ids, ids_nb1, T, tb, sl, ev);
#pragma unroll
    for (int u = 0; u < kRouteIds; ++u) {
      const int t = tb + sl.t0 + u * sl.step;
      if (!sl.active || t >= T) break;
      f(t, ev[u]);
    }
  }
}

// Inclusive sums over the block's threads of (a, b), each thread holding one pair; also the
// block totals. Two barriers.
__device__ __forceinline__ void route_block_scan(int &a, int &b, int &total_b, int (*s_w)[kRouteWarps]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int ua = __shfl_up_sync(0xffffffffu, a, o), ub = __shfl_up_sync(0xffffffffu, b, o);
    if (lane >= o) {
      a += ua;
      b += ub;
    }
  }
  if (lane == 31) {
    s_w[0][warp] = a;
    s_w[1][warp] = b;
  }
  __syncthreads();
  total_b = 0;
#pragma unroll
  for (int w = 0; w < kRouteWarps; ++w) {
    if (w < warp) {
      a += s_w[0][w];
      b += s_w[1][w];
    }
    total_b += s_w[1][w];
  }
  __syncthreads();  // s_w may be reused
}

__global__ void __launch_bounds__(kRouteThreads) route_kernel(const int32_t *ids, int64_t ids_nb1, int n_used, int T, int E, int X, int NT,
                                                              RouteTables rt, int max_tiles, unsigned *err) {
  __shared__ int s_cnt[kRouteThreads];  // counts, then scatter cursors
  __shared__ int s_w[2][kRouteWarps];
  const int tid = threadIdx.x;
  s_cnt[tid] = 0;
  const RouteSlot sl = route_slot(n_used);
  __syncthreads();
  for_route_ids(ids, ids_nb1, T, sl, [&](int, int e) {
    if (e >= 0 && e < E) atomicAdd(&s_cnt[e], 1);
    else report_bad_index(err, kKernelErrExpertId, e, E);  // left out of every tile
  });
  __syncthreads();
  const int c = s_cnt[tid], nt = (c + NT - 1) / NT;  // 0 past E
  int first = c, tile = nt, n_tiles;
  route_block_scan(first, tile, n_tiles, s_w);
  first -= c;  // exclusive: expert tid's first entry and tile
  tile -= nt;
  for (int k = 0; k < c; k += NT) rt.tiles[tile++] = make_int4(tid, first + k, min(NT, c - k), 0);
  for (int i = n_tiles + tid; i < max_tiles; i += kRouteThreads) rt.tiles[i] = make_int4(0, 0, 0, 0);
  s_cnt[tid] = first;  // expert tid's scatter cursor (only this thread read its count)
  __syncthreads();
  for_route_ids(ids, ids_nb1, T, sl, [&](int t, int e) {
    if (e < 0 || e >= E) return;
    const int p = atomicAdd(&s_cnt[e], 1);
    rt.entries[p] = make_int2(X == 1 ? t : t * X + sl.j, t * n_used + sl.j);
  });
}

// ---- the product ---------------------------------------------------------------------

template <DType T, int NT>
__global__ void __launch_bounds__(kWarps * 32) mmv_kernel(const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                                                          const float *X, float *Y, int ncols, const int4 *tiles, const int2 *entries) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  int expert = 0, first = blockIdx.y * NT, cnt;
  if (tiles) {
    const int4 tl = tiles[blockIdx.y];
    expert = tl.x;
    first = tl.y;
    cnt = tl.z;
  } else {
    cnt = min(NT, ncols - first);
  }
  if (cnt <= 0 || row >= M) return;
  const float *xp[NT];
  float *yp[NT];
#pragma unroll
  for (int k = 0; k < NT; ++k) {
    const int kk = k < cnt ? k : 0;
    const int2 e = entries ? entries[first + kk] : make_int2(first + kk, first + kk);
    xp[k] = X + static_cast<int64_t>(e.x) * K;
    yp[k] = Y + static_cast<int64_t>(e.y) * M + row;
  }
  const uint8_t *wrow = W + expert * expert_bytes + static_cast<int64_t>(row) * row_bytes;
  float acc[NT];
#pragma unroll
  for (int k = 0; k < NT; ++k) acc[k] = 0.0f;
  if constexpr (is_plain(T)) {
    for (int i = lane; i < K; i += 32) {
      const float w = plain_at<T>(wrow, i);
#pragma unroll
      for (int k = 0; k < NT; ++k) acc[k] += w * __ldg(xp[k] + i);
    }
  } else {
    const int n_sub = K / 32;
    for (int s = lane; s < n_sub; s += 32) {
      float w[32];
      dequant32<T>(wrow, s, w);
#pragma unroll
      for (int k = 0; k < NT; ++k) {
        if (k >= cnt) break;
        const float4 *x4 = reinterpret_cast<const float4 *>(xp[k] + s * 32);
        float a = 0.0f;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const float4 xv = __ldg(x4 + q);
          a += w[4 * q] * xv.x + w[4 * q + 1] * xv.y + w[4 * q + 2] * xv.z + w[4 * q + 3] * xv.w;
        }
        acc[k] += a;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < NT; ++k) {
    const float v = warp_sum(acc[k]);
    if (lane == 0 && k < cnt) *yp[k] = v;
  }
}

// ---- single column (decode): activation rounding fused, experts read from ids -------

constexpr DType vdt_of(DType t) {
  return t == DType::Q4_0 || t == DType::Q8_0 || t == DType::MXFP4 ? DType::Q8_0
         : is_plain(t)                                          ? t
                                                                : DType::Q8_K;
}

// Rounds the 32 activations of sub-block s held by this lane like act_round_kernel.
// Q8_K blocks span 8 consecutive lanes; every lane of the warp must call this.
template <DType V> __device__ __forceinline__ void round_act32(float *xv, int s) {
  if constexpr (V == DType::Q8_0) {
    float amax = 0.0f;
#pragma unroll
    for (int l = 0; l < 32; ++l) amax = fmaxf(amax, fabsf(xv[l]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float dh = __half2float(__float2half_rn(d));
#pragma unroll
    for (int l = 0; l < 32; ++l) xv[l] = roundf(xv[l] * id) * dh;
  } else if constexpr (V == DType::Q8_K) {
    float a = 0.0f, v = 0.0f;
    int idx = 1 << 30;
#pragma unroll
    for (int l = 0; l < 32; ++l)
      if (fabsf(xv[l]) > a) { a = fabsf(xv[l]); v = xv[l]; idx = (s & 7) * 32 + l; }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
      const float oa = __shfl_xor_sync(0xffffffffu, a, o), ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (oa > a || (oa == a && oi < idx)) { a = oa; v = ov; idx = oi; }
    }
    if (a == 0.0f) {
#pragma unroll
      for (int l = 0; l < 32; ++l) xv[l] = 0.0f;
    } else {
      const float iscale = -127.0f / v, d = 1.0f / iscale;
#pragma unroll
      for (int l = 0; l < 32; ++l) {
        int q = __float2int_rn(iscale * xv[l]);
        xv[l] = (q < 127 ? q : 127) * d;
      }
    }
  }
}

// One weight row against one activation column (rounded on the fly); lane partial sum.
// Every lane of the warp must call it (Q8_K rounding shuffles across 8 lanes).
// kRound = false: x was already rounded by act_round_kernel (then the weight and x loads
// are independent; measured faster for decode than rounding in the mat-vec).
// The row may be shared by `width` lanes (a power of two; >= 8 for quantized types, whose
// Q8_K rounding pairs lanes xor 1, 2, 4; 32 for plain types), `sub` = this lane's index among
// them: sub-blocks (elements) sub, sub + width, ... All lanes run the same trip count.
template <DType T, bool kRound>
__device__ __forceinline__ float row_dot1(const uint8_t *wrow, const float *x, int K, int sub, int width = 32) {
  float acc = 0.0f;
  if constexpr (is_plain(T)) {
    for (int i = sub; i < K; i += width) {
      float xv = __ldg(x + i);
      if constexpr (kRound && T == DType::F16) xv = __half2float(__float2half_rn(xv));
      if constexpr (kRound && T == DType::BF16) xv = __bfloat162float(__float2bfloat16_rn(xv));
      acc += plain_at<T>(wrow, i) * xv;
    }
  } else {
    const int n_sub = K / 32;
    for (int base = 0; base < n_sub; base += width) {
      const int s = base + sub;
      const bool act = s < n_sub;
      float xv[32];
      const float4 *x4 = reinterpret_cast<const float4 *>(x + (act ? s : 0) * 32);
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const float4 t = act ? __ldg(x4 + q) : make_float4(0.f, 0.f, 0.f, 0.f);
        xv[4 * q] = t.x; xv[4 * q + 1] = t.y; xv[4 * q + 2] = t.z; xv[4 * q + 3] = t.w;
      }
      if constexpr (kRound) round_act32<vdt_of(T)>(xv, s);
      if (act) {
        float w[32];
        dequant32<T>(wrow, s, w);
        float a = 0.0f;
#pragma unroll
        for (int l = 0; l < 32; ++l) a += w[l] * xv[l];
        acc += a;
      }
    }
  }
  return acc;
}

template <DType T, bool kRound>
__global__ void __launch_bounds__(kWarps * 32) mmv1_kernel(const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                                                           const uint8_t *xb, int64_t x_row_bytes, int X, float *Y, const int32_t *ids,
                                                           int E, unsigned *err) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int j = blockIdx.y;
  int expert = 0;
  if (ids) {
    expert = ids[j];
    if (expert < 0 || expert >= E) {  // nothing to compute; the output rows keep what they held
      if (blockIdx.x == 0 && threadIdx.x == 0) report_bad_index(err, kKernelErrExpertId, expert, E);
      return;
    }
  }
  if (row >= M) return;
  const float *x = reinterpret_cast<const float *>(xb + (X == 1 ? 0 : j) * x_row_bytes);
  const uint8_t *wrow = W + expert * expert_bytes + static_cast<int64_t>(row) * row_bytes;
  float acc = row_dot1<T, kRound>(wrow, x, K, lane);
  acc = warp_sum(acc);
  if (lane == 0) Y[static_cast<int64_t>(j) * M + row] = acc;
}

// MatMulHeads at few tokens: out[:, h, t] = W_h x[:, h, t]; grid (row tiles, H, T). A row
// takes `width` lanes (heads_row_width: short rows such as GLM's k_b, K 192 = 6 sub-blocks,
// would leave most of a warp idle), so a warp computes 32 / width rows of one head.
// Launched with PDL: the warp's weight rows go to L2 before pdl_wait. With a tail (the Concat
// after MLA's k_b product, cuda_fusion.h: HeadsConcat) d is the Concat's output, whose rows
// hold M more values than the product writes: block (0, h, t) copies row (h, t) of tail there.
template <DType T>
__global__ void __launch_bounds__(kWarps * 32) mmv_heads_kernel(const uint8_t *W, int64_t row_bytes, int64_t head_bytes, int K, int M,
                                                                int width, TView x, TView d, TView tail) {
  const int lane = threadIdx.x & 31, sub = lane & (width - 1);
  const int row0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * (32 / width);  // the warp's first row
  const int row = row0 + lane / width;
  const int64_t h = blockIdx.y, t = blockIdx.z;
  // Lanes of rows past M compute row M - 1 again (every lane joins the shuffles) and store nothing.
  const int64_t wr = row < M ? row : M - 1;
  const uint8_t *wrow = W + h * head_bytes + wr * row_bytes;
  if (row0 < M)
    for (int64_t o = static_cast<int64_t>(sub) * 128; o < row_bytes; o += static_cast<int64_t>(width) * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(wrow + o));
  pdl_wait();  // x and d: activations
  pdl_trigger();
  uint8_t *drow = static_cast<uint8_t *>(d.data) + h * d.nb[1] + t * d.nb[2];
  if (tail.data && blockIdx.x == 0) {
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(tail.data) + h * tail.nb[1] + t * tail.nb[2]);
    for (int64_t i = threadIdx.x; i < tail.ne[0]; i += blockDim.x) reinterpret_cast<float *>(drow)[M + i] = src[i];
  }
  if (row0 >= M) return;  // warp-uniform
  const float *xr = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + h * x.nb[1] + t * x.nb[2]);
  float acc = row_dot1<T, true>(wrow, xr, K, sub, width);
  for (int o = width >> 1; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (sub == 0 && row < M) reinterpret_cast<float *>(drow)[row] = acc;
}

// Lanes per row of mmv_heads_kernel: the sub-blocks of a row rounded up to a power of two,
// at least 8 (the Q8_K rounding's lane groups); plain types 32.
int heads_row_width(DType t, int64_t K) {
  if (is_plain(t)) return 32;
  const int64_t n_sub = K / 32;
  int w = 8;
  while (w < 32 && w < n_sub) w *= 2;
  return w;
}

void launch_mmv1(DType t, dim3 grid, cudaStream_t s, const uint8_t *W, int64_t rb, int64_t eb, int K, int M, const uint8_t *xb,
                 int64_t xrb, int X, float *Y, const int32_t *ids, int E, unsigned *err) {
  const dim3 block(kWarps * 32);
#define MOE_MMV1_CASE(TY) \
  case TY: mmv1_kernel<TY, false><<<grid, block, 0, s>>>(W, rb, eb, K, M, xb, xrb, X, Y, ids, E, err); break;
  switch (t) {
    MOE_MMV1_CASE(DType::F32)
    MOE_MMV1_CASE(DType::F16)
    MOE_MMV1_CASE(DType::BF16)
    MOE_MMV1_CASE(DType::Q4_0)
    MOE_MMV1_CASE(DType::Q8_0)
    MOE_MMV1_CASE(DType::MXFP4)
    MOE_MMV1_CASE(DType::Q2_K)
    MOE_MMV1_CASE(DType::Q3_K)
    MOE_MMV1_CASE(DType::Q4_K)
    MOE_MMV1_CASE(DType::Q5_K)
    MOE_MMV1_CASE(DType::Q6_K)
    default: fail(Status::Internal, "CUDA matmul: type %s not dispatched", dtype_name(t));
  }
#undef MOE_MMV1_CASE
  MOE_CUDA_LAUNCH_CHECK("mmv1_kernel");
}

template <int NT>
void launch_mmv(DType t, dim3 grid, cudaStream_t s, const uint8_t *W, int64_t rb, int64_t eb, int K, int M, const float *X, float *Y,
                int ncols, const int4 *tiles, const int2 *entries) {
  const dim3 block(kWarps * 32);
#define MOE_MMV_CASE(TY) \
  case TY: mmv_kernel<TY, NT><<<grid, block, 0, s>>>(W, rb, eb, K, M, X, Y, ncols, tiles, entries); break;
  switch (t) {
    MOE_MMV_CASE(DType::F32)
    MOE_MMV_CASE(DType::F16)
    MOE_MMV_CASE(DType::BF16)
    MOE_MMV_CASE(DType::Q4_0)
    MOE_MMV_CASE(DType::Q8_0)
    MOE_MMV_CASE(DType::MXFP4)
    MOE_MMV_CASE(DType::Q2_K)
    MOE_MMV_CASE(DType::Q3_K)
    MOE_MMV_CASE(DType::Q4_K)
    MOE_MMV_CASE(DType::Q5_K)
    MOE_MMV_CASE(DType::Q6_K)
    default: fail(Status::Internal, "CUDA matmul: type %s not dispatched", dtype_name(t));
  }
#undef MOE_MMV_CASE
  MOE_CUDA_LAUNCH_CHECK("mmv_kernel");
}

constexpr int kTile = 8;  // columns per tile of mmv_kernel (the tensor-core path tiles by kMmaCols)
static_assert(kTile == kMcolCols, "the multi-column mat-vec takes the route tiles of kTile entries");

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

struct MatmulShape {
  int64_t K, M, E, rows;  // rows: activation rows to round
  int n_used, T, X, NT, max_tiles;
  bool mma;  // tensor-core kernel (matmul_mma.cu); NT is then its column tile
  bool mmq;  // ... its exact-product variant for quantized weights (matmul_mmq.cu)
  bool mmq_i8;  // ... on int8 tensor cores (matmul_mmq_i8.cu): int8 activation integers
  bool sgemm;   // F32 weights, dense, many columns (routers at T > 1): matmul_f32.cu
  bool ref;     // Q4_K / Q5_K / Q6_K / Q8_0 on the f32 tile kernel's shapes: matmul_ref_order.cu
                // instead (the CPU's float order; int8 activations like the int8 MMQ)
  bool ref_f32; // dense F32 on those shapes: matmul_ref_order.cu too (f32 activations)
  bool blas;    // dense quantized, many columns: f16 dequantization + cuBLAS (matmul_blas.h) when
                // the executor has a handle, else the int8 MMQ above
  bool mcol;    // 2..15 dense columns / MatMulId under the GEMM's entries (mcol_entries) where the graph does
                // not ask for the CPU's order: the multi-column mat-vec (matvec_cols.cu)
  bool plain;   // F32 / F16 / BF16 weights (mcol: activations read in place, no rounding scratch)
};

// GpuTuning::blas_min_tokens; weights above kBlasMaxWeightBytes as f16 (an LM head asked for
// every position's logits) stay on the MMQ rather than take that much scratch.
constexpr int64_t kBlasMaxWeightBytes = 64ll << 20;

bool tensor_core_type(DType t) { return cuda_mma_type_supported(t) || cuda_mmq_type_supported(t); }

// MatMulId over E experts: routed entries from which the tensor-core GEMM takes over from the
// few-column kernel (GpuTuning::mcol_max_entries where that kernel runs on the tensor cores too).
static int64_t mcol_entries(DType t, int64_t E, const GpuTuning &tuning, const CudaPaths &paths) {
  const bool tc = (t == DType::Q4_K && tuning.mcol_tensor_cores) || (t == DType::Q6_K && tuning.mcol_tensor_cores_q6k);
  if (!tc || !paths.tensor_cores) return kMmaMinEntries;
  return std::max<int64_t>(kMmaMinEntries, tuning.mcol_max_entries > 0 ? tuning.mcol_max_entries : kMcolCols * E);
}

// The kernel choice for n under tuning on a device taking `paths`: the planner sizes the
// scratch from it and the launch follows it, so both must get the same tuning and paths.
// Where the device has no tensor-core GEMM for the type (sm_75 code; an int8 MMQ needing more
// shared memory than it grants), the batches the GEMMs would take go to the f32 tile kernels,
// dense quantized ones of tuning.blas_min_tokens columns still to cuBLAS.
MatmulShape shape_of(const Graph &g, const Node &n, const GpuTuning &tuning, const CudaPaths &paths) {
  const Node &w = g.node(n.src[0]), &x = g.node(n.src[1]);
  MatmulShape s{};
  bool tc_batch = false;  // a dense batch the tensor-core GEMMs take where the device has them
  int64_t gemm_entries = kMmaMinEntries;  // MatMulId: routed entries from which the GEMM runs
  s.K = w.ne[0];
  s.M = w.ne[1];
  // A final output (the LM head) takes CUDA's own order: the paths of the other types.
  const bool own = cuda_own_order_product(n, tuning);
  const bool ref_type = ref_order_dtype(w.type) && !own, ref_f32 = w.type == DType::F32 && !own;
  if (n.op == Op::MatMul) {
    s.E = 1;
    s.rows = x.ne[1] * x.ne[2] * x.ne[3];
    // The reference-order types and F32 keep the CPU's order up to kRefOrderMaxTokens columns.
    const int64_t keep = ref_type || ref_f32 ? cuda_ref_order_tokens(g, tuning) : 0;
    const int64_t tc_min = std::max<int64_t>(kMmaMinCols, keep + 1);
    tc_batch = s.rows >= tc_min && tensor_core_type(w.type);
    s.mma = tc_batch && cuda_tensor_core_gemm(w.type, paths);
    s.NT = s.rows == 1 ? 1 : s.mma ? kMmaCols : kTile;
    s.sgemm = w.type == DType::F32 && s.rows >= tc_min;
  } else {
    const Node &ids = g.node(n.src[2]);
    s.E = w.ne[2];
    s.n_used = static_cast<int>(ids.ne[0]);
    s.T = static_cast<int>(ids.ne[1]);
    s.X = static_cast<int>(x.ne[1]);
    s.rows = static_cast<int64_t>(s.X) * s.T;
    const int n = s.n_used * s.T;
    const bool keep_order = ref_type && s.T <= cuda_ref_order_tokens(g, tuning);
    gemm_entries = mcol_entries(w.type, s.E, tuning, paths);
    s.mma = s.T > 1 && n >= gemm_entries && !keep_order && cuda_tensor_core_gemm(w.type, paths);
    s.NT = s.T == 1 ? 1 : s.mma ? kMmaCols : kTile;
    s.max_tiles = (n + s.NT - 1) / s.NT + static_cast<int>(s.E < n ? s.E : n);
  }
  s.mmq = s.mma && cuda_mmq_type_supported(w.type);
  s.mmq_i8 = s.mmq && cuda_mmq_int8_type(w.type);
  s.plain = is_plain(w.type);
  // The few-column window (dense 2..15 columns, MatMulId 2+ tokens under kMmaMinEntries) of a
  // graph that does not ask for the CPU's order: the multi-column mat-vec, for every type it
  // takes (quantized weights from a padded weight tensor: its loads cover 16-byte pieces).
  // cpu_float_order graphs keep the paths below unchanged.
  const bool few = n.op == Op::MatMul ? s.rows >= 2 && s.rows < kMmaMinCols : s.T >= 2 && s.n_used * s.T < gemm_entries;
  s.mcol = few && !s.mma && !s.sgemm && cuda_ref_order_tokens(g, tuning) == 0 && cuda_mcol_type(w.type) && s.K > 0 &&
           (s.plain || cuda_weight_backed(g, w));
  s.ref = !s.mma && !s.mcol && s.NT > 1 && ref_type;
  s.ref_f32 = n.op == Op::MatMul && !s.mma && !s.sgemm && !s.mcol && s.NT > 1 && ref_f32;
  const int blas_min = tuning.blas_min_tokens;
  s.blas = n.op == Op::MatMul && tc_batch && cuda_mmq_type_supported(w.type) && blas_min > 0 && s.rows >= blas_min && s.M * s.K * 2 <= kBlasMaxWeightBytes;
  return s;
}

// Scratch of the rounded activations: f32 values, or for MMQ int8 / f16 integers then per-16
// scales.
// int8 integers (int8 MMQ, reference order) or f16 ones.
// The multi-column mat-vec takes int8 integers of quantized types and none of plain ones.
bool int8_acts(const MatmulShape &s) { return s.mmq_i8 || s.ref || s.mcol; }
bool int_acts(const MatmulShape &s) { return s.mmq || s.ref || (s.mcol && !s.plain); }
size_t mmq_ints_bytes(const MatmulShape &s) { return align256(static_cast<size_t>(s.K * s.rows) * (int8_acts(s) ? 1 : 2)); }
size_t act_scratch_bytes(const MatmulShape &s) {
  if (s.mcol && s.plain) return 0;
  if (int_acts(s)) return mmq_ints_bytes(s) + align256(static_cast<size_t>(s.K / 16 * s.rows) * sizeof(float2));
  return align256(static_cast<size_t>(s.K * s.rows) * 4);
}

// Dense int8 MMQ with few blocks splits K (launch_mmq_i8_matmul); the partial results follow
// the activation scratch. The work buffer is planned for an H200's SMs; fewer splits fit
// any device.
constexpr int kPlannedSms = 132;
// The cuBLAS path's scratch: the f16 weights, then the f16 activations.
size_t blas_w_bytes(const MatmulShape &s) { return align256(static_cast<size_t>(s.M * s.K) * 2); }
size_t blas_scratch_bytes(const MatmulShape &s) { return blas_w_bytes(s) + align256(static_cast<size_t>(s.rows * s.K) * 2); }

size_t split_part_bytes(const MatmulShape &s, int splits) {
  return splits > 1 ? align256(static_cast<size_t>(splits) * static_cast<size_t>(s.rows * s.M) * 4) : 0;
}
int dense_k_splits(const MatmulShape &s, int n_sm) {
  if (s.sgemm) return sgemm_f32_splits(s.K, s.M, s.rows, n_sm);
  return s.mmq_i8 && s.E == 1 ? mmq_i8_k_splits(s.K, s.M, s.rows, n_sm) : 1;
}

}  // namespace

void cuda_launch_route(cudaStream_t s, const int32_t *ids, int64_t ids_nb1, int n_used, int T, int E, int X, int NT, int2 *entries,
                       int4 *tiles, int max_tiles, unsigned *err) {
  if (n_used < 1 || n_used > kRouteThreads) fail(Status::Unsupported, "CUDA MoE: %d experts per token (max %d)", n_used, kRouteThreads);
  route_kernel<<<1, kRouteThreads, 0, s>>>(ids, ids_nb1, n_used, T, E, X, NT, RouteTables{entries, tiles}, max_tiles, err);
  MOE_CUDA_LAUNCH_CHECK("route_kernel");
}

bool cuda_matmul_type_supported(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q4_0: case DType::Q8_0: case DType::MXFP4:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: return true;
    default: return false;
  }
}

size_t cuda_matmul_work_size(const Graph &g, const Node &n, const GpuTuning &tuning, const CudaPaths &paths) {
  const MatmulShape s = shape_of(g, n, tuning, paths);
  size_t bytes = act_scratch_bytes(s);
  if (n.op == Op::MatMul) bytes += split_part_bytes(s, dense_k_splits(s, kPlannedSms));
  if (s.blas) bytes = std::max(bytes, blas_scratch_bytes(s));  // either path may run (no handle: the MMQ)
  if (n.op == Op::MatMulId) {
    bytes += align256(static_cast<size_t>(s.n_used) * s.T * sizeof(int2));
    bytes += align256(static_cast<size_t>(s.max_tiles) * sizeof(int4));
  }
  return bytes;
}

const char *cuda_matmul_path(const Graph &g, const Node &n, const GpuTuning &tuning, const CudaPaths &paths) {
  if (cuda_f16_halfsum_applies(g, n)) return "f16_halfsum";
  const MatmulShape s = shape_of(g, n, tuning, paths);
  // (cuda_op_matmul's order of choices)
  if (s.NT == 1) return "matvec";
  if (s.blas) return "blas";
  if (s.mcol) return "mcol";
  if (s.mmq) return "mmq";
  if (s.mma) return "mma";
  if (s.sgemm) return "sgemm";
  if (s.ref_f32) return "ref_f32";
  if (s.ref) return "ref";
  return "tile";
}

void launch_act_round(const LaunchStream &s, const TView &x, int64_t rows, int64_t K, DType vdt, void *out, void *q_out, bool q_int8,
                      float2 *s_out, bool out_f16) {
  if (vdt == DType::Q8_K) {
    if (K % 256 != 0) fail(Status::Internal, "CUDA activation rounding: Q8_K rows of %lld values (not a multiple of 256)", (long long)K);
    const int64_t units = rows * (K / 256);
    launch_pdl(act_round_q8k_kernel, dim3(static_cast<unsigned>((units + kRoundWarps - 1) / kRoundWarps)), dim3(kRoundWarps * 32), 0, s, x,
               static_cast<int>(K), units, out, out_f16, q_out, q_int8, s_out);
    return;
  }
  launch_pdl(act_round_kernel, dim3(static_cast<unsigned>(rows), static_cast<unsigned>((K + 255) / 256)), dim3(256), 0, s, x, K,
             static_cast<int>(vdt), out, out_f16, q_out, q_int8, s_out);
}

void cuda_matmul_heads_rows(const CudaOpCtx &c, const Node *concat) {
  const Node &w = c.src(0), &x = c.src(1);
  const int64_t K = w.ne[0], M = w.ne[1], H = x.ne[1], T = x.ne[2];
  if (M * H * T == 0) return;
  const int width = heads_row_width(w.type, K), rows_per_block = kWarps * (32 / width);
  const dim3 grid(static_cast<unsigned>((M + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(H), static_cast<unsigned>(T));
  const uint8_t *W = static_cast<const uint8_t *>(w.data);
  const TView d = tview(concat ? *concat : c.n);
  TView tail{};
  if (concat) tail = tview(c.g.node(concat->src[1]));
#define MOE_HEADS_CASE(TY)                                                                                                   \
  case TY:                                                                                                                   \
    launch_pdl(mmv_heads_kernel<TY>, grid, dim3(kWarps * 32), 0, c.stream, W, w.nb[1], w.nb[2], static_cast<int>(K), static_cast<int>(M), \
               width, tview(x), d, tail);                                                                                  \
    break;
  switch (w.type) {
    MOE_HEADS_CASE(DType::F32)
    MOE_HEADS_CASE(DType::F16)
    MOE_HEADS_CASE(DType::BF16)
    MOE_HEADS_CASE(DType::Q4_0)
    MOE_HEADS_CASE(DType::Q8_0)
    MOE_HEADS_CASE(DType::MXFP4)
    MOE_HEADS_CASE(DType::Q2_K)
    MOE_HEADS_CASE(DType::Q3_K)
    MOE_HEADS_CASE(DType::Q4_K)
    MOE_HEADS_CASE(DType::Q5_K)
    MOE_HEADS_CASE(DType::Q6_K)
    default: fail(Status::Internal, "CUDA matmul_heads: type %s not dispatched", dtype_name(w.type));
  }
#undef MOE_HEADS_CASE
}

// The K splits of a dense product that fit the node's work buffer (planned for kPlannedSms).
static int fitted_k_splits(const MatmulShape &s, const CudaOpCtx &c) {
  int splits = dense_k_splits(s, c.n_sm);
  while (splits > 1 && act_scratch_bytes(s) + split_part_bytes(s, splits) > c.n.work_size) --splits;
  return splits;
}

// MatMulId's route tables after the activation scratch, filled by one route launch.
static RouteTables launch_route_tables(const CudaOpCtx &c, const MatmulShape &s, uint8_t *work) {
  size_t off = act_scratch_bytes(s);
  RouteTables rt;
  rt.entries = reinterpret_cast<int2 *>(work + off);
  off += align256(static_cast<size_t>(s.n_used) * s.T * sizeof(int2));
  rt.tiles = reinterpret_cast<int4 *>(work + off);
  const Node &ids = c.src(2);
  cuda_launch_route(c.stream, static_cast<const int32_t *>(ids.data), static_cast<int64_t>(ids.nb[1] / 4), s.n_used, s.T, static_cast<int>(s.E),
                    s.X, s.NT, rt.entries, rt.tiles, s.max_tiles, c.ub.err);
  return rt;
}

// The kMcolTc* mask of the tuning on this device.
static unsigned mcol_tc_mask(const GpuTuning &tuning, const CudaPaths &paths) {
  if (!paths.tensor_cores) return 0u;
  return (tuning.mcol_tensor_cores ? kMcolTcQ4K : 0u) | (tuning.mcol_tensor_cores_q6k ? kMcolTcQ6K : 0u);
}

// The few-column kernel's arguments for weights w (s.K long rows) against x into y; expert stride
// where s has experts.
static McolArgs mcol_args(const Node &w, const Node &x, float *y, const MatmulShape &s) {
  McolArgs a{};
  a.w = static_cast<const uint8_t *>(w.data);
  a.rb = static_cast<int64_t>(w.nb[1]);
  a.eb = s.E > 1 ? static_cast<int64_t>(w.nb[2]) : 0;
  a.K = static_cast<int>(s.K);
  a.M = static_cast<int>(w.ne[1]);
  a.x = tview(x);
  a.y = y;
  return a;
}

// x's s.rows columns rounded to vdt's int8 form into work (integers, then the per-16 (scale,
// sum) pairs at mmq_ints_bytes), and a pointed at them.
static void round_acts(const CudaOpCtx &c, const Node &x, const MatmulShape &s, DType vdt, uint8_t *work, McolArgs &a) {
  float2 *xs = reinterpret_cast<float2 *>(work + mmq_ints_bytes(s));
  launch_act_round(c.stream, tview(x), s.rows, s.K, vdt, nullptr, work, true, xs);
  a.xq = reinterpret_cast<const int8_t *>(work);
  a.xs = xs;
}

// A dense few-column product of w over s.rows columns (a's activations, output and residual
// set): one launch over the column tiles.
static void launch_mcol_dense(const CudaOpCtx &c, const Node &w, McolArgs a, const MatmulShape &s) {
  a.ncols = static_cast<int>(s.rows);
  launch_mcol(w.type, c.stream, a, (a.ncols + kMcolCols - 1) / kMcolCols, c.n_sm, a.ncols, mcol_tc_mask(c.tuning, c.paths));
}

// The multi-column mat-vec (s.mcol): quantized activations rounded to int8 first (the
// one-token kernels' values), MatMulId routed, then one launch over the column / route tiles.
static void run_mcol(const CudaOpCtx &c, const MatmulShape &s) {
  const Node &w = c.src(0), &x = c.src(1);
  uint8_t *work = static_cast<uint8_t *>(c.n.work);
  McolArgs a = mcol_args(w, x, static_cast<float *>(c.n.data), s);
  if (!s.plain) round_acts(c, x, s, type_traits(w.type).vec_dot_type, work, a);
  if (c.n.op == Op::MatMul) return launch_mcol_dense(c, w, a, s);
  const RouteTables rt = launch_route_tables(c, s, work);
  a.tiles = rt.tiles;
  a.entries = rt.entries;
  launch_mcol(w.type, c.stream, a, s.max_tiles, c.n_sm, static_cast<int>(std::min<int64_t>(s.T, kMcolCols)), mcol_tc_mask(c.tuning, c.paths));
}

// cuda_mcol_swiglu_applies, with the gate product's shape.
static bool mcol_swiglu_shape(const Graph &g, const Node &sw, const GpuTuning &tuning, const CudaPaths &paths, MatmulShape &s) {
  if (!tuning.fusion || !tuning.mcol_swiglu || sw.op != Op::SwiGLU || sw.src[0] < 0 || sw.src[1] < 0) return false;
  const Node &gate = g.node(sw.src[0]), &up = g.node(sw.src[1]);
  if (gate.op != Op::MatMulId || up.op != Op::MatMulId || gate.src[1] != up.src[1] || gate.src[2] != up.src[2]) return false;
  const Node &wg = g.node(gate.src[0]), &wu = g.node(up.src[0]);
  if (wg.type != wu.type || wg.nb[1] != wu.nb[1] || wg.nb[2] != wu.nb[2]) return false;
  for (int d = 0; d < 4; ++d)
    if (wg.ne[d] != wu.ne[d] || gate.ne[d] != sw.ne[d] || up.ne[d] != sw.ne[d]) return false;
  const unsigned tc = mcol_tc_mask(tuning, paths);
  const bool tc_type = (wg.type == DType::Q4_K && (tc & kMcolTcQ4K)) || (wg.type == DType::Q6_K && (tc & kMcolTcQ6K));
  if (!tc_type || sw.type != DType::F32 || !sw.is_contiguous()) return false;
  s = shape_of(g, gate, tuning, paths);
  return s.mcol && s.T >= 2;
}

bool cuda_mcol_swiglu_applies(const Graph &g, const Node &sw, const GpuTuning &tuning, const CudaPaths &paths) {
  MatmulShape s;
  return mcol_swiglu_shape(g, sw, tuning, paths, s);
}

size_t cuda_swiglu_work_size(const Graph &g, const Node &sw, const GpuTuning &tuning, const CudaPaths &paths) {
  return cuda_mcol_swiglu_applies(g, sw, tuning, paths) ? cuda_matmul_work_size(g, g.node(sw.src[0]), tuning, paths) : 0;
}

bool cuda_mcol_swiglu(const CudaOpCtx &c, const Node &gate, const Node &up, const Node &sw) {
  MatmulShape s;
  if (&c.n != &sw || !mcol_swiglu_shape(c.g, sw, c.tuning, c.paths, s)) return false;
  if (!c.n.work || c.n.work_size < cuda_matmul_work_size(c.g, gate, c.tuning, c.paths)) return false;
  const Node &w = c.g.node(gate.src[0]), &x = c.g.node(gate.src[1]);
  uint8_t *work = static_cast<uint8_t *>(c.n.work);
  McolArgs a = mcol_args(w, x, static_cast<float *>(sw.data), s);
  a.w2 = static_cast<const uint8_t *>(c.g.node(up.src[0]).data);
  const unsigned tc = mcol_tc_mask(c.tuning, c.paths);
  if (!cuda_mcol_swiglu_takes(w.type, a, tc)) return false;  // before anything launched: the members run
  if (s.M == 0 || s.rows == 0) return true;
  round_acts(c, x, s, type_traits(w.type).vec_dot_type, work, a);
  const RouteTables rt = launch_route_tables(c.with_node(gate), s, work);
  a.tiles = rt.tiles;
  a.entries = rt.entries;
  return launch_mcol_swiglu(w.type, c.stream, a, s.max_tiles, c.n_sm, tc);
}

bool cuda_mcol_matvecs(const CudaOpCtx &c, const std::vector<int> &members) {
  if (!c.tuning.mcol_shared_rounding || members.size() < 2 || &c.n != &c.g.node(members.back())) return false;
  const Node &first = c.g.node(members.front());
  const MatmulShape s0 = shape_of(c.g, first, c.tuning, c.paths);
  const DType vdt = type_traits(c.g.node(first.src[0]).type).vec_dot_type;
  for (int id : members) {
    const Node &mm = c.g.node(id);
    const MatmulShape s = shape_of(c.g, mm, c.tuning, c.paths);
    if (mm.op != Op::MatMul || mm.src[1] != first.src[1] || !s.mcol || s.plain || s.K != s0.K || s.rows != s0.rows ||
        type_traits(c.g.node(mm.src[0]).type).vec_dot_type != vdt || mm.type != DType::F32 || !mm.is_contiguous())
      return false;
  }
  if (!c.n.work || c.n.work_size < act_scratch_bytes(s0)) return false;
  if (s0.rows == 0) return true;
  uint8_t *work = static_cast<uint8_t *>(c.n.work);
  const Node &x = c.g.node(first.src[1]);
  McolArgs acts{};
  round_acts(c, x, s0, vdt, work, acts);  // once for every member
  for (int id : members) {
    const Node &mm = c.g.node(id), &w = c.g.node(mm.src[0]);
    McolArgs a = mcol_args(w, x, static_cast<float *>(mm.data), s0);
    a.xq = acts.xq;
    a.xs = acts.xs;
    launch_mcol_dense(c, w, a, s0);
  }
  return true;
}

// cuda_mcol_matmul_add's conditions for product mm of add, with mm's shape and the residual.
static bool mcol_add_shape(const Graph &g, const Node &mm, const Node &add, const GpuTuning &tuning, const CudaPaths &paths, MatmulShape &s,
                           const Node *&res) {
  if (!tuning.fusion || !tuning.mcol_add || add.op != Op::Add || mm.op != Op::MatMul || add.src[0] < 0 || add.src[1] < 0) return false;
  const bool first = &g.node(add.src[0]) == &mm;
  if (!first && &g.node(add.src[1]) != &mm) return false;
  res = &g.node(add.src[first ? 1 : 0]);
  for (const Node *n : {&mm, &add, res})
    if (n->type != DType::F32 || !n->is_contiguous()) return false;
  for (int d = 0; d < 4; ++d)
    if (mm.ne[d] != add.ne[d] || res->ne[d] != add.ne[d]) return false;
  if (cuda_f16_halfsum_applies(g, mm)) return false;  // (cuda_op_matmul's first choice)
  s = shape_of(g, mm, tuning, paths);
  return s.mcol && s.rows >= 2 && s.M == add.ne[0];
}

size_t cuda_add_work_size(const Graph &g, const Node &add, const GpuTuning &tuning, const CudaPaths &paths) {
  size_t bytes = 0;
  for (int k = 0; k < 2; ++k) {
    MatmulShape s;
    const Node *res = nullptr;
    if (add.op == Op::Add && add.src[k] >= 0 && mcol_add_shape(g, g.node(add.src[k]), add, tuning, paths, s, res))
      bytes = std::max(bytes, act_scratch_bytes(s));
  }
  return bytes;
}

bool cuda_mcol_matmul_add(const CudaOpCtx &c, const Node &mm, const Node &add) {
  MatmulShape s;
  const Node *res = nullptr;
  if (&c.n != &add || !mcol_add_shape(c.g, mm, add, c.tuning, c.paths, s, res)) return false;
  const size_t need = act_scratch_bytes(s);
  if (need > 0 && (!c.n.work || c.n.work_size < need)) return false;
  if (s.M == 0) return true;
  const Node &w = c.g.node(mm.src[0]), &x = c.g.node(mm.src[1]);
  McolArgs a = mcol_args(w, x, static_cast<float *>(add.data), s);
  a.add = static_cast<const float *>(res->data);
  if (!s.plain) round_acts(c, x, s, type_traits(w.type).vec_dot_type, static_cast<uint8_t *>(c.n.work), a);
  launch_mcol_dense(c, w, a, s);  // (run_mcol's dense launch, the residual added as it stores)
  return true;
}

void cuda_op_matmul(const CudaOpCtx &c) {
  const Node &w = c.src(0), &x = c.src(1);
  const MatmulShape s = shape_of(c.g, c.n, c.tuning, c.paths);
  if (s.M == 0 || s.rows == 0) return;
  if (c.n.op == Op::MatMulId && s.E > kCudaMaxExperts) fail(Status::Unsupported, "CUDA MoE: %lld experts (max %d)", (long long)s.E, kCudaMaxExperts);
  // F16 weights with one column or experts: half-precision sums like the reference.
  if (cuda_f16_halfsum_applies(c.g, c.n)) return cuda_op_matmul_f16_halfsum(c);
  // One column (decode): rounding inside the mat-vec, no extra launch (ops/matvec.cu).
  if (s.NT == 1 && cuda_matvec(c)) return;
  const uint8_t *W = static_cast<const uint8_t *>(w.data);
  if (s.blas && c.blas && c.n.work && c.n.work_size >= blas_scratch_bytes(s)) {
    __half *W16 = static_cast<__half *>(c.n.work);
    __half *X16 = reinterpret_cast<__half *>(static_cast<uint8_t *>(c.n.work) + blas_w_bytes(s));
    launch_dequant_f16(w.type, c.stream, W, w.nb[1], static_cast<int>(s.K), static_cast<int>(s.M), W16);
    // The activations through the weight type's activation format (Q8_K / Q8_0), as the CPU and
    // the reference round them, then to f16: close to the CPU's products (plain f16
    // activations were ~0.7% off it, and turned 2 more conformance greedy checks).
    launch_act_round(c.stream, tview(x), s.rows, s.K, type_traits(w.type).vec_dot_type, X16, nullptr, false, nullptr, true);
    cuda_blas_gemm_f16(c.blas, static_cast<int>(s.M), static_cast<int>(s.rows), static_cast<int>(s.K), W16, static_cast<int>(s.K), X16,
                       static_cast<int>(s.K), static_cast<float *>(c.n.data), static_cast<int>(s.M));
    return;
  }
  if (s.mcol) return run_mcol(c, s);
  float *Y = static_cast<float *>(c.n.data);
  const dim3 grid_x(static_cast<unsigned>((s.M + kWarps - 1) / kWarps));
  uint8_t *work = static_cast<uint8_t *>(c.n.work);
  float *xr = reinterpret_cast<float *>(work);
  const DType vdt = type_traits(w.type).vec_dot_type;
  void *xq = s.mmq || s.ref ? work : nullptr;
  float2 *xs = s.mmq || s.ref ? reinterpret_cast<float2 *>(work + mmq_ints_bytes(s)) : nullptr;
  launch_act_round(c.stream, tview(x), s.rows, s.K, vdt, xr, xq, int8_acts(s), xs);
  if (s.NT == 1) {
    // One column that cuda_matvec does not take (activations too large for its shared
    // memory): no routing tables; experts come straight from ids.
    const bool moe = c.n.op == Op::MatMulId;
    const dim3 grid(grid_x.x, moe ? static_cast<unsigned>(s.n_used) : 1u);
    launch_mmv1(w.type, grid, c.stream, W, w.nb[1], moe ? w.nb[2] : 0, static_cast<int>(s.K), static_cast<int>(s.M),
                reinterpret_cast<const uint8_t *>(xr), static_cast<int64_t>(s.K) * 4, moe ? s.X : 1, Y,
                moe ? static_cast<const int32_t *>(c.src(2).data) : nullptr, static_cast<int>(s.E), c.ub.err);
    return;
  }
  if (c.n.op == Op::MatMul) {
    const int ncols = static_cast<int>(s.rows);
    const int n_col_tiles = (ncols + s.NT - 1) / s.NT;
    if (s.mmq) {
      const int splits = fitted_k_splits(s, c);
      float *part = splits > 1 ? reinterpret_cast<float *>(work + act_scratch_bytes(s)) : nullptr;
      launch_mmq_matmul(w.type, c.stream, W, w.nb[1], 0, static_cast<int>(s.K), static_cast<int>(s.M), xq, xs, Y, ncols, nullptr, nullptr,
                        n_col_tiles, part, splits);
    } else if (s.mma) {
      launch_mma_matmul(w.type, c.stream, W, w.nb[1], 0, static_cast<int>(s.K), static_cast<int>(s.M), xr, Y, ncols, nullptr, nullptr,
                        n_col_tiles);
    } else if (s.sgemm && c.blas && c.tuning.blas_min_tokens > 0 && w.nb[1] % 4 == 0) {
      // F32 weights (routers): cuBLAS's f32 GEMM, unless cuBLAS is switched off (blas min 0).
      // Measured 2026-12-01: 29.7 us per router call at 512 tokens on the split-K kernel below + its sum.
      cuda_blas_gemm_f32(c.blas, static_cast<int>(s.M), ncols, static_cast<int>(s.K), reinterpret_cast<const float *>(W),
                         static_cast<int>(w.nb[1] / 4), xr, static_cast<int>(s.K), Y, static_cast<int>(s.M));
    } else if (s.sgemm) {
      const int splits = fitted_k_splits(s, c);
      float *part = splits > 1 ? reinterpret_cast<float *>(work + act_scratch_bytes(s)) : Y;
      const int nz = launch_sgemm_f32(W, w.nb[1], static_cast<int>(s.K), static_cast<int>(s.M), xr, ncols, part, splits, c.stream);
      if (nz > 1) launch_sum_k_splits(part, static_cast<int64_t>(ncols) * s.M, nz, Y, c.stream);
    } else if (s.ref_f32) {
      // The CPU's batched F32 GEMM takes K % 16 == 0 and M % 4 == 0 (ref_order_path), else its vec_dot.
      launch_mmv_ref_f32(c.stream, reinterpret_cast<const float *>(W), static_cast<int64_t>(w.nb[1] / 4), static_cast<int>(s.K),
                         static_cast<int>(s.M), xr, Y, ncols, s.NT, s.K % 16 == 0 && s.M % 4 == 0);
    } else if (s.ref) {
      // The CPU runs Q4_K (rows % 8 == 0) in its repacked gemm order on full groups of 4 columns.
      const int gemm_cols = w.type == DType::Q4_K && ref_q4k_repacked(s.M) && ncols >= 4 ? ncols - ncols % 4 : 0;
      launch_mmv_ref(w.type, c.stream, W, w.nb[1], 0, static_cast<int>(s.K), static_cast<int>(s.M), static_cast<const int8_t *>(xq), xs, Y,
                     ncols, gemm_cols, s.NT, nullptr, nullptr, n_col_tiles);
    } else {
      launch_mmv<kTile>(w.type, dim3(grid_x.x, static_cast<unsigned>(n_col_tiles)), c.stream, W, w.nb[1], 0, s.K, s.M, xr, Y, ncols,
                        nullptr, nullptr);
    }
    return;
  }
  const RouteTables rt = launch_route_tables(c, s, work);
  if (s.mmq)
    launch_mmq_matmul(w.type, c.stream, W, w.nb[1], w.nb[2], static_cast<int>(s.K), static_cast<int>(s.M), xq, xs, Y, 0, rt.tiles,
                      rt.entries, s.max_tiles);
  else if (s.mma)
    launch_mma_matmul(w.type, c.stream, W, w.nb[1], w.nb[2], static_cast<int>(s.K), static_cast<int>(s.M), xr, Y, 0, rt.tiles,
                      rt.entries, s.max_tiles);
  else if (s.ref)
    launch_mmv_ref(w.type, c.stream, W, w.nb[1], w.nb[2], static_cast<int>(s.K), static_cast<int>(s.M), static_cast<const int8_t *>(xq), xs,
                   Y, 0, 0, s.NT, rt.tiles, rt.entries, s.max_tiles);
  else
    launch_mmv<kTile>(w.type, dim3(grid_x.x, static_cast<unsigned>(s.max_tiles)), c.stream, W, w.nb[1], w.nb[2], s.K, s.M, xr, Y, 0,
                      rt.tiles, rt.entries);
}

}  // namespace moe
