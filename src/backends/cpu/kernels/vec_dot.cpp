// Kernel selection: one table per ISA, built on first use; the active ISA is an atomic so
// tests can switch it while nothing else runs.
#include "backends/cpu/kernels/vec_dot.h"

#include <atomic>
#include <cstring>

#include "backends/cpu/kernels/vec_dot_impl.h"
#include "core/fp16.h"
#include "core/status.h"
#include "quant/quant_ref.h"

namespace moe {

namespace {

constexpr int kNumIsa = 4;
// Every type in DType fits below this id; tables are indexed by the raw GGML id.
constexpr int kMaxTypeId = 40;

void from_f32(const float *x, void *y, int64_t n) { std::memcpy(y, x, static_cast<size_t>(n) * 4); }
void from_f16(const float *x, void *y, int64_t n) {
  uint16_t *d = static_cast<uint16_t *>(y);
  for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(x[i]);
}
void from_bf16(const float *x, void *y, int64_t n) {
  uint16_t *d = static_cast<uint16_t *>(y);
  for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(x[i]);
}
void from_q8_0(const float *x, void *y, int64_t n) { quantize_row_q8_0_ref(x, static_cast<BlockQ8_0 *>(y), n); }
void from_q8_K(const float *x, void *y, int64_t n) { quantize_row_q8_K_ref(x, static_cast<BlockQ8_K *>(y), n); }
void from_q8_1(const float *x, void *y, int64_t n) { quantize_row_q8_1_ref(x, static_cast<BlockQ8_1 *>(y), n); }

FromFloatFn scalar_from_float(DType act) {
  switch (act) {
    case DType::F32: return from_f32;
    case DType::F16: return from_f16;
    case DType::BF16: return from_bf16;
    case DType::Q8_0: return from_q8_0;
    case DType::Q8_K: return from_q8_K;
    case DType::Q8_1: return from_q8_1;
    default: return nullptr;
  }
}

bool isa_built(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return true;
#if defined(MOEINFER_X86) || defined(__x86_64__)
    case CpuIsa::Avx2: return true;
    case CpuIsa::Avx512: return true;
#endif
#if defined(__aarch64__)
    case CpuIsa::Neon: return true;
#endif
    default: return false;
  }
}

CpuIsa detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2"))
    return CpuIsa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2"))
    return CpuIsa::Avx2;
  return CpuIsa::Scalar;
#elif defined(__aarch64__)
  return CpuIsa::Neon;  // Advanced SIMD is mandatory on AArch64
#else
  return CpuIsa::Scalar;
#endif
}

struct Tables {
  CpuTypeKernels k[kNumIsa][kMaxTypeId];
  VecDot4Fn k4[kNumIsa][kMaxTypeId] = {};
  Tables() {
    for (int isa = 0; isa < kNumIsa; ++isa) {
      for (int id = 0; id < kMaxTypeId; ++id) {
        const DType t = static_cast<DType>(id);
        CpuTypeKernels &e = k[isa][id];
        e.vec_dot_type = type_traits(t).vec_dot_type;
        if (!isa_built(static_cast<CpuIsa>(isa))) continue;
        VecDotFn f = nullptr;
        FromFloatFn q = nullptr;
        // Fall back ISA by ISA: AVX-512 -> AVX2 -> scalar; NEON -> scalar.
        switch (static_cast<CpuIsa>(isa)) {
          case CpuIsa::Avx512:
            f = vec_dot_kernel_avx512(t);
            q = from_float_kernel_avx512(e.vec_dot_type);
            if (!f) f = vec_dot_kernel_avx2(t);
            if (!q) q = from_float_kernel_avx2(e.vec_dot_type);
            break;
          case CpuIsa::Avx2:
            f = vec_dot_kernel_avx2(t);
            q = from_float_kernel_avx2(e.vec_dot_type);
            break;
          case CpuIsa::Neon: f = vec_dot_kernel_neon(t); break;
          default: break;
        }
        if (!f) f = vec_dot_kernel_scalar(t);
        if (!q) q = scalar_from_float(e.vec_dot_type);
        if (f && q) { e.vec_dot = f; e.from_float = q; }
        // A 4-row kernel is only valid next to the single-row kernel of the same ISA file.
        if (static_cast<CpuIsa>(isa) == CpuIsa::Avx512 && f == vec_dot_kernel_avx512(t)) k4[isa][id] = vec_dot4_kernel_avx512(t);
        if (static_cast<CpuIsa>(isa) == CpuIsa::Avx2 || (static_cast<CpuIsa>(isa) == CpuIsa::Avx512 && !vec_dot_kernel_avx512(t)))
          if (f == vec_dot_kernel_avx2(t)) k4[isa][id] = vec_dot4_kernel_avx2(t);
      }
    }
  }
};

const Tables &tables() {
  static const Tables t;
  return t;
}

std::atomic<int> g_isa{-1};

}  // namespace

CpuIsa detect_cpu_isa() {
  static const CpuIsa isa = detect();
  return isa;
}

CpuIsa active_cpu_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    v = static_cast<int>(detect_cpu_isa());
    g_isa.store(v, std::memory_order_relaxed);
  }
  return static_cast<CpuIsa>(v);
}

void set_cpu_isa(CpuIsa isa) {
  const CpuIsa best = detect_cpu_isa();
  // Clamp: Scalar always works; otherwise only the detected ISA or a lower x86 one.
  CpuIsa use = CpuIsa::Scalar;
  if (isa == best) use = isa;
  else if (isa == CpuIsa::Avx2 && best == CpuIsa::Avx512) use = CpuIsa::Avx2;
  g_isa.store(static_cast<int>(use), std::memory_order_relaxed);
}

const char *cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return "scalar";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Neon: return "neon";
  }
  return "unknown";
}

const CpuTypeKernels &cpu_type_kernels(DType weight_type) {
  const uint32_t id = static_cast<uint32_t>(weight_type);
  static const CpuTypeKernels none{};
  if (id >= static_cast<uint32_t>(kMaxTypeId)) return none;
  return tables().k[static_cast<int>(active_cpu_isa())][id];
}

void cpu_vec_dot_rows(DType wtype, int n, int nrows, float *out, const void *w,
                      size_t w_row_stride, const void *xq) {
  const CpuTypeKernels &k = cpu_type_kernels(wtype);
  if (!k.vec_dot) fail(Status::Unsupported, "cpu: no dot kernel for %s", dtype_name(wtype));
  const uint8_t *row = static_cast<const uint8_t *>(w);
  int r = 0;
  const uint32_t id = static_cast<uint32_t>(wtype);
  if (const VecDot4Fn k4 = tables().k4[static_cast<int>(active_cpu_isa())][id]) {
    for (; r + 4 <= nrows; r += 4, row += 4 * w_row_stride) k4(n, &out[r], row, w_row_stride, xq);
  }
  for (; r < nrows; ++r, row += w_row_stride) k.vec_dot(n, &out[r], row, xq);
}

}  // namespace moe
