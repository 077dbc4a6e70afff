// Which IR nodes the CUDA backend runs, their scratch sizes, and op -> launcher dispatch.
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/matmul_heads.h"
#include "backends/cuda/ops/quant_extra.h"

namespace moe {

static bool f32_rows(const Node &n) { return n.type == DType::F32 && n.nb[0] == 4; }
// GetRows, MatMul and MatMulId weights: the MMQ / mat-vec types or the extra ones (ops/quant_extra.h).
static bool weight_type_ok(DType t) { return cuda_matmul_type_supported(t) || cuda_extra_type(t); }

bool cuda_supports_node(const Graph &g, int id) {
  const Node &n = g.node(id);
  switch (n.op) {
    case Op::Leaf:
    case Op::View:
    case Op::Transfer: return true;
    case Op::GetRows: return weight_type_ok(g.node(n.src[0]).type) && n.ne[0] == g.node(n.src[0]).ne[0];
    case Op::MatMul:
    case Op::MatMulId: return weight_type_ok(g.node(n.src[0]).type) && g.node(n.src[1]).nb[0] == 4;
    case Op::TopK: return g.node(n.src[0]).ne[0] <= kCudaMaxExperts && n.ne[0] <= 32;
    case Op::Attention: return g.node(n.src[0]).ne[0] <= kCudaMaxHeadDim && n.ne[0] <= kCudaMaxHeadDim;
    case Op::Rope: return n.rope.n_rot <= kMaxRopeDims;
    case Op::MatMulHeads:
      if (cuda_extra_type(g.node(n.src[0]).type)) return g.node(n.src[1]).nb[0] == 4 && cuda_extra_heads_supported(g, n);
      return cuda_matmul_type_supported(g.node(n.src[0]).type) && g.node(n.src[1]).nb[0] == 4;
    case Op::GroupedTopK: return cuda_grouped_top_k_supported(n);
    case Op::SsmConv:
    case Op::DeltaNet: return cuda_delta_net_supported(g, n);
    case Op::L2Norm: case Op::Softplus:
    case Op::RmsNorm: case Op::Mul: case Op::Add: case Op::Scale: case Op::Softmax: case Op::Sigmoid:
    case Op::GatherCols: case Op::NormSum: case Op::SwiGLU: case Op::MoeCombine: case Op::KvStore: case Op::Copy:
    case Op::Slice: case Op::Concat: case Op::AddId: case Op::SwiGLUOai:
      return n.op == Op::KvStore || f32_rows(n);
    default: return false;
  }
}

size_t cuda_work_size(const Graph &g, int id, const GpuTuning &tuning, const CudaPaths &paths) {
  const Node &n = g.node(id);
  if ((n.op == Op::MatMul || n.op == Op::MatMulId || n.op == Op::MatMulHeads) && cuda_extra_type(g.node(n.src[0]).type))
    return cuda_extra_matmul_work_size(g, n, tuning, paths);
  if (n.op == Op::MatMul || n.op == Op::MatMulId) return cuda_matmul_work_size(g, n, tuning, paths);
  if (n.op == Op::Attention) return cuda_attention_work_size(g, n, tuning);
  if (n.op == Op::MatMulHeads) return cuda_matmul_heads_work_size(g, n, paths);
  if (n.op == Op::SwiGLU) return cuda_swiglu_work_size(g, n, tuning, paths);
  if (n.op == Op::Add) return cuda_add_work_size(g, n, tuning, paths);
  return 0;
}

void cuda_run_node(const CudaOpCtx &c) {
  switch (c.n.op) {
    case Op::Leaf:
    case Op::View: return;
    case Op::GetRows: return cuda_extra_type(c.src(0).type) ? cuda_op_get_rows_extra(c) : cuda_op_get_rows(c);
    case Op::MatMul:
    case Op::MatMulId: return cuda_extra_type(c.src(0).type) ? cuda_op_matmul_extra(c) : cuda_op_matmul(c);
    case Op::RmsNorm:
    case Op::Softmax:
    case Op::NormSum:
    case Op::L2Norm: return cuda_op_rowwise(c);
    case Op::Mul:
    case Op::Add:
    case Op::Scale:
    case Op::Sigmoid:
    case Op::SwiGLU:
    case Op::Copy:
    case Op::Slice:
    case Op::Concat:
    case Op::SwiGLUOai:
    case Op::Softplus: return cuda_op_elementwise(c);
    case Op::SsmConv: return cuda_op_ssm_conv(c);
    case Op::DeltaNet: return cuda_op_delta_net(c);
    case Op::MatMulHeads: return cuda_extra_type(c.src(0).type) ? cuda_op_matmul_extra(c) : cuda_op_matmul_heads(c);
    case Op::AddId: return cuda_op_add_id(c);
    case Op::GroupedTopK: return cuda_op_grouped_top_k(c);
    case Op::Rope: return cuda_op_rope(c);
    case Op::TopK: return cuda_op_top_k(c);
    case Op::GatherCols: return cuda_op_gather_cols(c);
    case Op::MoeCombine: return cuda_op_moe_combine(c);
    case Op::KvStore: return cuda_op_kv_store(c);
    case Op::Transfer: {  // a value crossing a device boundary (host <-> this GPU, or GPU -> GPU)
      const Node &src = c.g.node(c.n.src[0]);
      MOE_CUDA_CHECK(cudaMemcpyAsync(c.n.data, src.data, c.n.nbytes(), cudaMemcpyDefault, c.stream));
      return;
    }
    case Op::Attention: return cuda_op_attention(c);
    default: fail(Status::Internal, "CUDA: no kernel for %s", op_name(c.n.op));
  }
}

}  // namespace moe
