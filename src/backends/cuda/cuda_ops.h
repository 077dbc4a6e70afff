// CUDA op launchers: one per IR op, each validating nothing (placement already asked
// cuda_supports) and enqueueing its kernels on the executor's stream. Launchers never
// synchronise and never read device memory on the host, so a whole decode step can be
// captured into one CUDA graph. Run-time values that change between steps (the number of
// KV cells, the batch's cells/positions/sequences) are read by kernels from DevUbatch.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_paths.h"
#include "core/gpu_tuning.h"
#include "graph/ir.h"

namespace moe {

class KvCache;
struct CudaRopeTables;

// Device copy of the ubatch info (uploaded by the executor before each pass).
struct DevUbatch {
  const int32_t *cells = nullptr;     // [n_tokens]
  const int32_t *pos = nullptr;       // [n_tokens]
  const int32_t *seq = nullptr;       // [n_tokens]
  const int32_t *cell_pos = nullptr;  // [n_kv] (-1 free)
  const unsigned long long *cell_seq = nullptr;  // [n_kv] sequence bit sets
  const int32_t *n_kv = nullptr;      // scalar
  // Scalar: B when every used cell c < n_kv holds position c + B (cells in position order,
  // free cells allowed: one sequence that never wrapped), else kNoCellPosBase. With it a
  // token's visible cells lie in a span its position gives (attn_visible_span), so decode
  // attention sizes its cell ranges by the window, not n_kv. Null: unknown (no bound).
  const int32_t *cell_pos_base = nullptr;
  // kCudaSyncSlots counters (the executor's own, not per pass) for kernels whose last block
  // merges the others' results (found with __threadfence + atomicAdd). Zeroed once; every such
  // kernel's last block sets its slot back to 0, so each launch (and graph replay) starts from
  // zero. Kernels on the executor's one stream run in order (with PDL a kernel touches them
  // only after pdl_wait), so any kernel may use any slot. Null: none (use a fallback).
  unsigned *sync = nullptr;
  // kKernelErrorWords words where kernels report bad indices (ops/kernel_error.cuh); null: none.
  unsigned *err = nullptr;
  // Recurrent layers (KvCache::recurrent_src/dst): the ubatch's distinct sequences in order of
  // first appearance, each with the state copies its kernels read and write: rs[0] = count,
  // then per sequence {seq, src copy, dst copy}. Null when the cache has no recurrent layer.
  const int32_t *rs = nullptr;
  // Host side (never read by kernels): the ubatch's RoPE tables, see cuda_rope_table.
  const CudaRopeTables *rope = nullptr;
  // Several sequences decoding one token each (2+ tokens, no two of one sequence): per token
  // the cells < n_kv its sequence holds, in cell order (its visible cells and the hidden ones of
  // a later position or outside a window: kernels still apply the mask), so attention reads
  // them without scanning the other sequences' cells, which lie interleaved with them in the
  // cache. Token t's cells are seq_cells[seq_cells_at[t] .. seq_cells_at[t + 1]). Null for other
  // ubatches, where the lists would exceed 8 x n_kv entries (sequences sharing cells), or with
  // GpuTuning::seqs_decode_attention off.
  const int32_t *seq_cells = nullptr;
  const int32_t *seq_cells_at = nullptr;  // [n_tokens + 1]
};
constexpr int kCudaSyncSlots = 1024;
constexpr int32_t kNoCellPosBase = INT32_MIN;

// RoPE cos/sin of a ubatch computed on the host by the CPU's own rope_cache_init (libm's
// cosf/sinf; CUDA's differ in the last bit) and uploaded with the ubatch: for each distinct
// RopeParams of the graph, [n_tokens][cuda_rope_table_stride] floats (cos, sin pairs) at the
// positions DevUbatch::pos. Kernels use a row only where the op's own position equals it.
struct CudaRopeTables {
  int64_t n_tokens = 0;
  std::vector<std::pair<RopeParams, const float *>> tables;  // device addresses
};
inline int cuda_rope_table_stride(const RopeParams &p) { return (p.n_rot + 1) & ~1; }
bool rope_params_equal(const RopeParams &a, const RopeParams &b);
// The device table for p when the ubatch has one and its token count is T, else null.
const float *cuda_rope_table(const DevUbatch &ub, const RopeParams &p, int64_t T);

struct CudaOpCtx {
  LaunchStream stream;       // the executor's stream (and whether its launches use PDL)
  const Graph &g;
  const Node &n;
  DevUbatch ub;
  KvCache *kv;
  int n_sm;
  const GpuTuning &tuning;   // the executor's (the context's) options; the plan was sized with them
  void *blas = nullptr;      // the executor's cuBLAS handle (cuda_blas.h); null: none
  CudaPaths paths{};         // the device's kernel paths (CudaBackend::paths); default: no tensor cores, no PDL
  const Node &src(int k) const { return g.node(n.src[k]); }
  CudaOpCtx with_node(const Node &m) const { return CudaOpCtx{stream, g, m, ub, kv, n_sm, tuning, blas, paths}; }
};

TView tview(const Node &n);

bool cuda_supports_node(const Graph &g, int id);
// Scratch of node id for kernels run with `tuning` on a device taking `paths` (the launch
// then makes the same choices: both come from the executor that runs the plan).
size_t cuda_work_size(const Graph &g, int id, const GpuTuning &tuning, const CudaPaths &paths);
void cuda_run_node(const CudaOpCtx &c);  // dispatch by op

// Per-family launchers (ops/*.cu).
void cuda_op_elementwise(const CudaOpCtx &c);  // Mul Add Scale Sigmoid SwiGLU Copy Slice Concat SwiGLUOai Softplus
void cuda_op_rowwise(const CudaOpCtx &c);      // RmsNorm Softmax NormSum L2Norm
void cuda_op_get_rows(const CudaOpCtx &c);
void cuda_op_rope(const CudaOpCtx &c);
void cuda_op_top_k(const CudaOpCtx &c);
void cuda_op_gather_cols(const CudaOpCtx &c);
void cuda_op_moe_combine(const CudaOpCtx &c);
void cuda_fused_combine_add(const CudaOpCtx &c, const Node &comb, const Node &add);  // add = combine + the other src (CombineAdd)
void cuda_op_kv_store(const CudaOpCtx &c);
void cuda_op_attention(const CudaOpCtx &c);
void cuda_op_matmul(const CudaOpCtx &c);       // MatMul and MatMulId
void cuda_op_matmul_heads(const CudaOpCtx &c);
void cuda_op_add_id(const CudaOpCtx &c);
void cuda_op_grouped_top_k(const CudaOpCtx &c);
void cuda_op_ssm_conv(const CudaOpCtx &c);     // ops/delta_net.cu
void cuda_op_delta_net(const CudaOpCtx &c);
bool cuda_delta_net_supported(const Graph &g, const Node &n);
// Prompts on tensor cores (ops/delta_net_chunked.cu) with the layer's state buffer; false: not
// taken (no tensor cores or shared memory, d != 128, a short ubatch), nothing launched.
bool cuda_delta_net_chunked(const CudaOpCtx &c, float *base);
bool cuda_grouped_top_k_supported(const Node &n);
size_t cuda_matmul_work_size(const Graph &g, const Node &n, const GpuTuning &tuning, const CudaPaths &paths);
// A SwiGLU of two MatMulId (gate, up) of one activation and one set of ids at 2+ tokens whose
// products take the few-column tensor-core kernel: its GateUpSwiGLU group runs as one launch of
// that kernel (cuda_mcol_swiglu) with the SwiGLU node's scratch, sized as the gate product's
// (cuda_swiglu_work_size; planned after the SwiGLU's output, while the group keeps x and the ids
// live: cuda_fusion_keep_live). cuda_mcol_swiglu: false (nothing launched) where it does not
// apply (c.n must be the SwiGLU).
bool cuda_mcol_swiglu_applies(const Graph &g, const Node &sw, const GpuTuning &tuning, const CudaPaths &paths);
size_t cuda_swiglu_work_size(const Graph &g, const Node &sw, const GpuTuning &tuning, const CudaPaths &paths);
bool cuda_mcol_swiglu(const CudaOpCtx &c, const Node &gate, const Node &up, const Node &sw);
// A MatVecs group's MatMuls of one activation at 2..15 columns (a layer's q, k, v while a few
// sequences decode) on the few-column kernel with one activation rounding, into the last
// member's scratch (c.n: the group launches at its turn, when the other members' outputs and the
// activation are live, so nothing lies under it; each MatMul's scratch is the same size). The
// products are the unfused launches' bits. False (nothing launched) where it does not apply:
// GpuTuning::mcol_shared_rounding off, a member off the few-column quantized path, another
// activation format.
bool cuda_mcol_matvecs(const CudaOpCtx &c, const std::vector<int> &members);
// A MatMul of 2..15 columns on the few-column kernel and the residual Add after it (several
// sequences' attention output projection): its MatMulAdd group as one launch that adds the
// residual as it stores (cuda_mcol_matmul_add; the product's and the Add's bits) with the Add
// node's scratch, sized as the product's (cuda_add_work_size; planned after the Add's output,
// while the group keeps the activation live: cuda_fusion_keep_live). False (nothing launched)
// where it does not apply: GpuTuning::mcol_add or fusion off, another kernel, non-contiguous
// operands (c.n must be the Add).
size_t cuda_add_work_size(const Graph &g, const Node &add, const GpuTuning &tuning, const CudaPaths &paths);
bool cuda_mcol_matmul_add(const CudaOpCtx &c, const Node &mm, const Node &add);
// The kernel family cuda_op_matmul runs n on (the choice cuda_matmul_work_size sizes for):
// "f16_halfsum", "matvec" (one column), "mcol" (multi-column mat-vec), "ref", "ref_f32",
// "blas" (cuBLAS where the executor has a handle, else the int8 MMQ), "mmq", "mma", "sgemm",
// "tile" (the f32 tile kernel). For tests and profiles.
const char *cuda_matmul_path(const Graph &g, const Node &n, const GpuTuning &tuning, const CudaPaths &paths);
size_t cuda_attention_work_size(const Graph &g, const Node &n, const GpuTuning &tuning);  // split-cell partials
bool cuda_matmul_type_supported(DType t);
// F16 weights, one activation column or MoE: half-precision sums like the reference.
bool cuda_f16_halfsum_applies(const Graph &g, const Node &n);
void cuda_op_matmul_f16_halfsum(const CudaOpCtx &c);

// Fused decode mat-vec launchers (ops/matvec.cu), one token only. c.n is the group's last node (its data is
// the output). Activations are rounded inside the kernel; no extra launch.
void cuda_fused_matmul_add(const CudaOpCtx &c, const Node &mm, const Node &add);  // add = W x + the other src of add
void cuda_fused_gate_up_swiglu(const CudaOpCtx &c, const Node &up, const Node &gate, const Node &swiglu); // MatMulId x2 + SwiGLU(gate, up)
void cuda_fused_down_combine(const CudaOpCtx &c, const Node &down, const Node &combine, const Node *add,
                             bool ids_settled = false);  // MatMulId + MoeCombine (+ Add residual); ids_settled: FusedGroup's
// 2..kMaxFusedMatVecs MatMuls of one activation (a layer's q, k, v) in one launch; each
// member's output is written. Quantized weights whose types have the same group key (the
// same activation rounding); key 0: the type never joins a group. A MatMul may be followed
// in members by Add(it, row) (gpt-oss's q / k / v biases): then the Add's output is written.
constexpr int kMaxFusedMatVecs = 4;
int cuda_matvec_group_key(DType t);
void cuda_fused_matvecs(const CudaOpCtx &c, const std::vector<int> &members);

constexpr int kCudaMaxExperts = 512;   // top-k warp kernel: 16 slots per lane
constexpr int kCudaMaxHeadDim = 1024;  // attention accumulators: 8 per thread of 128

}  // namespace moe
