// Entry point of the emulated small-batch reference-order kernel (run_mmv_ref.sh) for
// mmv_ref_check.cpp: launch_mmv_ref with host pointers and (scale, sum) pairs as floats.
#pragma once
#include <cstdint>

#include "quant/dtype.h"

void emu_launch_mmv_ref(moe::DType t, const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M, const int8_t *Xq,
                        const float *Xs, float *Y, int ncols, int gemm_cols, int NT, const int *tiles, const int *entries, int n_col_tiles);
void emu_launch_mmv_ref_f32(const float *W, int64_t row_stride, int K, int M, const float *X, float *Y, int ncols, int NT, bool gemm16);
