// Fused op sequences (FusedKind::Sequence, cuda_fusion.h): a few consecutive small ops (the
// MLA glue of deepseek2 at one token: slices, ropes, concats, the latent's norm, the K store;
// the sigmoid router's tail: sigmoid, bias add, top-k, gather, renormalise, scale) run by ONE
// block, one op after the other, each op writing its output to its own buffer and a block
// barrier between ops. Every read and write therefore happens in the unfused order (which is
// why such a group needs no aliasing check), and each op computes its values with the unfused
// kernel's device functions (ew_value, rms_row_scale, rope_*, warp_top_k, kv_store_values),
// so the results are bit-identical to the unfused launches. Only for small tensors (the
// matcher caps the values per op): one block is fast there, and one launch replaces many.
#include "backends/cuda/cuda_fusion.h"
#include "backends/cuda/ops/ew_value.cuh"
#include "backends/cuda/ops/kv_store.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/rope.cuh"
#include "backends/cuda/ops/row_ops.cuh"
#include "backends/cuda/ops/top_k.cuh"
#include "kv/kv_cache.h"

namespace moe {

namespace {

constexpr int kSeqThreads = 512;  // a power of 2 (run_ew's teams), >= row_threads(n) of any RmsNorm (its reduction order)

enum SeqOp : int { kSqEw, kSqRope, kSqRmsNorm, kSqTopK, kSqGatherCols, kSqNormSum, kSqKvStore };

struct SeqStep {
  int op;              // SeqOp
  int ew;              // kSqEw: the EwOp (kSlice, kConcat, kMul, kAdd, kScale, kSigmoid)
  TView d, a, b;       // output, src0, src1 (Concat's second part, Mul/Add operand, GatherCols ids)
  int64_t start;       // Slice: first element of each source row
  float f0, f1;        // Scale: x * f0 + f1; RmsNorm: eps = f0
  int nthr;            // RmsNorm: the unfused kernel's block size (its reduction order)
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
  const int32_t *cells;  // token -> cache cell (KvStore)
  int n_cells;           // cells in the cache (a cell outside is reported, not stored)
  unsigned *err;         // DevUbatch::err
};
static_assert(sizeof(SeqArgs) <= 4096, "kernel parameters");

// Element i of an element-wise step's row (s0 / s1: the source rows), as ew_kernel computes it.
__device__ __forceinline__ float ew_row_value(const SeqStep &s, const float *s0, const float *s1, int64_t i, int64_t n) {
  switch (s.ew) {
    case kSlice: return s0[s.start + i];
    case kConcat: return i < s.a.ne[0] ? s0[i] : s1[i - s.a.ne[0]];
    case kMul: case kAdd: return ew_value(s.ew, s0[i], s1[i], i, n, s.f0, s.f1);
    default: return ew_value(s.ew, s0[i], 0.0f, i, n, s.f0, s.f1);
  }
}

// Rows are dealt to teams of threads (a warp, or more where there are few rows), so the
// row's index arithmetic (64-bit divisions) is done once per row, not per value. kBatch
// values per thread are loaded before any is stored (the output may alias an input as far
// as the compiler knows: a store after each load would keep one load at a time in flight).
__device__ void run_ew(const SeqStep &s) {
  constexpr int kBatch = 8;
  const int64_t n = s.d.ne[0], rows = s.d.ne[1] * s.d.ne[2] * s.d.ne[3];
  const int nthr = static_cast<int>(blockDim.x);
  int team = 32;
  while (team < nthr && rows * team * 2 <= nthr) team *= 2;  // blockDim is a power of 2: teams tile it
  const int lane = static_cast<int>(threadIdx.x) % team, teams = nthr / team;
  for (int64_t r = threadIdx.x / team; r < rows; r += teams) {
    const int64_t i1 = r % s.d.ne[1], i2 = (r / s.d.ne[1]) % s.d.ne[2], i3 = r / (s.d.ne[1] * s.d.ne[2]);
    float *dst = rowp(s.d, i1, i2, i3);
    const float *s0 = rowp(s.a, i1, i2, i3);
    const float *s1 = nullptr;
    if (s.ew == kConcat) s1 = rowp(s.b, i1, i2, i3);
    else if (s.ew == kMul || s.ew == kAdd) s1 = rowp(s.b, s.b.ne[1] == 1 ? 0 : i1, s.b.ne[2] == 1 ? 0 : i2, s.b.ne[3] == 1 ? 0 : i3);
    for (int64_t i0 = lane; i0 < n; i0 += static_cast<int64_t>(kBatch) * team) {
      float v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t i = i0 + static_cast<int64_t>(j) * team;
        v[j] = i < n ? ew_row_value(s, s0, s1, i, n) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t i = i0 + static_cast<int64_t>(j) * team;
        if (i < n) dst[i] = v[j];
      }
    }
  }
}

// rope_kernel's work, token after token ([head_dim, n_head, T]; a thread owns a whole pair).
__device__ void run_rope(const SeqStep &s, float *s_theta, float *s_cs) {
  const int64_t hd = s.d.ne[0], n_head = s.d.ne[1], T = s.d.ne[2];
  const int half_pairs = s.ra.n_rot / 2;
  const int64_t tail = hd - s.ra.n_rot;
  for (int64_t t = 0; t < T; ++t) {
    rope_angle_table(s.pos, t, s.ra, s_theta, s_cs);  // block-wide, ends with a barrier
    for (int64_t idx = threadIdx.x; idx < n_head * half_pairs; idx += blockDim.x) {
      const int64_t h = idx / half_pairs;
      const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(s.a.data) + h * s.a.nb[1] + t * s.a.nb[2]);
      float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(s.d.data) + h * s.d.nb[1] + t * s.d.nb[2]);
      rope_rotate_pair(src, dst, static_cast<int>(idx % half_pairs), s.ra, s_cs);
    }
    for (int64_t idx = threadIdx.x; idx < n_head * tail; idx += blockDim.x) {
      const int64_t h = idx / tail, i = s.ra.n_rot + idx % tail;
      const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(s.a.data) + h * s.a.nb[1] + t * s.a.nb[2]);
      float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(s.d.data) + h * s.d.nb[1] + t * s.d.nb[2]);
      dst[i] = src[i];
    }
    __syncthreads();  // s_cs is rebuilt for the next token
  }
}

// rms_norm_kernel's work, row after row.
__device__ void run_rms_norm(const SeqStep &s, double *s_red) {
  const int64_t n = s.d.ne[0], rows = s.d.ne[1] * s.d.ne[2] * s.d.ne[3];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i1 = r % s.d.ne[1], i2 = (r / s.d.ne[1]) % s.d.ne[2], i3 = r / (s.d.ne[1] * s.d.ne[2]);
    const float *src = rowp(s.a, i1, i2, i3);
    float *dst = rowp(s.d, i1, i2, i3);
    const float scale = rms_row_scale(src, n, s.f0, s.nthr, s_red);  // block-wide
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i] * scale;
  }
}

// top_k_kernel's work: a warp per token row.
__device__ void run_top_k(const SeqStep &s) {
  const int64_t T = s.d.ne[1];
  const int warps = static_cast<int>(blockDim.x >> 5);
  for (int64_t t = threadIdx.x >> 5; t < T; t += warps) {
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(s.a.data) + t * s.a.nb[1]);
    warp_top_k(src, static_cast<int>(s.a.ne[0]), static_cast<int>(s.d.ne[0]),
               reinterpret_cast<int32_t *>(static_cast<uint8_t *>(s.d.data) + t * s.d.nb[1]));
  }
}

// gather_cols_kernel's work.
__device__ void run_gather_cols(const SeqStep &s, unsigned *err) {
  const int64_t k = s.d.ne[0], T = s.d.ne[1];
  for (int64_t i = threadIdx.x; i < k * T; i += blockDim.x) {
    const int64_t t = i / k, j = i % k;
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(s.a.data) + t * s.a.nb[1]);
    const int32_t e = reinterpret_cast<const int32_t *>(static_cast<const uint8_t *>(s.b.data) + t * s.b.nb[1])[j];
    const bool ok = e >= 0 && e < s.a.ne[0];
    if (!ok) report_bad_index(err, kKernelErrRouteId, e, s.a.ne[0]);
    reinterpret_cast<float *>(static_cast<uint8_t *>(s.d.data) + t * s.d.nb[1])[j] = ok ? src[e] : 0.0f;
  }
}

// norm_sum_kernel's work: a thread per row, serial float sum.
__device__ void run_norm_sum(const SeqStep &s) {
  const int64_t rows = s.d.ne[1] * s.d.ne[2] * s.d.ne[3];
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t i1 = r % s.d.ne[1], i2 = (r / s.d.ne[1]) % s.d.ne[2], i3 = r / (s.d.ne[1] * s.d.ne[2]);
    const float *src = rowp(s.a, i1, i2, i3);
    float *dst = rowp(s.d, i1, i2, i3);
    float sum = 0.0f;
    for (int64_t i = 0; i < s.d.ne[0]; ++i) sum += src[i];
    for (int64_t i = 0; i < s.d.ne[0]; ++i) dst[i] = src[i] / sum;
  }
}

// kv_store_kernel's work: token t's row (kv_row values at src0 + t * nb[2]) into its cell.
__device__ void run_kv_store(const SeqStep &s, const SeqArgs &a) {
  for (int64_t t = 0; t < s.a.ne[2]; ++t) {
    const int32_t cell = a.cells[t];
    if (!kv_cell_in_cache(cell, a.n_cells, a.err, threadIdx.x == 0)) continue;  // the same cell in every thread
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(s.a.data) + t * s.a.nb[2]);
    kv_store_values(src, static_cast<int>(s.kv_row), s.kv + static_cast<size_t>(cell) * s.kv_rb, 0, s.kv_type);
  }
}

// __grid_constant__: steps are picked by a run-time index into the parameters, which must
// not make each thread copy them to local memory.
__global__ void __launch_bounds__(kSeqThreads) sequence_kernel(const __grid_constant__ SeqArgs a) {
  __shared__ float s_theta[kMaxRopeDims / 2];
  __shared__ float s_cs[kMaxRopeDims];
  __shared__ double s_red[32];
  pdl_wait();
  pdl_trigger();
  for (int k = 0; k < a.n; ++k) {
    const SeqStep &s = a.s[k];
    switch (s.op) {
      case kSqEw: run_ew(s); break;
      case kSqRope: run_rope(s, s_theta, s_cs); break;
      case kSqRmsNorm: run_rms_norm(s, s_red); break;
      case kSqTopK: run_top_k(s); break;
      case kSqGatherCols: run_gather_cols(s, a.err); break;
      case kSqNormSum: run_norm_sum(s); break;
      default: run_kv_store(s, a); break;
    }
    __syncthreads();  // the step's writes are visible to the whole block before the next step reads them
  }
}

bool kv_store_fits(const CudaOpCtx &c, const Node &n) {
  if (!c.kv) return false;
  const DType t = c.kv->dtype();
  if (t == DType::Q8_0) return n.ip[0] % 32 == 0;
  return t == DType::F32 || t == DType::F16;
}

SeqStep make_step(const CudaOpCtx &c, const Node &n) {
  SeqStep s{};
  s.d = tview(n);
  s.a = tview(c.g.node(n.src[0]));
  s.b = n.src[1] >= 0 ? tview(c.g.node(n.src[1])) : s.a;
  s.op = kSqEw;
  switch (n.op) {
    case Op::Slice: s.ew = kSlice; s.start = n.ip[0]; break;
    case Op::Concat: s.ew = kConcat; break;
    case Op::Mul: s.ew = kMul; break;
    case Op::Add: s.ew = kAdd; break;
    case Op::Scale: s.ew = kScale; s.f0 = n.fp[0]; s.f1 = n.fp[1]; break;
    case Op::Sigmoid: s.ew = kSigmoid; break;
    case Op::Rope:
      s.op = kSqRope;
      s.ra = make_rope_args(n.rope, c.ub, n.ne[2]);
      s.pos = static_cast<const int32_t *>(c.g.node(n.src[1]).data);
      break;
    case Op::RmsNorm: s.op = kSqRmsNorm; s.f0 = n.fp[0]; s.nthr = row_threads(n.ne[0]); break;
    case Op::TopK: s.op = kSqTopK; break;
    case Op::GatherCols: s.op = kSqGatherCols; break;
    case Op::NormSum: s.op = kSqNormSum; break;
    default:  // KvStore (the matcher admits no other op)
      s.op = kSqKvStore;
      s.kv = static_cast<uint8_t *>(n.kv_which == 0 ? c.kv->k_data(n.kv_layer) : c.kv->v_data(n.kv_layer));
      s.kv_rb = n.kv_which == 0 ? c.kv->k_row_bytes(n.kv_layer) : c.kv->v_row_bytes(n.kv_layer);
      s.kv_type = static_cast<int>(c.kv->dtype());
      s.kv_row = n.ip[0];
      break;
  }
  return s;
}

}  // namespace

bool cuda_fused_sequence_fit(const CudaOpCtx &c, const FusedGroup &grp) {
  if (grp.members.size() > static_cast<size_t>(kMaxFusedSequence)) return false;
  for (int m : grp.members)
    if (c.g.node(m).op == Op::KvStore && !kv_store_fits(c, c.g.node(m))) return false;
  return true;
}

void cuda_fused_sequence(const CudaOpCtx &c, const FusedGroup &grp) {
  SeqArgs a{};
  a.n = static_cast<int>(grp.members.size());
  a.cells = c.ub.cells;
  a.n_cells = c.kv ? static_cast<int>(c.kv->n_cells()) : 0;
  a.err = c.ub.err;
  for (int k = 0; k < a.n; ++k) a.s[k] = make_step(c, c.g.node(grp.members[static_cast<size_t>(k)]));
  launch_pdl(sequence_kernel, dim3(1), dim3(kSeqThreads), 0, c.stream, a);
}

}  // namespace moe
