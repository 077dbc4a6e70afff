// Decode attention (a few query tokens) for head sizes 64/128/256: a block owns one KV head,
// up to kHeads query heads of its GQA group, one token and one range of cells, so each K/V row
// is read once for the whole group. A warp takes a batch of visible cells at a time: each lane
// holds HD/32 consecutive dims of K, V, q and the output.
// Per cell the 8 heads' dot products are reduced by a transposing butterfly (9 shuffles, lane
// l ends with the total of head (l >> 2) & 7) instead of 8 separate ones (40 shuffles); the
// online softmax state (max, sum) of a head lives on its 4 owner lanes, updated once per batch
// (2 + batch exps per lane instead of 16 per cell), which broadcast p and the rescale factor.
// The number of ranges follows the token's visible span on the device: n_kv, or where the cells
// are in position order (DevUbatch::cell_pos_base) only the cells its position and window can
// see (ranges of at least GpuTuning::decode_min_chunk cells, default 64: n_kv 512 -> 8 ranges
// of 64, 16 per warp; a window of 128 -> 2; at most decode_max_ranges <= kSplit of them), so a
// short context or a window uses few, full blocks; blocks past the last range exit. The
// ranges of a token's blocks all agree (same span), so the merge counter's target holds.
// One range (a span of at most the minimum): the block writes the output itself (no partials,
// no counter). Several: each block writes (max, sum, acc) partials and the last to finish (an
// atomic counter in DevUbatch::sync, target = ranges in use) folds them into the output: one
// launch.
// Mask, q rounding and the partial layout are those of attention.cuh.
#include <cuda_fp16.h>

#include <algorithm>

#include "backends/cuda/ops/attention_decode.cuh"
#include "backends/cuda/ops/pdl.cuh"

namespace moe {

namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kSplit = kAttnDecodeMaxRanges;  // cell ranges at most: 4 KV heads x 64 ranges = 256 blocks at batch 1
constexpr int kMaxTokens = 4;
constexpr int kHeads = 8;       // query heads per block (the butterfly below is written for 8)

// K/V rows a warp loads before using them (HD 256: the loop already holds 2 x 64 floats of q / acc).
template <int HD> constexpr int decode_batch() { return HD >= 256 ? 4 : 8; }

// This lane's DPL consecutive dims (lane * DPL ...) of a cache row of type KT, in two steps:
// load_raw issues the loads into registers as stored (F16: DPL / 2 words of two halves; Q8_0:
// DPL quant bytes and the block's two scale bytes; F32: DPL words) and raw_dims converts them
// where they are used. Why: converting inside the load loop made each cell's conversion wait
// for its own loads before the next cell's were issued, so a batch of kB cells cost kB memory
// round trips instead of one (measured 2026-11-30: 38 us per layer at 4096 cells, a third of the stall
// samples on the f16 conversions).
template <int KT, int DPL> constexpr int raw_words() {
  return KT == static_cast<int>(DType::F16) ? DPL / 2 : KT == static_cast<int>(DType::Q8_0) ? DPL + 2 : DPL;
}
template <int KT, int DPL> __device__ __forceinline__ void load_raw(const uint8_t *row, int lane, uint32_t (&w)[raw_words<KT, DPL>()]) {
  const int d0 = lane * DPL;
  if constexpr (KT == static_cast<int>(DType::F16)) {
    const uint32_t *r = reinterpret_cast<const uint32_t *>(row) + d0 / 2;
#pragma unroll
    for (int i = 0; i < DPL / 2; ++i) w[i] = r[i];
  } else if constexpr (KT == static_cast<int>(DType::F32)) {
    const uint32_t *r = reinterpret_cast<const uint32_t *>(row) + d0;
#pragma unroll
    for (int i = 0; i < DPL; ++i) w[i] = r[i];
  } else {  // Q8_0: 34-byte blocks of 32 dims; a lane's dims never straddle a block
    const uint8_t *blk = row + (d0 / 32) * 34;
#pragma unroll
    for (int i = 0; i < DPL; ++i) w[i] = blk[2 + d0 % 32 + i];
    w[DPL] = blk[0];
    w[DPL + 1] = blk[1];
  }
}
template <int KT, int DPL> __device__ __forceinline__ void raw_dims(const uint32_t (&w)[raw_words<KT, DPL>()], float (&v)[DPL]) {
  if constexpr (KT == static_cast<int>(DType::F16)) {
#pragma unroll
    for (int i = 0; i < DPL / 2; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  } else if constexpr (KT == static_cast<int>(DType::F32)) {
#pragma unroll
    for (int i = 0; i < DPL; ++i) v[i] = __uint_as_float(w[i]);
  } else {
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(w[DPL] | (w[DPL + 1] << 8))));
#pragma unroll
    for (int i = 0; i < DPL; ++i) v[i] = static_cast<int8_t>(w[i]) * d;
  }
}

// q meets the cache in its type: rounded to f16 (F16 cache) or quantized to Q8_0 over each
// 32-dim block (Q8_0 cache; the block spans 32 / DPL consecutive lanes).
template <int DPL> __device__ __forceinline__ void round_q(float (&v)[DPL], int kt) {
  if (kt == static_cast<int>(DType::F16)) {
#pragma unroll
    for (int i = 0; i < DPL; ++i) v[i] = __half2float(__float2half_rn(v[i]));
  } else if (kt == static_cast<int>(DType::Q8_0)) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int o = 1; o < 32 / DPL; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float dh = __half2float(__float2half_rn(d));
#pragma unroll
    for (int i = 0; i < DPL; ++i) v[i] = roundf(v[i] * id) * dh;
  }
}

// Sums each of the 8 per-lane values d[g] over the warp: a butterfly that halves the values
// a lane carries at each of the first three steps (lanes keep the half their bit selects and
// send the other), then two plain steps. Lane l returns the total of head (l >> 2) & 7; its 4
// lanes hold bitwise equal totals (float addition is commutative).
__device__ __forceinline__ float reduce_8_heads(const float (&d)[kHeads], int lane) {
  static_assert(kHeads == 8, "the butterfly is written for 8 heads");
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
  float r4[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // heads 4 * b4 + i
    const float keep = b4 ? d[i + 4] : d[i], send = b4 ? d[i] : d[i + 4];
    r4[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
  float r2[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // heads 4 * b4 + 2 * b3 + i
    const float keep = b3 ? r4[i + 2] : r4[i], send = b3 ? r4[i] : r4[i + 2];
    r2[i] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
  float r = (b2 ? r2[1] : r2[0]) + __shfl_xor_sync(0xffffffffu, b2 ? r2[0] : r2[1], 4);  // head (lane >> 2) & 7
  r += __shfl_xor_sync(0xffffffffu, r, 2);
  r += __shfl_xor_sync(0xffffffffu, r, 1);
  return r;
}

// The lane that owns head g's softmax state (any of its 4 lanes would do).
__device__ __forceinline__ int owner_lane(int g) { return 4 * g; }

// Visibility of the cells base + lane (< end) as a warp ballot, or with a cell list (the
// token's DevUbatch::seq_cells) of the cells list[base + lane]; cell: this lane's cell. Only
// host-uploaded ubatch data is read, so it may run before pdl_wait (ops/pdl.cuh).
__device__ __forceinline__ unsigned visible_ballot(const DevUbatch &ub, const AttnArgs &a, unsigned long long bit, int pos, int base,
                                                   int end, int lane, const int32_t *list, int &cell) {
  const int i = base + lane;
  cell = i < end ? (list ? list[i] : i) : 0;
  const bool vis = i < end && attn_visible(ub.cell_pos[cell], ub.cell_seq[cell], bit, pos, a.window);
  return __ballot_sync(0xffffffffu, vis);
}

// GpuTuning::decode_max_ranges default 32 (not kSplit): a sweep at 4096 cells (2026-11-30, 14f7e41)
// (8 layers, tg64): 64 ranges 1,106 t/s, 32: 1,147, 16: 1,090, 8 x 256: 930; no difference at n_kv <= 128.

// What a block works on: KV head hk, query heads h0 .. h0 + ng - 1, token t, range z of
// cells [c_begin, c_end) (with list: of the token's cell list); n_used ranges in use.
struct DecodeJob {
  int hk, h0, ng, t, z, c_begin, c_end, n_used;
  const int32_t *list;
};

// The block's cells: per warp an online softmax over its share (see the file comment), then
// the warps merged in shared memory into the output (direct) or range z's partials.
template <int HD, int KT>
__device__ __forceinline__ void attn_decode_range(const TView &q, const TView &out, const AttnArgs &a, const DevUbatch &ub, float *part,
                                                  int n_head, const DecodeJob &j, bool direct, unsigned first_ballot, int first_cell,
                                                  float (&s_acc)[kWarps][kHeads][HD], float (&s_m)[kWarps][kHeads],
                                                  float (&s_s)[kWarps][kHeads]) {
  constexpr int DPL = HD / 32, kB = decode_batch<HD>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // q is loaded now and rounded at the first batch, after that batch's K/V loads are issued,
  // so its memory round trip overlaps theirs.
  float qv[kHeads][DPL];
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    const float *qrow = reinterpret_cast<const float *>(static_cast<const uint8_t *>(q.data) + (j.h0 + min(g, j.ng - 1)) * q.nb[1] + j.t * q.nb[2]);
#pragma unroll
    for (int i = 0; i < DPL; ++i) qv[g][i] = g < j.ng ? qrow[lane * DPL + i] : 0.0f;
  }
  bool q_rounded = false;

  const unsigned long long bit = 1ull << ub.seq[j.t];
  const int pos = ub.pos[j.t];
  float M = -INFINITY, S = 0.0f;  // of head (lane >> 2) & 7
  float acc[kHeads][DPL];
#pragma unroll
  for (int g = 0; g < kHeads; ++g)
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[g][i] = 0.0f;
  // Latency, not bandwidth, bounds this loop: a warp reads the mask of 32 consecutive cells at
  // once (one per lane; the first 32 before pdl_wait), then issues the K/V loads of up to kB
  // visible cells together before using any of them.
  const int per_warp = (j.c_end - j.c_begin + kWarps - 1) / kWarps;
  const int w_begin = j.c_begin + warp * per_warp, w_end = min(j.c_end, w_begin + per_warp);
  for (int base = w_begin; base < w_end; base += 32) {
    int my_cell = first_cell;
    unsigned todo = base == w_begin ? first_ballot : visible_ballot(ub, a, bit, pos, base, w_end, lane, j.list, my_cell);
    while (todo) {  // warp-uniform
      int cs[kB];
      uint32_t kr[kB][raw_words<KT, DPL>()], vr[kB][raw_words<KT, DPL>()];
#pragma unroll
      for (int u = 0; u < kB; ++u) {
        cs[u] = -1;
        if (todo) {
          cs[u] = __shfl_sync(0xffffffffu, my_cell, __ffs(todo) - 1);
          todo &= todo - 1;
          load_raw<KT, DPL>(a.kbase + cs[u] * a.krb + j.hk * a.khb, lane, kr[u]);
          load_raw<KT, DPL>(a.vbase + cs[u] * a.vrb + j.hk * a.vhb, lane, vr[u]);
        }
      }
      if (!q_rounded) {
#pragma unroll
        for (int g = 0; g < kHeads; ++g) round_q<DPL>(qv[g], a.kt);
        q_rounded = true;
      }
      // Scores of this lane's head for the batch's cells (cs[0] is always a cell).
      float s_own[kB];
#pragma unroll
      for (int u = 0; u < kB; ++u) {
        s_own[u] = -INFINITY;
        if (cs[u] >= 0) {  // warp-uniform
          float kv[DPL];
          raw_dims<KT, DPL>(kr[u], kv);
          float d[kHeads];
#pragma unroll
          for (int g = 0; g < kHeads; ++g) {
            float sdot = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; ++i) sdot += kv[i] * qv[g][i];
            d[g] = sdot;
          }
          s_own[u] = reduce_8_heads(d, lane) * a.scale;
        }
      }
      float newM = M;
#pragma unroll
      for (int u = 0; u < kB; ++u) newM = fmaxf(newM, s_own[u]);
      const float corr = expf(M - newM);  // 0 while M is -inf (newM is a real score)
      S *= corr;
      float p_own[kB];
#pragma unroll
      for (int u = 0; u < kB; ++u) {
        p_own[u] = expf(s_own[u] - newM);  // 0 for the batch's missing cells
        S += p_own[u];
      }
      M = newM;
#pragma unroll
      for (int g = 0; g < kHeads; ++g) {
        const float c = __shfl_sync(0xffffffffu, corr, owner_lane(g));
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[g][i] *= c;
      }
#pragma unroll
      for (int u = 0; u < kB; ++u) {
        if (cs[u] < 0) break;  // warp-uniform
        float vv[DPL];
        raw_dims<KT, DPL>(vr[u], vv);
#pragma unroll
        for (int g = 0; g < kHeads; ++g) {
          const float p = __shfl_sync(0xffffffffu, p_own[u], owner_lane(g));
#pragma unroll
          for (int i = 0; i < DPL; ++i) acc[g][i] += p * vv[i];
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
#pragma unroll
    for (int i = 0; i < DPL; ++i) s_acc[warp][g][lane * DPL + i] = acc[g][i];
  }
  if ((lane & 3) == 0) {
    s_m[warp][lane >> 2] = M;
    s_s[warp][lane >> 2] = S;
  }
  __syncthreads();
  for (int g = 0; g < j.ng; ++g) {
    float Mb = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) Mb = fmaxf(Mb, s_m[w][g]);
    float wgt[kWarps], Sb = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      wgt[w] = s_m[w][g] == -INFINITY ? 0.0f : expf(s_m[w][g] - Mb);
      Sb += s_s[w][g] * wgt[w];
    }
    float *dst, f = 1.0f;
    if (direct) {
      dst = attn_out_row(out, j.t, j.h0 + g);
      f = attn_final_scale(Mb, Sb, a.sinks, j.h0 + g);
    } else {
      dst = attn_partial(part, j.t, j.h0 + g, j.z, n_head, gridDim.z, HD) + 2;
      if (threadIdx.x == 0) {
        dst[-2] = Mb;
        dst[-1] = Sb;
      }
    }
    for (int d = threadIdx.x; d < HD; d += kThreads) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v += s_acc[w][g][d] * wgt[w];
      dst[d] = v * f;
    }
  }
}

// The last block of (KV head block, token t): folds the n_used ranges' partials of its ng
// heads into the output rows. A range whose cells are all hidden has max -inf and weighs 0
// (its accumulators are not read).
template <int HD>
__device__ void decode_merge(const TView &out, const AttnArgs &a, const float *part, const DecodeJob &j, int n_head) {
  __shared__ float s_w[kHeads][kSplit];
  __shared__ float s_f[kHeads];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int g = warp; g < j.ng; g += kWarps) {  // a warp per head: lanes over the ranges
    const float f = decode_range_weights<HD>(const_cast<float *>(part), j.t, j.h0 + g, j.n_used, n_head, gridDim.z, a.sinks, s_w[g], lane);
    if (lane == 0) s_f[g] = f;
  }
  __syncthreads();
  // A thread owns kPairs pairs of dims (8-byte loads: the partial rows are 8-byte aligned, HD + 2
  // even) and walks the ranges kUnroll at a time, so kPairs x kUnroll loads are in flight.
  constexpr int kPairs = kHeads * HD / 2 / kThreads;  // HD 64: 2, 128: 4, 256: 8
  constexpr int kUnroll = HD >= 256 ? 4 : 8;
  static_assert(kPairs * kThreads == kHeads * HD / 2, "pairs per thread");
  float2 sum[kPairs];
#pragma unroll
  for (int k = 0; k < kPairs; ++k) sum[k] = make_float2(0.0f, 0.0f);
  for (int z0 = 0; z0 < j.n_used; z0 += kUnroll) {
    float2 p[kUnroll][kPairs];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int k = 0; k < kPairs; ++k) {
        const int idx = threadIdx.x + k * kThreads, g = idx / (HD / 2), d = 2 * (idx % (HD / 2)), z = z0 + u;
        const bool use = z < j.n_used && g < j.ng && s_w[g][z] != 0.0f;
        p[u][k] = use ? __ldcg(reinterpret_cast<const float2 *>(attn_partial(const_cast<float *>(part), j.t, j.h0 + g, z, n_head, gridDim.z, HD) + 2 + d))
                      : make_float2(0.0f, 0.0f);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int k = 0; k < kPairs; ++k) {
        const int idx = threadIdx.x + k * kThreads, g = idx / (HD / 2), z = z0 + u;
        const float w = z < j.n_used && g < j.ng ? s_w[g][z] : 0.0f;
        sum[k].x += p[u][k].x * w;
        sum[k].y += p[u][k].y * w;
      }
  }
#pragma unroll
  for (int k = 0; k < kPairs; ++k) {
    const int idx = threadIdx.x + k * kThreads, g = idx / (HD / 2), d = 2 * (idx % (HD / 2));
    if (g < j.ng) {
      float *o = attn_out_row(out, j.t, j.h0 + g);
      o[d] = sum[k].x * s_f[g];
      o[d + 1] = sum[k].y * s_f[g];
    }
  }
}

// PDL: the ranges and the first mask ballot come from the ubatch (uploaded before the pass);
// q, the cache and the partials are touched after pdl_wait. merge = 0: every range writes
// partials (the unused ones an empty header) and attn_combine_launch folds them.
template <int HD, int KT>
__global__ void __launch_bounds__(kThreads) attn_decode_kernel(TView q, TView out, AttnArgs a, DevUbatch ub, float *part, int n_head,
                                                               int head_blocks, int merge, int max_ranges, int min_chunk) {
  __shared__ float s_acc[kWarps][kHeads][HD];
  __shared__ float s_m[kWarps][kHeads], s_s[kWarps][kHeads];
  __shared__ bool s_last;
  DecodeJob j;
  j.hk = blockIdx.x / head_blocks;
  j.h0 = j.hk * a.group + (blockIdx.x % head_blocks) * kHeads;
  j.ng = min(kHeads, (j.hk + 1) * a.group - j.h0);  // uniform over the block
  j.t = blockIdx.y;
  j.z = blockIdx.z;
  // The ranges cut the token's visible span (a window's cells where the cells are in position
  // order, else all n_kv), so a windowed layer runs w / 64 ranges instead of n_kv / 64; or,
  // with cell lists (several sequences, one token each), the token's list.
  j.list = ub.seq_cells ? ub.seq_cells + ub.seq_cells_at[j.t] : nullptr;
  const CellSpan sp = j.list ? CellSpan{0, ub.seq_cells_at[j.t + 1] - ub.seq_cells_at[j.t]} : attn_visible_span(ub, *ub.n_kv, ub.pos[j.t], a.window);
  const DecodeRanges r = decode_ranges(sp.hi - sp.lo, max_ranges, min_chunk);
  j.n_used = r.n_used;
  j.c_begin = min(sp.hi, sp.lo + j.z * r.chunk);
  j.c_end = min(sp.hi, j.c_begin + r.chunk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned first_ballot = 0;
  int first_cell = 0;
  if (j.z < j.n_used) {  // block-uniform
    const int per_warp = (j.c_end - j.c_begin + kWarps - 1) / kWarps;
    const int w_begin = j.c_begin + warp * per_warp, w_end = min(j.c_end, w_begin + per_warp);
    first_ballot = visible_ballot(ub, a, 1ull << ub.seq[j.t], ub.pos[j.t], w_begin, w_end, lane, j.list, first_cell);
  }
  pdl_wait();
  pdl_trigger();
  if (j.z >= j.n_used) {  // past the last range: nothing to do (merge = 0: an empty header per head)
    if (!merge && threadIdx.x < j.ng) {
      float *dst = attn_partial(part, j.t, j.h0 + threadIdx.x, j.z, n_head, gridDim.z, HD);
      dst[0] = -INFINITY;
      dst[1] = 0.0f;
    }
    return;
  }
  const bool direct = merge && j.n_used == 1;
  attn_decode_range<HD, KT>(q, out, a, ub, part, n_head, j, direct, first_ballot, first_cell, s_acc, s_m, s_s);
  if (!merge || direct) return;
  __threadfence();  // this block's partials are visible device-wide before it is counted
  __syncthreads();
  unsigned *ctr = ub.sync + j.t * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) {
    s_last = atomicAdd(ctr, 1u) == static_cast<unsigned>(j.n_used - 1);
    if (s_last) *ctr = 0;  // every range in use has counted: ready for the next launch / replay
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  decode_merge<HD>(out, a, part, j, n_head);
}
}  // namespace

bool attn_decode_applies(int64_t T, int64_t hd_k, int64_t hd_v, bool v_from_k) {
  return T >= 1 && T <= kMaxTokens && hd_k == hd_v && !v_from_k && (hd_k == 64 || hd_k == 128 || hd_k == 256);
}

size_t attn_decode_work_size(int64_t T, int64_t n_head, int64_t hd_v) {
  return T > kMaxTokens ? 0 : static_cast<size_t>(T * n_head * kSplit * (hd_v + 2)) * 4;
}

namespace {

// The grouped kernel over T tokens with at most `ranges` cell ranges per (KV head block, token)
// (grid.z = ranges: also the partials' range stride).
void decode_launch(const LaunchStream &s, TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *work, const GpuTuning &tuning,
                   int ranges) {
  const int n_head = static_cast<int>(q.ne[1]), T = static_cast<int>(q.ne[2]);
  const int n_head_kv = n_head / a.group;
  const int head_blocks = (a.group + kHeads - 1) / kHeads;
  const dim3 grid(static_cast<unsigned>(n_head_kv * head_blocks), static_cast<unsigned>(T), static_cast<unsigned>(ranges));
  // One counter per (KV head block, token); without room for them, a separate combine launch.
  const int merge = ub.sync && static_cast<int64_t>(grid.x) * T <= kCudaSyncSlots ? 1 : 0;
  // Instances: head size x cache type (F16, Q8_0, F32).
  // GpuTuning::decode_max_ranges / decode_min_chunk, clamped to what the kernel handles.
  const int max_ranges = std::min(std::max(tuning.decode_max_ranges, 1), ranges), min_chunk = std::max(tuning.decode_min_chunk, 1);
  auto go = [&](auto kernel) {
    launch_pdl(kernel, grid, dim3(kThreads), 0, s, q, out, a, ub, work, n_head, head_blocks, merge, max_ranges, min_chunk);
  };
  constexpr int F16 = static_cast<int>(DType::F16), Q8 = static_cast<int>(DType::Q8_0), F32 = static_cast<int>(DType::F32);
  const int kt = a.kt;
  if (kt != F16 && kt != Q8 && kt != F32) fail(Status::Internal, "CUDA decode attention: cache type %d not dispatched", kt);
  switch (a.hd_k) {
    case 64: kt == F16 ? go(attn_decode_kernel<64, F16>) : kt == Q8 ? go(attn_decode_kernel<64, Q8>) : go(attn_decode_kernel<64, F32>); break;
    case 128: kt == F16 ? go(attn_decode_kernel<128, F16>) : kt == Q8 ? go(attn_decode_kernel<128, Q8>) : go(attn_decode_kernel<128, F32>); break;
    case 256: kt == F16 ? go(attn_decode_kernel<256, F16>) : kt == Q8 ? go(attn_decode_kernel<256, Q8>) : go(attn_decode_kernel<256, F32>); break;
    default: fail(Status::Internal, "CUDA decode attention: head size %d not dispatched", a.hd_k);
  }
  if (!merge) attn_combine_launch(out, a, work, T, n_head, ranges, s);
}

}  // namespace

void attn_decode_launch(const LaunchStream &s, TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *work, const GpuTuning &tuning) {
  decode_launch(s, q, out, a, ub, work, tuning, kSplit);
}

// Ranges the planned scratch holds at least for several sequences' steps: 8 (64 sequences
// at 190 cells each: 1,520 cells per range, 380 per warp).
constexpr int kSeqsRanges = 8;

size_t attn_decode_seqs_work_size(int64_t T, int64_t n_head, int64_t hd_k, int64_t hd_v) {
  if (T <= kMaxTokens || T > kAttnDecodeSeqsMaxTokens || !attn_decode_applies(1, hd_k, hd_v, false)) return 0;
  return static_cast<size_t>(T * n_head * kSeqsRanges * (hd_v + 2)) * 4;
}

bool attn_decode_seqs_launch(const LaunchStream &s, TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *work, size_t work_size,
                             const GpuTuning &tuning) {
  const int64_t T = q.ne[2], n_head = q.ne[1];
  if (!ub.seq_cells || T <= kMaxTokens || T > kAttnDecodeSeqsMaxTokens || !work || !attn_decode_applies(1, a.hd_k, a.hd_v, false))
    return false;
  const size_t per_range = static_cast<size_t>(T * n_head * (a.hd_v + 2)) * 4;
  const int fit = static_cast<int>(std::min<size_t>(work_size / per_range, kSplit));
  const int ranges = std::min(std::max(tuning.decode_max_ranges, 1), fit);
  if (ranges < 1) return false;
  decode_launch(s, q, out, a, ub, work, tuning, ranges);
  return true;
}

}  // namespace moe
