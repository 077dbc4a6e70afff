// CPU dot-kernel throughput per weight type and ISA: one n=2048 vec_dot, and a 768x2048
// matvec through cpu_vec_dot_rows (the engine's inner loop). Bytes = weight bytes read,
// so the GB/s column is directly comparable to memory bandwidth.
//
//   bench-quant_dot --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels/vec_dot.h"
#include "quant/dtype.h"

using namespace moe;

namespace {

const DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0, DType::MXFP4,
                        DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};

struct Data {
  std::vector<uint8_t> w, xq;
  size_t stride = 0;
};

Data make(DType t, int n, int rows) {
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0, 1);
  Data d;
  d.stride = row_size(t, n);
  d.w.resize(d.stride * static_cast<size_t>(rows));
  std::vector<float> row(static_cast<size_t>(n));
  for (int r = 0; r < rows; ++r) {
    for (auto &v : row) v = nd(rng);
    quantize_row(t, row.data(), d.w.data() + d.stride * r, n);
  }
  for (auto &v : row) v = nd(rng);
  const DType at = type_traits(t).vec_dot_type;
  d.xq.resize(row_size(at, n));
  quantize_row(at, row.data(), d.xq.data(), n);
  return d;
}

void bm_vec_dot(benchmark::State &st, DType t, CpuIsa isa) {
  set_cpu_isa(isa);
  const int n = 2048;
  Data d = make(t, n, 1);
  const VecDotFn f = cpu_type_kernels(t).vec_dot;
  float s = 0;
  for (auto _ : st) {
    f(n, &s, d.w.data(), d.xq.data());
    benchmark::DoNotOptimize(s);
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(d.stride));
}

void bm_matvec(benchmark::State &st, DType t, CpuIsa isa) {
  set_cpu_isa(isa);
  const int n = 2048, rows = 768;
  Data d = make(t, n, rows);
  std::vector<float> out(rows);
  for (auto _ : st) {
    cpu_vec_dot_rows(t, n, rows, out.data(), d.w.data(), d.stride, d.xq.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(d.w.size()));
}

void bm_from_float(benchmark::State &st, DType act, CpuIsa isa) {
  set_cpu_isa(isa);
  const int n = 2048;
  std::vector<float> x(n, 0.5f);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i % 97) * 0.01f - 0.3f;
  std::vector<uint8_t> y(row_size(act, n));
  const FromFloatFn f = cpu_type_kernels(act == DType::Q8_K ? DType::Q4_K : DType::Q8_0).from_float;
  for (auto _ : st) {
    f(x.data(), y.data(), n);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * n * 4);
}

int register_all() {
  std::vector<CpuIsa> isas{CpuIsa::Scalar};
  const CpuIsa best = detect_cpu_isa();
  if (best == CpuIsa::Avx512) isas.push_back(CpuIsa::Avx2);
  if (best != CpuIsa::Scalar) isas.push_back(best);
  for (CpuIsa isa : isas) {
    const std::string is = cpu_isa_name(isa);
    for (DType t : kTypes) {
      const std::string tn = dtype_name(t);
      benchmark::RegisterBenchmark(("vec_dot/" + tn + "/" + is).c_str(), bm_vec_dot, t, isa);
      benchmark::RegisterBenchmark(("matvec768x2048/" + tn + "/" + is).c_str(), bm_matvec, t, isa);
    }
    for (DType a : {DType::Q8_0, DType::Q8_K})
      benchmark::RegisterBenchmark(("from_float/" + std::string(dtype_name(a)) + "/" + is).c_str(),
                                   bm_from_float, a, isa);
  }
  return 0;
}

const int registered = register_all();

}  // namespace
