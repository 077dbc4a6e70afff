// Decode attention (a few query tokens) for head sizes 64/128/256: a block owns one KV head,
// up to kHeads query heads of its GQA group, one token and one of kSplit cell ranges, so each
// K/V row is read once for the whole group (the per-q-head kernel read it group times). A warp
// takes a cell at a time: each lane holds HD/32 consecutive dims of K, V, q and the output,
// an online softmax per head in registers; the block's warps merge in shared memory and write
// (max, sum, acc) partials. The last block of a (KV head, token) to finish (an atomic counter
// in DevUbatch::sync) folds them over the ranges (plus the sink) into the output: one launch.
// Ranges hold at least kMinChunk cells, so at a short context most blocks find an empty range
// and only write an empty partial header and count themselves.
// Mask, q rounding and the partial layout are those of attention.cuh.
#include <cuda_fp16.h>

#include "backends/cuda/ops/attention_decode.cuh"
#include "backends/cuda/ops/pdl.cuh"

namespace moe {

namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kSplit = 64;      // cell ranges: 4 KV heads x 64 ranges = 256 blocks at batch 1
constexpr int kMaxTokens = 4;
constexpr int kHeads = 8;       // query heads per block
constexpr int kBatch = 4;       // K/V rows a warp loads before using them
constexpr int kMinChunk = 32;   // cells per range at least (a short context uses few ranges)

// This lane's DPL consecutive dims (lane * DPL ...) of a cache row, as floats.
template <int DPL> __device__ __forceinline__ void load_dims(const uint8_t *row, int lane, int kt, float (&v)[DPL]) {
  const int d0 = lane * DPL;
  if (kt == static_cast<int>(DType::F16)) {
    const __half2 *r = reinterpret_cast<const __half2 *>(row) + d0 / 2;
#pragma unroll
    for (int i = 0; i < DPL / 2; ++i) {
      const float2 f = __half22float2(r[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  } else if (kt == static_cast<int>(DType::F32)) {
    const float *r = reinterpret_cast<const float *>(row) + d0;
#pragma unroll
    for (int i = 0; i < DPL; ++i) v[i] = r[i];
  } else {  // Q8_0: 34-byte blocks of 32 dims; a lane's dims never straddle a block
    const uint8_t *blk = row + (d0 / 32) * 34;
    const float d = h2f(blk);
#pragma unroll
    for (int i = 0; i < DPL; ++i) v[i] = static_cast<int8_t>(blk[2 + d0 % 32 + i]) * d;
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

// One block's share: cells [c_begin, c_end) of KV head hk for query heads h0 .. h0 + ng - 1
// of token t, written as the partials of range z.
template <int HD>
__device__ __forceinline__ void attn_decode_range(const TView &q, const AttnArgs &a, const DevUbatch &ub, float *part, int n_head, int h0,
                                                  int ng, int hk, int t, int z, int c_begin, int c_end,
                                                  float (&s_acc)[kWarps][kHeads][HD], float (&s_m)[kWarps][kHeads],
                                                  float (&s_s)[kWarps][kHeads]) {
  constexpr int DPL = HD / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float qv[kHeads][DPL];
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    if (g < ng) {
      const float *qrow = reinterpret_cast<const float *>(static_cast<const uint8_t *>(q.data) + (h0 + g) * q.nb[1] + t * q.nb[2]);
#pragma unroll
      for (int i = 0; i < DPL; ++i) qv[g][i] = qrow[lane * DPL + i];
      round_q<DPL>(qv[g], a.kt);
    } else {
#pragma unroll
      for (int i = 0; i < DPL; ++i) qv[g][i] = 0.0f;
    }
  }

  const unsigned long long bit = 1ull << ub.seq[t];
  const int pos = ub.pos[t];
  float M[kHeads], S[kHeads], acc[kHeads][DPL];
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    M[g] = -INFINITY;
    S[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[g][i] = 0.0f;
  }
  // Latency, not bandwidth, bounds this loop (a few warps per SM, each walking its cells):
  // a warp reads the mask of 32 consecutive cells at once (one per lane), then issues the
  // K/V loads of up to kBatch visible cells together before using any of them, so a cell
  // costs about 1/kBatch of a memory round trip instead of two dependent ones. All kHeads
  // heads are computed (absent ones have q = 0 and are never written), so their shuffle
  // reductions interleave.
  const int per_warp = (c_end - c_begin + kWarps - 1) / kWarps;
  const int w_begin = c_begin + warp * per_warp, w_end = min(c_end, w_begin + per_warp);
  for (int base = w_begin; base < w_end; base += 32) {
    const int cl = base + lane;
    const bool vis = cl < w_end && attn_visible(ub.cell_pos[cl], ub.cell_seq[cl], bit, pos, a.window);
    unsigned todo = __ballot_sync(0xffffffffu, vis);
    while (todo) {
      int cs[kBatch];
      float kv[kBatch][DPL], vv[kBatch][DPL];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        cs[u] = -1;
        if (todo) {
          cs[u] = base + __ffs(todo) - 1;
          todo &= todo - 1;
          load_dims<DPL>(a.kbase + cs[u] * a.krb + hk * a.khb, lane, a.kt, kv[u]);
          load_dims<DPL>(a.vbase + cs[u] * a.vrb + hk * a.vhb, lane, a.kt, vv[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (cs[u] < 0) break;  // warp-uniform
        float sc[kHeads];
#pragma unroll
        for (int g = 0; g < kHeads; ++g) {
          float sdot = 0.0f;
#pragma unroll
          for (int i = 0; i < DPL; ++i) sdot += kv[u][i] * qv[g][i];
          sc[g] = sdot;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
          for (int g = 0; g < kHeads; ++g) sc[g] += __shfl_xor_sync(0xffffffffu, sc[g], o);
#pragma unroll
        for (int g = 0; g < kHeads; ++g) {
          const float s = sc[g] * a.scale;
          const float newM = fmaxf(M[g], s);
          const float corr = expf(M[g] - newM);  // 0 while M is -inf
          const float p = expf(s - newM);
          S[g] = S[g] * corr + p;
#pragma unroll
          for (int i = 0; i < DPL; ++i) acc[g][i] = acc[g][i] * corr + p * vv[u][i];
          M[g] = newM;
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
#pragma unroll
    for (int i = 0; i < DPL; ++i) s_acc[warp][g][lane * DPL + i] = acc[g][i];
    if (lane == 0) {
      s_m[warp][g] = M[g];
      s_s[warp][g] = S[g];
    }
  }
  __syncthreads();
  for (int g = 0; g < ng; ++g) {
    float Mb = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) Mb = fmaxf(Mb, s_m[w][g]);
    float wgt[kWarps], Sb = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      wgt[w] = s_m[w][g] == -INFINITY ? 0.0f : expf(s_m[w][g] - Mb);
      Sb += s_s[w][g] * wgt[w];
    }
    float *dst = attn_partial(part, t, h0 + g, z, n_head, kSplit, HD);
    for (int d = threadIdx.x; d < HD; d += kThreads) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v += s_acc[w][g][d] * wgt[w];
      dst[2 + d] = v;
    }
    if (threadIdx.x == 0) {
      dst[0] = Mb;
      dst[1] = Sb;
    }
  }
}

// Cells [begin, end) of range z: n_kv cut into chunks of at least kMinChunk cells.
__device__ __forceinline__ void decode_range(int n_kv, int z, int &begin, int &end) {
  const int chunk = max(kMinChunk, (n_kv + kSplit - 1) / kSplit);
  begin = min(n_kv, z * chunk);
  end = min(n_kv, begin + chunk);
}

// The last block of (KV head block, token t): folds the kSplit partials of its ng heads into
// the output rows. Empty ranges have max -inf and weigh 0 (their accumulators are not read).
template <int HD>
__device__ void decode_merge(const TView &out, const AttnArgs &a, const float *part, int t, int h0, int ng, int n_head) {
  __shared__ float s_w[kHeads][kSplit];
  __shared__ float s_f[kHeads];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int g = warp; g < ng; g += kWarps) {  // a warp per head: lanes over the ranges
    float2 ms[kSplit / 32];  // (max, sum) of a range: one 8-byte load (HD + 2 is even)
    float M = -INFINITY;
#pragma unroll
    for (int i = 0; i < kSplit / 32; ++i) {
      ms[i] = __ldcg(reinterpret_cast<const float2 *>(attn_partial(const_cast<float *>(part), t, h0 + g, lane + 32 * i, n_head, kSplit, HD)));
      M = fmaxf(M, ms[i].x);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float S = 0.0f;
#pragma unroll
    for (int i = 0; i < kSplit / 32; ++i) {
      const float w = ms[i].x == -INFINITY ? 0.0f : expf(ms[i].x - M);
      if (w != 0.0f) S += ms[i].y * w;
      s_w[g][lane + 32 * i] = w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) S += __shfl_xor_sync(0xffffffffu, S, o);
    if (lane == 0) s_f[g] = attn_final_scale(M, S, a.sinks, h0 + g);
  }
  __syncthreads();
  // A thread per pair of dims (8-byte loads: the partial rows are 8-byte aligned, HD + 2 even);
  // kMergeBatch ranges' loads in flight at once (the merge is latency bound at a deep cache).
  constexpr int kMergeBatch = HD >= 256 ? 8 : 16;  // HD 256: the main loop already needs every register
  for (int idx = threadIdx.x; idx < ng * (HD / 2); idx += kThreads) {
    const int g = idx / (HD / 2), d = 2 * (idx % (HD / 2));  // g is uniform over a warp
    const float *src = attn_partial(const_cast<float *>(part), t, h0 + g, 0, n_head, kSplit, HD) + 2 + d;
    float vx = 0.0f, vy = 0.0f;
    for (int z0 = 0; z0 < kSplit; z0 += kMergeBatch) {
      float2 p[kMergeBatch];
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j)
        p[j] = s_w[g][z0 + j] != 0.0f ? __ldcg(reinterpret_cast<const float2 *>(src + (z0 + j) * (HD + 2))) : make_float2(0.0f, 0.0f);
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) {
        vx += p[j].x * s_w[g][z0 + j];
        vy += p[j].y * s_w[g][z0 + j];
      }
    }
    float *o = attn_out_row(out, t, h0 + g);
    o[d] = vx * s_f[g];
    o[d + 1] = vy * s_f[g];
  }
}

// PDL: the ranges come from the ubatch (uploaded before the pass); q, the cache and the
// partials are touched after pdl_wait. merge = 0: partials only (attn_combine_launch folds).
template <int HD>
__global__ void __launch_bounds__(kThreads) attn_decode_kernel(TView q, TView out, AttnArgs a, DevUbatch ub, float *part, int n_head,
                                                               int head_blocks, int merge) {
  __shared__ float s_acc[kWarps][kHeads][HD];
  __shared__ float s_m[kWarps][kHeads], s_s[kWarps][kHeads];
  __shared__ bool s_last;
  const int hk = blockIdx.x / head_blocks;
  const int h0 = hk * a.group + (blockIdx.x % head_blocks) * kHeads;
  const int ng = min(kHeads, (hk + 1) * a.group - h0);  // uniform over the block
  const int t = blockIdx.y, z = blockIdx.z;
  int c_begin, c_end;
  decode_range(*ub.n_kv, z, c_begin, c_end);
  pdl_wait();
  pdl_trigger();
  if (c_begin >= c_end) {  // empty range: only the header (max -inf, sum 0) of each head
    if (threadIdx.x < ng) {
      float *dst = attn_partial(part, t, h0 + threadIdx.x, z, n_head, kSplit, HD);
      dst[0] = -INFINITY;
      dst[1] = 0.0f;
    }
  } else {
    attn_decode_range<HD>(q, a, ub, part, n_head, h0, ng, hk, t, z, c_begin, c_end, s_acc, s_m, s_s);
  }
  if (!merge) return;
  __threadfence();  // this block's partials are visible device-wide before it is counted
  __syncthreads();
  unsigned *ctr = ub.sync + t * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) {
    s_last = atomicAdd(ctr, 1u) == gridDim.z - 1;
    if (s_last) *ctr = 0;  // every block has counted: ready for the next launch / replay
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  decode_merge<HD>(out, a, part, t, h0, ng, n_head);
}
}  // namespace

bool attn_decode_applies(int64_t T, int64_t hd_k, int64_t hd_v, bool v_from_k) {
  return T >= 1 && T <= kMaxTokens && hd_k == hd_v && !v_from_k && (hd_k == 64 || hd_k == 128 || hd_k == 256);
}

size_t attn_decode_work_size(int64_t T, int64_t n_head, int64_t hd_v) {
  return T > kMaxTokens ? 0 : static_cast<size_t>(T * n_head * kSplit * (hd_v + 2)) * 4;
}

void attn_decode_launch(cudaStream_t s, TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *work) {
  const int n_head = static_cast<int>(q.ne[1]), T = static_cast<int>(q.ne[2]);
  const int n_head_kv = n_head / a.group;
  const int head_blocks = (a.group + kHeads - 1) / kHeads;
  const dim3 grid(static_cast<unsigned>(n_head_kv * head_blocks), static_cast<unsigned>(T), kSplit);
  // One counter per (KV head block, token); without room for them, a separate combine launch.
  const int merge = ub.sync && static_cast<int64_t>(grid.x) * T <= kCudaSyncSlots ? 1 : 0;
  switch (a.hd_k) {
    case 64: launch_pdl(attn_decode_kernel<64>, grid, dim3(kThreads), 0, s, q, out, a, ub, work, n_head, head_blocks, merge); break;
    case 128: launch_pdl(attn_decode_kernel<128>, grid, dim3(kThreads), 0, s, q, out, a, ub, work, n_head, head_blocks, merge); break;
    case 256: launch_pdl(attn_decode_kernel<256>, grid, dim3(kThreads), 0, s, q, out, a, ub, work, n_head, head_blocks, merge); break;
    default: fail(Status::Internal, "CUDA decode attention: head size %d not dispatched", a.hd_k);
  }
  if (!merge) attn_combine_launch(out, a, work, T, n_head, kSplit, s);
}

}  // namespace moe
