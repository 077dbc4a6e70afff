// MatMul / MatMulId / GetRows of the extra weight types (quant_extra.h): activation rounding
// into the CPU's Q8 blocks, the integer-dot warp-per-row kernel, f16 dequantization for cuBLAS,
// the batches handed to the int8 tensor-core GEMM (matmul_mmq_i8.cu) and GetRows. Decoders and
// device tables: quant_extra_decode.cuh (also staged for the GEMM by mmq_i8_extra.cuh).
#include "backends/cuda/ops/quant_extra.h"

#include <algorithm>

#include "backends/cuda/cuda_blas.h"
#include "backends/cuda/ops/act_round_warp.cuh"
#include "backends/cuda/ops/kernel_error.cuh"
#include "backends/cuda/ops/matmul_heads.h"
#include "backends/cuda/ops/matmul_mma.h"
#include "backends/cuda/ops/matmul_route.h"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/quant_extra_decode.cuh"
#include "backends/cuda/ops/ref_math.cuh"

namespace moe {

namespace {

constexpr int kXWarps = 4;       // weight rows per block of the dot kernel (a warp each)
constexpr int kXTile = 8;        // activation columns per block beyond one token
constexpr int kQuantWarps = 4;   // 256-value units per block of the activation rounding
// Dense weights above this as f16 stay on the integer kernels (as matmul.cu's cuBLAS path).
constexpr int64_t kBlasMaxWeightBytes = 64ll << 20;
// The int8 MMQ's dense K splits are sized for an H200's SMs in the plan (as matmul.cu); fewer
// fit any device.
constexpr int kPlannedSms = 132;

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// ---- activation rounding -----------------------------------------------------------------

// The rounding of one 256-value unit by a warp (lane l: values i0 .. i0 + 7 of the row src,
// i0 = unit start + 8 l; in: i0 < K): the lane's 8 integers and its 32-block's (d, s) (Q8_K:
// the 256-block's scale, 0; Q8_0 / Q8_1: the f16 scale and Q8_1's f16 d * sum of the 32
// integers). Every lane calls it (shuffles). quantize_acts_kernel and the one-token fused
// kernels round with it, so both hold the same integers and scales.
__device__ __forceinline__ void round_unit(const float *src, int i0, bool in, bool q8k, int (&qi)[8], float &d, float &s) {
  float v[8];
  load8_floats(src, i0, in, v);
  s = 0.0f;
  if (q8k) {
    d = q8k_round_warp(v, qi);
    return;
  }
  float am = 0.0f;
#pragma unroll
  for (int l = 0; l < 8; ++l) am = fmaxf(am, fabsf(v[l]));
  am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
  am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
  const float dd = am / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
  int sum = 0;
#pragma unroll
  for (int l = 0; l < 8; ++l) {
    qi[l] = static_cast<int>(roundf(v[l] * id));
    sum += qi[l];
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  d = __half2float(__float2half_rn(dd));
  s = __half2float(__float2half_rn(static_cast<float>(sum) * dd));
}

// Rows of x (row r = element (r % ne1, r / ne1 % ne2, ...) of its rows) into int8 q[r K + i]
// and, per 32 values, ds[r K / 32 + i / 32] = (d, s): Q8_K: (the 256-block's scale, 0);
// Q8_0 / Q8_1: (the f16 scale, Q8_1's f16 s = d * sum of the 32 integers), the values the CPU's
// quantize_row gives. per16 (the int8 MMQ's layout, launch_mmq_i8_matmul): ds per 16 values
// instead, ds[r K / 16 + i / 16] = (d, s) for the first 16 of a 32 and (d, 0) for the second
// (its Q4_1 / Q5_1 fold adds m s once per 32; the other types read only d).
// A warp per 256 values, lane l holding 8 (K % 32 == 0; Q8_K: K % 256 == 0).
__global__ void __launch_bounds__(kQuantWarps * 32) quantize_acts_kernel(TView x, int K, int64_t units, bool q8k, bool per16, int8_t *q,
                                                                         float2 *ds) {
  const int64_t u = static_cast<int64_t>(blockIdx.x) * kQuantWarps + (threadIdx.x >> 5);
  if (u >= units) return;  // whole warps
  const int lane = threadIdx.x & 31, nb = (K + 255) / 256;
  const int64_t r = u / nb;
  const int i0 = static_cast<int>(u % nb) * 256 + lane * 8;
  const bool in = i0 < K;  // the 4 lanes of a 32-block agree
  const int64_t i1 = r % x.ne[1], i2 = (r / x.ne[1]) % x.ne[2], i3 = r / (x.ne[1] * x.ne[2]);
  const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + i1 * x.nb[1] + i2 * x.nb[2] + i3 * x.nb[3]);
  int qi[8];
  float d, s;
  round_unit(src, i0, in, q8k, qi, d, s);
  if (!in) return;
  *reinterpret_cast<uint2 *>(q + r * K + i0) = pack_int8x8(qi);
  if (per16 && (lane & 1) == 0) ds[r * (K / 16) + i0 / 16] = make_float2(d, (lane & 2) ? 0.0f : s);
  if (!per16 && (lane & 3) == 0) ds[r * (K / 32) + i0 / 32] = make_float2(d, s);
}

// ---- the product -----------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Which activation rows a block's columns read and which output rows they write: dense
// (columns blockIdx.y * NT ...), routed tiles (matmul_route.h), one token's experts straight
// from ids (blockIdx.y = slot j), or MatMulHeads (blockIdx.y = head h's token tile j).
struct XCols {
  int ncols;                // dense: the number of columns
  const int4 *tiles;        // routed
  const int2 *entries;
  const int32_t *ids;       // one token: ids[j], activation row X == 1 ? 0 : j, output row j
  int X, E;
  unsigned *err;
  int H, T, tiles_per_head;  // heads (H > 0): head h = expert h, activation row t H + h
  int64_t y_nb1, y_nb2;      // heads: output strides in floats (out[:, h, t] at h y_nb1 + t y_nb2)
};

// Y[out row][row] = W(expert)[row] . x(act row), a warp per weight row, lanes over sub-blocks.
// An ordinary launch (no PDL): every read of activations follows the previous kernel.
template <DType T, int NT>
__global__ void __launch_bounds__(kXWarps * 32) extra_dot_kernel(const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                                                                 const int8_t *xq, const float2 *xds, float *Y, XCols cols) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kXWarps + (threadIdx.x >> 5);
  int expert = 0, first = static_cast<int>(blockIdx.y) * NT, cnt;
  if (cols.tiles) {
    const int4 tl = cols.tiles[blockIdx.y];
    expert = tl.x;
    first = tl.y;
    cnt = tl.z;
  } else if (cols.H > 0) {
    expert = static_cast<int>(blockIdx.y) / cols.tiles_per_head;
    first = (static_cast<int>(blockIdx.y) % cols.tiles_per_head) * NT;
    cnt = min(NT, cols.T - first);
  } else if (cols.ids) {
    expert = cols.ids[blockIdx.y];
    if (expert < 0 || expert >= cols.E) {  // nothing to compute; the output row keeps what it held
      if (blockIdx.x == 0 && threadIdx.x == 0) report_bad_index(cols.err, kKernelErrExpertId, expert, cols.E);
      return;
    }
    cnt = 1;
  } else {
    cnt = min(NT, cols.ncols - first);
  }
  if (cnt <= 0 || row >= M) return;
  int64_t xr[NT], yo[NT];  // activation row, first output element of the column
#pragma unroll
  for (int k = 0; k < NT; ++k) {
    const int kk = k < cnt ? k : 0;
    if (cols.entries) {
      const int2 e = cols.entries[first + kk];
      xr[k] = e.x;
      yo[k] = static_cast<int64_t>(e.y) * M;
    } else if (cols.H > 0) {
      const int64_t t = first + kk;
      xr[k] = t * cols.H + expert;
      yo[k] = expert * cols.y_nb1 + t * cols.y_nb2;
    } else if (cols.ids) {
      xr[k] = cols.X == 1 ? 0 : static_cast<int64_t>(blockIdx.y);
      yo[k] = static_cast<int64_t>(blockIdx.y) * M;
    } else {
      xr[k] = first + kk;
      yo[k] = xr[k] * M;
    }
  }
  const uint8_t *wrow = W + expert * expert_bytes + static_cast<int64_t>(row) * row_bytes;
  const int n_sub = K / 32;
  float acc[NT];
#pragma unroll
  for (int k = 0; k < NT; ++k) acc[k] = 0.0f;
  for (int s = lane; s < n_sub; s += 32) {
    SubBlock b;
    decode_sub<T>(wrow, s, b);
#pragma unroll
    for (int k = 0; k < NT; ++k) {
      if (k >= cnt) break;
      const int4 *p = reinterpret_cast<const int4 *>(xq + xr[k] * K + 32 * s);
      const int4 a = __ldg(p), c = __ldg(p + 1);
      const int xv[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
      const float2 sc = __ldg(xds + xr[k] * n_sub + s);
      acc[k] += dot_sub<T>(b, xv, sc.x, sc.y);
    }
  }
#pragma unroll
  for (int k = 0; k < NT; ++k) {
    const float v = warp_sum(acc[k]);
    if (lane == 0 && k < cnt) Y[yo[k] + row] = v;
  }
}

// ---- one-token fused groups --------------------------------------------------------------
// The decode groups of cuda_fusion.h for these types, one launch each: gate/up MatMulId (or
// MatMul) + SwiGLU, down MatMulId + MoeCombine [+ Add], MatMul + Add, MatVecs (q, k, v). Every block rounds the
// activation rows it reads into shared memory with round_unit (the integers and scales
// quantize_acts_kernel writes) and a warp per (weight row, slot) sums the sub-blocks as
// extra_dot_kernel<T, 1> does (lane s: sub-blocks s, s + 32, ...; warp_sum): the products
// are the unfused ones bit for bit, and the SwiGLU (ref_swiglu), the combine (rounded products,
// rounded sums in slot order, as moe_route.cu) and the Add are the unfused kernels' float steps.
// PDL launches: each kernel waits (pdl_wait) before its first read and triggers only after, so
// expert ids are read once their writer completed and a next kernel that reads settled ids
// before its own wait (matvec.cu's kModeDownSettled) still finds the router complete.

constexpr int kFWarps = 8;                // warps per block of the fused kernels
constexpr int kFDownRows = 4;             // down rows per block (its warps share them over the slots)
constexpr int kFMaxVals = 16384;          // rounded activation values a block holds (rows x K)
constexpr int kFMaxSlots = 32;            // down: experts per token
constexpr int kFPairs = 4;                // down: (row, slot) dots a warp runs side by side

struct FusedActs {  // a block's rounded activation rows: q[r K + i], (d, s) per 32 values
  int4 q[kFMaxVals / 16];
  float2 ds[kFMaxVals / 32];
};

// Rows 0 .. rows - 1 of x (row r at x + r x_stride floats) rounded into a by the block's warps.
__device__ __forceinline__ void round_rows_shared(const float *x, int64_t x_stride, int rows, int K, bool q8k, FusedActs &a) {
  const int lane = threadIdx.x & 31, nb = (K + 255) / 256, units = rows * nb;
  int8_t *q = reinterpret_cast<int8_t *>(a.q);
  for (int u = threadIdx.x >> 5; u < units; u += blockDim.x >> 5) {  // whole warps
    const int r = u / nb, i0 = (u % nb) * 256 + lane * 8;
    const bool in = i0 < K;
    int qi[8];
    float d, s;
    round_unit(x + r * x_stride, i0, in, q8k, qi, d, s);
    if (!in) continue;
    *reinterpret_cast<uint2 *>(q + r * K + i0) = pack_int8x8(qi);
    if ((lane & 3) == 0) a.ds[(r * K + i0) / 32] = make_float2(d, s);
  }
  __syncthreads();
}

// Weight row wrow . rounded activation row r of a (all lanes get the sum).
template <DType T> __device__ __forceinline__ float row_dot_shared(const uint8_t *wrow, int K, const FusedActs &a, int r) {
  const int lane = threadIdx.x & 31, n_sub = K / 32;
  const int8_t *xq = reinterpret_cast<const int8_t *>(a.q) + r * K;
  float acc = 0.0f;
  for (int s = lane; s < n_sub; s += 32) {
    SubBlock b;
    decode_sub<T>(wrow, s, b);
    const int4 *p = reinterpret_cast<const int4 *>(xq + 32 * s);
    const int4 u = p[0], c = p[1];
    const int xv[8] = {u.x, u.y, u.z, u.w, c.x, c.y, c.z, c.w};
    const float2 sc = a.ds[r * n_sub + s];
    acc += dot_sub<T>(b, xv, sc.x, sc.y);
  }
  return warp_sum(acc);
}

// out[j y_stride + row] = SwiGLU(gate(expert ids[j])[row] . x_j, up(...)[row] . x_j) for slot
// j = blockIdx.y (ids null: dense, expert 0), x_j = x row (X == 1 ? 0 : j). A bad id: the
// slot's rows are zeros and the id is reported.
template <DType T>
__global__ void __launch_bounds__(kFWarps * 32) extra_gate_up_kernel(const uint8_t *Wg, const uint8_t *Wu, int64_t rb, int64_t eb, int K, int M,
                                                                     const float *x, int64_t x_stride, int X, const int32_t *ids, int E,
                                                                     unsigned *err, bool q8k, float *out, int64_t y_stride) {
  pdl_wait();
  pdl_trigger();
  __shared__ FusedActs acts;
  const int j = static_cast<int>(blockIdx.y), row = static_cast<int>(blockIdx.x) * kFWarps + static_cast<int>(threadIdx.x >> 5);
  const int expert = ids ? ids[j] : 0;
  float *y = out + j * y_stride;
  if (expert < 0 || expert >= E) {  // (the block's threads agree)
    if (blockIdx.x == 0 && threadIdx.x == 0) report_bad_index(err, kKernelErrExpertId, expert, E);
    if (row < M && (threadIdx.x & 31) == 0) y[row] = 0.0f;
    return;
  }
  round_rows_shared(x + (X == 1 ? 0 : j) * x_stride, 0, 1, K, q8k, acts);
  if (row >= M) return;
  const int64_t off = expert * eb + static_cast<int64_t>(row) * rb;
  const float g = row_dot_shared<T>(Wg + off, K, acts, 0), u = row_dot_shared<T>(Wu + off, K, acts, 0);
  if ((threadIdx.x & 31) == 0) y[row] = ref_swiglu(g, u, row, M);
}

// out[row] = sum over slots j (in order) of w[j] * (down(expert ids[j])[row] . x_j) [+ add[row]],
// x_j = x row (X == 1 ? 0 : j); a block's warps share its kFDownRows rows x n_used slots. A
// bad id: its product counts as 0 and the id is reported.
template <DType T>
__global__ void __launch_bounds__(kFWarps * 32) extra_down_kernel(const uint8_t *W, int64_t rb, int64_t eb, int K, int M, const float *x,
                                                                  int64_t x_stride, int X, const int32_t *ids, int n_used, int E, unsigned *err,
                                                                  bool q8k, const float *cw, const float *add, float *out) {
  pdl_wait();
  pdl_trigger();
  __shared__ FusedActs acts;
  __shared__ float prod[kFDownRows * kFMaxSlots];
  round_rows_shared(x, x_stride, X, K, q8k, acts);
  // A warp's (row, slot) pairs p, p + kFWarps, ... in batches of kFPairs dotted side by side
  // (each pair's lanes and sums in extra_dot_kernel's order), so a lane has kFPairs sub-block
  // loads in flight instead of one.
  const int lane = threadIdx.x & 31, row0 = static_cast<int>(blockIdx.x) * kFDownRows, n_pairs = kFDownRows * n_used, n_sub = K / 32;
  for (int p0 = static_cast<int>(threadIdx.x >> 5); p0 < n_pairs; p0 += kFWarps * kFPairs) {
    const uint8_t *wrow[kFPairs];
    int xr[kFPairs];
    bool ok[kFPairs];
    float acc[kFPairs];
#pragma unroll
    for (int b = 0; b < kFPairs; ++b) {
      const int p = p0 + b * kFWarps, j = p % n_used, row = row0 + p / n_used, expert = p < n_pairs ? ids[j] : 0;
      ok[b] = p < n_pairs && row < M && expert >= 0 && expert < E;
      if (p < n_pairs && row < M && !ok[b] && blockIdx.x == 0 && lane == 0) report_bad_index(err, kKernelErrExpertId, expert, E);
      wrow[b] = ok[b] ? W + expert * eb + static_cast<int64_t>(row) * rb : W;
      xr[b] = X == 1 ? 0 : j;
      acc[b] = 0.0f;
    }
    for (int s = lane; s < n_sub; s += 32) {
      SubBlock sb[kFPairs];
#pragma unroll
      for (int b = 0; b < kFPairs; ++b)
        if (ok[b]) decode_sub<T>(wrow[b], s, sb[b]);
#pragma unroll
      for (int b = 0; b < kFPairs; ++b) {
        if (!ok[b]) continue;
        const int4 *q = reinterpret_cast<const int4 *>(reinterpret_cast<const int8_t *>(acts.q) + xr[b] * K + 32 * s);
        const int4 u = q[0], c = q[1];
        const int xv[8] = {u.x, u.y, u.z, u.w, c.x, c.y, c.z, c.w};
        const float2 sc = acts.ds[xr[b] * n_sub + s];
        acc[b] += dot_sub<T>(sb[b], xv, sc.x, sc.y);
      }
    }
#pragma unroll
    for (int b = 0; b < kFPairs; ++b) {
      const float v = warp_sum(acc[b]);  // (0 for a bad id: no contribution)
      const int p = p0 + b * kFWarps;
      if (lane == 0 && p < n_pairs && row0 + p / n_used < M) prod[p] = v;
    }
  }
  __syncthreads();
  const int r = static_cast<int>(threadIdx.x), row = row0 + r;
  if (r >= kFDownRows || row >= M) return;
  float acc = __fmul_rn(prod[r * n_used], cw[0]);
  for (int j = 1; j < n_used; ++j) acc = __fadd_rn(acc, __fmul_rn(prod[r * n_used + j], cw[j]));
  out[row] = add ? __fadd_rn(acc, add[row]) : acc;
}

// out[row] = W[row] . x + add[row] (one token, dense).
template <DType T>
__global__ void __launch_bounds__(kFWarps * 32) extra_matmul_add_kernel(const uint8_t *W, int64_t rb, int K, int M, const float *x, bool q8k,
                                                                        const float *add, float *out) {
  pdl_wait();
  pdl_trigger();
  __shared__ FusedActs acts;
  round_rows_shared(x, 0, 1, K, q8k, acts);
  const int row = static_cast<int>(blockIdx.x) * kFWarps + static_cast<int>(threadIdx.x >> 5);
  if (row >= M) return;
  const float v = row_dot_shared<T>(W + static_cast<int64_t>(row) * rb, K, acts, 0);
  if ((threadIdx.x & 31) == 0) out[row] = __fadd_rn(v, add[row]);
}

// Up to kMaxFusedMatVecs dense one-token products of one activation (a layer's q, k, v):
// segment k owns blocks [first_block, next one's) and writes y[row] = W[row] . x
// [+ add[row]].
struct XSeg {
  const uint8_t *w;
  int64_t rb;
  float *y;
  const float *add;  // null: none
  int M, first_block;
};
struct XSegs {
  XSeg s[kMaxFusedMatVecs];
  int n;
};

template <DType T>
__global__ void __launch_bounds__(kFWarps * 32) extra_matvecs_kernel(XSegs segs, int K, const float *x, bool q8k) {
  pdl_wait();
  pdl_trigger();
  __shared__ FusedActs acts;
  round_rows_shared(x, 0, 1, K, q8k, acts);
  int k = 0;
  while (k + 1 < segs.n && static_cast<int>(blockIdx.x) >= segs.s[k + 1].first_block) ++k;
  const XSeg &sg = segs.s[k];
  const int row = (static_cast<int>(blockIdx.x) - sg.first_block) * kFWarps + static_cast<int>(threadIdx.x >> 5);
  if (row >= sg.M) return;
  const float v = row_dot_shared<T>(sg.w + static_cast<int64_t>(row) * sg.rb, K, acts, 0);
  if ((threadIdx.x & 31) == 0) sg.y[row] = sg.add ? __fadd_rn(v, sg.add[row]) : v;
}

// ---- dequantization --------------------------------------------------------------------

// A thread per 32-weight sub-block (unit u = row * K / 32 + sub-block): f16 weights for cuBLAS.
template <DType T> __global__ void extra_dequant_f16_kernel(const uint8_t *W, int64_t row_bytes, int K, int64_t units, __half *W16) {
  const int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= units) return;
  const int per_row = K / 32;
  const int64_t m = u / per_row;
  const int sb = static_cast<int>(u - m * per_row);
  float w[32];
  dequant_sub<T>(W + m * row_bytes, sb, w);
  __half2 *o = reinterpret_cast<__half2 *>(W16 + m * K + 32 * sb);
#pragma unroll
  for (int l = 0; l < 16; ++l) o[l] = __floats2half2_rn(w[2 * l], w[2 * l + 1]);
}

// GetRows: out row r = the dequantized table row ids[r]; a thread per 32-value sub-block.
template <DType T> __global__ void extra_get_rows_kernel(TView tab, TView ids, TView d, int64_t n_sub, unsigned *err) {
  const int64_t r = blockIdx.y;
  const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= n_sub) return;
  const int32_t id = static_cast<const int32_t *>(ids.data)[r];
  float *out = reinterpret_cast<float *>(static_cast<uint8_t *>(d.data) + r * d.nb[1]) + 32 * s;
  float w[32];
  if (id < 0 || id >= tab.ne[1]) {
    // The context validates token ids before a decode; zeros keep the output defined.
    if (s == 0) report_bad_index(err, kKernelErrGetRows, id, tab.ne[1]);
#pragma unroll
    for (int l = 0; l < 32; ++l) w[l] = 0.0f;
  } else {
    dequant_sub<T>(static_cast<const uint8_t *>(tab.data) + id * tab.nb[1], static_cast<int>(s), w);
  }
#pragma unroll
  for (int l = 0; l < 32; ++l) out[l] = w[l];
}

#define MOE_EXTRA_TYPES(X)                                                                                               \
  X(DType::Q4_1) X(DType::Q5_0) X(DType::Q5_1) X(DType::IQ4_NL) X(DType::IQ4_XS) X(DType::IQ3_S) X(DType::IQ3_XXS) \
  X(DType::IQ2_S) X(DType::IQ2_XS) X(DType::IQ2_XXS) X(DType::IQ1_S) X(DType::IQ1_M)

template <int NT>
void launch_dot(DType t, dim3 grid, cudaStream_t s, const uint8_t *W, int64_t rb, int64_t eb, int K, int M, const int8_t *xq,
                const float2 *xds, float *Y, const XCols &cols) {
  switch (t) {
#define MOE_DOT_CASE(TY) \
  case TY: extra_dot_kernel<TY, NT><<<grid, kXWarps * 32, 0, s>>>(W, rb, eb, K, M, xq, xds, Y, cols); break;
    MOE_EXTRA_TYPES(MOE_DOT_CASE)
#undef MOE_DOT_CASE
    default: fail(Status::Internal, "CUDA matmul (extra types): type %s not dispatched", dtype_name(t));
  }
  MOE_CUDA_LAUNCH_CHECK("extra_dot_kernel");
}

void launch_dequant_f16_extra(DType t, cudaStream_t s, const uint8_t *W, int64_t rb, int K, int M, __half *W16) {
  const int64_t units = static_cast<int64_t>(M) * (K / 32);
  const dim3 grid(static_cast<unsigned>((units + 255) / 256));
  switch (t) {
#define MOE_DEQ_CASE(TY) \
  case TY: extra_dequant_f16_kernel<TY><<<grid, 256, 0, s>>>(W, rb, K, units, W16); break;
    MOE_EXTRA_TYPES(MOE_DEQ_CASE)
#undef MOE_DEQ_CASE
    default: fail(Status::Internal, "CUDA f16 dequantization (extra types): type %s not dispatched", dtype_name(t));
  }
  MOE_CUDA_LAUNCH_CHECK("extra_dequant_f16_kernel");
}

// ---- shapes and scratch ----------------------------------------------------------------

struct XShape {
  int64_t K, M, E, rows;  // rows: activation rows to round (X * T for MatMulId, H * T for MatMulHeads)
  int n_used, T, X, max_tiles;
  bool moe, heads, blas;
  bool mmq;  // the int8 tensor-core GEMM (matmul_mmq_i8.cu): MatMulId of >= kMmaMinEntries entries,
             // dense of >= kMmaMinCols columns (cuBLAS first where blas says so)
  int tile;  // MatMulId's routing tile: kMmaCols on the MMQ, else kXTile
};

// The kernel choice for n under tuning on a device taking paths: the planner sizes the scratch
// from it and the launch follows it.
XShape xshape(const Graph &g, const Node &n, const GpuTuning &tuning, const CudaPaths &paths) {
  const Node &w = g.node(n.src[0]), &x = g.node(n.src[1]);
  XShape s{};
  s.K = w.ne[0];
  s.M = w.ne[1];
  s.moe = n.op == Op::MatMulId;
  s.heads = n.op == Op::MatMulHeads;
  if (s.heads) {  // x [K, H, T]: head h is "expert" h
    s.E = w.ne[2];
    s.X = static_cast<int>(x.ne[1]);
    s.T = static_cast<int>(x.ne[2]);
    s.rows = x.ne[1] * x.ne[2];
  } else if (!s.moe) {
    s.E = 1;
    s.rows = x.ne[1] * x.ne[2] * x.ne[3];
    const int blas_min = tuning.blas_min_tokens;
    s.blas = blas_min > 0 && s.rows >= blas_min && s.M * s.K * 2 <= kBlasMaxWeightBytes;
    s.mmq = s.rows >= kMmaMinCols && cuda_mmq_i8_extra_gemm(w.type, paths);
  } else {
    const Node &ids = g.node(n.src[2]);
    s.E = w.ne[2];
    s.n_used = static_cast<int>(ids.ne[0]);
    s.T = static_cast<int>(ids.ne[1]);
    s.X = static_cast<int>(x.ne[1]);
    s.rows = static_cast<int64_t>(s.X) * s.T;
    s.mmq = s.T > 1 && s.n_used * s.T >= kMmaMinEntries && cuda_mmq_i8_extra_gemm(w.type, paths);
  }
  s.tile = s.mmq ? kMmaCols : kXTile;
  if (s.moe) s.max_tiles = cuda_route_max_tiles(s.n_used, s.T, s.E, s.tile);
  return s;
}

size_t act_q_bytes(const XShape &s) { return align256(static_cast<size_t>(s.rows * s.K)); }
// (d, s) per 32 values, or per 16 for the MMQ (quantize_acts_kernel's per16).
size_t act_bytes(const XShape &s) {
  return act_q_bytes(s) + align256(static_cast<size_t>(s.rows * (s.K / (s.mmq ? 16 : 32))) * sizeof(float2));
}
bool routed(const XShape &s) { return s.moe && s.T > 1; }
size_t entries_bytes(const XShape &s) { return align256(static_cast<size_t>(s.n_used) * s.T * sizeof(int2)); }
size_t route_bytes(const XShape &s) { return routed(s) ? entries_bytes(s) + align256(static_cast<size_t>(s.max_tiles) * sizeof(int4)) : 0; }
size_t blas_w_bytes(const XShape &s) { return align256(static_cast<size_t>(s.M * s.K) * 2); }
size_t blas_bytes(const XShape &s) { return blas_w_bytes(s) + align256(static_cast<size_t>(s.rows * s.K) * 2); }
// Dense MMQ K splits: their partial results follow the activations.
int mmq_splits(const XShape &s, int n_sm) { return s.mmq && !s.moe ? mmq_i8_k_splits(s.K, s.M, s.rows, n_sm) : 1; }
size_t part_bytes(const XShape &s, int splits) { return splits > 1 ? align256(static_cast<size_t>(splits) * s.rows * s.M * 4) : 0; }

}  // namespace

bool cuda_extra_type(DType t) { return is_extra_type(t); }

size_t cuda_extra_matmul_work_size(const Graph &g, const Node &n, const GpuTuning &tuning, const CudaPaths &paths) {
  const XShape s = xshape(g, n, tuning, paths);
  const size_t ints = act_bytes(s) + route_bytes(s) + part_bytes(s, mmq_splits(s, kPlannedSms));
  return s.blas ? std::max(ints, blas_bytes(s)) : ints;  // either may run (no cuBLAS handle: the integer kernel)
}

bool cuda_extra_heads_supported(const Graph &g, const Node &n) {
  const Node &x = g.node(n.src[1]);
  return x.ne[3] == 1 && n.nb[0] == 4 && n.nb[1] % 4 == 0 && n.nb[2] % 4 == 0 &&
         static_cast<int64_t>(x.ne[1]) * ((x.ne[2] + kXTile - 1) / kXTile) <= 65535;  // grid.y
}

namespace {

// The batches of the int8 MMQ: activations rounded into its per-16 layout, MatMulId's
// entries routed into tiles of kMmaCols, dense K split where the work buffer holds the parts.
void matmul_extra_mmq(const CudaOpCtx &c, const XShape &s) {
  const Node &w = c.src(0), &x = c.src(1);
  const uint8_t *W = static_cast<const uint8_t *>(w.data);
  uint8_t *work = static_cast<uint8_t *>(c.n.work);
  const int K = static_cast<int>(s.K), M = static_cast<int>(s.M);
  int8_t *xq = reinterpret_cast<int8_t *>(work);
  float2 *xs = reinterpret_cast<float2 *>(work + act_q_bytes(s));
  const int64_t units = s.rows * ((s.K + 255) / 256);
  quantize_acts_kernel<<<static_cast<unsigned>((units + kQuantWarps - 1) / kQuantWarps), kQuantWarps * 32, 0, c.stream>>>(
      tview(x), K, units, type_traits(w.type).vec_dot_type == DType::Q8_K, true, xq, xs);
  MOE_CUDA_LAUNCH_CHECK("quantize_acts_kernel");
  float *Y = static_cast<float *>(c.n.data);
  if (!s.moe) {
    int splits = mmq_splits(s, c.n_sm);
    while (splits > 1 && act_bytes(s) + part_bytes(s, splits) > c.n.work_size) --splits;
    float *part = splits > 1 ? reinterpret_cast<float *>(work + act_bytes(s)) : nullptr;
    const int ncols = static_cast<int>(s.rows);
    launch_mmq_i8_matmul(w.type, c.stream, W, w.nb[1], 0, K, M, xq, xs, Y, ncols, nullptr, nullptr, (ncols + kMmaCols - 1) / kMmaCols, part,
                         splits);
    return;
  }
  const Node &ids = c.src(2);
  int2 *entries = reinterpret_cast<int2 *>(work + act_bytes(s));
  int4 *tiles = reinterpret_cast<int4 *>(work + act_bytes(s) + entries_bytes(s));
  cuda_launch_route(c.stream, static_cast<const int32_t *>(ids.data), static_cast<int64_t>(ids.nb[1] / 4), s.n_used, s.T, static_cast<int>(s.E),
                    s.X, s.tile, entries, tiles, s.max_tiles, c.ub.err);
  launch_mmq_i8_matmul(w.type, c.stream, W, w.nb[1], w.nb[2], K, M, xq, xs, Y, 0, tiles, entries, s.max_tiles, nullptr, 1);
}

}  // namespace

void cuda_op_matmul_extra(const CudaOpCtx &c) {
  const Node &w = c.src(0), &x = c.src(1);
  const XShape s = xshape(c.g, c.n, c.tuning, c.paths);
  if (s.M == 0 || s.rows == 0) return;
  if (s.moe && s.E > kCudaMaxExperts) fail(Status::Unsupported, "CUDA MoE: %lld experts (max %d)", (long long)s.E, kCudaMaxExperts);
  const uint8_t *W = static_cast<const uint8_t *>(w.data);
  uint8_t *work = static_cast<uint8_t *>(c.n.work);
  const int K = static_cast<int>(s.K), M = static_cast<int>(s.M);
  const DType vdt = type_traits(w.type).vec_dot_type;
  if (s.blas && c.blas && work && c.n.work_size >= blas_bytes(s)) {
    __half *W16 = reinterpret_cast<__half *>(work);
    __half *X16 = reinterpret_cast<__half *>(work + blas_w_bytes(s));
    launch_dequant_f16_extra(w.type, c.stream, W, w.nb[1], K, M, W16);
    // Q8_1's values are Q8_0's (its s only serves the integer dot's min term).
    launch_act_round(c.stream, tview(x), s.rows, s.K, vdt == DType::Q8_1 ? DType::Q8_0 : vdt, X16, nullptr, false, nullptr, true);
    cuda_blas_gemm_f16(c.blas, M, static_cast<int>(s.rows), K, W16, K, X16, K, static_cast<float *>(c.n.data), M);
    return;
  }
  if (s.mmq) return matmul_extra_mmq(c, s);
  int8_t *xq = reinterpret_cast<int8_t *>(work);
  float2 *xds = reinterpret_cast<float2 *>(work + act_q_bytes(s));
  const int64_t units = s.rows * ((s.K + 255) / 256);
  quantize_acts_kernel<<<static_cast<unsigned>((units + kQuantWarps - 1) / kQuantWarps), kQuantWarps * 32, 0, c.stream>>>(
      tview(x), K, units, vdt == DType::Q8_K, false, xq, xds);
  MOE_CUDA_LAUNCH_CHECK("quantize_acts_kernel");
  float *Y = static_cast<float *>(c.n.data);
  const unsigned gx = static_cast<unsigned>((s.M + kXWarps - 1) / kXWarps);
  XCols cols{};
  if (s.heads) {
    const int nt = s.T == 1 ? 1 : kXTile;
    cols.H = s.X;
    cols.T = s.T;
    cols.tiles_per_head = (s.T + nt - 1) / nt;
    cols.y_nb1 = static_cast<int64_t>(c.n.nb[1] / 4);
    cols.y_nb2 = static_cast<int64_t>(c.n.nb[2] / 4);
    const dim3 grid(gx, static_cast<unsigned>(s.X * cols.tiles_per_head));
    if (nt == 1) launch_dot<1>(w.type, grid, c.stream, W, w.nb[1], w.nb[2], K, M, xq, xds, Y, cols);
    else launch_dot<kXTile>(w.type, grid, c.stream, W, w.nb[1], w.nb[2], K, M, xq, xds, Y, cols);
    return;
  }
  if (!s.moe) {
    cols.ncols = static_cast<int>(s.rows);
    if (s.rows == 1)
      launch_dot<1>(w.type, dim3(gx, 1), c.stream, W, w.nb[1], 0, K, M, xq, xds, Y, cols);
    else
      launch_dot<kXTile>(w.type, dim3(gx, static_cast<unsigned>((s.rows + kXTile - 1) / kXTile)), c.stream, W, w.nb[1], 0, K, M, xq, xds, Y,
                         cols);
    return;
  }
  const Node &ids = c.src(2);
  cols.X = s.X;
  cols.E = static_cast<int>(s.E);
  cols.err = c.ub.err;
  if (!routed(s)) {  // one token: its n_used experts straight from ids
    cols.ids = static_cast<const int32_t *>(ids.data);
    launch_dot<1>(w.type, dim3(gx, static_cast<unsigned>(s.n_used)), c.stream, W, w.nb[1], w.nb[2], K, M, xq, xds, Y, cols);
    return;
  }
  int2 *entries = reinterpret_cast<int2 *>(work + act_bytes(s));
  int4 *tiles = reinterpret_cast<int4 *>(work + act_bytes(s) + entries_bytes(s));
  cuda_launch_route(c.stream, static_cast<const int32_t *>(ids.data), static_cast<int64_t>(ids.nb[1] / 4), s.n_used, s.T, cols.E, s.X, s.tile,
                    entries, tiles, s.max_tiles, c.ub.err);
  cols.tiles = tiles;
  cols.entries = entries;
  launch_dot<kXTile>(w.type, dim3(gx, static_cast<unsigned>(s.max_tiles)), c.stream, W, w.nb[1], w.nb[2], K, M, xq, xds, Y, cols);
}

void cuda_op_get_rows_extra(const CudaOpCtx &c) {
  const Node &tab = c.src(0), &ids = c.src(1);
  const int64_t n = ids.ne[0], n_sub = tab.ne[0] / 32;
  if (n == 0 || n_sub == 0) return;
  const dim3 grid(static_cast<unsigned>((n_sub + 127) / 128), static_cast<unsigned>(n));
  switch (tab.type) {
#define MOE_ROWS_CASE(TY) \
  case TY: extra_get_rows_kernel<TY><<<grid, 128, 0, c.stream>>>(tview(tab), tview(ids), tview(c.n), n_sub, c.ub.err); break;
    MOE_EXTRA_TYPES(MOE_ROWS_CASE)
#undef MOE_ROWS_CASE
    default: fail(Status::Internal, "CUDA get_rows (extra types): type %s not dispatched", dtype_name(tab.type));
  }
  MOE_CUDA_LAUNCH_CHECK("extra_get_rows_kernel");
}

// ---- one-token fused groups: the launchers ---------------------------------------------

namespace {

const float *f32_of(const Node &n) { return static_cast<const float *>(n.data); }
bool f32_row_of(const Node &n, int64_t len) { return n.type == DType::F32 && n.nb[0] == 4 && n.ne[0] == len && n.nb[1] % 4 == 0; }
// rows activation rows of K values fit a block's shared rounding (FusedActs).
bool fused_acts_fit(const Node &x, int64_t K, int64_t rows) { return f32_row_of(x, K) && K % 32 == 0 && rows * K <= kFMaxVals; }
bool acts_q8k(DType t) { return type_traits(t).vec_dot_type == DType::Q8_K; }
bool same_weights(const Node &a, const Node &b) {
  for (int d = 0; d < 4; ++d)
    if (a.ne[d] != b.ne[d] || a.nb[d] != b.nb[d]) return false;
  return a.type == b.type;
}
// A one-token MatMulId's ids [n_used, 1] and activation rows X (1 or n_used), or false.
bool one_token_ids(const Graph &g, const Node &mm, int &n_used, int &X) {
  const Node &ids = g.node(mm.src[2]), &x = g.node(mm.src[1]), &w = g.node(mm.src[0]);
  n_used = static_cast<int>(ids.ne[0]);
  X = static_cast<int>(x.ne[1]);
  return ids.type == DType::I32 && ids.nb[0] == 4 && ids.ne[1] == 1 && ids.ne[2] == 1 && x.ne[2] == 1 && x.ne[3] == 1 &&
         (X == 1 || X == n_used) && ids.ne[0] <= 65535 && w.ne[2] <= kCudaMaxExperts;
}

}  // namespace

bool cuda_extra_fused_gate_up(const CudaOpCtx &c, const Node &gate, const Node &up, const Node &swiglu) {
  const Node &wg = c.g.node(gate.src[0]), &wu = c.g.node(up.src[0]), &x = c.g.node(gate.src[1]);
  const bool moe = gate.op == Op::MatMulId;
  if (!is_extra_type(wg.type) || !same_weights(wg, wu) || gate.op != up.op || gate.src[1] != up.src[1]) return false;
  if (moe ? gate.src[2] != up.src[2] : gate.op != Op::MatMul || x.ne[1] * x.ne[2] * x.ne[3] != 1) return false;
  const int64_t K = wg.ne[0], M = wg.ne[1];
  int slots = 1, X = 1;
  if (moe && !one_token_ids(c.g, gate, slots, X)) return false;
  if (!fused_acts_fit(x, K, 1) || !f32_row_of(swiglu, M) || swiglu.ne[1] != slots || M > (1 << 30)) return false;
  if (M == 0 || slots == 0) return true;
  const dim3 grid(static_cast<unsigned>((M + kFWarps - 1) / kFWarps), static_cast<unsigned>(slots));
  const uint8_t *Wg = static_cast<const uint8_t *>(wg.data), *Wu = static_cast<const uint8_t *>(wu.data);
  const int32_t *ids = moe ? static_cast<const int32_t *>(c.g.node(gate.src[2]).data) : nullptr;
  const int64_t rb = static_cast<int64_t>(wg.nb[1]), eb = moe ? static_cast<int64_t>(wg.nb[2]) : 0, xs = static_cast<int64_t>(x.nb[1] / 4);
  const int E = moe ? static_cast<int>(wg.ne[2]) : 1;
  float *out = static_cast<float *>(swiglu.data);
  const int64_t ys = static_cast<int64_t>(swiglu.nb[1] / 4);
  switch (wg.type) {
#define MOE_GATE_UP_CASE(TY)                                                                                                                   \
  case TY:                                                                                                                                     \
    launch_pdl(extra_gate_up_kernel<TY>, grid, dim3(kFWarps * 32), 0, c.stream, Wg, Wu, rb, eb, static_cast<int>(K), static_cast<int>(M), \
               f32_of(x), xs, X, ids, E, c.ub.err, acts_q8k(TY), out, ys);                                                                \
    break;
    MOE_EXTRA_TYPES(MOE_GATE_UP_CASE)
#undef MOE_GATE_UP_CASE
    default: return false;
  }
  return true;
}

bool cuda_extra_fused_down(const CudaOpCtx &c, const Node &down, const Node &combine, const Node *add) {
  const Node &w = c.g.node(down.src[0]), &x = c.g.node(down.src[1]), &cw = c.g.node(combine.src[1]);
  if (down.op != Op::MatMulId || !is_extra_type(w.type) || &c.g.node(combine.src[0]) != &down) return false;
  const int64_t K = w.ne[0], M = w.ne[1];
  int slots = 0, X = 0;
  if (!one_token_ids(c.g, down, slots, X) || slots < 1 || slots > kFMaxSlots || !fused_acts_fit(x, K, X) || M > (1 << 30)) return false;
  if (!f32_row_of(cw, slots) || !f32_row_of(combine, M) || combine.ne[1] * combine.ne[2] * combine.ne[3] != 1) return false;
  const Node *other = nullptr;
  if (add) {
    other = &c.g.node(add->src[0]) == &combine ? &c.g.node(add->src[1]) : &c.g.node(add->src[0]);
    if (!f32_row_of(*add, M) || !f32_row_of(*other, M)) return false;
  }
  if (M == 0) return true;
  const dim3 grid(static_cast<unsigned>((M + kFDownRows - 1) / kFDownRows));
  const uint8_t *W = static_cast<const uint8_t *>(w.data);
  const int32_t *ids = static_cast<const int32_t *>(c.g.node(down.src[2]).data);
  const int64_t rb = static_cast<int64_t>(w.nb[1]), eb = static_cast<int64_t>(w.nb[2]), xs = static_cast<int64_t>(x.nb[1] / 4);
  const float *radd = other ? f32_of(*other) : nullptr;
  float *out = static_cast<float *>(add ? add->data : combine.data);
  switch (w.type) {
#define MOE_DOWN_CASE(TY)                                                                                                                  \
  case TY:                                                                                                                                 \
    launch_pdl(extra_down_kernel<TY>, grid, dim3(kFWarps * 32), 0, c.stream, W, rb, eb, static_cast<int>(K), static_cast<int>(M), f32_of(x), \
               xs, X, ids, slots, static_cast<int>(w.ne[2]), c.ub.err, acts_q8k(TY), f32_of(cw), radd, out);                                \
    break;
    MOE_EXTRA_TYPES(MOE_DOWN_CASE)
#undef MOE_DOWN_CASE
    default: return false;
  }
  return true;
}

bool cuda_extra_fused_matmul_add(const CudaOpCtx &c, const Node &mm, const Node &add) {
  const Node &w = c.g.node(mm.src[0]), &x = c.g.node(mm.src[1]);
  if (mm.op != Op::MatMul || !is_extra_type(w.type) || x.ne[1] * x.ne[2] * x.ne[3] != 1) return false;
  const int64_t K = w.ne[0], M = w.ne[1];
  const Node &other = &c.g.node(add.src[0]) == &mm ? c.g.node(add.src[1]) : c.g.node(add.src[0]);
  if (!fused_acts_fit(x, K, 1) || !f32_row_of(add, M) || !f32_row_of(other, M) || M > (1 << 30)) return false;
  if (M == 0) return true;
  const dim3 grid(static_cast<unsigned>((M + kFWarps - 1) / kFWarps));
  const uint8_t *W = static_cast<const uint8_t *>(w.data);
  switch (w.type) {
#define MOE_MM_ADD_CASE(TY)                                                                                                            \
  case TY:                                                                                                                             \
    launch_pdl(extra_matmul_add_kernel<TY>, grid, dim3(kFWarps * 32), 0, c.stream, W, static_cast<int64_t>(w.nb[1]), static_cast<int>(K), \
               static_cast<int>(M), f32_of(x), acts_q8k(TY), f32_of(other), static_cast<float *>(add.data));                          \
    break;
    MOE_EXTRA_TYPES(MOE_MM_ADD_CASE)
#undef MOE_MM_ADD_CASE
    default: return false;
  }
  return true;
}

int cuda_extra_matvec_group_key(DType t) { return is_extra_type(t) ? 1000 + static_cast<int>(t) : 0; }

bool cuda_extra_fused_matvecs(const CudaOpCtx &c, const std::vector<int> &members) {
  const Node &first = c.g.node(members.front());
  const Node &x = c.g.node(first.src[1]);
  const DType t = c.g.node(first.src[0]).type;
  const int64_t K = c.g.node(first.src[0]).ne[0];
  if (!is_extra_type(t) || !fused_acts_fit(x, K, 1) || x.ne[1] * x.ne[2] * x.ne[3] != 1) return false;
  XSegs segs{};
  int blocks = 0;
  for (size_t k = 0; k < members.size(); ++k) {
    const Node &mm = c.g.node(members[k]);
    if (mm.op == Op::Add && segs.n > 0) {  // Add(product, row) right after its MatMul: the row joins that segment
      XSeg &prev = segs.s[segs.n - 1];
      const Node &pm = c.g.node(members[k - 1]);
      const bool first_src = &c.g.node(mm.src[0]) == &pm;
      const Node &row = c.g.node(first_src ? mm.src[1] : mm.src[0]);
      if (pm.op != Op::MatMul || (!first_src && &c.g.node(mm.src[1]) != &pm) || prev.add || !f32_row_of(row, prev.M) || !f32_row_of(mm, prev.M))
        return false;
      prev.add = f32_of(row);
      prev.y = static_cast<float *>(mm.data);
      continue;
    }
    const Node &w = c.g.node(mm.src[0]);
    if (segs.n == kMaxFusedMatVecs || mm.op != Op::MatMul || mm.src[1] != first.src[1] || w.type != t || w.ne[0] != K || w.ne[1] > (1 << 30) ||
        !f32_row_of(mm, w.ne[1]))
      return false;
    segs.s[segs.n++] = XSeg{static_cast<const uint8_t *>(w.data), static_cast<int64_t>(w.nb[1]), static_cast<float *>(mm.data), nullptr,
                            static_cast<int>(w.ne[1]), blocks};
    blocks += static_cast<int>((w.ne[1] + kFWarps - 1) / kFWarps);
  }
  if (blocks == 0) return true;
  switch (t) {
#define MOE_MATVECS_CASE(TY)                                                                                                            \
  case TY:                                                                                                                              \
    launch_pdl(extra_matvecs_kernel<TY>, dim3(static_cast<unsigned>(blocks)), dim3(kFWarps * 32), 0, c.stream, segs, static_cast<int>(K), \
               f32_of(x), acts_q8k(TY));                                                                                                \
    break;
    MOE_EXTRA_TYPES(MOE_MATVECS_CASE)
#undef MOE_MATVECS_CASE
    default: return false;
  }
  return true;
}

}  // namespace moe
