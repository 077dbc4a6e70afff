// Norm prologue of a one-token mat-vec group (cuda_fusion.h: FusedGroup::norm_prologue): the
// RmsNorm -> Mul(row weight) in front of the group's MatMuls runs in the group's launch.
// Every thread block computes the row's 1 / rms from the norm's input x (global memory,
// after pdl_wait) and normalises each value where it rounds the activation into shared
// memory (matvec.cu round_slots), instead of a row-chain launch writing the Mul output
// first. The arithmetic is the row chains' (row_ops.cuh: rms_row_scale over the unfused
// RmsNorm kernel's block size, then (x * scale) * w, each product rounded to float), so the
// rounded activations, hence the products, are bit-identical to the unfused schedule.
//
//   scale = norm_prologue_scale(np, x, K, red);           // block-wide, once per thread block
//   load8_floats(x, i0, in, v);
//   if (in) norm_prologue_apply(np, scale, i0, v);         // v: the Mul output's 8 values
//
// Block 0 writes the normalised row (NormPrologue::normed) where a node outside the group
// reads the Mul output; other blocks of the launch never read it (they compute it), later
// launches do (PDL: after their pdl_wait, i.e. after this launch completed).
#pragma once
#include <cuda_runtime.h>

#include "backends/cuda/ops/act_round_warp.cuh"
#include "backends/cuda/ops/row_ops.cuh"

namespace moe {

// A separate kernel parameter (MvArgs is at its 128-byte limit: matvec.cu).
struct NormPrologue {
  const float *w;   // the Mul's row weight [K]; null: no prologue (the activation is the MatMuls' input)
  float *normed;    // the Mul's output [K] when read outside the group (written by block 0), or null
  float eps;        // the RmsNorm's
  int rms_threads;  // the unfused RmsNorm kernel's block size (row_threads(K): its reduction order)
};

// 1 / rms of the norm's input row x [K] as the RmsNorm kernel (and the row chains) compute it.
// Block-wide: every thread of the block calls it (any block size >= rms_threads, a multiple of
// 32: threads past rms_threads add zeros); red: 32 doubles of shared memory, read until the
// caller's next barrier.
__device__ __forceinline__ float norm_prologue_scale(const NormPrologue &np, const float *x, int K, double *red) {
  return rms_row_scale(x, K, np.eps, np.rms_threads, red);
}

// Elements [i0, i0 + 8) of the row, v holding x's values: the RmsNorm output rounded to float
// as it is stored, times the Mul weight (no fma: two rounded products, as the two kernels).
// Block 0 stores them to np.normed.
__device__ __forceinline__ void norm_prologue_apply(const NormPrologue &np, float scale, int i0, float (&v)[8]) {
  float w[8];
  load8_floats(np.w, i0, true, w);
#pragma unroll
  for (int l = 0; l < 8; ++l) v[l] = __fmul_rn(__fmul_rn(v[l], scale), w[l]);
  if (np.normed && blockIdx.x == 0) {
#pragma unroll
    for (int l = 0; l < 8; ++l) np.normed[i0 + l] = v[l];
  }
}

}  // namespace moe
