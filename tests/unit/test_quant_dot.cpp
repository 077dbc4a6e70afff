// CPU dot kernels: every ISA this machine runs against a float64 reference computed from
// the dequantized weight row and the dequantized activation row, plus SIMD-vs-scalar
// agreement and byte-identical activation quantizers.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/kernels/vec_dot.h"
#include "quant/dtype.h"

using namespace moe;

namespace {

const DType kWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,
                              DType::Q8_0, DType::MXFP4, DType::Q2_K, DType::Q3_K,
                              DType::Q4_K, DType::Q5_K, DType::Q6_K};

std::vector<CpuIsa> available_isas() {
  std::vector<CpuIsa> v{CpuIsa::Scalar};
  const CpuIsa best = detect_cpu_isa();
  if (best == CpuIsa::Avx512) v.push_back(CpuIsa::Avx2);
  if (best != CpuIsa::Scalar) v.push_back(best);
  return v;
}

struct IsaGuard {
  CpuIsa saved = active_cpu_isa();
  ~IsaGuard() { set_cpu_isa(saved); }
};

std::vector<float> random_row(int n, std::mt19937 &rng, int kind) {
  std::normal_distribution<float> nd(0, 1);
  std::uniform_real_distribution<float> ud(-1, 1);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto &v : x) {
    switch (kind) {
      case 0: v = nd(rng); break;
      case 1: v = ud(rng) + 0.3f; break;                           // biased: exercises mins
      case 2: v = ud(rng) > 0.95f ? nd(rng) * 50 : nd(rng); break;  // outliers
      default: v = nd(rng) * 1e-3f; break;
    }
  }
  return x;
}

struct Prepared {
  std::vector<uint8_t> w, xq;
  double ref = 0, abs_sum = 0;  // float64 reference and sum of |w_i x_i|
};

// Quantize with the reference quantizers, then compute the float64 reference dot from
// what the kernel actually sees (dequantized weight x dequantized activation).
Prepared prepare(DType wt, const std::vector<float> &w, const std::vector<float> &x) {
  const int n = static_cast<int>(w.size());
  const DType at = type_traits(wt).vec_dot_type;
  Prepared p;
  p.w.resize(row_size(wt, n));
  p.xq.resize(row_size(at, n));
  quantize_row(wt, w.data(), p.w.data(), n);
  quantize_row(at, x.data(), p.xq.data(), n);
  std::vector<float> wd(static_cast<size_t>(n)), xd(static_cast<size_t>(n));
  dequantize_row(wt, p.w.data(), wd.data(), n);
  dequantize_row(at, p.xq.data(), xd.data(), n);
  for (int i = 0; i < n; ++i) {
    p.ref += static_cast<double>(wd[i]) * xd[i];
    p.abs_sum += std::fabs(static_cast<double>(wd[i]) * xd[i]);
  }
  return p;
}

// f32 accumulation over n terms: allow a few ulps per term relative to sum |w x|.
double tolerance(const Prepared &p, int n) { return 1e-6 + 4e-7 * std::sqrt(n) * p.abs_sum + 1e-7 * p.abs_sum; }

}  // namespace

TEST_CASE("cpu kernels exist for every supported weight type on every ISA", "[quant][cpu]") {
  IsaGuard guard;
  for (CpuIsa isa : available_isas()) {
    set_cpu_isa(isa);
    REQUIRE(active_cpu_isa() == isa);
    for (DType t : kWeightTypes) {
      INFO(cpu_isa_name(isa) << " " << dtype_name(t));
      const CpuTypeKernels &k = cpu_type_kernels(t);
      CHECK(k.vec_dot != nullptr);
      CHECK(k.from_float != nullptr);
      CHECK(k.vec_dot_type == type_traits(t).vec_dot_type);
    }
    CHECK(cpu_type_kernels(static_cast<DType>(34)).vec_dot == nullptr);  // tq1_0: known, no kernel
  }
}

TEST_CASE("vec_dot matches a float64 reference on every ISA", "[quant][cpu]") {
  IsaGuard guard;
  std::mt19937 rng(1234);
  for (DType t : kWeightTypes) {
    // Plain types get odd lengths (33 per "block") to exercise the SIMD tails.
    const int bs = type_traits(t).is_quantized ? static_cast<int>(type_traits(t).block_size) : 33;
    for (int blocks : {1, 3, 7, 8}) {
      for (int kind = 0; kind < 4; ++kind) {
        const int n = blocks * bs;
        auto w = random_row(n, rng, kind);
        auto x = random_row(n, rng, (kind + 1) % 4);
        const Prepared p = prepare(t, w, x);
        for (CpuIsa isa : available_isas()) {
          set_cpu_isa(isa);
          float s = -12345.0f;
          cpu_type_kernels(t).vec_dot(n, &s, p.w.data(), p.xq.data());
          INFO(cpu_isa_name(isa) << " " << dtype_name(t) << " n=" << n << " kind=" << kind);
          CHECK(std::fabs(s - p.ref) <= tolerance(p, n));
        }
      }
    }
  }
}

TEST_CASE("vec_dot on all-zero blocks and saturated values", "[quant][cpu]") {
  IsaGuard guard;
  std::mt19937 rng(77);
  for (DType t : kWeightTypes) {
    const int n = 512;
    // zero weights
    std::vector<float> zero(n, 0.0f);
    auto x = random_row(n, rng, 0);
    Prepared pz = prepare(t, zero, x);
    // alternating extreme weights (hit the code range ends) against extreme activations
    std::vector<float> ext(static_cast<size_t>(n)), xe(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      ext[i] = (i % 3 == 0 ? -1.0f : 1.0f) * (i % 5 == 0 ? 1000.0f : 999.0f);
      xe[i] = (i % 2 ? 1.0f : -1.0f) * 60000.0f;
    }
    Prepared pe = prepare(t, ext, xe);
    // half the blocks zero
    auto wz = random_row(n, rng, 0);
    for (int i = 0; i < n / 2; ++i) wz[i] = 0;
    Prepared ph = prepare(t, wz, x);
    for (CpuIsa isa : available_isas()) {
      set_cpu_isa(isa);
      INFO(cpu_isa_name(isa) << " " << dtype_name(t));
      float s = 1.0f;
      cpu_type_kernels(t).vec_dot(n, &s, pz.w.data(), pz.xq.data());
      CHECK(s == 0.0f);
      cpu_type_kernels(t).vec_dot(n, &s, pe.w.data(), pe.xq.data());
      CHECK(std::fabs(s - pe.ref) <= tolerance(pe, n));
      cpu_type_kernels(t).vec_dot(n, &s, ph.w.data(), ph.xq.data());
      CHECK(std::fabs(s - ph.ref) <= tolerance(ph, n));
    }
  }
}

TEST_CASE("SIMD kernels agree with scalar and rows helper matches single dots", "[quant][cpu]") {
  IsaGuard guard;
  std::mt19937 rng(99);
  const int n = 2048, rows = 13;
  for (DType t : kWeightTypes) {
    const DType at = type_traits(t).vec_dot_type;
    const size_t stride = row_size(t, n);
    std::vector<uint8_t> w(stride * rows), xq(row_size(at, n));
    for (int r = 0; r < rows; ++r) {
      auto wr = random_row(n, rng, r % 4);
      quantize_row(t, wr.data(), w.data() + r * stride, n);
    }
    auto x = random_row(n, rng, 0);
    quantize_row(at, x.data(), xq.data(), n);
    set_cpu_isa(CpuIsa::Scalar);
    std::vector<float> ref(rows);
    cpu_vec_dot_rows(t, n, rows, ref.data(), w.data(), stride, xq.data());
    for (CpuIsa isa : available_isas()) {
      set_cpu_isa(isa);
      std::vector<float> out(rows, -1.0f);
      cpu_vec_dot_rows(t, n, rows, out.data(), w.data(), stride, xq.data());
      for (int r = 0; r < rows; ++r) {
        float single;
        cpu_type_kernels(t).vec_dot(n, &single, w.data() + r * stride, xq.data());
        INFO(cpu_isa_name(isa) << " " << dtype_name(t) << " row " << r);
        CHECK(out[r] == single);
        CHECK(std::fabs(out[r] - ref[r]) <= 1e-4 * (1.0 + std::fabs(ref[r])));
      }
    }
  }
  CHECK_THROWS(cpu_vec_dot_rows(static_cast<DType>(34), 256, 1, nullptr, nullptr, 0, nullptr));
}

TEST_CASE("activation quantizers are byte-identical to the reference ones", "[quant][cpu]") {
  IsaGuard guard;
  std::mt19937 rng(5);
  for (DType t : kWeightTypes) {
    const DType at = type_traits(t).vec_dot_type;
    for (int n : {256, 768, 2048}) {
      for (int kind = 0; kind < 4; ++kind) {
        auto x = random_row(n, rng, kind);
        if (kind == 3) {  // exact .5 ties after scaling and an all-zero block
          for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 16) * 0.5f;
          x[5] = 127.0f / 16;
          for (int i = 256 - 32; i < 256; ++i) x[i] = 0;
        }
        if (kind == 3 && (at == DType::F16 || at == DType::BF16)) {
          // halfway ties, subnormals, overflow, infinities, -0 (meaningless for int8 blocks)
          const float edge[] = {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 1e-6f, -3e-8f, 70000.0f,
                                -65520.0f, 65519.0f, 1e-40f, -0.0f, INFINITY, -INFINITY,
                                1.00390625f, 1.01171875f, 3.4e38f};
          for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); ++i) x[40 + i] = edge[i];
        }
        std::vector<uint8_t> ref(row_size(at, n));
        quantize_row(at, x.data(), ref.data(), n);
        for (CpuIsa isa : available_isas()) {
          set_cpu_isa(isa);
          std::vector<uint8_t> got(ref.size(), 0xCD);
          cpu_type_kernels(t).from_float(x.data(), got.data(), n);
          INFO(cpu_isa_name(isa) << " " << dtype_name(at) << " n=" << n << " kind=" << kind);
          CHECK(std::memcmp(got.data(), ref.data(), ref.size()) == 0);
        }
      }
    }
  }
}
