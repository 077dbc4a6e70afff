// Small-batch MatMul / MatMulId of the reference-order types (Q4_K, Q5_K, Q6_K, Q8_0; dense
// F32) in the CPU's float order per column (matmul_ref_order.cu), used by cuda_op_matmul for
// batches of 2 .. kRefOrderMaxTokens tokens.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/gpu_tuning.h"
#include "quant/dtype.h"

namespace moe {

struct Node;
class Graph;

// Batches of up to this many tokens keep the CPU's float order on CUDA: the products of the
// reference-order types and of F32 weights (routers) here, attention over an F32 cache in
// attention_ref_order.cu. Why: the K-quant conformance files are chaotic (a 1-ulp change
// flips a Q8_K activation rounding and moves logits by ~1), their prompts and teacher-forced
// records are batches of 10..92 tokens, and the tensor-core kernels sum in another order.
// Cost: prompts of 16..128 tokens run on these warp-per-row kernels (2026-11-30, H200, the
// Qwen3-30B-A3B shape: pp128 813 t/s against pp512 12,630), so it is opt-in per context
// (moe_context_params.cpu_float_order -> Graph::cpu_float_order); longer batches always take
// the tensor cores.
// The limit is GpuTuning::ref_order_max_tokens (default kGpuRefOrderMaxTokens = 128); tests of
// the tensor-core and tiled kernels set 0 so batches from 16 tokens (MatMulId: 64 entries;
// attention: 17 tokens) reach those kernels.
constexpr int kRefOrderMaxTokens = kGpuRefOrderMaxTokens;
// The limit for graph g: tuning.ref_order_max_tokens where g asks for the CPU's float order
// (Graph::cpu_float_order), else 0 (every batch from 16 tokens takes the tensor cores).
int cuda_ref_order_tokens(const Graph &g, const GpuTuning &tuning);

// A MatMul / MatMulId whose output is final (Node::final_output: the LM head) takes CUDA's own
// float order at every batch size when tuning.own_order_head (the default): no rounding follows
// its output, so the chaos argument above does not apply, and the reference order costs the LM
// head up to ~4x (gpt-oss's Q8_0 head). Tests that want the CPU's bits of a product they mark
// as a graph output turn it off.
bool cuda_own_order_product(const Node &n, const GpuTuning &tuning);

// Y[col] = W X[col] as launch_mmq_matmul's int8 form describes X (Xq: int8 integers, Xs:
// (scale, integer sum) per 16, act_round_kernel with q_int8). Dense (tiles == nullptr):
// column c reads X row c and writes Y row c, ncols columns in n_col_tiles tiles of NT;
// gemm_cols: the leading columns the CPU runs in Q4_K's repacked gemm order (its full groups
// of 4; 0 for the other types). MatMulId: tile i is (expert, first entry, count, 0) over
// `entries` (activation row, output row), n_col_tiles its tile capacity.
void launch_mmv_ref(DType t, cudaStream_t s, const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M, const int8_t *Xq,
                    const float2 *Xs, float *Y, int ncols, int gemm_cols, int NT, const int4 *tiles, const int2 *entries, int n_col_tiles);

// Dense F32 weights on 2..15 columns in the CPU's order: its batched GEMM order where it takes
// that path (gemm16: K % 16 == 0 and M % 4 == 0), else its one-token order. X: the f32
// activation rows (K apart), row_stride: of W, in floats.
void launch_mmv_ref_f32(cudaStream_t s, const float *W, int64_t row_stride, int K, int M, const float *X, float *Y, int ncols, int NT,
                        bool gemm16);

}  // namespace moe
