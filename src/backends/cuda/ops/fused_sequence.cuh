// The Sequence group's launch arguments (cuda_fusion.h: Sequence), shared by the generic
// kernel (fused_sequence.cu) and the MLA glue kernel (mla_glue.cu), which runs deepseek2's
// glue sequence with its rows in shared memory.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_fusion.h"
#include "backends/cuda/ops/rope.cuh"

namespace moe {

constexpr int kSeqThreads = 512;   // one-block launches: a power of 2 (run_ew's teams), >= row_threads(n) of any RmsNorm
constexpr int kPartThreads = 256;  // launches of several blocks (rows of a few hundred values): >= row_threads(n) too
constexpr int kMaxPartBlocks = 128;  // blocks per part (a part with more rows deals them out)

enum SeqOp : int { kSqEw, kSqRope, kSqRmsNorm, kSqSoftmax, kSqTopK, kSqGatherCols, kSqNormSum, kSqKvStore };

struct SeqStep {
  int op;              // SeqOp
  int ew;              // kSqEw: the EwOp (kSlice, kConcat, kMul, kAdd, kScale, kSigmoid)
  int part;            // the independent part it belongs to (plan_blocks)
  TView d, a, b;       // output, src0, src1 (Concat's second part, Mul/Add operand, GatherCols ids)
  int64_t start;       // Slice: first element of each source row
  float f0, f1;        // Scale: x * f0 + f1; RmsNorm: eps = f0
  int nthr;            // RmsNorm, Softmax: the unfused kernel's block size (its reduction order)
  RopeArgs ra;
  const int32_t *pos;  // Rope positions
  uint8_t *kv;         // KvStore: the cache tensor, its row bytes, its DType, values per token
  size_t kv_rb;
  int kv_type;
  int64_t kv_row;
};

struct SeqArgs {
  SeqStep s[kMaxFusedSequence];
  int n;
  int part_block[kMaxFusedSequence + 1];  // part p owns blocks [part_block[p], part_block[p + 1])
  const int32_t *cells;  // token -> cache cell (KvStore)
  int n_cells;           // cells in the cache (a cell outside is reported, not stored)
  unsigned *err;         // DevUbatch::err
};
static_assert(sizeof(SeqArgs) <= 4096, "kernel parameters");

// A view's bytes [lo, hi) (every element a step may touch; 4-byte elements): the Sequence
// launchers' aliasing checks.
struct ViewBytes {
  uintptr_t lo, hi;
  bool meets(const ViewBytes &o) const { return lo < o.hi && o.lo < hi; }
};
inline ViewBytes bytes_of(const TView &v) {
  uintptr_t last = 4;
  for (int d = 0; d < 4; ++d) last += static_cast<uintptr_t>(v.ne[d] - 1) * static_cast<uintptr_t>(v.nb[d]);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(v.data);
  return {lo, lo + last};
}

// One member node as a step (host).
SeqStep make_seq_step(const CudaOpCtx &c, const Node &n);

// deepseek2's MLA glue (FusedGroup::mla_glue) with rows in shared memory (mla_glue.cu): false
// where the launch's buffers do not allow it (the caller then runs the generic kernel).
bool launch_mla_glue(const SeqArgs &a, unsigned live, const LaunchStream &stream);

}  // namespace moe
