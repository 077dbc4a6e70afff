// Tensor-core GEMM for quantized weights (prefill MatMul / MatMulId) whose products are
// exact, on f16 mma for the types whose integers need more than int8 once their group scale
// is folded in (Q2_K, Q3_K; the others, MXFP4 included, use int8
// mma, matmul_mmq_i8.cu): per group of 16 or 32 consecutive weights of a row, w = a q + b with small integer q
// (unpack32<T>), and per activation block x = c qx with int8 qx (the Q8_0 / Q8_K rounding
// of act_round_kernel, emitted as f16 integers plus per-16 (c, X = sum qx)). An m16n8k16
// f16 mma of q against qx into a zeroed fragment yields S = sum q qx exactly (|S| <= 32 *
// 127 * 127 < 2^24), which is folded into f32 accumulators as acc += S (a c) + b (c X).
// So the only roundings are f32 ones, as in the f32 mat-vec kernels, unlike an f16
// dequantized tile, whose ~2^-12 per term broke conformance.
// The fold (a multiply and an FMA per output) is the cost over a plain f16 GEMM, so it is
// done once per K step (fold_k_step); the min terms b c X of Q2_K are one
// more exact mma per 256-block (fold_mins).
// Tiling, column tiles (dense range or MatMulId routing tile), loads and stores are those
// of matmul_mma.cu (mma_common.cuh): 128 rows x 64 columns per block, 8 warps of 32 x 32.
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops/matmul_mma.h"
#include "backends/cuda/ops/arch_guard.cuh"
#include "backends/cuda/ops/mma_common.cuh"
#include "backends/cuda/ops/mmq_weights.cuh"
#include "backends/cuda/ops/quant.cuh"

namespace moe {

namespace {

using namespace mma_tile;
using namespace mmq;

constexpr int kGroups = kBK / 16;  // k16 scale groups per K step
// Scale rows padded to 5 float2 (40 bytes): the 8 rows (or 4 columns) a warp reads at once
// fall on distinct banks.
constexpr int kSld = kGroups + 1;
// Min integers m and activation sums X of the 16 k16 groups of a 256-block (types with a
// min term), f16; 48-byte rows put the 8 rows of an ldmatrix phase on distinct bank quads.
constexpr int kMinLd = 16 + 8;

// One fold (an f32 rescale of an exact integer sum) per K step: 64 weights inside one
// 256-block of Q2_K / Q3_K, whose group scale is d * sc with a small integer sc, which is
// multiplied into the weight integers (|sc q| <= 32 * 4, exact in f16; per step |S| <= 64 *
// 128 * 127 < 2^24), leaving d and the Q8_K block's c.

// The per-thread share of one K step, staged in registers: 32 weight integers of one row
// (f16 pairs) with the (scale, min scale) of their two k16 groups and their min integers
// (f16 pair; types with a min term); 16 activation integers of one column (f16) with the
// (c, X) of their k16 group.
struct QStage {
  uint32_t w[16];
  float2 ws[2];
  uint32_t m;
  uint4 x[2];
  float2 xs;
};

// Thread -> (row tid / 2, sub-block (k0 + 32 (tid % 2)) / 32). K is a multiple of 32 for
// every quantized type: a sub-block is whole or past K (zero, like rows past M).
template <DType T>
__device__ __forceinline__ void fetch_qweights(QStage &st, const uint8_t *W, int64_t row_bytes, int row0, int M, int K, int k0) {
  const int row = row0 + (threadIdx.x >> 1);
  const int kb = k0 + (threadIdx.x & 1) * 32;
  if (row >= M || kb >= K) {
#pragma unroll
    for (int i = 0; i < 16; ++i) st.w[i] = 0;
    st.ws[0] = st.ws[1] = make_float2(0.0f, 0.0f);
    st.m = 0;
    return;
  }
  stage_subblock<T>(W + static_cast<int64_t>(row) * row_bytes, kb / 32, st.w, st.ws, st.m);
}

// Thread -> (column tid / 4, k16 group k0 / 16 + tid % 4). xrow < 0 (a column past the
// tile's count) and groups past K are zero.
__device__ __forceinline__ void fetch_qacts(QStage &st, const uint16_t *Xq, const float2 *Xs, int xrow, int K, int k0) {
  const int kb = k0 + (threadIdx.x & 3) * 16;
  if (xrow < 0 || kb >= K) {
    st.x[0] = st.x[1] = make_uint4(0u, 0u, 0u, 0u);
    st.xs = make_float2(0.0f, 0.0f);
    return;
  }
  const uint4 *src = reinterpret_cast<const uint4 *>(Xq + static_cast<int64_t>(xrow) * K + kb);
  st.x[0] = __ldg(src);
  st.x[1] = __ldg(src + 1);
  st.xs = __ldg(Xs + static_cast<int64_t>(xrow) * (K / 16) + kb / 16);
}

// s4: the K step's place in its 256-block (min integers and sums go to its 4 groups there).
template <DType T>
__device__ __forceinline__ void store_qstage(const QStage &st, uint16_t (*sA)[kLd], uint16_t (*sB)[kLd], float2 (*sWs)[kSld],
                                             float2 (*sXs)[kSld], uint16_t (*sMA)[kMinLd], uint16_t (*sMB)[kMinLd], int s4) {
  const int tid = threadIdx.x;
  uint4 *a = reinterpret_cast<uint4 *>(&sA[tid >> 1][(tid & 1) * 32]);
#pragma unroll
  for (int q = 0; q < 4; ++q) a[q] = make_uint4(st.w[4 * q], st.w[4 * q + 1], st.w[4 * q + 2], st.w[4 * q + 3]);
  sWs[tid >> 1][2 * (tid & 1)] = st.ws[0];
  sWs[tid >> 1][2 * (tid & 1) + 1] = st.ws[1];
  uint4 *b = reinterpret_cast<uint4 *>(&sB[tid >> 2][(tid & 3) * 16]);
  b[0] = st.x[0];
  b[1] = st.x[1];
  sXs[tid >> 2][tid & 3] = st.xs;
  if constexpr (has_min<T>) {
    *reinterpret_cast<uint32_t *>(&sMA[tid >> 1][4 * s4 + 2 * (tid & 1)]) = st.m;
    sMB[tid >> 2][4 * s4 + (tid & 3)] = __half_as_ushort(__float2half_rn(st.xs.y));  // |X| <= 2032: exact
  }
}

// One fold per K step: the 4 k16 mmas of each (mi, ni) into one
// exact sum, then acc += S (d c).
template <DType T>
__device__ __forceinline__ void fold_k_step(float (&acc)[2][4][4], const uint16_t (*sA)[kLd], const uint16_t (*sB)[kLd],
                                            const float2 (*sWs)[kSld], const float2 (*sXs)[kSld], const WarpTile &wt) {
  const int lane = wt.lane, wm = wt.wm, wn = wt.wn, n_live = wt.n_live;
  float sum[2][4][4];
  zero_tile(sum);
  mma_k_step<false>(sum, sA, sB, wt);
  const int g = lane >> 2, t = lane & 3;
  float d[2][2];  // d of this thread's rows g and g + 8 of each 16-row tile
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) d[mi][h] = sWs[wm + 16 * mi + g + 8 * h][0].x;
#pragma unroll
  for (int ni = 0; ni < 4; ++ni) {
    if (ni * 8 >= n_live) continue;
    float c[2];  // c of this thread's columns 2t, 2t + 1 (one Q8_K block per step)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) c[cc] = sXs[wn + ni * 8 + 2 * t + cc][0].x;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = fmaf(sum[mi][ni][e], d[mi][e >> 1] * c[e & 1], acc[mi][ni][e]);
  }
}

// Min terms of a whole 256-block (Q2_K), after its last K step: sum over its
// 16 k16 groups of b c X = -(dmin c) sum_g m_g X_g, the integer sum by one mma (m <= 63 and
// |X| <= 2032 are exact in f16, |sum| <= 16 * 63 * 2032 < 2^24).
template <DType T>
__device__ __forceinline__ void fold_mins(float (&acc)[2][4][4], const uint16_t (*sMA)[kMinLd], const uint16_t (*sMB)[kMinLd],
                                          const float2 (*sWs)[kSld], const float2 (*sXs)[kSld], const WarpTile &wt) {
  const int lane = wt.lane, wm = wt.wm, wn = wt.wn, n_live = wt.n_live;
  uint32_t a[2][4], b[4][2];
  load_frags_k16(a, b, sMA, sMB, wm, wn, 0, lane);
  const int g = lane >> 2, t = lane & 3;
  float dmin[2][2];  // of this thread's rows g and g + 8 of each 16-row tile
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) dmin[mi][h] = sWs[wm + 16 * mi + g + 8 * h][0].y;
#pragma unroll
  for (int ni = 0; ni < 4; ++ni) {
    if (ni * 8 >= n_live) continue;
    float c[2];
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) c[cc] = sXs[wn + ni * 8 + 2 * t + cc][0].x;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma16816<false>(sum, a[mi], b[ni]);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = fmaf(-sum[e], dmin[mi][e >> 1] * c[e & 1], acc[mi][ni][e]);
    }
  }
}

// grid: (ceil(M / 128), column tiles), as launch_mma_matmul.
template <DType T>
__global__ void __launch_bounds__(kThreads, 2) mmq_matmul_kernel(const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                                                                  const uint16_t *Xq, const float2 *Xs, float *Y, int ncols,
                                                                  const int4 *tiles, const int2 *entries) {
#if MOE_CUDA_TENSOR_CORE_CODE
  // Activation blocks (32 or 256) are multiples of 32 and aligned, so a fold has one c.
  // sA[row][k]: weight integers (mma A, row-major). sB[col][k]: activation integers (mma B,
  // column-major). sWs[row][g] = (a or d, dmin), sXs[col][g] = (c, X) of k16 group g of the step.
  __shared__ __align__(16) uint16_t sA[kBM][kLd];
  __shared__ __align__(16) uint16_t sB[kBN][kLd];
  __shared__ float2 sWs[kBM][kSld];
  __shared__ float2 sXs[kBN][kSld];
  // sMA[row][g] = m, sMB[col][g] = X of k16 group g of the current 256-block (min terms).
  __shared__ __align__(16) uint16_t sMA[has_min<T> ? kBM : 1][kMinLd];
  __shared__ __align__(16) uint16_t sMB[has_min<T> ? kBN : 1][kMinLd];
  __shared__ int s_xrow[kBN], s_yrow[kBN];

  const ColTile ct = begin_col_tile(ncols, tiles, entries, s_xrow, s_yrow);
  const int cnt = ct.cnt, tid = threadIdx.x;
  if (cnt <= 0) return;

  const int row0 = blockIdx.x * kBM;
  const uint8_t *We = W + ct.expert * expert_bytes;
  const int xrow = s_xrow[tid >> 2];

  const WarpTile wt = warp_tile(cnt, row0, M);
  float acc[2][4][4];
  zero_tile(acc);

  // Register-staged pipeline as in matmul_mma.cu: the next step's loads and unpacking are
  // issued before this step's mma (the last fetch re-reads the last step, unused).
  QStage st;
  fetch_qweights<T>(st, We, row_bytes, row0, M, K, 0);
  fetch_qacts(st, Xq, Xs, xrow, K, 0);
  for (int k0 = 0; k0 < K; k0 += kBK) {
    const int s4 = (k0 / kBK) & 3;  // K step within its 256-block
    store_qstage<T>(st, sA, sB, sWs, sXs, sMA, sMB, s4);
    __syncthreads();
    const int kn = k0 + kBK < K ? k0 + kBK : k0;
    fetch_qweights<T>(st, We, row_bytes, row0, M, K, kn);
    fetch_qacts(st, Xq, Xs, xrow, K, kn);
    prefetch_weights_l2(We, row_bytes, row0, M, K, k0 + 3 * kBK);
    if (wt.live) {
      static_assert(has_int_group_scale<T>, "one fold per K step");
      fold_k_step<T>(acc, sA, sB, sWs, sXs, wt);
      if constexpr (has_min<T>)
        if (s4 == 3) fold_mins<T>(acc, sMA, sMB, sWs, sXs, wt);  // K is a multiple of 256
    }
    __syncthreads();
  }

  if (!wt.live) return;
  store_warp_tile(acc, Y, s_yrow, M, cnt, row0 + wt.wm, wt.wn, wt.lane);
#else
  __trap();  // sm_75 code: never launched (cuda_paths.h)
#endif
}

// Test hook: sub-block s of `row` three ways, dequant32 into w[32 s ..], unpack32 into
// q[32 s ..] and ab[4 s ..] = (a0, a1, b0, b1), and the kernel's staging (stage_subblock)
// decoded back to weights into staged[32 s ..].
template <DType T> __global__ void unpack_check_kernel(const uint8_t *row, int n_sub, float *w, int *q, float *ab, float *staged) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n_sub) return;
  dequant32<T>(row, s, w + 32 * s);
  unpack32<T>(row, s, q + 32 * s, ab + 4 * s, ab + 4 * s + 2);
  QStage st;
  stage_subblock<T>(row, s, st.w, st.ws, st.m);
  __half2 m2;
  memcpy(&m2, &st.m, 4);
  const float m[2] = {__low2float(m2), __high2float(m2)};
  for (int l = 0; l < 32; ++l) {
    __half2 h;
    memcpy(&h, &st.w[l / 2], 4);
    const float v = (l & 1) ? __high2float(h) : __low2float(h);
    const float2 sc = st.ws[l / 16];
    staged[32 * s + l] = sc.x * v - sc.y * m[l / 16];
  }
}

}  // namespace

bool cuda_mmq_type_supported(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q8_0: case DType::MXFP4: case DType::Q2_K: case DType::Q3_K: case DType::Q4_K:
    case DType::Q5_K: case DType::Q6_K: return true;
    default: return false;
  }
}

#define MOE_MMQ_TYPES(X) X(DType::Q2_K) X(DType::Q3_K)

void launch_mmq_matmul(DType t, const LaunchStream &s, const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                       const void *Xq, const float2 *Xs, float *Y, int ncols, const int4 *tiles, const int2 *entries,
                       int n_col_tiles, float *part, int k_splits) {
  if (cuda_mmq_int8_type(t))
    return launch_mmq_i8_matmul(t, s, W, row_bytes, expert_bytes, K, M, static_cast<const int8_t *>(Xq), Xs, Y, ncols, tiles, entries,
                                n_col_tiles, part, k_splits);
  if (n_col_tiles <= 0 || M <= 0) return;
  const dim3 grid(static_cast<unsigned>((M + kBM - 1) / kBM), static_cast<unsigned>(n_col_tiles));
#define MOE_MMQ_CASE(TY) \
  case TY: mmq_matmul_kernel<TY><<<grid, kThreads, 0, s>>>(W, row_bytes, expert_bytes, K, M, static_cast<const uint16_t *>(Xq), Xs, Y, \
                                                   ncols, tiles, entries);                                                    \
    break;
  switch (t) {
    MOE_MMQ_TYPES(MOE_MMQ_CASE)
    default: fail(Status::Internal, "CUDA MMQ matmul: type %s not dispatched", dtype_name(t));
  }
#undef MOE_MMQ_CASE
  MOE_CUDA_LAUNCH_CHECK("mmq_matmul_kernel");
}

void cuda_unpack32_check_launch(DType t, const uint8_t *d_row, int n_sub, float *d_w, int *d_q, float *d_ab, float *d_staged,
                                cudaStream_t s) {
  if (cuda_mmq_int8_type(t)) return cuda_i8_unpack_check_launch(t, d_row, n_sub, d_w, d_q, d_ab, d_staged, s);
  const unsigned blocks = static_cast<unsigned>((n_sub + 63) / 64);
#define MOE_UNPACK_CASE(TY) \
  case TY: unpack_check_kernel<TY><<<blocks, 64, 0, s>>>(d_row, n_sub, d_w, d_q, d_ab, d_staged); break;
  switch (t) {
    MOE_MMQ_TYPES(MOE_UNPACK_CASE)
    default: fail(Status::Internal, "unpack32 check: type %s not dispatched", dtype_name(t));
  }
#undef MOE_UNPACK_CASE
  MOE_CUDA_LAUNCH_CHECK("unpack_check_kernel");
}
#undef MOE_MMQ_TYPES

}  // namespace moe
