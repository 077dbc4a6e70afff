// Dot-kernel throughput of Q4_1, Q5_0, Q5_1 and the i-quants per ISA, one thread. Each ISA's
// kernel is taken from its own table (vec_dot_impl.h), so the AVX-512 column is the AVX-512
// code whatever dispatch would pick; ISAs this CPU lacks are not registered. Two shapes:
// one n=4096 vec_dot (weights in L1/L2) and 1024 rows x 4096 (0.8-3 MB of weights, L2/L3).
// Bytes = weight bytes read, so GB/s compares directly with memory bandwidth.
//
//   bench-quant_dot_newtypes --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Weights are random bytes with finite f16 scales: the kernels' cost does not depend on the
// values, and the i-quant quantizer is too slow to fill megabytes.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels/vec_dot.h"
#include "backends/cpu/kernels/vec_dot_impl.h"
#include "quant/dtype.h"

using namespace moe;

namespace {

const DType kTypes[] = {DType::Q4_1,   DType::Q5_0,    DType::Q5_1,    DType::IQ4_NL, DType::IQ4_XS, DType::IQ3_S,
                        DType::IQ3_XXS, DType::IQ2_S,  DType::IQ2_XS,  DType::IQ2_XXS, DType::IQ1_S, DType::IQ1_M};

constexpr uint16_t kHalfOne = 0x3C00;

void set_half(uint8_t *p, uint16_t h) { std::memcpy(p, &h, 2); }

// Random block bytes; the f16 scale fields set to 1.0 (and Q4_1/Q5_1's min to 1.0).
std::vector<uint8_t> random_weights(DType t, int n, int rows) {
  const size_t bytes = type_traits(t).type_size, nb = static_cast<size_t>(n / type_traits(t).block_size) * rows;
  std::vector<uint8_t> w(bytes * nb);
  std::mt19937_64 rng(7);
  for (auto &b : w) b = static_cast<uint8_t>(rng());
  for (size_t i = 0; i < nb; ++i) {
    uint8_t *blk = w.data() + i * bytes;
    if (t == DType::IQ1_M) {  // the f16 scale is the top nibble of the four scale words
      for (int k = 0; k < 4; ++k) blk[48 + 2 * k + 1] = static_cast<uint8_t>((blk[48 + 2 * k + 1] & 0x0F) | (((kHalfOne >> (4 * k)) & 0xF) << 4));
      continue;
    }
    set_half(blk, kHalfOne);
    if (t == DType::Q4_1 || t == DType::Q5_1) set_half(blk + 2, kHalfOne);
  }
  return w;
}

std::vector<uint8_t> activations(DType t, int n) {
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto &v : x) v = nd(rng);
  const DType at = type_traits(t).vec_dot_type;
  std::vector<uint8_t> xq(row_size(at, n));
  quantize_row(at, x.data(), xq.data(), n);
  return xq;
}

void bm_rows(benchmark::State &st, DType t, VecDotFn f, int rows) {
  const int n = 4096;
  const std::vector<uint8_t> w = random_weights(t, n, rows), xq = activations(t, n);
  const size_t stride = row_size(t, n);
  std::vector<float> out(static_cast<size_t>(rows));
  for (auto _ : st) {
    for (int r = 0; r < rows; ++r) f(n, &out[static_cast<size_t>(r)], w.data() + stride * r, xq.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(w.size()));
}

int register_all() {
  struct Isa {
    CpuIsa isa;
    VecDotFn (*table)(DType);
  };
  const CpuIsa best = detect_cpu_isa();
  std::vector<Isa> isas{{CpuIsa::Scalar, vec_dot_extra_kernel_scalar}};
  if (best == CpuIsa::Avx2 || best == CpuIsa::Avx512) isas.push_back({CpuIsa::Avx2, vec_dot_extra_kernel_avx2});
  if (best == CpuIsa::Avx512) isas.push_back({CpuIsa::Avx512, vec_dot_extra_kernel_avx512});
  if (best == CpuIsa::Neon) isas.push_back({CpuIsa::Neon, vec_dot_extra_kernel_neon});
  for (DType t : kTypes) {
    for (const Isa &i : isas) {
      const VecDotFn f = i.table(t);
      if (!f) continue;
      const std::string name = std::string(dtype_name(t)) + "/" + cpu_isa_name(i.isa);
      benchmark::RegisterBenchmark(("vec_dot4096/" + name).c_str(), bm_rows, t, f, 1);
      benchmark::RegisterBenchmark(("rows1024x4096/" + name).c_str(), bm_rows, t, f, 1024);
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace
