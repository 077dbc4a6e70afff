// Row reductions shared by the RmsNorm / Softmax kernels (elementwise.cu) and the fused
// kernels (fused.cu), so a fused chain computes exactly the bits of the unfused ops: the
// block size, the per-thread stride and the reduction order are part of the result.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/ops/reduce.cuh"
#include "backends/cuda/ops/ref_math.cuh"

namespace moe {

// Threads per block of the row kernels for rows of n values.
__host__ __device__ inline int row_threads(int64_t n) { return n >= 256 ? 256 : n > 64 ? 128 : 64; }

// 1 / rms of a row as the RmsNorm kernel computes it: threads [0, nthr) sum x*x (float
// product, double sum) with stride nthr; threads past nthr add zeros (same bits as a block
// of nthr). Block-wide: every thread calls it; sh holds 32 doubles.
__device__ __forceinline__ float rms_row_scale(const float *src, int n, float eps, int nthr, double *sh) {
  double s = 0.0;
  if (static_cast<int>(threadIdx.x) < nthr)
    for (int i = threadIdx.x; i < n; i += nthr) s += static_cast<double>(src[i] * src[i]);
  s = blk_sum(s, sh);
  return 1.0f / sqrtf(static_cast<float>(s / static_cast<double>(n)) + eps);
}

// rms_row_scale's bits computed by one warp (all 32 lanes call it; every lane gets the
// value): lane l plays thread 32 v + l of each of the nthr / 32 warps v of a block of nthr
// (nthr = row_threads(n) <= 256), with the same strided double sums, the same xor butterfly
// per warp and the warp sums added in warp order, as blk_sum does.
__device__ __forceinline__ float rms_row_scale_warp(const float *src, int n, float eps, int nthr) {
  constexpr int kMaxWarps = 8;
  const int lane = threadIdx.x & 31, nw = nthr >> 5;
  double s[kMaxWarps];
#pragma unroll
  for (int v = 0; v < kMaxWarps; ++v) {
    s[v] = 0.0;
    if (v < nw)
      for (int i = 32 * v + lane; i < n; i += nthr) s[v] += static_cast<double>(src[i] * src[i]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int v = 0; v < kMaxWarps; ++v)
      if (v < nw) s[v] += __shfl_xor_sync(0xffffffffu, s[v], o);  // warp-uniform condition
  double t = 0;
#pragma unroll
  for (int v = 0; v < kMaxWarps; ++v)
    if (v < nw) t += s[v];
  return 1.0f / sqrtf(static_cast<float>(t / static_cast<double>(n)) + eps);
}

constexpr int kWeightRegs = 8;  // Mul weights a thread holds in registers (rows up to 8 x the block size)

// dst[i] = src[i] for i < n (global -> shared), thread tid of nthr taking i = tid + k nthr,
// kBatch loads in flight before their stores: a shared store after each load would keep one
// load at a time in flight (the compiler cannot prove the generic src is not shared memory).
// L2: load through L2 only (__ldcg): a row other blocks of the same launch wrote (their
// stores are not in this multiprocessor's L1; a line of it may be there, stale).
template <int kBatch, bool L2 = false> __device__ __forceinline__ void stage_row(float *dst, const float *src, int n, int tid, int nthr) {
  for (int i0 = tid; i0 < n; i0 += kBatch * nthr) {
    float v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = i0 + j * nthr;
      if constexpr (L2) v[j] = i < n ? __ldcg(src + i) : 0.0f;
      else v[j] = i < n ? src[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (i0 + j * nthr < n) dst[i0 + j * nthr] = v[j];
  }
}

// RmsNorm [-> Mul(w)] of a row staged in shared memory, in place: the row chains' arithmetic
// (fused.cu), also run by the mat-vec epilogues (matvec.cu) so both give the same bits.
// rms_threads: the unfused RmsNorm kernel's block size (its reduction order); wr: thread t's
// weights w[t + j blockDim.x], j < kWeightRegs (loaded early by the caller), the rest read
// from w (null: no Mul). Block-wide: every thread calls it; ends with a barrier.
__device__ __forceinline__ void rms_mul_staged(float *s_row, int n, float eps, int rms_threads, const float *w,
                                               const float (&wr)[kWeightRegs], double *s_red) {
  const float scale = rms_row_scale(s_row, n, eps, rms_threads, s_red);  // its barriers end every read of s_row
#pragma unroll
  for (int j = 0; j < kWeightRegs; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i >= n) continue;
    float v = s_row[i] * scale;  // the RmsNorm output, rounded to float as it would be stored
    if (w) v = v * wr[j];
    s_row[i] = v;
  }
  for (int i = threadIdx.x + kWeightRegs * blockDim.x; i < n; i += blockDim.x) {
    float v = s_row[i] * scale;
    if (w) v = v * w[i];
    s_row[i] = v;
  }
  __syncthreads();
}

// The row prologue of the kernels that normalise a row as the row chains do (row_chains_kernel,
// router_mv_kernel, topk_router_kernel):
//   float wr[kWeightRegs];
//   load_row_weights(w, n, nthr, wr);     // a weight: before pdl_wait, in flight with what follows
//   pdl_wait(); ...
//   stage_normed_row(s, x, n, nthr, rms, eps, rms_threads, w, wr, s_red, normed);
// Thread threadIdx.x of nthr (the block) takes w[threadIdx.x + j nthr], j < kWeightRegs (zero
// past n or where w is null).
__device__ __forceinline__ void load_row_weights(const float *w, int n, int nthr, float (&wr)[kWeightRegs]) {
#pragma unroll
  for (int j = 0; j < kWeightRegs; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * nthr;
    wr[j] = w && i < n ? __ldg(w + i) : 0.0f;
  }
}

// Stages row x [n] in shared memory s (stage_row: threadIdx.x of nthr, kWeightRegs loads in
// flight) and, where rms, normalises it in place (rms_mul_staged: eps, rms_threads, the Mul
// weight w with wr from load_row_weights); then block 0 writes the normalised row to normed
// where set. Block-wide: every thread calls it; s is complete for every thread afterwards.
__device__ __forceinline__ void stage_normed_row(float *s, const float *x, int n, int nthr, bool rms, float eps, int rms_threads,
                                                 const float *w, const float (&wr)[kWeightRegs], double *s_red, float *normed = nullptr) {
  stage_row<kWeightRegs>(s, x, n, threadIdx.x, nthr);
  __syncthreads();
  if (!rms) return;
  rms_mul_staged(s, n, eps, rms_threads, w, wr, s_red);
  if (blockIdx.x == 0 && normed)
    for (int i = threadIdx.x; i < n; i += nthr) normed[i] = s[i];
}

// Softmax of one row over threads [0, nthr) of the block (stride nthr; threads past nthr
// add nothing) in the CPU's order, bit for bit: max; the reference's vector expf on the
// 16-element chunks (libm's expf on the tail there, CUDA's here: within an ulp); the double
// sum of each chunk's 16-lane tree in chunk order, then of the tail values (rows are expert
// counts: a few hundred values; warp 0's lanes build the chunks' trees side by side and every
// lane adds them in chunk order); one float reciprocal. dst may be shared memory. Block-wide
// (at least one warp): every thread calls it. Each thread rescales only the values it wrote.
__device__ __forceinline__ void softmax_row(const float *src, float *dst, int n, float *shf, double *shd, int nthr) {
  const int i0 = static_cast<int>(threadIdx.x) < nthr ? threadIdx.x : n;
  float mx = -INFINITY;
  for (int i = i0; i < n; i += nthr) mx = fmaxf(mx, src[i]);
  mx = blk_max(mx, shf);
  const int n16 = n & ~15;
  for (int i = i0; i < n; i += nthr) dst[i] = i < n16 ? ref_expf_v(src[i] - mx) : expf(src[i] - mx);
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int nc = n16 / 16;
    double s = 0.0;
    for (int c0 = 0; c0 < nc; c0 += 32) {
      const double h = c0 + lane < nc ? static_cast<double>(ref_hsum16(dst + 16 * (c0 + lane))) : 0.0;
      const int m = nc - c0 < 32 ? nc - c0 : 32;
      for (int j = 0; j < m; ++j) s += __shfl_sync(0xffffffffu, h, j);  // chunk c0 + j
    }
    if (lane == 0) {
      for (int i = n16; i < n; ++i) s += static_cast<double>(dst[i]);
      shd[0] = s;
    }
  }
  __syncthreads();
  const float inv = static_cast<float>(1.0 / shd[0]);
  for (int i = i0; i < n; i += nthr) dst[i] *= inv;
}

}  // namespace moe
