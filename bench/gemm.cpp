// Q4_K weight rows x Q8_K activation columns: the tile kernel (kernels/gemm.h) against
// per-column cpu_vec_dot_rows (the engine's loop before it). 64 rows of n=1024 (36 KiB,
// cache-resident: compute, not memory) x C columns, C = 1, 4, 8 (1 = decode, 8 = an
// expert's tokens in a 64-token prefill). items/s = row x column products per second.
//
//   bench-gemm --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backends/cpu/kernels/gemm.h"
#include "backends/cpu/kernels/ref_order_dot.h"
#include "backends/cpu/kernels/vec_dot.h"
#include "quant/dtype.h"

using namespace moe;

namespace {

constexpr int kN = 1024, kRows = 64;

struct Data {
  DType t;
  size_t ws, xs;  // before w, x
  std::vector<uint8_t> w, x;
  std::vector<float> out;
  std::vector<float *> outs;
  std::vector<const void *> xp;
  explicit Data(int cols, DType type = DType::Q4_K)
      : t(type), ws(row_size(type, kN)), xs(row_size(DType::Q8_K, kN)), w(ws * kRows), x(xs * cols), out(static_cast<size_t>(kRows) * cols), outs(cols), xp(cols) {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0, 1);
    std::vector<float> f(kN);
    for (int r = 0; r < kRows; ++r) {
      for (auto &v : f) v = nd(rng);
      quantize_row(t, f.data(), w.data() + r * ws, kN);
    }
    for (int c = 0; c < cols; ++c) {
      for (auto &v : f) v = nd(rng);
      quantize_row(DType::Q8_K, f.data(), x.data() + c * xs, kN);
      outs[c] = out.data() + c * kRows;
      xp[c] = x.data() + c * xs;
    }
  }
};

void BM_vec_dot_rows(benchmark::State &st) {
  const int cols = static_cast<int>(st.range(0));
  Data d(cols);
  for (auto _ : st) {
    for (int r0 = 0; r0 < kRows; r0 += 16)
      for (int c = 0; c < cols; ++c) cpu_vec_dot_rows(DType::Q4_K, kN, 16, d.outs[c] + r0, d.w.data() + r0 * d.ws, d.ws, d.xp[c]);
    benchmark::DoNotOptimize(d.out.data());
  }
  st.SetItemsProcessed(st.iterations() * kRows * cols);
}

void BM_gemm_q4_K(benchmark::State &st) {
  const int cols = static_cast<int>(st.range(0));
  const Q4kOrder order = st.range(1) ? Q4kOrder::Gemm : Q4kOrder::Gemv;
  if (!cpu_gemm_q4_K_supported()) { st.SkipWithError("no Q4_K gemm kernel on this CPU"); return; }
  Data d(cols);
  for (auto _ : st) {
    for (int r0 = 0; r0 < kRows; r0 += 16) {
      float *o[64];
      for (int c = 0; c < cols; ++c) o[c] = d.outs[c] + r0;
      cpu_gemm_q4_K(kN, 16, cols, o, d.w.data() + r0 * d.ws, d.ws, d.xp.data(), order);
    }
    benchmark::DoNotOptimize(d.out.data());
  }
  st.SetItemsProcessed(st.iterations() * kRows * cols);
}

// Q6_K: arg 0 = columns; arg 1: 0 ref_order_dot_rows per column (what the engine ran
// before the tiles), 1 the tile kernel.
void BM_q6_K(benchmark::State &st) {
  const int cols = static_cast<int>(st.range(0));
  if (st.range(1) && !cpu_gemm_q6_K_supported()) { st.SkipWithError("no Q6_K gemm kernel on this CPU"); return; }
  Data d(cols, DType::Q6_K);
  for (auto _ : st) {
    for (int r0 = 0; r0 < kRows; r0 += 16) {
      if (st.range(1)) {
        float *o[64];
        for (int c = 0; c < cols; ++c) o[c] = d.outs[c] + r0;
        cpu_gemm_q6_K(kN, 16, cols, o, d.w.data() + r0 * d.ws, d.ws, d.xp.data());
      } else {
        for (int c = 0; c < cols; ++c)
          ref_order_dot_rows(DType::Q6_K, kN, 16, d.outs[c] + r0, d.w.data() + r0 * d.ws, d.ws, d.xp[c], RefPath::VecDot);
      }
    }
    benchmark::DoNotOptimize(d.out.data());
  }
  st.SetItemsProcessed(st.iterations() * kRows * cols);
}

}  // namespace

BENCHMARK(BM_q6_K)->Args({1, 0})->Args({1, 1})->Args({8, 0})->Args({8, 1});
BENCHMARK(BM_vec_dot_rows)->Arg(1)->Arg(4)->Arg(8);
BENCHMARK(BM_gemm_q4_K)->Args({1, 0})->Args({4, 0})->Args({8, 0})->Args({8, 1});
