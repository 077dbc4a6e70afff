// Fused op sequences (FusedKind::Sequence, cuda_fusion.h): a few consecutive small ops (the
// MLA glue of deepseek2 at one token: slices, ropes, concats, the latent's norm, the K store;
// the sigmoid router's tail: sigmoid, bias add, top-k, gather, renormalise, scale; gpt-oss's
// router tail: top-k, gather, softmax of the chosen) in one launch. Each op computes its
// values with the unfused kernel's device functions (ew_value, rms_row_scale, softmax_row,
// rope_*, warp_top_k, kv_store_values), so the results are bit-identical to
// the unfused launches. Only for small tensors (the matcher caps the values per op).
//
// Every op here is row-wise: output row r reads row r of each operand (a broadcast operand:
// its one row; a K store: token r's row). The launcher (plan_blocks) reads the steps' address
// ranges and splits the steps into independent parts: steps joined where one reads or
// overwrites another's bytes row for row (the same row layout at the same address), so that a
// part's row r is a chain that one block can run in order. Each part gets blocks, block j of
// a part running rows j, j + nb, ... of each of its steps with a block barrier between steps.
// The MLA glue at one token so runs as 40 (q: nope copy | pe slice -> rope), 2 (k_pe ->
// rope | latent -> norm -> mul) and 21 (qk concat | kk concat -> K store) blocks instead of one
// block running every row of every step in turn. Steps whose bytes meet otherwise (the
// planner reused a dead buffer with another row layout) form a serial part: one block runs
// all its rows, every read and write in the unfused order, whatever aliases.
#include "backends/cuda/cuda_fusion.h"

#include <algorithm>

#include "backends/cuda/ops/ew_value.cuh"
#include "backends/cuda/ops/fused_sequence.cuh"
#include "backends/cuda/ops/kv_store.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/rope.cuh"
#include "backends/cuda/ops/row_ops.cuh"
#include "backends/cuda/ops/top_k.cuh"
#include "kv/kv_cache.h"

namespace moe {

namespace {

// The rows of a part this block runs: j, j + nb, ... (j < nb).
struct RowSet {
  int64_t j, nb;
  __host__ __device__ int64_t count(int64_t rows) const { return j < rows ? (rows - j + nb - 1) / nb : 0; }
  __host__ __device__ int64_t row(int64_t v) const { return j + v * nb; }
};

// Element i of an element-wise step's row (s0 / s1: the source rows), as ew_kernel computes it.
__device__ __forceinline__ float ew_row_value(const SeqStep &s, const float *s0, const float *s1, int64_t i, int64_t n) {
  switch (s.ew) {
    case kSlice: return s0[s.start + i];
    case kConcat: return i < s.a.ne[0] ? s0[i] : s1[i - s.a.ne[0]];
    case kMul: case kAdd: return ew_value(s.ew, s0[i], s1[i], i, n, s.f0, s.f1);
    default: return ew_value(s.ew, s0[i], 0.0f, i, n, s.f0, s.f1);
  }
}

// The block's rows are dealt to teams of threads (a warp, or more where there are few rows),
// so the row's index arithmetic (64-bit divisions) is done once per row, not per value.
// kBatch values per thread are loaded before any is stored (the output may alias an input as
// far as the compiler knows: a store after each load would keep one load at a time in flight).
__device__ void run_ew(const SeqStep &s, RowSet rs) {
  constexpr int kBatch = 8;
  const int64_t n = s.d.ne[0], rows = rs.count(s.d.ne[1] * s.d.ne[2] * s.d.ne[3]);
  const int nthr = static_cast<int>(blockDim.x);
  int team = 32;
  while (team < nthr && rows * team * 2 <= nthr) team *= 2;  // blockDim is a power of 2: teams tile it
  const int lane = static_cast<int>(threadIdx.x) % team, teams = nthr / team;
  for (int64_t v = threadIdx.x / team; v < rows; v += teams) {
    const int64_t r = rs.row(v);
    const int64_t i1 = r % s.d.ne[1], i2 = (r / s.d.ne[1]) % s.d.ne[2], i3 = r / (s.d.ne[1] * s.d.ne[2]);
    float *dst = rowp(s.d, i1, i2, i3);
    const float *s0 = rowp(s.a, i1, i2, i3);
    const float *s1 = nullptr;
    if (s.ew == kConcat) s1 = rowp(s.b, i1, i2, i3);
    else if (s.ew == kMul || s.ew == kAdd) s1 = rowp(s.b, s.b.ne[1] == 1 ? 0 : i1, s.b.ne[2] == 1 ? 0 : i2, s.b.ne[3] == 1 ? 0 : i3);
    for (int64_t i0 = lane; i0 < n; i0 += static_cast<int64_t>(kBatch) * team) {
      float v8[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t i = i0 + static_cast<int64_t>(j) * team;
        v8[j] = i < n ? ew_row_value(s, s0, s1, i, n) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t i = i0 + static_cast<int64_t>(j) * team;
        if (i < n) dst[i] = v8[j];
      }
    }
  }
}

// rope_kernel's work on the block's rows ([head_dim, n_head, T]; row h + n_head t), token
// after token (one angle table each; a thread owns a whole pair).
__device__ void run_rope(const SeqStep &s, RowSet rs, float *s_theta, float *s_cs) {
  const int64_t hd = s.d.ne[0], n_head = s.d.ne[1], T = s.d.ne[2];
  const int half_pairs = s.ra.n_rot / 2;
  const int64_t tail = hd - s.ra.n_rot;
  for (int64_t t = 0; t < T; ++t) {
    // The block's rows of token t: first, first + nb, ... below (t + 1) n_head.
    const int64_t first = t * n_head + ((rs.j - t * n_head) % rs.nb + rs.nb) % rs.nb;
    if (first >= (t + 1) * n_head) continue;  // block-uniform
    const int64_t mine = ((t + 1) * n_head - first + rs.nb - 1) / rs.nb;
    rope_angle_table(s.pos, t, s.ra, s_theta, s_cs);  // block-wide, ends with a barrier
    for (int64_t idx = threadIdx.x; idx < mine * half_pairs; idx += blockDim.x) {
      const int64_t h = first + (idx / half_pairs) * rs.nb - t * n_head;
      const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(s.a.data) + h * s.a.nb[1] + t * s.a.nb[2]);
      float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(s.d.data) + h * s.d.nb[1] + t * s.d.nb[2]);
      rope_rotate_pair(src, dst, static_cast<int>(idx % half_pairs), s.ra, s_cs);
    }
    for (int64_t idx = threadIdx.x; idx < mine * tail; idx += blockDim.x) {
      const int64_t h = first + (idx / tail) * rs.nb - t * n_head, i = s.ra.n_rot + idx % tail;
      const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(s.a.data) + h * s.a.nb[1] + t * s.a.nb[2]);
      float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(s.d.data) + h * s.d.nb[1] + t * s.d.nb[2]);
      dst[i] = src[i];
    }
    __syncthreads();  // s_cs is rebuilt for the next token
  }
}

// rms_norm_kernel's work, row after row.
__device__ void run_rms_norm(const SeqStep &s, RowSet rs, double *s_red) {
  const int64_t n = s.d.ne[0], rows = s.d.ne[1] * s.d.ne[2] * s.d.ne[3];
  for (int64_t r = rs.j; r < rows; r += rs.nb) {
    const int64_t i1 = r % s.d.ne[1], i2 = (r / s.d.ne[1]) % s.d.ne[2], i3 = r / (s.d.ne[1] * s.d.ne[2]);
    const float *src = rowp(s.a, i1, i2, i3);
    float *dst = rowp(s.d, i1, i2, i3);
    const float scale = rms_row_scale(src, n, s.f0, s.nthr, s_red);  // block-wide
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i] * scale;
  }
}

// softmax_kernel's work, row after row (the CPU's order: softmax_row).
__device__ void run_softmax(const SeqStep &s, RowSet rs, float *s_redf, double *s_red) {
  const int64_t rows = s.d.ne[1] * s.d.ne[2] * s.d.ne[3];
  for (int64_t r = rs.j; r < rows; r += rs.nb) {
    const int64_t i1 = r % s.d.ne[1], i2 = (r / s.d.ne[1]) % s.d.ne[2], i3 = r / (s.d.ne[1] * s.d.ne[2]);
    softmax_row(rowp(s.a, i1, i2, i3), rowp(s.d, i1, i2, i3), static_cast<int>(s.d.ne[0]), s_redf, s_red, s.nthr);  // block-wide
  }
}

// top_k_kernel's work: a warp per token row.
__device__ void run_top_k(const SeqStep &s, RowSet rs) {
  const int64_t T = rs.count(s.d.ne[1]);
  const int warps = static_cast<int>(blockDim.x >> 5);
  for (int64_t v = threadIdx.x >> 5; v < T; v += warps) {
    const int64_t t = rs.row(v);
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(s.a.data) + t * s.a.nb[1]);
    warp_top_k(src, static_cast<int>(s.a.ne[0]), static_cast<int>(s.d.ne[0]),
               reinterpret_cast<int32_t *>(static_cast<uint8_t *>(s.d.data) + t * s.d.nb[1]));
  }
}

// gather_cols_kernel's work.
__device__ void run_gather_cols(const SeqStep &s, RowSet rs, unsigned *err) {
  const int64_t k = s.d.ne[0], T = rs.count(s.d.ne[1]);
  for (int64_t i = threadIdx.x; i < k * T; i += blockDim.x) {
    const int64_t t = rs.row(i / k), j = i % k;
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(s.a.data) + t * s.a.nb[1]);
    const int32_t e = reinterpret_cast<const int32_t *>(static_cast<const uint8_t *>(s.b.data) + t * s.b.nb[1])[j];
    const bool ok = e >= 0 && e < s.a.ne[0];
    if (!ok) report_bad_index(err, kKernelErrRouteId, e, s.a.ne[0]);
    reinterpret_cast<float *>(static_cast<uint8_t *>(s.d.data) + t * s.d.nb[1])[j] = ok ? src[e] : 0.0f;
  }
}

// norm_sum_kernel's work: a thread per row, serial float sum.
__device__ void run_norm_sum(const SeqStep &s, RowSet rs) {
  const int64_t rows = rs.count(s.d.ne[1] * s.d.ne[2] * s.d.ne[3]);
  for (int64_t v = threadIdx.x; v < rows; v += blockDim.x) {
    const int64_t r = rs.row(v);
    const int64_t i1 = r % s.d.ne[1], i2 = (r / s.d.ne[1]) % s.d.ne[2], i3 = r / (s.d.ne[1] * s.d.ne[2]);
    const float *src = rowp(s.a, i1, i2, i3);
    float *dst = rowp(s.d, i1, i2, i3);
    float sum = 0.0f;
    for (int64_t i = 0; i < s.d.ne[0]; ++i) sum += src[i];
    for (int64_t i = 0; i < s.d.ne[0]; ++i) dst[i] = src[i] / sum;
  }
}

// kv_store_kernel's work: token t's row (kv_row values at src0 + t * nb[2]) into its cell.
__device__ void run_kv_store(const SeqStep &s, RowSet rs, const SeqArgs &a) {
  for (int64_t t = rs.j; t < s.a.ne[2]; t += rs.nb) {
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
  __shared__ float s_redf[32];
  int part = 0;
  while (static_cast<int>(blockIdx.x) >= a.part_block[part + 1]) ++part;
  const RowSet rs{static_cast<int64_t>(blockIdx.x) - a.part_block[part], static_cast<int64_t>(a.part_block[part + 1] - a.part_block[part])};
  pdl_wait();
  pdl_trigger();
  for (int k = 0; k < a.n; ++k) {
    const SeqStep &s = a.s[k];
    if (s.part != part) continue;  // block-uniform
    switch (s.op) {
      case kSqEw: run_ew(s, rs); break;
      case kSqRope: run_rope(s, rs, s_theta, s_cs); break;
      case kSqRmsNorm: run_rms_norm(s, rs, s_red); break;
      case kSqSoftmax: run_softmax(s, rs, s_redf, s_red); break;
      case kSqTopK: run_top_k(s, rs); break;
      case kSqGatherCols: run_gather_cols(s, rs, a.err); break;
      case kSqNormSum: run_norm_sum(s, rs); break;
      default: run_kv_store(s, rs, a); break;
    }
    __syncthreads();  // the step's writes are visible to the whole block before the next step reads them
  }
}

// ---- host: the parts of a launch (plan_blocks)

// Rows of a step: what its row loop runs over.
int64_t step_rows(const SeqStep &s) {
  switch (s.op) {
    case kSqRope: return s.d.ne[1] * s.d.ne[2];
    case kSqTopK: case kSqGatherCols: return s.d.ne[1];
    case kSqKvStore: return s.a.ne[2];
    default: return s.d.ne[1] * s.d.ne[2] * s.d.ne[3];
  }
}

// Packed rows of 4-byte values, rows in (i1, i2, i3) order: row r at r * ne[0] * 4.
bool packed(const TView &v) {
  return v.nb[0] == 4 && v.nb[1] == v.ne[0] * 4 && v.nb[2] == v.nb[1] * v.ne[1] && v.nb[3] == v.nb[2] * v.ne[2];
}
int64_t tensor_rows(const TView &v) { return v.ne[1] * v.ne[2] * v.ne[3]; }

// An operand of step s that the step reads row for row (row r for its row r).
struct Operand {
  TView v;
  bool by_row;
};
int operands(const SeqStep &s, Operand (&o)[2]) {
  const int64_t rows = step_rows(s);
  const bool a_rows = tensor_rows(s.a) == rows && (s.op != kSqKvStore || s.a.ne[1] == 1);
  o[0] = {s.a, a_rows};
  const bool two = (s.op == kSqEw && (s.ew == kConcat || s.ew == kMul || s.ew == kAdd)) || s.op == kSqGatherCols;
  if (two) o[1] = {s.b, tensor_rows(s.b) == rows};
  return two ? 2 : 1;
}

// Whether x's row r is exactly y's row r for every r (same address, same packed row layout).
bool same_rows(const TView &x, const TView &y) {
  return x.data == y.data && x.ne[0] == y.ne[0] && tensor_rows(x) == tensor_rows(y) && packed(x) && packed(y);
}

// Splits the steps into parts and deals the blocks (a.part_block, each step's part); returns
// the block count. Steps p < m whose bytes meet (m reads what p wrote, m overwrites what p
// read, both write the same bytes) join one part. A part whose meetings are all the same rows
// read row for row gets a block per row; a part with any other meeting (the planner put a
// buffer over a dead one of another row layout) is serial: one block runs all its rows, so
// its reads and writes happen in the unfused order. Parts never meet: they run side by side.
int plan_blocks(SeqArgs &a) {
  int parent[kMaxFusedSequence];
  bool serial[kMaxFusedSequence];
  for (int k = 0; k < a.n; ++k) {
    parent[k] = k;
    serial[k] = false;
  }
  auto root = [&](int k) {
    while (parent[k] != k) k = parent[k];
    return k;
  };
  for (int m = 0; m < a.n; ++m) {
    Operand om[2];
    const int nm = operands(a.s[m], om);
    const bool m_writes = a.s[m].op != kSqKvStore;  // (the K store writes the cache, which no step reads)
    for (int p = 0; p < m; ++p) {
      Operand op[2];
      const int np = operands(a.s[p], op);
      const bool p_writes = a.s[p].op != kSqKvStore;
      bool join = false, by_rows = true;
      auto check = [&](const TView &x, bool x_by_row, const TView &y, bool y_by_row) {
        if (!bytes_of(x).meets(bytes_of(y))) return;
        join = true;
        by_rows = by_rows && x_by_row && y_by_row && same_rows(x, y);
      };
      for (int i = 0; i < nm && p_writes; ++i) check(om[i].v, om[i].by_row, a.s[p].d, true);   // m reads p's output
      for (int i = 0; i < np && m_writes; ++i) check(a.s[m].d, true, op[i].v, op[i].by_row);  // m overwrites p's input
      if (m_writes && p_writes) check(a.s[m].d, true, a.s[p].d, true);                        // both write
      if (!join) continue;
      const int rm = root(m), rp = root(p);
      const bool ser = serial[rm] || serial[rp] || !by_rows;
      parent[rm] = rp;
      serial[rp] = ser;
    }
  }
  int n_parts = 0, blocks = 0;
  int part_of_root[kMaxFusedSequence];
  for (int k = 0; k < a.n; ++k) part_of_root[k] = -1;
  for (int k = 0; k < a.n; ++k) {
    const int r = root(k);
    if (part_of_root[r] < 0) part_of_root[r] = n_parts++;
    a.s[k].part = part_of_root[r];
  }
  a.part_block[0] = 0;
  for (int p = 0; p < n_parts; ++p) {
    int64_t rows = 1;
    bool ser = false;
    for (int k = 0; k < a.n; ++k)
      if (a.s[k].part == p) {
        rows = std::max(rows, step_rows(a.s[k]));
        ser = ser || serial[root(k)];
      }
    blocks += ser ? 1 : static_cast<int>(std::min<int64_t>(rows, kMaxPartBlocks));
    a.part_block[p + 1] = blocks;
  }
  return blocks;
}

// Plans the parts and launches (one block: kSeqThreads threads; more: kPartThreads each).
template <typename Stream> void launch_sequence(SeqArgs &a, const Stream &stream) {
  const int blocks = plan_blocks(a);
  launch_pdl(sequence_kernel, dim3(static_cast<unsigned>(blocks)), dim3(blocks > 1 ? kPartThreads : kSeqThreads), 0, stream, a);
}

bool kv_store_fits(const CudaOpCtx &c, const Node &n) {
  if (!c.kv) return false;
  const DType t = c.kv->dtype();
  if (t == DType::Q8_0) return n.ip[0] % 32 == 0;
  return t == DType::F32 || t == DType::F16;
}

}  // namespace

SeqStep make_seq_step(const CudaOpCtx &c, const Node &n) {
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
    case Op::Softmax: s.op = kSqSoftmax; s.nthr = row_threads(n.ne[0]); break;
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
  for (int k = 0; k < a.n; ++k) a.s[k] = make_seq_step(c, c.g.node(grp.members[static_cast<size_t>(k)]));
  if (grp.mla_glue && launch_mla_glue(a, grp.live_mask, c.stream)) return;
  launch_sequence(a, c.stream);
}

}  // namespace moe
