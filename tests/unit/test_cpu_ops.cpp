// Every IR op on the CPU backend against a naive float64 reference on random inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>

#include "backends/backend.h"
#include "core/fp16.h"
#include "support/graph_runner.h"
#include "support/random_data.h"

using namespace moe;
using moe_test::max_abs_diff;
using moe_test::randn;
using moe_test::GraphRun;
using moe_test::WeightStore;

namespace {



std::vector<double> dequant_matrix(const GgufTensorInfo *t) {
  const int64_t rows = t->n_elements() / t->ne[0];
  std::vector<float> tmp(static_cast<size_t>(t->n_elements()));
  const size_t rs = row_size(t->type, t->ne[0]);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(t->type, t->data + r * rs, tmp.data() + r * t->ne[0], t->ne[0]);
  return std::vector<double>(tmp.begin(), tmp.end());
}

int threads_for(int i) { return 1 + i % 3; }

}  // namespace

TEST_CASE("cpu op: matmul against float64 for every weight type, odd shapes, batch 1 and >1", "[ops][cpu]") {
  auto cpu = make_cpu_backend();
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q8_0, DType::Q2_K,
                         DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4};
  int iter = 0;
  for (DType t : types) {
    const int64_t K = type_traits(t).block_size == 256 ? 512 : 96, M = 37;
    for (int64_t N : {1, 5}) {
      WeightStore ws;
      auto wv = randn(static_cast<size_t>(K * M), 11 + iter, 0.5f);
      const GgufTensorInfo *w = ws.add("w", t, {K, M}, wv);
      Graph g;
      int x = g.input("x", DType::F32, {K, N});
      int y = g.matmul(g.weight(w), x);
      g.mark_output(y, "y");
      GraphRun run(std::move(g), *cpu, threads_for(iter++));
      auto xv = randn(static_cast<size_t>(K * N), 7);
      run.set_input(x, xv.data(), xv.size() * 4);
      run.run();
      auto got = run.output(y);
      auto wd = dequant_matrix(w);
      std::vector<double> want(static_cast<size_t>(M * N));
      double scale = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t m = 0; m < M; ++m) {
          double s = 0, a = 0;
          for (int64_t k = 0; k < K; ++k) {
            s += wd[static_cast<size_t>(m * K + k)] * xv[static_cast<size_t>(n * K + k)];
            a += std::fabs(wd[static_cast<size_t>(m * K + k)] * xv[static_cast<size_t>(n * K + k)]);
          }
          want[static_cast<size_t>(n * M + m)] = s;
          scale = std::max(scale, a);
        }
      // Activations are quantized (8-bit) for quantized weights: error bound relative to sum |w x|.
      const double tol = (t == DType::F32 ? 1e-5 : t == DType::F16 || t == DType::BF16 ? 1e-2 : 2e-2) * scale;
      INFO("type " << dtype_name(t) << " N=" << N);
      CHECK(max_abs_diff(got, want) < tol);
    }
  }
}

TEST_CASE("cpu op: matmul_id routes each token to its experts", "[ops][cpu][moe]") {
  auto cpu = make_cpu_backend();
  for (DType t : {DType::F16, DType::Q8_0, DType::Q4_K}) {
    const int64_t K = 256, M = 24, E = 6, k = 3, T = 4;
    WeightStore ws;
    auto wv = randn(static_cast<size_t>(K * M * E), 3, 0.3f);
    const GgufTensorInfo *w = ws.add("experts", t, {K, M, E}, wv);
    for (int64_t X : {int64_t(1), k}) {
      Graph g;
      int x = g.input("x", DType::F32, {K, X, T});
      int ids = g.input("ids", DType::I32, {k, T});
      int y = g.matmul_id(g.weight(w), x, ids);
      g.mark_output(y, "y");
      GraphRun run(std::move(g), *cpu, 2);
      auto xv = randn(static_cast<size_t>(K * X * T), 9);
      // Includes a token whose k slots pick the same expert, and experts nobody picks.
      std::vector<int32_t> idv = {0, 5, 2, 5, 5, 5, 1, 0, 3, 2, 2, 0};
      run.set_input(x, xv.data(), xv.size() * 4);
      run.set_input(ids, idv.data(), idv.size() * 4);
      run.run();
      auto got = run.output(y);
      auto wd = dequant_matrix(w);
      std::vector<double> want(static_cast<size_t>(M * k * T));
      for (int64_t tt = 0; tt < T; ++tt)
        for (int64_t j = 0; j < k; ++j) {
          const int64_t e = idv[static_cast<size_t>(tt * k + j)];
          const float *xr = xv.data() + (X == 1 ? tt : tt * X + j) * K;
          for (int64_t m = 0; m < M; ++m) {
            double s = 0;
            for (int64_t q = 0; q < K; ++q) s += wd[static_cast<size_t>((e * M + m) * K + q)] * xr[q];
            want[static_cast<size_t>((tt * k + j) * M + m)] = s;
          }
        }
      INFO("type " << dtype_name(t) << " X=" << X);
      CHECK(max_abs_diff(got, want) < 0.05 * std::sqrt(static_cast<double>(K)));
    }
  }
}

TEST_CASE("cpu op: decode products small enough for one thread run back to back without barriers", "[ops][cpu][threads]") {
  // Three small products in one serial run (thread 0 alone, no barrier in between: each must
  // restart the shared item counter), then a product too large for one thread, at 2 and 3
  // threads; all against float64. A missed restart leaves the later products' rows unwritten.
  auto cpu = make_cpu_backend();
  const int64_t K = 256, M1 = 16, M2 = 24, M3 = 20, E = 6, k = 2, Mbig = 512;
  WeightStore ws;
  const GgufTensorInfo *w1 = ws.add("w1", DType::F32, {K, M1}, randn(static_cast<size_t>(K * M1), 21, 0.5f));
  const GgufTensorInfo *w2 = ws.add("w2", DType::Q4_K, {K, M2}, randn(static_cast<size_t>(K * M2), 22, 0.5f));
  const GgufTensorInfo *we = ws.add("we", DType::Q4_K, {K, M3, E}, randn(static_cast<size_t>(K * M3 * E), 23, 0.5f));
  const GgufTensorInfo *wb = ws.add("wb", DType::Q4_K, {K, Mbig}, randn(static_cast<size_t>(K * Mbig), 24, 0.5f));
  for (int threads : {2, 3}) {
    Graph g;
    const int x = g.input("x", DType::F32, {K, 1});
    const int ids = g.input("ids", DType::I32, {k, 1});
    const int y1 = g.matmul(g.weight(w1), x), y2 = g.matmul(g.weight(w2), x);
    const int y3 = g.matmul_id(g.weight(we), g.view(x, {K, 1, 1}), ids);
    const int y4 = g.matmul(g.weight(wb), x);
    for (int y : {y1, y2, y3, y4}) g.mark_output(y, "y" + std::to_string(y));
    GraphRun run(std::move(g), *cpu, threads);
    const auto xv = randn(static_cast<size_t>(K), 25);
    const std::vector<int32_t> idv = {4, 1};
    run.set_input(x, xv.data(), xv.size() * 4);
    run.set_input(ids, idv.data(), idv.size() * 4);
    run.run();
    auto want = [&](const GgufTensorInfo *w, int64_t M, int64_t e) {
      const auto wd = dequant_matrix(w);
      std::vector<double> r(static_cast<size_t>(M));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t q = 0; q < K; ++q) r[static_cast<size_t>(m)] += wd[static_cast<size_t>((e * M + m) * K + q)] * xv[static_cast<size_t>(q)];
      return r;
    };
    std::vector<double> w3 = want(we, M3, idv[0]), w3b = want(we, M3, idv[1]);
    w3.insert(w3.end(), w3b.begin(), w3b.end());
    const double tol = 0.05 * std::sqrt(static_cast<double>(K));
    INFO("threads " << threads);
    CHECK(max_abs_diff(run.output(y1), want(w1, M1, 0)) < 1e-3);
    CHECK(max_abs_diff(run.output(y2), want(w2, M2, 0)) < tol);
    CHECK(max_abs_diff(run.output(y3), w3) < tol);
    CHECK(max_abs_diff(run.output(y4), want(wb, Mbig, 0)) < tol);
  }
}

TEST_CASE("cpu op: rms_norm, mul, add, scale, softmax, sigmoid, swiglu, norm_sum", "[ops][cpu]") {
  auto cpu = make_cpu_backend();
  const int64_t n = 67, rows = 5;
  auto a = randn(static_cast<size_t>(n * rows), 1), b = randn(static_cast<size_t>(n * rows), 2), w = randn(static_cast<size_t>(n), 3);
  WeightStore ws;
  const GgufTensorInfo *wt = ws.add("w", DType::F32, {n}, w);
  Graph g;
  int A = g.input("a", DType::F32, {n, rows}), B = g.input("b", DType::F32, {n, rows});
  int rn = g.rms_norm(A, 1e-5f), ml = g.mul(A, g.weight(wt)), ad = g.add(A, B), sc = g.scale(A, 0.5f, 0.25f);
  int sm = g.softmax(A), sg = g.sigmoid(A), sw = g.swiglu(A, B);
  for (int id : {rn, ml, ad, sc, sm, sg, sw}) g.mark_output(id, "o" + std::to_string(id));
  GraphRun run(std::move(g), *cpu, 3);
  run.set_input(A, a.data(), a.size() * 4);
  run.set_input(B, b.data(), b.size() * 4);
  run.run();
  std::vector<double> wrn(a.size()), wml(a.size()), wad(a.size()), wsc(a.size()), wsm(a.size()), wsg(a.size()), wsw(a.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0, mx = -1e300, se = 0;
    for (int64_t i = 0; i < n; ++i) { double x = a[static_cast<size_t>(r * n + i)]; ss += x * x; mx = std::max(mx, x); }
    for (int64_t i = 0; i < n; ++i) se += std::exp(a[static_cast<size_t>(r * n + i)] - mx);
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = static_cast<size_t>(r * n + i);
      const double x = a[k], y = b[k];
      wrn[k] = x / std::sqrt(ss / n + 1e-5);
      wml[k] = x * w[static_cast<size_t>(i)];
      wad[k] = x + y;
      wsc[k] = x * 0.5 + 0.25;
      wsm[k] = std::exp(x - mx) / se;
      wsg[k] = 1 / (1 + std::exp(-x));
      wsw[k] = x / (1 + std::exp(-x)) * y;
    }
  }
  CHECK(max_abs_diff(run.output(rn), wrn) < 1e-5);
  CHECK(max_abs_diff(run.output(ml), wml) < 1e-6);
  CHECK(max_abs_diff(run.output(ad), wad) < 1e-6);
  CHECK(max_abs_diff(run.output(sc), wsc) < 1e-6);
  CHECK(max_abs_diff(run.output(sm), wsm) < 1e-6);
  CHECK(max_abs_diff(run.output(sg), wsg) < 1e-6);
  CHECK(max_abs_diff(run.output(sw), wsw) < 1e-5);
}

TEST_CASE("cpu op: top_k (ties to the lower index), gather_cols, norm_sum, moe_combine", "[ops][cpu][moe]") {
  auto cpu = make_cpu_backend();
  const int64_t E = 8, k = 3, T = 3, M = 5;
  std::vector<float> p = {0.1f, 0.5f, 0.5f, 0.2f, 0.9f, 0.0f, 0.3f, 0.3f,   // tie 1/2 -> 1 first
                          1, 1, 1, 1, 1, 1, 1, 1,                           // all equal -> 0,1,2
                          -3, -1, -2, -8, -0.5f, -9, -4, -1};
  Graph g;
  int P = g.input("p", DType::F32, {E, T});
  int ids = g.top_k(P, static_cast<int>(k));
  int wts = g.gather_cols(P, ids);
  int nw = g.norm_sum(g.copy(wts));
  int EX = g.input("ex", DType::F32, {M, k, T});
  int comb = g.moe_combine(EX, wts);
  for (int id : {ids, wts, nw, comb}) g.mark_output(id, "o" + std::to_string(id));
  GraphRun run(std::move(g), *cpu, 2);
  auto ex = randn(static_cast<size_t>(M * k * T), 5);
  run.set_input(P, p.data(), p.size() * 4);
  run.set_input(EX, ex.data(), ex.size() * 4);
  run.run();
  CHECK(run.output_i32(ids) == std::vector<int32_t>{4, 1, 2, 0, 1, 2, 4, 1, 7});
  auto w = run.output(wts);
  CHECK(w == std::vector<float>{0.9f, 0.5f, 0.5f, 1, 1, 1, -0.5f, -1, -1});
  auto n = run.output(nw);
  CHECK(n[0] == Approx(0.9 / 1.9));
  CHECK(n[3] == Approx(1.0 / 3));
  auto c = run.output(comb);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t m = 0; m < M; ++m) {
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += ex[static_cast<size_t>((t * k + j) * M + m)] * w[static_cast<size_t>(t * k + j)];
      CHECK(c[static_cast<size_t>(t * M + m)] == Approx(s).margin(1e-5));
    }
}

TEST_CASE("cpu op: rope NeoX and normal against float64 angles", "[ops][cpu]") {
  auto cpu = make_cpu_backend();
  const int64_t hd = 64, nh = 3, T = 4;
  for (bool neox : {true, false}) {
    for (int n_rot : {64, 32}) {
      RopeParams rp;
      rp.n_rot = n_rot;
      rp.neox = neox;
      rp.freq_base = 10000.0f;
      Graph g;
      int X = g.input("x", DType::F32, {hd, nh, T});
      int pos = g.input("pos", DType::I32, {T});
      int y = g.rope(X, pos, rp);
      g.mark_output(y, "y");
      GraphRun run(std::move(g), *cpu, 2);
      auto x = randn(static_cast<size_t>(hd * nh * T), 4);
      std::vector<int32_t> pv = {0, 1, 7, 1000};
      run.set_input(X, x.data(), x.size() * 4);
      run.set_input(pos, pv.data(), pv.size() * 4);
      run.run();
      auto got = run.output(y);
      std::vector<double> want(x.begin(), x.end());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < nh; ++h) {
          double *r = want.data() + (t * nh + h) * hd;
          const float *s = x.data() + (t * nh + h) * hd;
          for (int i = 0; i < n_rot / 2; ++i) {
            const double th = pv[static_cast<size_t>(t)] * std::pow(10000.0, -2.0 * i / n_rot);
            const int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
            r[a] = s[a] * std::cos(th) - s[b] * std::sin(th);
            r[b] = s[a] * std::sin(th) + s[b] * std::cos(th);
          }
        }
      INFO("neox " << neox << " n_rot " << n_rot);
      CHECK(max_abs_diff(got, want) < 2e-3);  // float angle accumulation at position 1000
    }
  }
}

TEST_CASE("cpu op: get_rows dequantizes the selected rows", "[ops][cpu]") {
  auto cpu = make_cpu_backend();
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q2_K, DType::Q6_K}) {
    const int64_t K = 256, R = 9;
    WeightStore ws;
    const GgufTensorInfo *w = ws.add("table", t, {K, R}, randn(static_cast<size_t>(K * R), 8));
    Graph g;
    int ids = g.input("ids", DType::I32, {3});
    int y = g.get_rows(g.weight(w), ids);
    g.mark_output(y, "y");
    GraphRun run(std::move(g), *cpu, 2);
    std::vector<int32_t> iv = {8, 0, 8};
    run.set_input(ids, iv.data(), 12);
    run.run();
    auto got = run.output(y);
    auto wd = dequant_matrix(w);
    for (int j = 0; j < 3; ++j)
      for (int64_t q = 0; q < K; ++q) CHECK(got[static_cast<size_t>(j * K + q)] == static_cast<float>(wd[static_cast<size_t>(iv[static_cast<size_t>(j)] * K + q)]));
  }
}
