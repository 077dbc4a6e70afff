// KV cache writes (F32 / F16 / Q8_0 rows at the batch's cells) and causal GQA attention
// over the cache. Attention is one block per (head, token) streaming the cache in tiles of
// 128 cells with an online softmax (flash-decoding order, f32 accumulators); the mask
// (free cell, other sequence, future position) comes from the device copy of the cell
// state, and the number of cells from device memory, so a captured graph stays valid as
// the cache fills. q meets the cache in its type like the reference: rounded to f16 for an
// F16 cache, quantized to Q8_0 for a Q8_0 cache.
#include <cuda_fp16.h>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/kv_store.cuh"
#include "backends/cuda/ops/quant.cuh"
#include "backends/cuda/ops/reduce.cuh"
#include "kv/kv_cache.h"

namespace moe {

namespace {

constexpr int kThreads = 128;
constexpr int kAcc = kCudaMaxHeadDim / kThreads;

__global__ void kv_store_kernel(TView x, uint8_t *base, size_t rb, int64_t row, int kt, const int32_t *cells) {
  const int64_t t = blockIdx.x;
  const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + t * x.nb[2]);
  kv_store_values(src, row, base + static_cast<size_t>(cells[t]) * rb, 0, kt);
}

struct AttnArgs {
  const uint8_t *kbase, *vbase;
  size_t krb, vrb, khb, vhb;  // row bytes and per-head bytes
  int hd_k, hd_v, group, kt;
  float scale;
  int window;           // sliding window (0 = off): hidden once pos - cell_pos >= window
  const float *sinks;   // per-head sink logits or null
};

__device__ __forceinline__ float k_dot(const uint8_t *k, const float *q, int hd, int kt) {
  float s = 0.0f;
  if (kt == static_cast<int>(DType::F32)) {
    const float *kf = reinterpret_cast<const float *>(k);
#pragma unroll 8
    for (int i = 0; i < hd; ++i) s += kf[i] * q[i];
  } else if (kt == static_cast<int>(DType::F16)) {
    const __half2 *k2 = reinterpret_cast<const __half2 *>(k);
#pragma unroll 8
    for (int i = 0; i < hd / 2; ++i) {
      const float2 kv = __half22float2(k2[i]);
      s += kv.x * q[2 * i] + kv.y * q[2 * i + 1];
    }
    if (hd & 1) s += __half2float(reinterpret_cast<const __half *>(k)[hd - 1]) * q[hd - 1];
  } else {
    for (int b = 0; b < hd / 32; ++b) {
      const uint8_t *blk = k + b * 34;
      const float d = h2f(blk);
      float a = 0.0f;
      for (int l = 0; l < 32; ++l) a += static_cast<int8_t>(blk[2 + l]) * q[b * 32 + l];
      s += a * d;
    }
  }
  return s;
}

__device__ __forceinline__ float v_at(const uint8_t *v, int i, int kt) {
  if (kt == static_cast<int>(DType::F32)) return reinterpret_cast<const float *>(v)[i];
  if (kt == static_cast<int>(DType::F16)) return __half2float(reinterpret_cast<const __half *>(v)[i]);
  const uint8_t *blk = v + (i / 32) * 34;
  return static_cast<int8_t>(blk[2 + (i % 32)]) * h2f(blk);
}

__global__ void __launch_bounds__(kThreads) attn_kernel(TView q, TView out, AttnArgs a, DevUbatch ub) {
  __shared__ float s_q[kCudaMaxHeadDim];
  __shared__ float s_p[kThreads];
  __shared__ float s_red[32];
  const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
  const int hk = h / a.group;
  const float *qrow = reinterpret_cast<const float *>(static_cast<const uint8_t *>(q.data) + h * q.nb[1] + t * q.nb[2]);
  for (int i0 = 0; i0 < a.hd_k; i0 += kThreads) {
    const int i = i0 + tid;
    float v = i < a.hd_k ? qrow[i] : 0.0f;
    if (a.kt == static_cast<int>(DType::F16)) {
      v = __half2float(__float2half_rn(v));
    } else if (a.kt == static_cast<int>(DType::Q8_0)) {
      float amax = fabsf(v);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      v = roundf(v * id) * __half2float(__float2half_rn(d));
    }
    if (i < a.hd_k) s_q[i] = v;
  }
  __syncthreads();
  const int n_kv = *ub.n_kv;
  const unsigned long long bit = 1ull << ub.seq[t];
  const int pos = ub.pos[t];
  float M = -INFINITY, S = 0.0f;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  for (int c0 = 0; c0 < n_kv; c0 += kThreads) {
    const int c = c0 + tid;
    float s = -INFINITY;
    if (c < n_kv) {
      const int cp = ub.cell_pos[c];
      if (cp >= 0 && (ub.cell_seq[c] & bit) && cp <= pos && (a.window <= 0 || pos - cp < a.window)) s = k_dot(a.kbase + c * a.krb + hk * a.khb, s_q, a.hd_k, a.kt) * a.scale;
    }
    const float tmax = blk_max(s, s_red);
    const float newM = fmaxf(M, tmax);
    if (newM == -INFINITY) continue;  // uniform: nothing visible yet
    const float corr = expf(M - newM);  // 0 when M is -inf
    const float p = s == -INFINITY ? 0.0f : expf(s - newM);
    s_p[tid] = p;
    const float psum = blk_sum(p, s_red);  // its barriers also publish s_p
    S = S * corr + psum;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] *= corr;
    const int n = min(kThreads, n_kv - c0);
#pragma unroll 4
    for (int j = 0; j < n; ++j) {
      const float pj = s_p[j];
      if (pj == 0.0f) continue;
      const uint8_t *vrow = a.vbase + (c0 + j) * a.vrb + hk * a.vhb;
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const int d = tid + i * kThreads;
        if (d < a.hd_v) acc[i] += pj * v_at(vrow, d, a.kt);
      }
    }
    M = newM;
    __syncthreads();  // s_p is rewritten by the next tile
  }
  if (a.sinks) {  // one more logit with a zero value vector
    const float sk = a.sinks[h];
    if (sk > M) {
      const float ms = expf(M - sk);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] *= ms;
      S = S * ms + 1.0f;
    } else {
      S += expf(sk - M);
    }
  }
  float *o = reinterpret_cast<float *>(static_cast<uint8_t *>(out.data) + h * out.nb[1] + t * out.nb[2]);
  const float inv = S > 0.0f ? 1.0f / S : 0.0f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int d = tid + i * kThreads;
    if (d < a.hd_v) o[d] = acc[i] * inv;
  }
}

// ---- decode (few query tokens): cells split over kSplit blocks per (head, token) ------

constexpr int kSplit = 16;
constexpr int kMaxSplitTokens = 4;
constexpr int kAccW = kCudaMaxHeadDim / 32;

__device__ __forceinline__ float k_at(const uint8_t *k, int i, int kt) { return v_at(k, i, kt); }

// A warp per cell (lanes over head dims), an online softmax per warp, warps merged in shared
// memory; the block writes (max, sum, acc[hd_v]) for its share of the cells.
__global__ void __launch_bounds__(kThreads) attn_split_kernel(TView q, AttnArgs a, DevUbatch ub, float *part) {
  __shared__ float s_q[kCudaMaxHeadDim];
  __shared__ float s_acc[kThreads / 32][kCudaMaxHeadDim];
  __shared__ float s_m[kThreads / 32], s_s[kThreads / 32];
  const int h = blockIdx.x, t = blockIdx.y, z = blockIdx.z, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_head = gridDim.x;
  const int hk = h / a.group;
  const float *qrow = reinterpret_cast<const float *>(static_cast<const uint8_t *>(q.data) + h * q.nb[1] + t * q.nb[2]);
  for (int i0 = 0; i0 < a.hd_k; i0 += kThreads) {
    const int i = i0 + tid;
    float v = i < a.hd_k ? qrow[i] : 0.0f;
    if (a.kt == static_cast<int>(DType::F16)) {
      v = __half2float(__float2half_rn(v));
    } else if (a.kt == static_cast<int>(DType::Q8_0)) {
      float amax = fabsf(v);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      v = roundf(v * id) * __half2float(__float2half_rn(d));
    }
    if (i < a.hd_k) s_q[i] = v;
  }
  __syncthreads();
  const int n_kv = *ub.n_kv;
  const int chunk = (n_kv + kSplit - 1) / kSplit;
  const int c_begin = z * chunk, c_end = min(n_kv, c_begin + chunk);
  const unsigned long long bit = 1ull << ub.seq[t];
  const int pos = ub.pos[t];
  float M = -INFINITY, S = 0.0f;
  float acc[kAccW];
#pragma unroll
  for (int i = 0; i < kAccW; ++i) acc[i] = 0.0f;
  for (int c = c_begin + warp; c < c_end; c += kThreads / 32) {
    const int cp = ub.cell_pos[c];
    if (!(cp >= 0 && (ub.cell_seq[c] & bit) && cp <= pos && (a.window <= 0 || pos - cp < a.window))) continue;
    const uint8_t *krow = a.kbase + c * a.krb + hk * a.khb;
    const uint8_t *vrow = a.vbase + c * a.vrb + hk * a.vhb;
    float vv[kAccW];
#pragma unroll
    for (int i = 0; i < kAccW; ++i) {
      const int d = lane + 32 * i;
      vv[i] = d < a.hd_v ? v_at(vrow, d, a.kt) : 0.0f;
    }
    float sdot = 0.0f;
    for (int d = lane; d < a.hd_k; d += 32) sdot += k_at(krow, d, a.kt) * s_q[d];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sdot += __shfl_xor_sync(0xffffffffu, sdot, o);
    const float sc = sdot * a.scale;
    const float newM = fmaxf(M, sc);
    const float corr = expf(M - newM);
    const float p = expf(sc - newM);
    S = S * corr + p;
#pragma unroll
    for (int i = 0; i < kAccW; ++i) acc[i] = acc[i] * corr + p * vv[i];
    M = newM;
  }
#pragma unroll
  for (int i = 0; i < kAccW; ++i) {
    const int d = lane + 32 * i;
    if (d < a.hd_v) s_acc[warp][d] = acc[i];
  }
  if (lane == 0) { s_m[warp] = M; s_s[warp] = S; }
  __syncthreads();
  float Mb = -INFINITY;
  for (int w = 0; w < kThreads / 32; ++w) Mb = fmaxf(Mb, s_m[w]);
  float wgt[kThreads / 32], Sb = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) {
    wgt[w] = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - Mb);
    Sb += s_s[w] * wgt[w];
  }
  float *dst = part + ((static_cast<int64_t>(t) * n_head + h) * kSplit + z) * (a.hd_v + 2);
  for (int d = tid; d < a.hd_v; d += kThreads) {
    float v = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) v += s_acc[w][d] * wgt[w];
    dst[2 + d] = v;
  }
  if (tid == 0) { dst[0] = Mb; dst[1] = Sb; }
}

__global__ void attn_combine_kernel(TView out, AttnArgs a, const float *part) {
  const int h = blockIdx.x, t = blockIdx.y, n_head = gridDim.x;
  const float *src = part + (static_cast<int64_t>(t) * n_head + h) * kSplit * (a.hd_v + 2);
  float M = -INFINITY;
  for (int z = 0; z < kSplit; ++z) M = fmaxf(M, src[z * (a.hd_v + 2)]);
  float S = 0.0f;
  for (int z = 0; z < kSplit; ++z) {
    const float mz = src[z * (a.hd_v + 2)];
    if (mz != -INFINITY) S += src[z * (a.hd_v + 2) + 1] * expf(mz - M);
  }
  float ms = 1.0f;
  if (a.sinks) {
    const float sk = a.sinks[h];
    if (sk > M) { ms = expf(M - sk); S = S * ms + 1.0f; }
    else S += expf(sk - M);
  }
  const float inv = S > 0.0f ? 1.0f / S : 0.0f;
  float *o = reinterpret_cast<float *>(static_cast<uint8_t *>(out.data) + h * out.nb[1] + t * out.nb[2]);
  for (int d = threadIdx.x; d < a.hd_v; d += blockDim.x) {
    float v = 0.0f;
    for (int z = 0; z < kSplit; ++z) {
      const float mz = src[z * (a.hd_v + 2)];
      if (mz != -INFINITY) v += src[z * (a.hd_v + 2) + 2 + d] * expf(mz - M);
    }
    o[d] = v * ms * inv;
  }
}

}  // namespace

size_t cuda_attention_work_size(const Node &n) {
  const int64_t T = n.ne[2], n_head = n.ne[1], hd_v = n.ne[0];
  if (T > kMaxSplitTokens) return 0;
  return static_cast<size_t>(T * n_head * kSplit * (hd_v + 2)) * 4;
}

void cuda_op_kv_store(const CudaOpCtx &c) {
  const Node &x = c.src(0);
  const int layer = c.n.kv_layer;
  const int64_t T = x.ne[2];
  if (T == 0) return;
  KvCache &kv = *c.kv;
  uint8_t *base = static_cast<uint8_t *>(c.n.kv_which == 0 ? kv.k_data(layer) : kv.v_data(layer));
  const size_t rb = c.n.kv_which == 0 ? kv.k_row_bytes(layer) : kv.v_row_bytes(layer);
  kv_store_kernel<<<static_cast<unsigned>(T), 128, 0, c.stream>>>(tview(x), base, rb, c.n.ip[0], static_cast<int>(kv.dtype()), c.ub.cells);
  MOE_CUDA_LAUNCH_CHECK("kv_store_kernel");
}

void cuda_op_attention(const CudaOpCtx &c) {
  const Node &q = c.src(0);
  KvCache &kv = *c.kv;
  const int layer = c.n.kv_layer;
  const int64_t hd_k = q.ne[0], n_head = q.ne[1], T = q.ne[2], hd_v = c.n.ne[0];
  if (T == 0 || n_head == 0) return;
  const int64_t n_head_kv = kv.dims(layer).k_row / hd_k;
  const DType kt = kv.dtype();
  AttnArgs a;
  // MLA: V is the leading part of the single K head (no V cache).
  const bool v_from_k = (c.n.ip[2] & 1) != 0;
  a.kbase = static_cast<const uint8_t *>(kv.k_data(layer));
  a.vbase = static_cast<const uint8_t *>(v_from_k ? kv.k_data(layer) : kv.v_data(layer));
  a.krb = kv.k_row_bytes(layer);
  a.vrb = v_from_k ? a.krb : kv.v_row_bytes(layer);
  a.khb = row_size(kt, hd_k);
  a.vhb = v_from_k ? a.khb : row_size(kt, hd_v);
  a.window = c.n.ip[3];
  a.sinks = c.n.src[3] >= 0 ? static_cast<const float *>(c.src(3).data) : nullptr;
  a.hd_k = static_cast<int>(hd_k);
  a.hd_v = static_cast<int>(hd_v);
  a.group = static_cast<int>(n_head / n_head_kv);
  a.kt = static_cast<int>(kt);
  a.scale = c.n.fp[0];
  if (T <= kMaxSplitTokens && c.n.work) {
    float *part = static_cast<float *>(c.n.work);
    attn_split_kernel<<<dim3(static_cast<unsigned>(n_head), static_cast<unsigned>(T), kSplit), kThreads, 0, c.stream>>>(tview(q), a, c.ub,
                                                                                                                      part);
    MOE_CUDA_LAUNCH_CHECK("attn_split_kernel");
    attn_combine_kernel<<<dim3(static_cast<unsigned>(n_head), static_cast<unsigned>(T)), 128, 0, c.stream>>>(tview(c.n), a, part);
    MOE_CUDA_LAUNCH_CHECK("attn_combine_kernel");
    return;
  }
  attn_kernel<<<dim3(static_cast<unsigned>(n_head), static_cast<unsigned>(T)), kThreads, 0, c.stream>>>(tview(q), tview(c.n), a, c.ub);
  MOE_CUDA_LAUNCH_CHECK("attn_kernel");
}

}  // namespace moe
