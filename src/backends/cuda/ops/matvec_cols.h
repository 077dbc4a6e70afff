// Multi-column mat-vec: MatMul with 2..15 activation columns and MatMulId with 2+ tokens below
// the tensor-core thresholds, each weight row read once for a tile of up to kMcolCols columns
// (see matvec_cols.cu).
//
//   McolArgs a{...};                       // weights, activations, output, tiles
//   launch_act_round(...int8...);          // quantized types only: a.xq / a.xs
//   cuda_launch_route(...);                // MatMulId only: a.tiles / a.entries
//   launch_mcol(w.type, stream, a, n_tiles, n_sm);
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_common.h"
#include "quant/dtype.h"

namespace moe {

constexpr int kMcolCols = 8;  // columns per tile (matmul.cu's kTile: MatMulId's route tiles)

// Weight types launch_mcol takes: those of the one-token mat-vec (matvec.cu).
bool cuda_mcol_type(DType t);

struct McolArgs {
  const uint8_t *w;      // weights; expert e at w + e * eb
  int64_t rb, eb;        // row and expert strides (bytes; eb 0 for MatMul)
  int K, M;              // row length, rows
  // Quantized types: activation row r rounded through the weight's activation format as
  // launch_act_round writes it for the int8 paths: K integers at xq + r K, and per 16
  // elements (scale, integer sum) at xs + r K / 16. Unused for plain types.
  const int8_t *xq;
  const float2 *xs;
  // Plain types (F32 / F16 / BF16): the f32 activations, row r at i1 = r % ne1,
  // i2 = (r / ne1) % ne2, i3 = r / (ne1 ne2) (act_round_kernel's order), rounded on the fly.
  TView x;
  float *y;              // output row o at y + o M
  int ncols;             // MatMul: activation columns (column c reads row c, writes row c)
  const int4 *tiles;     // MatMulId: route tiles (matmul_route.h) of <= kMcolCols entries; null for MatMul
  const int2 *entries;   // MatMulId: route entries (activation row, output row)
  const uint8_t *w2;     // launch_mcol_swiglu: the up weights (a.w: gate; same shape and strides)
  // MatMul: a residual added to each product as it is stored (row o at add + o M, y's layout;
  // may be y itself: each value is read by the thread that writes it), the Add launch's bits;
  // null: none.
  const float *add;
};

// Y = W X over n_tiles column tiles (MatMul: ceil(ncols / kMcolCols); MatMulId: the route's
// tile capacity). max_cols: the most columns a tile can hold (MatMul: its columns; MatMulId:
// the tokens, an expert's entries when a token's slots name distinct experts); at most 4 takes
// the 4-column kernel (more are still right, in passes). tensor_cores (sm_80+ code only): the
// weight types (kMcolTc*) that take the int8 tensor-core kernel (Q4_K: 16-byte aligned rows;
// Q6_K: even addresses; K a multiple of 256).
// With PDL where the stream has it.
constexpr unsigned kMcolTcQ4K = 1, kMcolTcQ6K = 2;
void launch_mcol(DType t, const LaunchStream &s, const McolArgs &a, int n_tiles, int n_sm, int max_cols = kMcolCols,
                 unsigned tensor_cores = 0);
// y = SwiGLU(W X, W2 X) (silu of the gate product a.w times the up product a.w2, the SwiGLU
// launch's bits) in one launch of the tensor-core kernel; each product's sums are launch_mcol's.
// False (nothing launched) where that kernel does not take the weights (type, alignment:
// cuda_mcol_swiglu_takes).
bool cuda_mcol_swiglu_takes(DType t, const McolArgs &a, unsigned tensor_cores);
bool launch_mcol_swiglu(DType t, const LaunchStream &s, const McolArgs &a, int n_tiles, int n_sm, unsigned tensor_cores);

}  // namespace moe
