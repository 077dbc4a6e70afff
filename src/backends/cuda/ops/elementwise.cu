// Row-local F32 ops (strided rows over dims 1..3, GGML broadcasting for src1) and the
// row reductions RmsNorm / Softmax / NormSum, with the CPU reference's accumulation
// precision (double sums where the reference uses them). All launch with PDL (ops/pdl.cuh):
// every kernel waits for its predecessor before its first load.
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/ew_value.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/row_ops.cuh"

namespace moe {

namespace {

__global__ void ew_kernel(TView d, TView a, TView b, int op, float f0, float f1, int64_t start) {
  pdl_wait();
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const int64_t i1 = r % d.ne[1], i2 = (r / d.ne[1]) % d.ne[2], i3 = r / (d.ne[1] * d.ne[2]);
  float *dst = rowp(d, i1, i2, i3);
  const float *s0 = rowp(a, i1, i2, i3);
  const float *s1 = nullptr;
  if (op == kMul || op == kAdd) s1 = rowp(b, b.ne[1] == 1 ? 0 : i1, b.ne[2] == 1 ? 0 : i2, b.ne[3] == 1 ? 0 : i3);
  else if (op == kSwiGLU || op == kConcat || op == kSwiGLUOai) s1 = rowp(b, i1, i2, i3);
  // kBatch values per thread loaded before any is stored: a store after each load would keep
  // one load at a time in flight (dst may alias the sources as far as the compiler knows).
  constexpr int kBatch = 4;
  const int64_t n = d.ne[0], na = a.ne[0], step = blockDim.x;
  for (int64_t i0 = threadIdx.x; i0 < n; i0 += kBatch * step) {
    float x[kBatch], y[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = i0 + j * step;
      x[j] = y[j] = 0.0f;
      if (i >= n) continue;
      if (op == kSlice) x[j] = s0[start + i];
      else if (op == kConcat) x[j] = i < na ? s0[i] : s1[i - na];
      else {
        x[j] = s0[i];
        if (s1) y[j] = s1[i];
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = i0 + j * step;
      if (i < n) dst[i] = op == kSlice || op == kConcat ? x[j] : ew_value(op, x[j], y[j], i, n, f0, f1);
    }
  }
}

// Every operand contiguous and of the output's shape (no broadcast): the tensors as flat
// arrays, 4 consecutive values per thread (16-byte loads when aligned, decided on the host)
// so each thread has all its loads in flight at once. Element e is column e % ne0 of its row.
template <bool kVec4>
__global__ void ew_flat_kernel(float *d, const float *a, const float *b, int64_t n, int64_t ne0, int op, float f0, float f1) {
  pdl_wait();
  pdl_trigger();
  const int64_t e0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (e0 >= n) return;
  float x[4], y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if constexpr (kVec4) {  // n % 4 == 0
    const float4 xa = *reinterpret_cast<const float4 *>(a + e0);
    x[0] = xa.x; x[1] = xa.y; x[2] = xa.z; x[3] = xa.w;
    if (b) {
      const float4 yb = *reinterpret_cast<const float4 *>(b + e0);
      y[0] = yb.x; y[1] = yb.y; y[2] = yb.z; y[3] = yb.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      x[j] = e0 + j < n ? a[e0 + j] : 0.0f;
      if (b && e0 + j < n) y[j] = b[e0 + j];
    }
  }
  // Column of element e0 + j (only SwiGLU reads it: one 64-bit division per thread, not per value).
  int64_t col = op == kSwiGLU ? e0 % ne0 : 0;
  float r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    r[j] = ew_value(op, x[j], y[j], col, ne0, f0, f1);
    if (++col == ne0) col = 0;
  }
  if constexpr (kVec4) {
    *reinterpret_cast<float4 *>(d + e0) = make_float4(r[0], r[1], r[2], r[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (e0 + j < n) d[e0 + j] = r[j];
  }
}

__global__ void rms_norm_kernel(TView d, TView a, float eps) {
  __shared__ double sh[32];
  pdl_wait();
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const int64_t i1 = r % d.ne[1], i2 = (r / d.ne[1]) % d.ne[2], i3 = r / (d.ne[1] * d.ne[2]);
  const float *src = rowp(a, i1, i2, i3);
  float *dst = rowp(d, i1, i2, i3);
  const int64_t n = d.ne[0];
  const float scale = rms_row_scale(src, n, eps, static_cast<int>(blockDim.x), sh);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i] * scale;
}

__global__ void softmax_kernel(TView d, TView a) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  pdl_wait();
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const int64_t i1 = r % d.ne[1], i2 = (r / d.ne[1]) % d.ne[2], i3 = r / (d.ne[1] * d.ne[2]);
  softmax_row(rowp(a, i1, i2, i3), rowp(d, i1, i2, i3), d.ne[0], shf, shd, static_cast<int>(blockDim.x));
}

// x / max(||x||, eps) per row: float squares summed in double, as the CPU's L2Norm.
__global__ void l2_norm_kernel(TView d, TView a, float eps) {
  __shared__ double sh[32];
  pdl_wait();
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const int64_t i1 = r % d.ne[1], i2 = (r / d.ne[1]) % d.ne[2], i3 = r / (d.ne[1] * d.ne[2]);
  const float *src = rowp(a, i1, i2, i3);
  float *dst = rowp(d, i1, i2, i3);
  const int64_t n = d.ne[0];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(src[i] * src[i]);
  s = blk_sum(s, sh);
  const float scale = 1.0f / fmaxf(sqrtf(static_cast<float>(s)), eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i] * scale;
}

// Rows are short (k experts): one thread per row, serial float sum like the reference.
__global__ void norm_sum_kernel(TView d, TView a, int64_t nrows) {
  pdl_wait();
  pdl_trigger();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= nrows) return;
  const int64_t i1 = r % d.ne[1], i2 = (r / d.ne[1]) % d.ne[2], i3 = r / (d.ne[1] * d.ne[2]);
  const float *src = rowp(a, i1, i2, i3);
  float *dst = rowp(d, i1, i2, i3);
  float s = 0.0f;
  for (int64_t i = 0; i < d.ne[0]; ++i) s += src[i];
  for (int64_t i = 0; i < d.ne[0]; ++i) dst[i] = src[i] / s;
}

// x holds n.ne values densely in n's order (F32 rows, no gaps).
bool contiguous_like(const Node &x, const Node &n) {
  int64_t nb = 4;
  for (int d = 0; d < 4; ++d) {
    if (x.ne[d] != n.ne[d] || n.nb[d] != static_cast<size_t>(nb) || x.nb[d] != static_cast<size_t>(nb)) return false;
    nb *= n.ne[d];
  }
  return true;
}
bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void cuda_op_elementwise(const CudaOpCtx &c) {
  const Node &n = c.n;
  const int64_t rows = n.ne[1] * n.ne[2] * n.ne[3];
  if (rows == 0 || n.ne[0] == 0) return;
  int op = kCopy;
  switch (n.op) {
    case Op::Mul: op = kMul; break;
    case Op::Add: op = kAdd; break;
    case Op::Scale: op = kScale; break;
    case Op::Sigmoid: op = kSigmoid; break;
    case Op::SwiGLU: op = kSwiGLU; break;
    case Op::Slice: op = kSlice; break;
    case Op::Concat: op = kConcat; break;
    case Op::SwiGLUOai: op = kSwiGLUOai; break;
    case Op::Softplus: op = kSoftplus; break;
    default: op = kCopy; break;
  }
  TView b = n.src[1] >= 0 ? tview(c.src(1)) : tview(c.src(0));
  if (op != kSlice && op != kConcat && contiguous_like(c.src(0), n) && (n.src[1] < 0 || contiguous_like(c.src(1), n))) {
    const int64_t total = rows * n.ne[0];
    float *d = static_cast<float *>(n.data);
    const float *a = static_cast<const float *>(c.src(0).data);
    const float *bp = n.src[1] >= 0 && op != kScale && op != kSigmoid && op != kCopy && op != kSoftplus ? static_cast<const float *>(c.src(1).data) : nullptr;
    const bool vec4 = total % 4 == 0 && aligned16(d) && aligned16(a) && (!bp || aligned16(bp));
    const dim3 grid(static_cast<unsigned>((total + 4 * 256 - 1) / (4 * 256)));
    if (vec4) launch_pdl(ew_flat_kernel<true>, grid, dim3(256), 0, c.stream, d, a, bp, total, n.ne[0], op, n.fp[0], n.fp[1]);
    else launch_pdl(ew_flat_kernel<false>, grid, dim3(256), 0, c.stream, d, a, bp, total, n.ne[0], op, n.fp[0], n.fp[1]);
    return;
  }
  launch_pdl(ew_kernel, dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(row_threads(n.ne[0]))), 0, c.stream, tview(n),
             tview(c.src(0)), b, op, n.fp[0], n.fp[1], static_cast<int64_t>(n.ip[0]));
}

void cuda_op_rowwise(const CudaOpCtx &c) {
  const Node &n = c.n;
  const int64_t rows = n.ne[1] * n.ne[2] * n.ne[3];
  if (rows == 0 || n.ne[0] == 0) return;
  const dim3 grid(static_cast<unsigned>(rows)), block(static_cast<unsigned>(row_threads(n.ne[0])));
  if (n.op == Op::RmsNorm) launch_pdl(rms_norm_kernel, grid, block, 0, c.stream, tview(n), tview(c.src(0)), n.fp[0]);
  else if (n.op == Op::Softmax) launch_pdl(softmax_kernel, grid, block, 0, c.stream, tview(n), tview(c.src(0)));
  else if (n.op == Op::L2Norm) launch_pdl(l2_norm_kernel, grid, block, 0, c.stream, tview(n), tview(c.src(0)), n.fp[0]);
  else launch_pdl(norm_sum_kernel, dim3(static_cast<unsigned>((rows + 127) / 128)), dim3(128), 0, c.stream, tview(n), tview(c.src(0)), rows);
}

}  // namespace moe
