// Small-batch products of the reference-order types (matmul_ref_order.h): a warp per weight
// row, its columns one after another, each folded by matvec_ref_order.cuh's code in passes
// of 4 fold blocks (one piece per lane) straight from the GGUF blocks in device memory; the
// other columns of a tile re-read the row from L1 / L2. Bit-identical with the CPU's
// ref_order_dot_rows on the path ref_order_path gives each column.
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops/matmul_ref_order.h"
#include "backends/cuda/ops/matvec_ref_order.cuh"
#include "backends/cuda/ops/ref_math.cuh"
#include "graph/ir.h"

#include <algorithm>

namespace moe {

namespace {

constexpr int kRefWarps = 4;  // weight rows per block

template <DType T>
__global__ void __launch_bounds__(kRefWarps * 32) mmv_ref_kernel(const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                                                                 const int8_t *xq, const float2 *xs, float *Y, int ncols, int gemm_cols, int NT,
                                                                 const int4 *tiles, const int2 *entries) {
  constexpr int FB = ref_fold_elems<T>, BS = BlockInfo<T>::bytes;
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kRefWarps + (threadIdx.x >> 5);  // warp-uniform
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
  const uint8_t *wrow = W + expert * expert_bytes + static_cast<int64_t>(row) * row_bytes;
  const int nfb = K / FB;
  const bool repack = T == DType::Q4_K && ref_q4k_repacked(M);
  for (int c = 0; c < cnt; ++c) {
    const int2 e = entries ? entries[first + c] : make_int2(first + c, first + c);
    const XGlobalAct xa{xq + static_cast<int64_t>(e.x) * K, xs + static_cast<int64_t>(e.x) * (K / 16)};
    const bool gemm = repack && entries == nullptr && first + c < gemm_cols;  // warp-uniform
    float acc = 0.0f, accm = 0.0f;
    for (int i0 = 0; i0 < nfb; i0 += 4) {
      const uint8_t *cb = wrow + static_cast<int64_t>(i0) * BS;
      const int n = min(4, nfb - i0);
      bool done = false;
      if constexpr (T == DType::Q4_K) {
        if (gemm) {
          ref_q4k_gemm_pass(cb, n, i0 * FB, xa, acc, accm);
          done = true;
        }
      }
      if (!done) ref_chunk<T, 4 * FB>(cb, n * FB, i0 * FB, xa, repack, acc, accm);
    }
    // (gemm: every lane holds both accumulators, ref_q4k_gemm_pass)
    const float v = gemm ? acc - accm : ref_finish<T>(acc, accm, repack);
    if (lane == 0) Y[static_cast<int64_t>(e.y) * M + row] = v;
  }
}

// Dense F32: a warp per row, its columns one after another (launch_mmv_ref_f32).
__global__ void __launch_bounds__(kRefWarps * 32) mmv_ref_f32_kernel(const float *W, int64_t row_stride, int K, int M, const float *X,
                                                                     float *Y, int ncols, int NT, bool gemm16) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kRefWarps + (threadIdx.x >> 5);  // warp-uniform
  const int first = blockIdx.y * NT, cnt = min(NT, ncols - first);
  if (cnt <= 0 || row >= M) return;
  const float *w = W + static_cast<int64_t>(row) * row_stride;
  for (int c = 0; c < cnt; ++c) {
    const float *x = X + static_cast<int64_t>(first + c) * K;
    const float v = gemm16 ? ref_dot_f32_gemm_row(w, x, K) : ref_dot_f32_row(w, x, K);
    if (lane == 0) Y[static_cast<int64_t>(first + c) * M + row] = v;
  }
}

}  // namespace

int cuda_ref_order_tokens(const Graph &g, const GpuTuning &tuning) {
  return g.cpu_float_order ? std::max(tuning.ref_order_max_tokens, 0) : 0;
}

bool cuda_own_order_product(const Node &n, const GpuTuning &tuning) {
  return (n.op == Op::MatMul || n.op == Op::MatMulId) && n.final_output && tuning.own_order_head;
}

void launch_mmv_ref_f32(cudaStream_t s, const float *W, int64_t row_stride, int K, int M, const float *X, float *Y, int ncols, int NT,
                        bool gemm16) {
  const dim3 grid(static_cast<unsigned>((M + kRefWarps - 1) / kRefWarps), static_cast<unsigned>((ncols + NT - 1) / NT)), block(kRefWarps * 32);
  mmv_ref_f32_kernel<<<grid, block, 0, s>>>(W, row_stride, K, M, X, Y, ncols, NT, gemm16);
  MOE_CUDA_LAUNCH_CHECK("mmv_ref_f32_kernel");
}

void launch_mmv_ref(DType t, cudaStream_t s, const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M, const int8_t *Xq,
                    const float2 *Xs, float *Y, int ncols, int gemm_cols, int NT, const int4 *tiles, const int2 *entries, int n_col_tiles) {
  const dim3 grid(static_cast<unsigned>((M + kRefWarps - 1) / kRefWarps), static_cast<unsigned>(n_col_tiles)), block(kRefWarps * 32);
  switch (t) {
#define MOE_REF_CASE(TY)                                                                                                     \
  case TY: mmv_ref_kernel<TY><<<grid, block, 0, s>>>(W, row_bytes, expert_bytes, K, M, Xq, Xs, Y, ncols, gemm_cols, NT, tiles, entries); \
    break;
    MOE_REF_CASE(DType::Q4_K)
    MOE_REF_CASE(DType::Q5_K)
    MOE_REF_CASE(DType::Q6_K)
    MOE_REF_CASE(DType::Q8_0)
#undef MOE_REF_CASE
    default: fail(Status::Internal, "CUDA reference-order matmul: type %s not dispatched", dtype_name(t));
  }
  MOE_CUDA_LAUNCH_CHECK("mmv_ref_kernel");
}

}  // namespace moe
