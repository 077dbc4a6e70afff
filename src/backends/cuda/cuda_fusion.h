// Kernel fusion in the CUDA executor: a fusion plan lists groups of consecutive graph nodes
// (Leaf/View nodes between them do not run) that one fused launch computes. The IR and the
// CPU backend are untouched: fusion is a CUDA-side decision made per compiled graph.
//
//   FusionPlan p = plan_fusion(g, tuning.delta_norm ? 0 : kNoDeltaNorm);  // once per graph (the executor caches it)
//   int k = p.group_of[i];                   // node i belongs to group k (or -1)
//   if (i == p.groups[k].last) cuda_run_group(p.groups[k], ctx);  // members before it are skipped
//
// A group is formed only when it is safe to run all its members at the position of its last
// one: every member output that is read outside the group (or is a graph output) is in
// `written` and the kernel writes it; every other member output has no reader outside the
// group and is not written at all; nothing the kernel writes (outputs, scratch) overlaps
// anything it reads from outside the group; all members share a device and a segment.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/cuda_ops.h"

namespace moe {

enum class FusedKind : uint8_t {
  RowChains,     // per-row chains RmsNorm -> Mul(row weight) -> Rope -> KvStore (any suffix/prefix; up to 4 chains)
  Router,        // [[RmsNorm -> Mul ->] [side MatMul ->] MatMul (F32, T = 1) ->] Softmax -> TopK -> GatherCols [-> NormSum] (softmax gating), or
                 // [RmsNorm -> Mul ->] [side MatMul ->] MatMul (F32, T = 1) -> Sigmoid [-> Add bias] -> TopK -> GatherCols [-> NormSum] [-> Scale]
                 // (side: kMaxRouterSideRows)
  MatMulAdd,     // MatMul + Add (1..kMaxMatVecsCols columns)
  GateUpSwiGLU,  // MatMulId x2 + SwiGLU (T <= kMaxGateUpTokens; MatMul: T = 1), or gpt-oss's (MatMulId -> AddId bias) x2 + SwiGLUOai (T = 1)
  DownCombine,   // MatMulId [+ AddId bias (gpt-oss)] + MoeCombine [+ Add] (T = 1)
  MatVecs,       // 2..kMaxFusedMatVecs MatMuls of one activation, e.g. q, k, v (T <= kMaxMatVecsCols, quantized weights), or as many MatMul -> Add pairs (T = 1)
  Sequence,      // 2..kMaxFusedSequence small row ops run in order, a block per row of each independent part (MLA glue, router tails)
  DeltaIn,       // gated DeltaNet input: gate chain + SsmConv + q/k/v slices + q/k L2Norms (ops/delta_net_fused.cu)
  GatedNorm,     // RmsNorm -> Mul(row weight) -> SwiGLU(z, .) (the DeltaNet output norm)
  SharedGate,    // Sigmoid -> MoeCombine(one expert) -> Add -> Add (sigmoid-gated shared expert + residual)
  DeltaNorm,     // DeltaNet -> GatedNorm's RmsNorm -> Mul -> SwiGLU in the DeltaNet kernel (ops/delta_net.cu)
  TopKRouter,    // [RmsNorm -> Mul ->] MatMul (F32, T = 1) -> Add bias -> TopK -> GatherCols -> Softmax [-> Scale]
                 // (gpt-oss: top-k of the biased logits, softmax over the chosen ones; ops/router_topk.cu)
  CombineAdd,    // MoeCombine -> Add(combine, r) of 2+ tokens: the residual added in the combine's launch (ops/moe_route.cu)
  HeadsConcat,   // MatMulHeads -> Concat(product, b): MLA's absorbed q written into the Concat's rows, b copied
                 // after them, in the product's launch (ops/matmul_heads.cu; few tokens, else unfused)
};

// A GateUpSwiGLU group of 2..kMaxGateUpTokens tokens runs as one launch where its products
// take the few-column tensor-core kernel (cuda_mcol_swiglu), else its members in order.
constexpr int64_t kMaxGateUpTokens = 256;
// A MatVecs group of 2..kMaxMatVecsCols columns rounds its activation once for every member's
// few-column launch (cuda_mcol_matvecs, GpuTuning::mcol_shared_rounding), else its members run
// in order.
constexpr int64_t kMaxMatVecsCols = 15;

struct FusedGroup {
  FusedKind kind = FusedKind::RowChains;
  int first = 0, last = 0;     // node index range [first, last]; the group launches at last's turn
  std::vector<int> members;    // the compute nodes in it, in order
  std::vector<int> written;    // member outputs the fused kernel writes
  std::string label;           // "fused:rms_norm+mul" (per-op profiler)
  // DownCombine: the launch right before this group (the gate/up group) reads the same expert
  // ids, so their writer ran at least two launches earlier and, under the PDL contract
  // (pdl.cuh), has completed when this kernel starts: it may read them before pdl_wait.
  bool ids_settled = false;
  std::vector<int> parts;      // DeltaIn: its nodes by role (DeltaInPart)
  // Sequence: deepseek2's MLA glue in its graph order (Slice, Rope, Slice, RmsNorm, Mul,
  // Concat, KvStore of the K row; Slice, Slice, Rope of q): run with its rows in shared memory
  // (ops/mla_glue.cu), writing only the members read after the group (bit k of live_mask:
  // member k). The group's inputs stay live until its last member (cuda_fusion_keep_live).
  bool mla_glue = false;
  unsigned live_mask = 0;
};

struct FusionPlan {
  std::vector<FusedGroup> groups;
  std::vector<int> group_of;   // per node: the group whose range holds it, or -1
};

// A Router group's side MatMul: a one-token F32 product of the router's activation with at most
// this many rows (qwen3next's shared-expert gate logit, 1 row), right before the router's MatMul;
// the router launch computes its rows in one more block and writes them.
constexpr int64_t kMaxRouterSideRows = 8;

// Whether an executor fuses at all is GpuTuning::fusion (tests compare fused and unfused runs).
// In plan_fusion's flags: no DeltaNorm groups (GpuTuning::delta_norm off; the output norm is
// then a GatedNorm launch). cuda_fusion_keep_live extends their lifetimes either way.
constexpr unsigned kNoDeltaNorm = 1;
// Whether the fused mat-vec groups (MatMulAdd, GateUpSwiGLU, DownCombine, MatVecs) are planned:
// their launchers live in ops/matvec.cu (MOE_CUDA_FUSED_MATVEC=0 leaves them out).
bool cuda_fused_matvec_available();

FusionPlan plan_fusion(const Graph &g, unsigned flags);  // flags: 0 or kNoDeltaNorm
// The lifetimes the memory planner must extend for the groups of `device` (Backend::extend_lifetimes):
// DeltaIn groups read their inputs after writing outputs placed after those inputs' last reader.
void cuda_fusion_keep_live(const Graph &g, int device, std::vector<int> &keep_until);

// The chains of a RowChains group: each chain lists member ids; a chain's first node reads
// its input (src0) from outside the group, every later node reads the previous one.
constexpr int kMaxFusedChains = 4;
constexpr int64_t kMaxFusedRow = 8192;  // values per row (the row is staged in shared memory)
std::vector<std::vector<int>> row_chains(const Graph &g, const std::vector<int> &members);

// A Sequence group starts at a Slice, Concat, Sigmoid or TopK (the glue of deepseek2's MLA and
// its sigmoid router; gpt-oss's router tail, top-k before the softmax; a softmax router starts
// at its Softmax, a Router group) and takes the consecutive ops of {Slice, Concat, Rope,
// RmsNorm, Softmax, Mul, Add, Scale, Sigmoid, TopK, GatherCols, NormSum, KvStore} after it
// whose operands and outputs hold at most kMaxSequenceValues values and whose RmsNorm /
// Softmax rows and Rope / KvStore tokens (done one after another) are at most
// kMaxSequenceRows: decode and a few tokens. Its
// kernel runs the members in their order, each completed before the next, so it reads and
// writes exactly as the unfused schedule does: the group needs no aliasing check, and every
// member output is written.
constexpr int kMaxFusedSequence = 10;  // deepseek2's MLA glue: K slices, norm, rope, concat, store; q slices, rope
constexpr int64_t kMaxSequenceValues = 16384;
constexpr int64_t kMaxSequenceRows = 4;

// A DeltaIn group is the consecutive run of compute nodes between a gated DeltaNet layer's
// input projections and its DeltaNet node, exactly these (any order; qwen3next / qwen35moe):
//   [Slice(ba) x2 ->] Add(alpha, dt_bias) -> Softplus -> Mul(., ssm_a); Sigmoid(beta);
//   Concat(decay, sigmoid) = the DeltaNet's gates; SsmConv(qkv) -> Slice q / k / v (channels
//   [0, d n_k), [d n_k, 2 d n_k), the rest), q and k through L2Norm (rows of d = the head size)
// where the intermediates have no reader outside (the Concat, the L2Norms and the v Slice are
// written) and the ubatch has at most kMaxDeltaInTokens tokens (the kernel's L2 norms run token
// after token per sequence: prompts keep the unfused kernels). The planner keeps the group's
// inputs live until its last member (cuda_fusion_keep_live), so its outputs never lie over them.
// The roles in FusedGroup::parts:
enum DeltaInPart : int { kDiConv, kDiQ, kDiK, kDiV, kDiGates, kDiAdd, kDiMul, kDiSigmoid, kDiParts };
constexpr int kMaxDeltaIn = 13;
constexpr int64_t kMaxDeltaInTokens = 16;
// A gate operand (the Add's alpha, the Sigmoid's beta: [n_v, T]) as the kernel reads it: element
// f = h + n_v t is element (start + f % len, rest % ne1, rest / ne1) of node src, rest = f / len.
// Through a View of a Slice (qwen3next's ba) src is the Slice's source, else the operand itself
// (start 0, len = its ne0).
void delta_gate_source(const Graph &g, int operand, int &src, int64_t &start, int64_t &len);

// A GatedNorm group: RmsNorm(x) -> Mul(., w of ne0 values) -> SwiGLU(z, .), the first two read
// by nothing else (any row count); the SwiGLU is written.
// A SharedGate group (qwen3next / qwen35moe, every layer): s = Sigmoid(logit [1, T]),
// g = MoeCombine(shared [M, 1, T], s), a = Add(routed, g) (either order), y = Add(a, r) (either
// order), all F32 rows [M, T]; s, g and a read by nothing else; y is written.

// A DeltaNorm group: DeltaNet o -> RmsNorm(o) -> Mul(., w) -> SwiGLU(z, .) as a GatedNorm group
// takes them, where the DeltaNet takes the token-sequential kernel with whole blocks
// (cuda_delta_norm_fits: head size a multiple of kDeltaNormRowsPerBlock, at most kDeltaNormMaxD,
// at most kMaxDeltaInTokens tokens, n_v x T sync counters). The head's last block to finish a
// token's rows normalises that head row (o and the SwiGLU are written). The planner keeps the
// group's inputs and o live until the SwiGLU (cuda_fusion_keep_live): the last blocks write y
// while other heads' blocks still read q / k / v / gates and write o.
constexpr int kDeltaNormRowsPerBlock = 4;
constexpr int64_t kDeltaNormMaxD = 1024;
bool cuda_delta_norm_fits(const Graph &g, const Node &dn);

// Runs a group; c.n is the node at grp.last. Falls back to the members' own launchers
// where the fused kernel does not apply at run time (e.g. a KV cache type it lacks).
void cuda_run_group(const FusedGroup &grp, const CudaOpCtx &c);

// Fused kernels (ops/fused.cu).
void cuda_fused_row_chains(const CudaOpCtx &c, const FusedGroup &grp);
void cuda_fused_router(const CudaOpCtx &c, const FusedGroup &grp);
bool cuda_fused_row_chains_fit(const CudaOpCtx &c, const FusedGroup &grp);  // run-time checks (KV type)
// ops/fused_sequence.cu.
void cuda_fused_sequence(const CudaOpCtx &c, const FusedGroup &grp);
bool cuda_fused_sequence_fit(const CudaOpCtx &c, const FusedGroup &grp);  // run-time checks (KV type)
// ops/delta_net_fused.cu.
void cuda_fused_delta_in(const CudaOpCtx &c, const FusedGroup &grp);
void cuda_fused_gated_norm(const CudaOpCtx &c, const FusedGroup &grp);
void cuda_fused_shared_gate(const CudaOpCtx &c, const FusedGroup &grp);
// ops/delta_net.cu.
void cuda_fused_delta_norm(const CudaOpCtx &c, const FusedGroup &grp);
// ops/router_topk.cu.
void cuda_fused_topk_router(const CudaOpCtx &c, const FusedGroup &grp);

}  // namespace moe
