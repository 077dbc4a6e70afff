// MoE routing helpers on the device: top-k (a warp per token), gathering the chosen
// probabilities, and the weighted combine of expert outputs; plus GetRows (embedding
// lookup / row selection) for every weight type. All launch with PDL (ops/pdl.cuh): every
// kernel waits for its predecessor before its first load.
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/kernel_error.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/quant.cuh"
#include "backends/cuda/ops/top_k.cuh"

namespace moe {

namespace {

__global__ void top_k_kernel(TView x, TView d, int k, int64_t T) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= T) return;
  const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + t * x.nb[1]);
  warp_top_k(src, static_cast<int>(x.ne[0]), k, reinterpret_cast<int32_t *>(static_cast<uint8_t *>(d.data) + t * d.nb[1]));
}

__global__ void gather_cols_kernel(TView x, TView ids, TView d, int64_t k, int64_t T, unsigned *err) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= k * T) return;
  const int64_t t = i / k, j = i % k;
  const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + t * x.nb[1]);
  const int32_t e = reinterpret_cast<const int32_t *>(static_cast<const uint8_t *>(ids.data) + t * ids.nb[1])[j];
  const bool ok = e >= 0 && e < x.ne[0];
  if (!ok) report_bad_index(err, kKernelErrRouteId, e, x.ne[0]);
  reinterpret_cast<float *>(static_cast<uint8_t *>(d.data) + t * d.nb[1])[j] = ok ? src[e] : 0.0f;
}

// r (data null: none): a residual added to the sum (CombineAdd groups: the Add launch's one
// float addition), row t at r + t r.nb[1]; d may lie over it (each value is read by the thread
// that writes it).
__global__ void moe_combine_kernel(TView ex, TView w, TView d, TView r, int64_t M, int64_t k) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M) return;
  const float *wt = reinterpret_cast<const float *>(static_cast<const uint8_t *>(w.data) + t * w.nb[1]);
  const uint8_t *eb = static_cast<const uint8_t *>(ex.data) + t * ex.nb[2];
  float acc = reinterpret_cast<const float *>(eb)[i] * wt[0];
  // A rounded product, then a rounded sum (no fma), as the CPU op and the reference.
  for (int64_t j = 1; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(reinterpret_cast<const float *>(eb + j * ex.nb[1])[i], wt[j]));
  if (r.data) acc = __fadd_rn(acc, reinterpret_cast<const float *>(static_cast<const uint8_t *>(r.data) + t * r.nb[1])[i]);
  reinterpret_cast<float *>(static_cast<uint8_t *>(d.data) + t * d.nb[1])[i] = acc;
}

// The same for k <= kCombineMaxK experts, 4 outputs per thread (M % 4 == 0, 16-byte aligned
// rows): every expert's float4 is loaded before the first sum, so a thread has k loads in
// flight instead of one (the generic kernel's loop waits for each in turn).
constexpr int kCombineMaxK = 8;
__global__ void moe_combine4_kernel(TView ex, TView w, TView d, TView r, int64_t M, int k) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.y;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i >= M) return;
  const float *wt = reinterpret_cast<const float *>(static_cast<const uint8_t *>(w.data) + t * w.nb[1]);
  const uint8_t *eb = static_cast<const uint8_t *>(ex.data) + t * ex.nb[2] + i * 4;
  float4 v[kCombineMaxK];
#pragma unroll
  for (int j = 0; j < kCombineMaxK; ++j)
    if (j < k) v[j] = *reinterpret_cast<const float4 *>(eb + j * ex.nb[1]);
  float4 acc = make_float4(__fmul_rn(v[0].x, wt[0]), __fmul_rn(v[0].y, wt[0]), __fmul_rn(v[0].z, wt[0]), __fmul_rn(v[0].w, wt[0]));
#pragma unroll
  for (int j = 1; j < kCombineMaxK; ++j)
    if (j < k) {
      acc.x = __fadd_rn(acc.x, __fmul_rn(v[j].x, wt[j]));
      acc.y = __fadd_rn(acc.y, __fmul_rn(v[j].y, wt[j]));
      acc.z = __fadd_rn(acc.z, __fmul_rn(v[j].z, wt[j]));
      acc.w = __fadd_rn(acc.w, __fmul_rn(v[j].w, wt[j]));
    }
  if (r.data) {
    const float4 rv = *reinterpret_cast<const float4 *>(static_cast<const uint8_t *>(r.data) + t * r.nb[1] + i * 4);
    acc = make_float4(__fadd_rn(acc.x, rv.x), __fadd_rn(acc.y, rv.y), __fadd_rn(acc.z, rv.z), __fadd_rn(acc.w, rv.w));
  }
  *reinterpret_cast<float4 *>(static_cast<uint8_t *>(d.data) + t * d.nb[1] + i * 4) = acc;
}

__global__ void add_id_kernel(TView x, TView b, TView ids, TView d, int64_t M, int64_t k, int64_t T, unsigned *err) {
  pdl_wait();
  pdl_trigger();
  const int64_t r = blockIdx.y;  // j + k * t
  const int64_t j = r % k, t = r / k;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M) return;
  const int32_t e = *reinterpret_cast<const int32_t *>(static_cast<const uint8_t *>(ids.data) + j * ids.nb[0] + t * ids.nb[1]);
  const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + j * x.nb[1] + t * x.nb[2]);
  float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(d.data) + j * d.nb[1] + t * d.nb[2]);
  if (e < 0 || e >= b.ne[1]) {
    if (i == 0) report_bad_index(err, kKernelErrRouteId, e, b.ne[1]);
    dst[i] = src[i];
    return;
  }
  dst[i] = src[i] + reinterpret_cast<const float *>(static_cast<const uint8_t *>(b.data) + e * b.nb[1])[i];
}

constexpr int kMaxGroups = 64;

// DeepSeek-V3 grouped selection, one thread per token, in the reference's exact order.
__global__ void grouped_top_k_kernel(TView x, TView d, int k, int G, int G_used, int64_t T) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const int64_t E = x.ne[0], per = E / G;
  const float *s = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + t * x.nb[1]);
  int32_t *dst = reinterpret_cast<int32_t *>(static_cast<uint8_t *>(d.data) + t * d.nb[1]);
  float gscore[kMaxGroups];
  unsigned long long kept = 0;
  for (int g = 0; g < G; ++g) {
    const float *p = s + g * per;
    int64_t b1 = 0;
    for (int64_t i = 1; i < per; ++i) if (p[i] > p[b1]) b1 = i;
    int64_t b2 = -1;
    for (int64_t i = 0; i < per; ++i) if (i != b1 && (b2 < 0 || p[i] > p[b2])) b2 = i;
    gscore[g] = b2 < 0 ? p[b1] : p[b1] + p[b2];
  }
  for (int j = 0; j < G_used; ++j) {
    int best = -1;
    for (int g = 0; g < G; ++g)
      if (!((kept >> g) & 1ull) && (best < 0 || gscore[g] > gscore[best])) best = g;
    kept |= 1ull << best;
  }
  for (int j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      if (!((kept >> (e / per)) & 1ull)) continue;
      bool taken = false;
      for (int q = 0; q < j; ++q) taken |= dst[q] == e;
      if (taken) continue;
      if (best < 0 || s[e] > s[best]) best = static_cast<int32_t>(e);
    }
    dst[j] = best;
  }
}

// One thread per 32-element sub-block (plain types: per element) of each selected row.
template <DType T> __device__ void get_row_sub(const uint8_t *row, int64_t s, float *out) {
  if constexpr (is_plain(T)) {
    out[s] = plain_at<T>(row, s);
  } else {
    float w[32];
    dequant32<T>(row, static_cast<int>(s), w);
#pragma unroll
    for (int l = 0; l < 32; ++l) out[s * 32 + l] = w[l];
  }
}

__global__ void get_rows_kernel(TView tab, int type, TView ids, TView d, int64_t n_units, unsigned *err) {
  pdl_wait();
  pdl_trigger();
  const int64_t r = blockIdx.y;
  const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= n_units) return;
  const int32_t id = static_cast<const int32_t *>(ids.data)[r];
  float *out = reinterpret_cast<float *>(static_cast<uint8_t *>(d.data) + r * d.nb[1]);
  if (id < 0 || id >= tab.ne[1]) {
    // The context validates token ids before a decode; zeros keep the output defined.
    if (s == 0) report_bad_index(err, kKernelErrGetRows, id, tab.ne[1]);
    const int64_t per = n_units == tab.ne[0] ? 1 : 32;
    for (int64_t l = 0; l < per; ++l) out[s * per + l] = 0.0f;
    return;
  }
  const uint8_t *row = static_cast<const uint8_t *>(tab.data) + id * tab.nb[1];
  switch (static_cast<DType>(type)) {
    case DType::F32: get_row_sub<DType::F32>(row, s, out); break;
    case DType::F16: get_row_sub<DType::F16>(row, s, out); break;
    case DType::BF16: get_row_sub<DType::BF16>(row, s, out); break;
    case DType::Q4_0: get_row_sub<DType::Q4_0>(row, s, out); break;
    case DType::Q8_0: get_row_sub<DType::Q8_0>(row, s, out); break;
    case DType::MXFP4: get_row_sub<DType::MXFP4>(row, s, out); break;
    case DType::Q2_K: get_row_sub<DType::Q2_K>(row, s, out); break;
    case DType::Q3_K: get_row_sub<DType::Q3_K>(row, s, out); break;
    case DType::Q4_K: get_row_sub<DType::Q4_K>(row, s, out); break;
    case DType::Q5_K: get_row_sub<DType::Q5_K>(row, s, out); break;
    case DType::Q6_K: get_row_sub<DType::Q6_K>(row, s, out); break;
    default: break;
  }
}

}  // namespace

void cuda_op_top_k(const CudaOpCtx &c) {
  const int64_t T = c.n.ne[1];
  if (T == 0) return;
  launch_pdl(top_k_kernel, dim3(static_cast<unsigned>((T + 3) / 4)), dim3(128), 0, c.stream, tview(c.src(0)), tview(c.n),
             static_cast<int>(c.n.ne[0]), T);
}

void cuda_op_gather_cols(const CudaOpCtx &c) {
  const int64_t k = c.n.ne[0], T = c.n.ne[1];
  if (k * T == 0) return;
  launch_pdl(gather_cols_kernel, dim3(static_cast<unsigned>((k * T + 127) / 128)), dim3(128), 0, c.stream, tview(c.src(0)), tview(c.src(1)),
             tview(c.n), k, T, c.ub.err);
}

// MoeCombine(ex, w) into out [+ the residual res].
static void launch_combine(const CudaOpCtx &c, const Node &ex_n, const Node &w, const Node &out, const Node *res) {
  const int64_t M = out.ne[0], T = out.ne[1], k = ex_n.ne[1];
  if (M * T == 0) return;
  const TView ex = tview(ex_n), d = tview(out);
  TView r{};
  if (res) r = tview(*res);
  const uintptr_t align = reinterpret_cast<uintptr_t>(ex.data) | reinterpret_cast<uintptr_t>(d.data) | ex.nb[1] | ex.nb[2] | d.nb[1] |
                          reinterpret_cast<uintptr_t>(r.data) | static_cast<uintptr_t>(r.nb[1]);
  if (k >= 1 && k <= kCombineMaxK && M % 4 == 0 && align % 16 == 0) {
    launch_pdl(moe_combine4_kernel, dim3(static_cast<unsigned>((M / 4 + 255) / 256), static_cast<unsigned>(T)), dim3(256), 0, c.stream, ex,
               tview(w), d, r, M, static_cast<int>(k));
    return;
  }
  launch_pdl(moe_combine_kernel, dim3(static_cast<unsigned>((M + 255) / 256), static_cast<unsigned>(T)), dim3(256), 0, c.stream, ex, tview(w),
             d, r, M, k);
}

void cuda_op_moe_combine(const CudaOpCtx &c) { launch_combine(c, c.src(0), c.src(1), c.n, nullptr); }

void cuda_fused_combine_add(const CudaOpCtx &c, const Node &comb, const Node &add) {
  const Node &res = &c.g.node(add.src[0]) == &comb ? c.g.node(add.src[1]) : c.g.node(add.src[0]);
  launch_combine(c, c.g.node(comb.src[0]), c.g.node(comb.src[1]), add, &res);
}

void cuda_op_add_id(const CudaOpCtx &c) {
  const int64_t M = c.n.ne[0], k = c.n.ne[1], T = c.n.ne[2];
  if (M * k * T == 0) return;
  launch_pdl(add_id_kernel, dim3(static_cast<unsigned>((M + 255) / 256), static_cast<unsigned>(k * T)), dim3(256), 0, c.stream,
             tview(c.src(0)), tview(c.src(1)), tview(c.src(2)), tview(c.n), M, k, T, c.ub.err);
}

bool cuda_grouped_top_k_supported(const Node &n) { return n.ip[1] > 0 && n.ip[1] <= kMaxGroups; }

void cuda_op_grouped_top_k(const CudaOpCtx &c) {
  const int64_t T = c.n.ne[1];
  if (T == 0) return;
  launch_pdl(grouped_top_k_kernel, dim3(static_cast<unsigned>((T + 63) / 64)), dim3(64), 0, c.stream, tview(c.src(0)), tview(c.n),
             static_cast<int>(c.n.ip[0]), static_cast<int>(c.n.ip[1]), static_cast<int>(c.n.ip[2]), T);
}

void cuda_op_get_rows(const CudaOpCtx &c) {
  const Node &tab = c.src(0), &ids = c.src(1);
  const int64_t n = ids.ne[0];
  if (n == 0) return;
  const bool plain = tab.type == DType::F32 || tab.type == DType::F16 || tab.type == DType::BF16;
  const int64_t units = plain ? tab.ne[0] : tab.ne[0] / 32;
  launch_pdl(get_rows_kernel, dim3(static_cast<unsigned>((units + 127) / 128), static_cast<unsigned>(n)), dim3(128), 0, c.stream, tview(tab),
             static_cast<int>(tab.type), tview(ids), tview(c.n), units, c.ub.err);
}

}  // namespace moe
