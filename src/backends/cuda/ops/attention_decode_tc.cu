// Decode attention on f16 tensor cores (opt-in: GpuTuning::tc_decode_attention) for an F16
// cache, head sizes 128 / 256, up to 4 tokens: a block owns one KV head, a tile of 16 query
// rows (token, head) of its group and one range of cells. The rows are the M side of
// mma.sync m16n8k16 (q in registers as A fragments, rounded to f16 like the reference), cells
// the N side: per warp tile of 16 cells S = q K^T (K B fragments loaded straight from global
// memory: a lane's 4-byte words are the dims it needs), the online softmax in f32 on the S
// fragments, then O += P V with P rounded to f16 and V from shared memory (cp.async, read
// transposed by ldmatrix). Why: the grouped kernel (attention_decode.cu) spends ~300-600
// dependent instructions per cell and warp on the dots and V FMAs of 8 heads; here a 16-cell
// tile is 2 x HD/16 + HD/8 mma per warp whatever the group size (docs/perf/cuda.md).
// Each of the 4 warps walks a quarter of the block's range; the warps merge in shared memory.
// Head size 256 splits the output dims over two blocks (both compute the scores), so q and
// the accumulators stay at 64 registers each, as in attention_mma.cu.
// Ranges, the partial layout (attn_decode_work_size), the last-block merge counters and the
// masks are those of the grouped kernel.
#include "backends/cuda/ops/arch_guard.cuh"
#include "backends/cuda/ops/attention_decode.cuh"
#include "backends/cuda/ops/mma_common.cuh"
#include "backends/cuda/ops/pdl.cuh"

namespace moe {

namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kRows = 16;   // query rows per block (the mma M side)
constexpr int kCells = 16;  // cells per warp tile: one k-step of P V
constexpr int kSplit = kAttnDecodeMaxRanges;
constexpr int kMaxTokens = 4;

template <int HD> struct TcShape {
  static constexpr int kDv = HD <= 128 ? HD : 128;  // output dims per block
  static constexpr int kHalves = HD / kDv;          // blocks per row tile
  static constexpr int kLdv = kDv + 8;              // halves per shared V row: ldmatrix rows on distinct banks
};

using mma_tile::cp_async_16;
using mma_tile::cp_async_commit;
using mma_tile::cp_async_wait;
using mma_tile::ldmatrix_x4_trans;
using mma_tile::mma16816;
using mma_tile::pack2;

// What a block works on: KV head hk, rows r0 .. r0 + 15 (row r: token r / group, head
// hk * group + r % group), output dims dv0 .., range z of cells [c_begin, c_end).
struct TcJob {
  int hk, r0, rows, dv0, z, c_begin, c_end, n_used;
};

// The merge's second pass: a thread owns KP pairs of dims of the nr real rows (8-byte loads:
// the partial rows are 8-byte aligned, HD + 2 even) and walks the ranges KU at a time, so
// KP x KU loads are in flight. Why: with one (row, dim) value at a time and 2 ranges in
// flight, the 32 ranges of a 4096-cell context were 16 dependent L2 round trips (~10 us: the
// kernel measured slower than the grouped one at depth, docs/perf/cuda.md 2026-12-03 evening).
template <int DV, int HD, int KP, int KU>
__device__ __forceinline__ void tc_merge_values(const TView &out, const AttnArgs &a, const float *part, const TcJob &j, int nr, int n_head,
                                                const float (&s_w)[kRows][kSplit], const float (&s_f)[kRows]) {
  float *p = const_cast<float *>(part);
  float2 sum[KP];
  int off[KP], row[KP];  // value pair k of range z: p + off[k] + z * (HD + 2); off[k] < 0: none
#pragma unroll
  for (int k = 0; k < KP; ++k) {
    const int e = threadIdx.x + k * kThreads, r = e / (DV / 2), gr = j.r0 + r;
    row[k] = r;
    off[k] = r < nr ? static_cast<int>(attn_partial(p, gr / a.group, j.hk * a.group + gr % a.group, 0, n_head, kSplit, HD) - p) + 2 + j.dv0 +
                          2 * (e % (DV / 2))
                    : -1;
    sum[k] = make_float2(0.0f, 0.0f);
  }
  for (int z0 = 0; z0 < j.n_used; z0 += KU) {
    float2 v[KU][KP];
#pragma unroll
    for (int u = 0; u < KU; ++u)
#pragma unroll
      for (int k = 0; k < KP; ++k) {
        const int z = z0 + u;
        v[u][k] = off[k] >= 0 && z < j.n_used && s_w[row[k]][z] != 0.0f ? __ldcg(reinterpret_cast<const float2 *>(p + off[k] + z * (HD + 2)))
                                                                        : make_float2(0.0f, 0.0f);
      }
#pragma unroll
    for (int u = 0; u < KU; ++u)
#pragma unroll
      for (int k = 0; k < KP; ++k)
        if (off[k] >= 0 && z0 + u < j.n_used) {
          const float w = s_w[row[k]][z0 + u];
          sum[k].x += v[u][k].x * w;
          sum[k].y += v[u][k].y * w;
        }
  }
#pragma unroll
  for (int k = 0; k < KP; ++k) {
    if (off[k] < 0) continue;
    const int e = threadIdx.x + k * kThreads, r = row[k], gr = j.r0 + r, d = j.dv0 + 2 * (e % (DV / 2));
    float *o = attn_out_row(out, gr / a.group, j.hk * a.group + gr % a.group);
    o[d] = sum[k].x * s_f[r];
    o[d + 1] = sum[k].y * s_f[r];
  }
}

// The last block of a row tile folds the n_used ranges' partials of its rows (its dims) into
// the output. A range whose cells are all hidden has max -inf and weighs 0.
template <int DV, int HD>
__device__ void tc_merge(const TView &out, const AttnArgs &a, const float *part, const TcJob &j, int n_head, float (&s_w)[kRows][kSplit],
                         float (&s_f)[kRows]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float *p = const_cast<float *>(part);
  for (int r = warp; r < kRows; r += kWarps) {
    const int gr = j.r0 + r;
    if (gr >= j.rows) break;  // warp-uniform
    const int t = gr / a.group, h = j.hk * a.group + gr % a.group;
    const float f = decode_range_weights<HD>(p, t, h, j.n_used, n_head, kAttnDecodeMaxRanges, a.sinks, s_w[r], lane);
    if (lane == 0) s_f[r] = f;
  }
  __syncthreads();
  // Rows past the batch have no partials: with a group of 8 at one token (the common decode
  // case) half the tile. The threads cover only the nr real rows' values, so twice the loads
  // are in flight per thread there.
  const int nr = min(kRows, j.rows - j.r0);
  constexpr int kPairsAll = kRows * DV / 2 / kThreads, kPairsHalf = kPairsAll / 2;
  static_assert(kPairsAll * kThreads * 2 == kRows * DV && kPairsHalf * kThreads * 2 == kRows / 2 * DV, "pairs per thread");
  if (nr <= kRows / 2) tc_merge_values<DV, HD, kPairsHalf, 8>(out, a, part, j, nr, n_head, s_w, s_f);
  else tc_merge_values<DV, HD, kPairsAll, 4>(out, a, part, j, nr, n_head, s_w, s_f);
}

template <int HD>
__global__ void __launch_bounds__(kThreads) attn_decode_tc_kernel(TView q, TView out, AttnArgs a, DevUbatch ub, float *part, int n_head,
                                                                  int row_tiles, int T, int merge, int max_ranges, int min_chunk) {
#if MOE_CUDA_TENSOR_CORE_CODE
  constexpr int DV = TcShape<HD>::kDv, kHalves = TcShape<HD>::kHalves, LDV = TcShape<HD>::kLdv;
  constexpr int KS = HD / 16;  // k-steps of q K^T
  constexpr int ND = DV / 8;   // output column blocks (8 dims) of this block
  static_assert(ND % 2 == 0, "ldmatrix.x4 serves two output blocks");
  // The warps' V tiles while they walk their cells, then their (unnormalised) outputs.
  constexpr int kVBytes = kWarps * kCells * LDV * 2, kOBytes = kWarps * kRows * DV * 4;
  __shared__ __align__(16) uint8_t s_buf[kVBytes > kOBytes ? kVBytes : kOBytes];
  __shared__ float s_m[kWarps][kRows], s_s[kWarps][kRows];
  __shared__ float s_w[kRows][kSplit], s_f[kRows];
  __shared__ bool s_last;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  TcJob j;
  j.hk = static_cast<int>(blockIdx.x) / (row_tiles * kHalves);
  j.r0 = static_cast<int>(blockIdx.x) / kHalves % row_tiles * kRows;
  j.dv0 = static_cast<int>(blockIdx.x) % kHalves * DV;
  j.rows = T * a.group;
  j.z = blockIdx.z;
  const int n_kv = *ub.n_kv;
  const DecodeRanges rg = decode_ranges(n_kv, max_ranges, min_chunk);
  j.n_used = rg.n_used;
  j.c_begin = min(n_kv, j.z * rg.chunk);
  j.c_end = min(n_kv, j.c_begin + rg.chunk);
  pdl_wait();
  pdl_trigger();
  if (j.z >= j.n_used) {  // past the last range (merge = 0: an empty header per row)
    if (!merge && threadIdx.x < kRows && j.r0 + static_cast<int>(threadIdx.x) < j.rows) {
      const int gr = j.r0 + threadIdx.x;
      float *dst = attn_partial(part, gr / a.group, j.hk * a.group + gr % a.group, j.z, n_head, kSplit, HD);
      dst[0] = -INFINITY;
      dst[1] = 0.0f;
    }
    return;
  }

  // This lane's fragment rows g (i = 0) and g + 8 (i = 1); rows past the batch see nothing.
  int rpos[2];
  unsigned long long rbit[2];
  uint32_t qa[KS][4];
  {
    const float *qrow[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int gr = j.r0 + g + 8 * i;
      const bool ok = gr < j.rows;
      const int t = ok ? gr / a.group : 0;
      rpos[i] = ok ? ub.pos[t] : -1;
      rbit[i] = ok ? 1ull << ub.seq[t] : 0ull;
      qrow[i] = ok ? reinterpret_cast<const float *>(static_cast<const uint8_t *>(q.data) + (j.hk * a.group + gr % a.group) * q.nb[1] + t * q.nb[2])
                   : nullptr;
    }
    auto qat = [&](int i, int d) { return qrow[i] ? qrow[i][d] : 0.0f; };
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const int d = 16 * ks + 2 * tq;
      qa[ks][0] = pack2<false>(qat(0, d), qat(0, d + 1));
      qa[ks][1] = pack2<false>(qat(1, d), qat(1, d + 1));
      qa[ks][2] = pack2<false>(qat(0, d + 8), qat(0, d + 9));
      qa[ks][3] = pack2<false>(qat(1, d + 8), qat(1, d + 9));
    }
  }
  // The block's tokens, for the test "may some row see this cell".
  const int t_lo = j.r0 / a.group, t_hi = min(j.rows - 1, j.r0 + kRows - 1) / a.group;

  float o[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nd][e] = 0.0f;
  float M[2] = {-INFINITY, -INFINITY}, S[2] = {0.0f, 0.0f};  // S: this lane's columns only

  __half(*s_v)[LDV] = reinterpret_cast<__half(*)[LDV]>(s_buf) + warp * kCells;
  const uint8_t *kbase = a.kbase + j.hk * a.khb, *vbase = a.vbase + j.hk * a.vhb + j.dv0 * sizeof(__half);
  const int per_warp = (j.c_end - j.c_begin + kWarps - 1) / kWarps;
  const int w_begin = j.c_begin + warp * per_warp, w_end = min(j.c_end, w_begin + per_warp);
  for (int c0 = w_begin; c0 < w_end; c0 += kCells) {
    // Cells some row of the block sees (lanes 0..15: cell c0 + lane). Tiles nobody sees are
    // skipped; unseen cells are neither loaded nor multiplied (V zeros: free cells may hold NaN).
    // Lane l < 16 keeps cell c0 + l's metadata for the mask below (shuffled, not reloaded).
    bool seen = false;
    int my_cp = -1;
    unsigned long long my_cs = 0ull;
    if (lane < kCells && c0 + lane < w_end) {
      my_cp = ub.cell_pos[c0 + lane];
      my_cs = ub.cell_seq[c0 + lane];
      for (int t = t_lo; t <= t_hi; ++t) seen = seen || attn_visible(my_cp, my_cs, 1ull << ub.seq[t], ub.pos[t], a.window);
    }
    const unsigned vis = __ballot_sync(0xffffffffu, seen);
    if (!vis) continue;  // warp-uniform

    // V tile: 16-byte copies, cell e / (DV / 8), chunk e % (DV / 8).
#pragma unroll
    for (int i = 0; i < kCells * DV / 8 / 32; ++i) {
      const int e = lane + 32 * i, c = e / (DV / 8), ch = e % (DV / 8);
      if (vis >> c & 1) cp_async_16(&s_v[c][ch * 8], vbase + static_cast<size_t>(c0 + c) * a.vrb + ch * 16);
      else *reinterpret_cast<uint4 *>(&s_v[c][ch * 8]) = make_uint4(0, 0, 0, 0);
    }
    cp_async_commit();

    // S = q K^T: B fragment of cell block nb, k-step ks = K[c0 + 8 nb + g][16 ks + 2 tq ..] (reg 0), + 8 dims (reg 1).
    float s[2][4];
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      const int c = 8 * nb + g;
      const uint32_t *krow = reinterpret_cast<const uint32_t *>(kbase + static_cast<size_t>(c0 + c) * a.krb);
      const bool ld = vis >> c & 1;
      uint32_t kb[KS][2];
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        kb[ks][0] = ld ? krow[8 * ks + tq] : 0u;
        kb[ks][1] = ld ? krow[8 * ks + 4 + tq] : 0u;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nb][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) mma16816<false>(s[nb], qa[ks], kb[ks]);
    }

    // Scale and mask (f32) per element: column (cell) 8 nb + 2 tq + (e & 1), row i = e >> 1.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int ci = 8 * nb + 2 * tq + cc;  // (-1, 0) past w_end, as loaded above
        const int cp = __shfl_sync(0xffffffffu, my_cp, ci);
        const unsigned long long cs = __shfl_sync(0xffffffffu, my_cs, ci);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float v = attn_visible(cp, cs, rbit[i], rpos[i], a.window) ? s[nb][2 * i + cc] * a.scale : -INFINITY;
          s[nb][2 * i + cc] = v;
          mx[i] = fmaxf(mx[i], v);
        }
      }
    float corr[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float newM = fmaxf(M[i], mx[i]);
      corr[i] = newM == -INFINITY ? 1.0f : expf(M[i] - newM);  // 0 when M was -inf
      M[i] = newM;
      S[i] *= corr[i];
    }
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1;
        const float p = s[nb][e] == -INFINITY ? 0.0f : expf(s[nb][e] - M[i]);
        s[nb][e] = p;
        S[i] += p;
      }
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) {
      o[nd][0] *= corr[0];
      o[nd][1] *= corr[0];
      o[nd][2] *= corr[1];
      o[nd][3] *= corr[1];
    }

    cp_async_wait<0>();  // this lane's V copies are done
    __syncwarp();        // ... and the warp's
    // O += P V: the S fragments of cell blocks 0 and 1 are the A fragment of the k-step;
    // matrix m of the transposing ldmatrix: cells 8 (m & 1).., dims 8 (nd + m / 2).. -> B of
    // output blocks nd and nd + 1.
    const uint32_t pa[4] = {pack2<false>(s[0][0], s[0][1]), pack2<false>(s[0][2], s[0][3]), pack2<false>(s[1][0], s[1][1]),
                            pack2<false>(s[1][2], s[1][3])};
#pragma unroll
    for (int nd = 0; nd < ND; nd += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, reinterpret_cast<const uint16_t *>(&s_v[(lane & 7) + 8 * ((lane >> 3) & 1)][nd * 8 + 8 * (lane >> 4)]));
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      mma16816<false>(o[nd], pa, b0);
      mma16816<false>(o[nd + 1], pa, b1);
    }
    __syncwarp();  // the warp is done reading s_v before the next tile's copies
  }

  // The warps' states, merged in shared memory (s_buf now holds the outputs).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    S[i] += __shfl_xor_sync(0xffffffffu, S[i], 1);
    S[i] += __shfl_xor_sync(0xffffffffu, S[i], 2);
  }
  __syncthreads();  // every warp is done with its V tile
  float(*s_o)[kRows][DV] = reinterpret_cast<float(*)[kRows][DV]>(s_buf);
#pragma unroll
  for (int nd = 0; nd < ND; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) s_o[warp][g + 8 * (e >> 1)][nd * 8 + 2 * tq + (e & 1)] = o[nd][e];
  if (tq == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      s_m[warp][g + 8 * i] = M[i];
      s_s[warp][g + 8 * i] = S[i];
    }
  }
  __syncthreads();
  const bool direct = merge && j.n_used == 1;
  for (int e = threadIdx.x; e < kRows * DV; e += kThreads) {
    const int r = e / DV, d = e % DV, gr = j.r0 + r;
    if (gr >= j.rows) break;  // rows grow with e
    const int t = gr / a.group, h = j.hk * a.group + gr % a.group;
    float Mb = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) Mb = fmaxf(Mb, s_m[w][r]);
    float Sb = 0.0f, v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wgt = s_m[w][r] == -INFINITY ? 0.0f : expf(s_m[w][r] - Mb);
      Sb += s_s[w][r] * wgt;
      v += s_o[w][r][d] * wgt;
    }
    float f;
    // Both halves of a 256-dim row compute the same max and sum and may both write the header.
    float *dst = attn_row_dst(out, direct ? nullptr : part, a.sinks, t, h, j.z, n_head, kSplit, HD, Mb, Sb, d == 0, f);
    dst[j.dv0 + d] = v * f;
  }
  if (!merge || direct) return;
  __threadfence();  // this block's partials are visible device-wide before it is counted
  __syncthreads();
  unsigned *ctr = ub.sync + blockIdx.x;
  if (threadIdx.x == 0) {
    s_last = atomicAdd(ctr, 1u) == static_cast<unsigned>(j.n_used - 1);
    if (s_last) *ctr = 0;  // every range in use has counted: ready for the next launch / replay
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  tc_merge<DV, HD>(out, a, part, j, n_head, s_w, s_f);
#else
  __trap();  // sm_75 code: never launched (cuda_paths.h)
#endif
}

}  // namespace

bool attn_decode_tc_applies(int64_t T, int64_t hd_k, int64_t hd_v, bool v_from_k, const AttnArgs &a) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.kbase) | reinterpret_cast<uintptr_t>(a.vbase) | a.krb | a.vrb | a.khb | a.vhb;
  return T >= 1 && T <= kMaxTokens && hd_k == hd_v && !v_from_k && (hd_k == 128 || hd_k == 256) && a.kt == static_cast<int>(DType::F16) &&
         bits % 16 == 0;
}

void attn_decode_tc_launch(const LaunchStream &s, TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *work, const GpuTuning &tuning) {
  const int n_head = static_cast<int>(q.ne[1]), T = static_cast<int>(q.ne[2]);
  const int n_head_kv = n_head / a.group;
  const int row_tiles = (T * a.group + kRows - 1) / kRows;
  const int halves = a.hd_k == 256 ? TcShape<256>::kHalves : 1;
  const dim3 grid(static_cast<unsigned>(n_head_kv * row_tiles * halves), 1, kSplit);
  // One counter per block column (KV head, row tile, half); without room, a combine launch.
  const int merge = ub.sync && static_cast<int64_t>(grid.x) <= kCudaSyncSlots ? 1 : 0;
  const int max_ranges = std::min(std::max(tuning.decode_max_ranges, 1), kSplit), min_chunk = std::max(tuning.decode_min_chunk, 1);
  auto go = [&](auto kernel) { launch_pdl(kernel, grid, dim3(kThreads), 0, s, q, out, a, ub, work, n_head, row_tiles, T, merge, max_ranges, min_chunk); };
  if (a.hd_k == 128) go(attn_decode_tc_kernel<128>);
  else if (a.hd_k == 256) go(attn_decode_tc_kernel<256>);
  else fail(Status::Internal, "CUDA tensor-core decode attention: head size %d not dispatched", a.hd_k);
  if (!merge) attn_combine_launch(out, a, work, T, n_head, kSplit, s);
}

}  // namespace moe
