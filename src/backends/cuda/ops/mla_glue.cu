// deepseek2's MLA glue at a few tokens (FusedGroup::mla_glue) with its rows in shared memory.
// The generic Sequence kernel (fused_sequence.cu) runs the ten members one after another
// through global memory, a block barrier and an L2 round trip per step: 19 us per layer on
// GLM-4.7-Flash (H200, eager), the K row's seven dependent steps being the critical path.
// Here one block per token loads the kv_a row once and computes the K row (rope of k_pe, the
// latent's norm and weight, their concat) in shared memory before storing it in the cache; one
// block per (head, token) loads q's row once, writes the nope slice and the roped pe part.
// Every value comes from the unfused kernels' device functions in their order (rope_*,
// rms_row_scale with the RmsNorm kernel's thread count, ew_value, kv_store_values), so the
// results are bit-identical to the generic kernel's. Only members read after the group are
// written (FusedGroup::live_mask): the planner keeps the group's inputs live until its last
// member, so no written row lies over an input (checked here again before launching).
#include <algorithm>

#include "backends/cuda/ops/ew_value.cuh"
#include "backends/cuda/ops/fused_sequence.cuh"
#include "backends/cuda/ops/kv_store.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/row_ops.cuh"

namespace moe {

namespace {

constexpr int kGlueThreads = 256;  // >= row_threads(n) of the latent's norm
constexpr int kMaxGlueRow = 1024;  // values of a kv_a row / a q head row held in shared memory

// The members (the order mla_glue in cuda_fusion.cpp checks).
enum GlueStep : int { kKpeSlice, kKpeRope, kLatSlice, kLatNorm, kLatMul, kKConcat, kKStore, kQNope, kQPeSlice, kQPeRope };

// Row r of a tensor whose rows are (i1, i2, i3) in order.
__device__ __forceinline__ float *row_of(const TView &v, int64_t r) {
  return rowp(v, r % v.ne[1], (r / v.ne[1]) % v.ne[2], r / (v.ne[1] * v.ne[2]));
}

__device__ __forceinline__ void load_row(const float *src, float *dst, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
__device__ __forceinline__ void store_row(const float *src, const TView &d, int64_t r, bool live) {
  if (!live) return;
  float *dst = row_of(d, r);
  for (int64_t i = threadIdx.x; i < d.ne[0]; i += blockDim.x) dst[i] = src[i];
}

// Rope of one head row (rope_kernel's pairs and its copied tail), src and dst in any memory.
__device__ __forceinline__ void rope_row(const float *src, float *dst, int64_t hd, const RopeArgs &ra, const float *s_cs) {
  for (int k = threadIdx.x; k < ra.n_rot / 2; k += blockDim.x) rope_rotate_pair(src, dst, k, ra, s_cs);
  for (int64_t i = ra.n_rot + threadIdx.x; i < hd; i += blockDim.x) dst[i] = src[i];
}

// Blocks [0, T): the K row of token t; blocks [T, T + H T): q's head row h + H t.
__global__ void __launch_bounds__(kGlueThreads) mla_glue_kernel(const __grid_constant__ SeqArgs a, unsigned live, int T) {
  __shared__ float s_row[kMaxGlueRow];  // the kv_a row / the q head row
  __shared__ float s_kk[kMaxGlueRow];   // the K row: [latent, k_pe]
  __shared__ float s_theta[kMaxRopeDims / 2];
  __shared__ float s_cs[kMaxRopeDims];
  __shared__ double s_red[32];
  pdl_wait();
  pdl_trigger();
  auto is_live = [&](int k) { return (live >> k) & 1u; };
  if (static_cast<int>(blockIdx.x) < T) {
    const int64_t t = blockIdx.x;
    const SeqStep &kpe = a.s[kKpeSlice], &rope = a.s[kKpeRope], &lat = a.s[kLatSlice], &norm = a.s[kLatNorm], &mul = a.s[kLatMul],
                  &cat = a.s[kKConcat], &st = a.s[kKStore];
    load_row(row_of(kpe.a, t), s_row, kpe.a.ne[0]);
    rope_angle_table(rope.pos, t, rope.ra, s_theta, s_cs);  // (block-wide; its barriers also cover the load)
    const float *pe = s_row + kpe.start, *lt = s_row + lat.start;
    const int64_t n_pe = kpe.d.ne[0], n_lat = lat.d.ne[0];
    float *k_lat = s_kk, *k_pe = s_kk + n_lat;  // the concat's row: [weighted latent, roped k_pe]
    store_row(pe, kpe.d, t, is_live(kKpeSlice));
    store_row(lt, lat.d, t, is_live(kLatSlice));
    rope_row(pe, k_pe, n_pe, rope.ra, s_cs);
    const float scale = rms_row_scale(lt, static_cast<int>(n_lat), norm.f0, norm.nthr, s_red);  // (block-wide)
    const float *w = rowp(mul.b, 0, 0, 0);
    for (int64_t i = threadIdx.x; i < n_lat; i += blockDim.x) {
      const float v = lt[i] * scale;
      if (is_live(kLatNorm)) row_of(norm.d, t)[i] = v;
      k_lat[i] = ew_value(kMul, v, w[i], i, n_lat, mul.f0, mul.f1);
    }
    __syncthreads();
    store_row(k_pe, rope.d, t, is_live(kKpeRope));
    store_row(k_lat, mul.d, t, is_live(kLatMul));
    store_row(s_kk, cat.d, t, is_live(kKConcat));
    const int32_t cell = a.cells[t];
    if (kv_cell_in_cache(cell, a.n_cells, a.err, threadIdx.x == 0))
      kv_store_values(s_kk, static_cast<int>(st.kv_row), st.kv + static_cast<size_t>(cell) * st.kv_rb, 0, st.kv_type);
    return;
  }
  const SeqStep &nope = a.s[kQNope], &pes = a.s[kQPeSlice], &rope = a.s[kQPeRope];
  const int64_t r = blockIdx.x - T, t = r / nope.d.ne[1];
  load_row(row_of(nope.a, r), s_row, nope.a.ne[0]);
  rope_angle_table(rope.pos, t, rope.ra, s_theta, s_cs);  // (block-wide; its barriers also cover the load)
  store_row(s_row + nope.start, nope.d, r, is_live(kQNope));
  store_row(s_row + pes.start, pes.d, r, is_live(kQPeSlice));
  if (is_live(kQPeRope)) rope_row(s_row + pes.start, row_of(rope.d, r), rope.d.ne[0], rope.ra, s_cs);
}

bool f32_packed_rows(const TView &v) { return v.nb[0] == 4; }

}  // namespace

bool launch_mla_glue(const SeqArgs &a, unsigned live, const LaunchStream &stream) {
  if (a.n != kQPeRope + 1) return false;
  const SeqStep &kpe = a.s[kKpeSlice], &lat = a.s[kLatSlice], &cat = a.s[kKConcat], &st = a.s[kKStore], &nope = a.s[kQNope],
                &pes = a.s[kQPeSlice], &qrope = a.s[kQPeRope], &krope = a.s[kKpeRope];
  const int64_t T = kpe.a.ne[1] * kpe.a.ne[2] * kpe.a.ne[3], H = nope.d.ne[1];
  // The rows: the slices read the same kv_a / q row; the concat is [latent, k_pe]; the store takes the concat's row.
  if (kpe.a.data != lat.a.data || nope.a.data != pes.a.data || kpe.a.ne[0] > kMaxGlueRow || nope.a.ne[0] > kMaxGlueRow) return false;
  if (cat.d.ne[0] != lat.d.ne[0] + kpe.d.ne[0] || cat.d.ne[0] > kMaxGlueRow || st.kv_row != cat.d.ne[0] || krope.d.ne[1] != 1) return false;
  if (qrope.d.ne[1] * qrope.d.ne[2] != H * T || nope.d.ne[1] * nope.d.ne[2] != H * T || krope.d.ne[2] != T) return false;
  if (krope.ra.n_rot > kMaxRopeDims || qrope.ra.n_rot > kMaxRopeDims || a.s[kLatNorm].nthr > kGlueThreads) return false;
  for (int k = 0; k < a.n; ++k)
    if (k != kKStore && !f32_packed_rows(a.s[k].d)) return false;
  // No written row over an input (the kv_a row, q, the norm weight).
  const ViewBytes in[] = {bytes_of(kpe.a), bytes_of(nope.a), bytes_of(a.s[kLatMul].b)};
  for (int k = 0; k < a.n; ++k)
    if (((live >> k) & 1u) && k != kKStore)
      for (const ViewBytes &b : in)
        if (bytes_of(a.s[k].d).meets(b)) return false;
  const unsigned blocks = static_cast<unsigned>(T + H * T);
  launch_pdl(mla_glue_kernel, dim3(blocks), dim3(kGlueThreads), 0, stream, a, live, static_cast<int>(T));
  cuda_note_mla_glue();
  return true;
}

}  // namespace moe
