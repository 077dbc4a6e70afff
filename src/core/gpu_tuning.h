// GPU tuning options of one context: alternative kernels and launch settings, kept for
// measuring them (moeinfer-cli bench --help-dev) and for tests that need one kernel path.
// Defaults are the fastest measured settings (docs/perf/cuda.md). They are internal: the C
// ABI does not expose them.
//
//   ContextParams cp;  cp.gpu_tuning.fusion = false;      // this context only
//   auto ctx = Context::create(model, cp);                 // plans and kernels use cp.gpu_tuning
//
// The context copies them into its compile options (scratch sizes depend on some: blas_min_tokens,
// prefill_attn_blocks, own_order_head, ref_order_max_tokens) and into each GPU executor, which
// hands them to every kernel launcher (CudaOpCtx::tuning), so plan and kernels always agree and
// two contexts of one process may use different values at the same time. No effect without CUDA.
#pragma once

#include <string>

namespace moe {

// Dense quantized products of >= this many tokens run on cuBLAS over f16-dequantized weights.
// Measured faster than the int8 MMQ from 64 tokens (2026-12-01; full file pp64 +2%, pp128 +6%),
// but below 128 the int8 kernels' exact integer products keep the default float order as
// close to the reference as at 14f7e41 (conformance prompts are 10-84 tokens; with 64, prompt 4
// of qwen3moe-q4_k_m took another greedy step).
constexpr int kGpuBlasMinTokens = 128;
// Batches of up to this many tokens keep the CPU's float order where the context asks for it
// (ContextParams::cpu_float_order; ops/matmul_ref_order.h says why).
constexpr int kGpuRefOrderMaxTokens = 128;

struct GpuTuning {
  // Programmatic dependent launch: a kernel's start overlaps the previous kernel's tail
  // (only where the device runs sm_90 code: cuda_paths.h, ops/pdl.cuh). Default on.
  bool dependent_launch = true;
  // Fused kernels for groups of nodes (cuda_fusion.h). Default on.
  bool fusion = true;
  // The gated DeltaNet's output norm in the DeltaNet kernel's last block per head (cuda_fusion.h:
  // DeltaNorm) instead of its own launch. Default on (not yet measured on a GPU: the A/B switch).
  bool delta_norm = true;
  // The LM head (a final output) in CUDA's own float order at every batch size. Default on;
  // off: the CPU's order like any other product (tests of bit-identical products).
  bool own_order_head = true;
  // One-token mat-vec groups of 2..3 blocks per SM in the lean 8-warp kernel. Default on;
  // off: the 16-warp launch.
  bool lean_groups = true;
  // The same lean launch for a lone one-token MatMul [+ Add] (the o-projections; ops/matvec.cu
  // matvec_lean_kernel) where its grid has 2..3 logical blocks per SM. Default on: measured on
  // the H200 (2026-12-04) gpt-oss-20b tg128 317.4 -> 333.7, Qwen3.5-35B-A3B 271.6 -> 275.1, GLM
  // and Qwen3-30B-A3B unchanged (no such grid); off: bench --no-lean-rows.
  bool lean_rows = true;
  // Few-column products (2..15 columns, MatMulId under the tensor-core GEMM's threshold: a few
  // sequences decoding together) of Q4_K weights on the int8 tensor cores (ops/matvec_cols.cu,
  // mcol_mma_q4k_kernel; sm_80 code) instead of the dp4a multi-column kernel. Default on;
  // off: bench --no-mcol-tc.
  bool mcol_tensor_cores = true;
  // The same for Q6_K weights (the down and v products of Q4_K_M files). Measured on the H200
  // (2026-12-04, Qwen3-30B-A3B Q4_K_M, 4 sequences, ncu): MoE down 31.5 -> 28.3 us, v 9.4 -> 6.6 us;
  // aggregate x4 597 -> 606 t/s. Default on; off: bench --no-mcol-tc-q6k.
  bool mcol_tensor_cores_q6k = true;
  // With mcol_tensor_cores (Q4_K) / mcol_tensor_cores_q6k (Q6_K): MatMulId of fewer routed (token, slot) entries than this runs on
  // that kernel instead of the tensor-core GEMM, whose 64-column tiles are mostly empty while an
  // expert gets a few tokens. 0 (default): 8 per expert, one full 8-column tile each on average
  // (Qwen3-30B-A3B: 1024, so up to 127 sequences decoding together); never below the GEMM's own
  // 64 (matmul_mma.h). Measured on the H200 (2026-12-04, Qwen3-30B-A3B Q4_K_M, aggregate
  // decode): 16 sequences 888 -> 1162 t/s at 256, 64 sequences 1751 -> 2084 at 1024 (the GEMM
  // at 64). bench --mcol-max-entries N. Sizes the planned scratch (route tables).
  int mcol_max_entries = 0;
  // A few tokens' MoE gate/up + SwiGLU (2+ tokens under that threshold, Q4_K / Q6_K on the
  // tensor-core kernel) as one launch of that kernel, gate and up rows in warps of one block
  // (cuda_mcol_swiglu) instead of two product launches and a SwiGLU launch. Default on; off:
  // bench --no-mcol-swiglu. Sizes the planned scratch (the SwiGLU node's).
  bool mcol_swiglu = true;
  // A few columns' q / k / v (a MatVecs group of 2..15 columns) with one activation rounding launch
  // instead of one per product (cuda_mcol_matvecs). Measured on the H200 (2026-12-04,
  // Qwen3-30B-A3B Q4_K_M, aggregate decode, two A/B pairs): 4 sequences 645 / 645 -> 679 / 659
  // t/s, 16 within noise. Default on; off: bench --no-mcol-shared-rounding.
  bool mcol_shared_rounding = true;
  // A few columns' MatMul + residual Add (2..15 columns on the few-column kernel: the attention
  // output projection of several sequences) as one launch that adds the residual in its store
  // (cuda_mcol_matmul_add) instead of a product and an Add launch. Default on; off: bench
  // --no-mcol-add. Sizes the planned scratch (the Add's).
  bool mcol_add = true;
  // The MoE combine of 2+ tokens and the residual Add after it in one launch (CombineAdd
  // groups, cuda_fused_combine_add) instead of two. Default on; off: bench --no-combine-add.
  bool combine_add = true;
  // Several sequences decoding one token each (2..64 tokens, no two of one sequence): the ubatch
  // carries each token's cell list (DevUbatch::seq_cells) and attention runs on the grouped
  // decode kernel over that list, instead of scanning every cell (up to 4 tokens) or the tiled
  // prompt kernels (5..64), whose 64-cell tiles all hold some sequence's cell, the sequences'
  // cells lying interleaved in the cache (attn_decode_seqs_launch). Default on; off: bench
  // --no-seqs-decode-attn.
  bool seqs_decode_attention = true;
  // Decode attention: at most decode_max_ranges cell ranges (clamped to 1..64, default 32)
  // of at least decode_min_chunk cells (>= 1, default 64) per launch. 32-cell ranges measured
  // within noise at depth 512 / 4096 and slower below 64 cells (two ranges and a merge instead
  // of one direct write: 7.8 -> 8.9 us under ncu; docs/perf/cuda.md, 2026-12-03 night).
  int decode_max_ranges = 32;
  int decode_min_chunk = 64;
  // MLA attention (deepseek2, attention_mla.cu): cells per split at least this many (rounded up
  // to its 64-cell tiles); splits without cells exit at once, and where one split holds all
  // cells it writes the output and the combine does nothing. Default 64: measured fastest
  // (H200, GLM-4.7-Flash tg128 at depth 0 / 512 / 4096: 64 209.6 / 191.0 / 150.3, 128 206.3 /
  // 185.6 / 148.5, 256 208.1 / 169.0 / 150.3; docs/perf/cuda.md).
  int mla_split_cells = 64;
  // Decode attention on the tensor cores (attention_decode_tc.cu: F16 cache, head size 128 /
  // 256, sm_80 code) instead of the grouped kernel. Default off: not yet measured on a GPU.
  bool tc_decode_attention = false;
  // Prefill attention (tiled kernels): cells are split until ~this many blocks per SM run
  // (clamped to 1..16, default 2). Sizes the planned scratch.
  int prefill_attn_blocks = 2;
  // Dense quantized products of >= this many tokens on cuBLAS over f16 weights; 0: no cuBLAS
  // at all (the F32 router products included; executors then create no handle). Sizes the
  // planned scratch. Default kGpuBlasMinTokens.
  int blas_min_tokens = kGpuBlasMinTokens;
  // With ContextParams::cpu_float_order: batches of up to this many tokens keep the CPU's
  // float order (>= 0; 0: every batch from 16 tokens takes the tensor cores). Default
  // kGpuRefOrderMaxTokens. Sizes the planned scratch.
  int ref_order_max_tokens = kGpuRefOrderMaxTokens;
  // Timing what-ifs only (bench --skip-launches): launches whose label (the eager profile's:
  // "fused:rms_norm+mul", "attention T=1", "matmul q4_K T=1", ...) contains one of these
  // '|'-separated patterns (or equals one written "=label") are left out of captured graphs, so a
  // replayed step shows what they cost in the graph. The results are wrong while it is set;
  // integer values (expert ids) then keep their bytes for the whole graph (compiler.cpp), so
  // the router can be left out too. Default empty.
  std::string skip_launches;

  bool operator==(const GpuTuning &o) const {
    return dependent_launch == o.dependent_launch && fusion == o.fusion && delta_norm == o.delta_norm &&
           own_order_head == o.own_order_head && lean_groups == o.lean_groups && lean_rows == o.lean_rows && mcol_tensor_cores == o.mcol_tensor_cores && mcol_tensor_cores_q6k == o.mcol_tensor_cores_q6k &&
           mcol_max_entries == o.mcol_max_entries && mcol_swiglu == o.mcol_swiglu && mcol_shared_rounding == o.mcol_shared_rounding && mcol_add == o.mcol_add && combine_add == o.combine_add && seqs_decode_attention == o.seqs_decode_attention && decode_max_ranges == o.decode_max_ranges &&
           decode_min_chunk == o.decode_min_chunk && mla_split_cells == o.mla_split_cells && tc_decode_attention == o.tc_decode_attention && prefill_attn_blocks == o.prefill_attn_blocks &&
           blas_min_tokens == o.blas_min_tokens && ref_order_max_tokens == o.ref_order_max_tokens &&
           skip_launches == o.skip_launches;
  }
  bool operator!=(const GpuTuning &o) const { return !(*this == o); }
};

}  // namespace moe
