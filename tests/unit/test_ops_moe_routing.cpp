// MoE routing ops of deepseek2 / gpt-oss on the CPU backend against naive float64
// references: grouped top-k (ties, all-equal groups), sigmoid gating with a selection bias,
// per-expert biases (add_id) and the clamped SwiGLU-OAI; plus the row ops MLA uses.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

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


// Reference grouped selection: rank groups by the sum of their two best scores (stable
// sort, so equal sums keep the lower group first), keep the best n_used groups, then sort
// the experts of kept groups by score (stable: ties -> lower index) and take k.
std::vector<int32_t> ref_grouped_top_k(const std::vector<double> &s, int G, int G_used, int k) {
  const int E = static_cast<int>(s.size()), per = E / G;
  std::vector<double> gs(static_cast<size_t>(G));
  for (int g = 0; g < G; ++g) {
    std::vector<double> v(s.begin() + g * per, s.begin() + (g + 1) * per);
    std::sort(v.begin(), v.end(), std::greater<double>());
    gs[static_cast<size_t>(g)] = per >= 2 ? v[0] + v[1] : v[0];
  }
  std::vector<int> order(static_cast<size_t>(G));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return gs[static_cast<size_t>(a)] > gs[static_cast<size_t>(b)]; });
  std::vector<bool> kept(static_cast<size_t>(G), false);
  for (int j = 0; j < G_used; ++j) kept[static_cast<size_t>(order[static_cast<size_t>(j)])] = true;
  std::vector<int32_t> cand;
  for (int e = 0; e < E; ++e)
    if (kept[static_cast<size_t>(e / per)]) cand.push_back(e);
  std::stable_sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)]; });
  cand.resize(static_cast<size_t>(k));
  return cand;
}

std::vector<int32_t> run_grouped(const std::vector<float> &scores, int64_t E, int64_t T, int G, int G_used, int k, int threads) {
  auto cpu = make_cpu_backend();
  Graph g;
  int x = g.input("x", DType::F32, {E, T});
  int y = g.grouped_top_k(x, k, G, G_used);
  g.mark_output(y, "ids");
  GraphRun run(std::move(g), *cpu, threads);
  run.set_input(x, scores.data(), scores.size() * 4);
  run.run();
  return run.output_i32(y);
}

}  // namespace

TEST_CASE("grouped top-k: random scores with many ties match the stable-sort reference", "[ops][cpu][moe_routing]") {
  struct Cfg { int E, G, Gu, k; } cfgs[] = {{16, 4, 2, 4}, {32, 8, 3, 6}, {8, 8, 3, 3}, {12, 3, 3, 12}, {16, 1, 1, 5}};
  int iter = 0;
  for (const Cfg &c : cfgs) {
    const int64_t T = 37;
    std::mt19937 rng(100 + iter);
    std::uniform_int_distribution<int> d(0, 7);
    std::vector<float> s(static_cast<size_t>(c.E * T));
    for (auto &v : s) v = static_cast<float>(d(rng)) * 0.25f;  // exact in float: sums exact, ties frequent
    auto got = run_grouped(s, c.E, T, c.G, c.Gu, c.k, 1 + iter % 3);
    ++iter;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> row(s.begin() + t * c.E, s.begin() + (t + 1) * c.E);
      auto want = ref_grouped_top_k(row, c.G, c.Gu, c.k);
      std::vector<int32_t> have(got.begin() + t * c.k, got.begin() + (t + 1) * c.k);
      INFO("E=" << c.E << " G=" << c.G << " token " << t);
      CHECK(have == want);
    }
  }
}

TEST_CASE("grouped top-k: all-equal scores pick the lowest groups and experts", "[ops][cpu][moe_routing]") {
  // Every score equal: groups 0 and 1 are kept, experts 0..3 chosen in index order.
  std::vector<float> s(16, 0.5f);
  CHECK(run_grouped(s, 16, 1, 4, 2, 4, 2) == std::vector<int32_t>{0, 1, 2, 3});
  // Groups whose scores are all equal inside, different across groups: group 2 (all 0.9)
  // and group 0 (all 0.7) win over group 1 (0.6) and group 3 (0.7, tie with group 0 -> lower index).
  std::vector<float> s2 = {0.7f, 0.7f, 0.7f, 0.7f, 0.6f, 0.6f, 0.6f, 0.6f, 0.9f, 0.9f, 0.9f, 0.9f, 0.7f, 0.7f, 0.7f, 0.7f};
  CHECK(run_grouped(s2, 16, 1, 4, 2, 5, 1) == std::vector<int32_t>{8, 9, 10, 11, 0});
  // A single strong expert does not carry its group: the group score is the sum of the top 2.
  std::vector<float> s3 = {3.0f, -1.0f, -1.0f, -1.0f, 1.25f, 1.25f, 0.0f, 0.0f, 1.5f, 1.5f, 0.0f, 0.0f, 0.125f, 0.125f, 0.125f, 0.125f};
  CHECK(run_grouped(s3, 16, 1, 4, 2, 3, 1) == std::vector<int32_t>{8, 9, 4});
  // Negative scores (sigmoid + negative bias can go below zero) are ranked like any other.
  std::vector<float> s4 = {-1.0f, -2.0f, -0.5f, -0.25f, -3.0f, -3.0f, -3.0f, -3.0f};
  CHECK(run_grouped(s4, 8, 1, 2, 1, 2, 1) == std::vector<int32_t>{3, 2});
}

TEST_CASE("sigmoid gating with selection bias, grouped selection, renormalised and scaled weights", "[ops][cpu][moe_routing]") {
  auto cpu = make_cpu_backend();
  const int64_t E = 16, T = 23;
  const int G = 4, Gu = 2, k = 4;
  const float wscale = 2.5f;
  WeightStore ws;
  auto bias_v = randn(E, 5, 0.3f);
  const GgufTensorInfo *bias = ws.add("exp_probs_b.bias", DType::F32, {E}, bias_v);
  Graph g;
  int logits = g.input("logits", DType::F32, {E, T});
  int probs = g.sigmoid(logits);
  int sel = g.add(probs, g.weight(bias));
  int ids = g.grouped_top_k(sel, k, G, Gu);
  int w = g.scale(g.norm_sum(g.gather_cols(probs, ids)), wscale);
  g.mark_output(ids, "ids");
  g.mark_output(w, "w");
  GraphRun run(std::move(g), *cpu, 3);
  auto lv = randn(static_cast<size_t>(E * T), 9, 2.0f);
  run.set_input(logits, lv.data(), lv.size() * 4);
  run.run();
  auto got_ids = run.output_i32(ids);
  auto got_w = run.output(w);
  int n_bias_changed = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> p(static_cast<size_t>(E)), s(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      p[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-static_cast<double>(lv[static_cast<size_t>(t * E + e)])));
      s[static_cast<size_t>(e)] = p[static_cast<size_t>(e)] + bias_v[static_cast<size_t>(e)];
    }
    auto want = ref_grouped_top_k(s, G, Gu, k);
    n_bias_changed += ref_grouped_top_k(p, G, Gu, k) != want;
    double sum = 0;
    for (int32_t e : want) sum += p[static_cast<size_t>(e)];
    for (int j = 0; j < k; ++j) {
      INFO("token " << t << " slot " << j);
      REQUIRE(got_ids[static_cast<size_t>(t * k + j)] == want[static_cast<size_t>(j)]);
      // weights are the unbiased sigmoid scores
      CHECK(got_w[static_cast<size_t>(t * k + j)] == Approx(p[static_cast<size_t>(want[static_cast<size_t>(j)])] / sum * wscale).epsilon(1e-5));
    }
  }
  CHECK(n_bias_changed > 0);  // the bias really changes the selection in this data
}

TEST_CASE("swiglu_oai matches the clamped float64 definition on both sides of the limit", "[ops][cpu][moe_routing]") {
  auto cpu = make_cpu_backend();
  const int64_t n = 64, rows = 7;
  Graph g;
  int gate = g.input("g", DType::F32, {n, rows});
  int up = g.input("u", DType::F32, {n, rows});
  int y = g.swiglu_oai(gate, up, 1.702f, 7.0f);
  g.mark_output(y, "y");
  GraphRun run(std::move(g), *cpu, 2);
  auto gv = randn(static_cast<size_t>(n * rows), 1, 6.0f), uv = randn(static_cast<size_t>(n * rows), 2, 6.0f);
  gv[0] = 7.0f; gv[1] = 7.5f; uv[2] = -7.0f; uv[3] = -9.0f; uv[4] = 12.0f;  // at / beyond the clamp
  run.set_input(gate, gv.data(), gv.size() * 4);
  run.set_input(up, uv.data(), uv.size() * 4);
  run.run();
  auto got = run.output(y);
  int clamped = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double x = std::min<double>(gv[i], 7.0), u = std::max(-7.0, std::min<double>(uv[i], 7.0));
    clamped += gv[i] > 7.0f || std::fabs(uv[i]) > 7.0f;
    const double want = x / (1.0 + std::exp(-1.702 * x)) * (u + 1.0);
    CHECK(got[i] == Approx(want).epsilon(1e-5).margin(1e-5));
  }
  CHECK(clamped > 10);
}

TEST_CASE("add_id adds the bias column of each routed expert", "[ops][cpu][moe_routing]") {
  auto cpu = make_cpu_backend();
  const int64_t M = 24, E = 6, k = 3, T = 5;
  WeightStore ws;
  auto bv = randn(static_cast<size_t>(M * E), 3);
  const GgufTensorInfo *b = ws.add("b", DType::F32, {M, E}, bv);
  Graph g;
  int x = g.input("x", DType::F32, {M, k, T});
  int ids = g.input("ids", DType::I32, {k, T});
  int y = g.add_id(x, g.weight(b), ids);
  g.mark_output(y, "y");
  GraphRun run(std::move(g), *cpu, 2);
  auto xv = randn(static_cast<size_t>(M * k * T), 4);
  std::vector<int32_t> iv = {5, 0, 2, 1, 1, 3, 4, 0, 5, 2, 3, 4, 0, 5, 1};
  run.set_input(x, xv.data(), xv.size() * 4);
  run.set_input(ids, iv.data(), iv.size() * 4);
  run.run();
  auto got = run.output(y);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t i = 0; i < M; ++i) {
        const size_t o = static_cast<size_t>((t * k + j) * M + i);
        CHECK(got[o] == Approx(static_cast<double>(xv[o]) + bv[static_cast<size_t>(iv[static_cast<size_t>(t * k + j)] * M + i)]));
      }
}

TEST_CASE("slice, concat and per-head matmul (MLA absorption) against float64", "[ops][cpu][moe_routing]") {
  auto cpu = make_cpu_backend();
  const int64_t K = 32, M = 24, H = 4, T = 3, P = 16;
  for (DType wt : {DType::F32, DType::F16}) {
    WeightStore ws;
    auto wv = randn(static_cast<size_t>(K * M * H), 21, 0.5f);
    const GgufTensorInfo *w = ws.add("k_b", wt, {K, M, H}, wv);
    Graph g;
    int q = g.input("q", DType::F32, {K + P, H, T});
    int nope = g.slice(q, 0, K);
    int pe = g.slice(q, K, P);
    int abs = g.matmul_heads(g.weight(w), nope);  // [M, H, T]
    int cat = g.concat(abs, pe);                  // [M + P, H, T]
    g.mark_output(cat, "cat");
    GraphRun run(std::move(g), *cpu, 3);
    auto qv = randn(static_cast<size_t>((K + P) * H * T), 22);
    run.set_input(q, qv.data(), qv.size() * 4);
    run.run();
    auto got = run.output(cat);
    REQUIRE(got.size() == static_cast<size_t>((M + P) * H * T));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float *qr = qv.data() + (t * H + h) * (K + P);
        const float *out = got.data() + (t * H + h) * (M + P);
        for (int64_t m = 0; m < M; ++m) {
          double acc = 0;
          for (int64_t i = 0; i < K; ++i) {
            const double wq = wt == DType::F16 ? round_fp16(wv[static_cast<size_t>((h * M + m) * K + i)]) : wv[static_cast<size_t>((h * M + m) * K + i)];
            const double xq = wt == DType::F16 ? round_fp16(qr[i]) : qr[i];  // F16 weights meet F16-rounded activations
            acc += wq * xq;
          }
          CHECK(out[m] == Approx(acc).epsilon(1e-4).margin(1e-4));
        }
        for (int64_t i = 0; i < P; ++i) CHECK(out[M + i] == qr[K + i]);
      }
  }
}
