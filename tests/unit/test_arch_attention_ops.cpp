// Attention variants of deepseek2 / gpt-oss on the CPU backend against a naive float64
// softmax attention: sliding-window masks at the window boundary (positions with gaps),
// per-head sinks, and MLA's latent-as-V (V = leading part of the single K head).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "backends/backend.h"
#include "kv/kv_cache.h"
#include "support/graph_runner.h"
#include "support/random_data.h"

using namespace moe;
using moe_test::max_abs_diff;
using moe_test::randn;
using moe_test::GraphRun;
using moe_test::WeightStore;

namespace {


struct AttnCase {
  int64_t hd_k, hd_v, H, Hkv;
  bool v_from_k = false;
  int32_t window = 0;
  bool sinks = false;
  std::vector<int32_t> pos;
  KvType kv = KvType::F32;  // F16 takes the grouped (GQA) path; Q8_0 the online softmax
};

// Runs one ubatch (all tokens of sequence 0, cells 0..T-1) and compares with float64.
// Returns the number of (query, cell) pairs the window hid that causality alone would show.
int check_attention(const AttnCase &c, uint32_t seed, int threads) {
  auto cpu = make_cpu_backend();
  const int64_t T = static_cast<int64_t>(c.pos.size());
  const uint32_t n_cells = 32;
  KvCache kv(n_cells, 1, c.kv, {KvLayerDims{c.hd_k * c.Hkv, c.v_from_k ? 0 : c.hd_v * c.Hkv}}, *cpu);
  WeightStore ws;
  auto sink_v = randn(static_cast<size_t>(c.H), seed + 7, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd_k));
  Graph g;
  int q = g.input("q", DType::F32, {c.hd_k, c.H, T});
  int k = g.input("k", DType::F32, {c.hd_k, c.Hkv, T});
  int v = c.v_from_k ? -1 : g.input("v", DType::F32, {c.hd_v, c.Hkv, T});
  int ks = g.kv_store(k, 0, 0);
  int vs = c.v_from_k ? ks : g.kv_store(v, 0, 1);
  AttentionOptions o;
  o.v_from_k = c.v_from_k;
  o.window = c.window;
  if (c.sinks) o.sinks = g.weight(ws.add("sinks", DType::F32, {c.H}, sink_v));
  int att = g.attention_ext(q, ks, vs, c.hd_v, scale, o);
  g.node(att).ip[1] = static_cast<int32_t>(n_cells);
  g.mark_output(att, "att");
  GraphRun run(std::move(g), *cpu, threads);
  auto qv = randn(static_cast<size_t>(c.hd_k * c.H * T), seed);
  auto kvv = randn(static_cast<size_t>(c.hd_k * c.Hkv * T), seed + 1);
  auto vv = randn(static_cast<size_t>(c.hd_v * c.Hkv * T), seed + 2);
  run.set_input(q, qv.data(), qv.size() * 4);
  run.set_input(k, kvv.data(), kvv.size() * 4);
  if (!c.v_from_k) run.set_input(v, vv.data(), vv.size() * 4);

  std::vector<int32_t> cells(static_cast<size_t>(T)), seq(static_cast<size_t>(T), 0);
  for (int64_t t = 0; t < T; ++t) cells[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  kv.claim(cells.data(), c.pos.data(), seq.data(), static_cast<uint32_t>(T));
  UbatchInfo ub;
  ub.n_tokens = static_cast<int32_t>(T);
  ub.cells = cells.data();
  ub.pos = c.pos.data();
  ub.seq = seq.data();
  ub.n_kv = kv.n_kv();
  ub.cell_state = kv.cells();
  ExecEnv env{&ub, &kv};
  run.run(env);
  auto got = run.output(att);

  int hidden_by_window = 0;
  const int64_t group = c.H / c.Hkv;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t hk = h / group;
      const float *qr = qv.data() + (t * c.H + h) * c.hd_k;
      std::vector<double> s;
      std::vector<int64_t> vis;
      for (int64_t j = 0; j < T; ++j) {
        const int32_t pq = c.pos[static_cast<size_t>(t)], pc = c.pos[static_cast<size_t>(j)];
        if (pc > pq) continue;
        if (c.window > 0 && pq - pc >= c.window) { hidden_by_window += h == 0; continue; }
        const float *kr = kvv.data() + (j * c.Hkv + hk) * c.hd_k;
        double d = 0;
        for (int64_t i = 0; i < c.hd_k; ++i) d += static_cast<double>(qr[i]) * kr[i];
        s.push_back(d * scale);
        vis.push_back(j);
      }
      double mx = -1e300;
      for (double x : s) mx = std::max(mx, x);
      const double sk = c.sinks ? sink_v[static_cast<size_t>(h)] : -1e300;
      if (c.sinks) mx = std::max(mx, sk);
      double sum = c.sinks ? std::exp(sk - mx) : 0.0;
      for (double &x : s) { x = std::exp(x - mx); sum += x; }
      for (int64_t i = 0; i < c.hd_v; ++i) {
        double acc = 0;
        for (size_t n = 0; n < vis.size(); ++n) {
          const double vval = c.v_from_k ? kvv[static_cast<size_t>((vis[n] * c.Hkv + hk) * c.hd_k + i)]
                                         : vv[static_cast<size_t>((vis[n] * c.Hkv + hk) * c.hd_v + i)];
          acc += s[n] / sum * vval;
        }
        INFO("token " << t << " head " << h << " dim " << i);
        // F16/Q8_0 caches round K, V, q and the probabilities: tolerance by cache type.
        const double tol = c.kv == KvType::F32 ? 1e-5 : c.kv == KvType::F16 ? 1e-2 : 4e-2;
        CHECK(got[static_cast<size_t>((t * c.H + h) * c.hd_v + i)] == Approx(acc).epsilon(1e-4).margin(tol));
      }
    }
  return hidden_by_window;
}

}  // namespace

TEST_CASE("attention: sliding window hides cells at pos <= query_pos - window (positions with gaps)", "[ops][cpu][attention]") {
  AttnCase c{16, 16, 4, 2, false, 0, false, {}, KvType::F32};
  c.pos = {0, 1, 2, 4, 5, 8, 9, 10, 13, 17, 18, 19};
  for (int32_t w : {1, 3, 4, 8}) {
    c.window = w;
    INFO("window " << w);
    const int hidden = check_attention(c, 11 + static_cast<uint32_t>(w), 1 + w % 3);
    CHECK(hidden > 0);  // the boundary is exercised, not just full causal attention
  }
  // window 4: query at pos 8 sees pos 5 (8-5 = 3 < 4) but not pos 4 (8-4 = 4): both cells exist.
  c.window = 0;
  CHECK(check_attention(c, 3, 2) == 0);
}

TEST_CASE("attention: per-head sinks add one logit with a zero value", "[ops][cpu][attention]") {
  AttnCase c{32, 32, 4, 2, false, 0, false, {}, KvType::F32};
  c.sinks = true;
  c.pos = {0, 1, 2, 3, 4, 5, 6};
  check_attention(c, 31, 2);
  c.window = 3;  // sinks together with a window, as in gpt-oss's windowed layers
  CHECK(check_attention(c, 41, 3) > 0);
}

TEST_CASE("attention: MLA latent cache, V read from the K row's leading latent part", "[ops][cpu][attention]") {
  AttnCase c{48, 32, 4, 1, false, 0, false, {}, KvType::F32};
  c.v_from_k = true;
  c.pos = {0, 1, 2, 3, 4};
  check_attention(c, 51, 2);
}

TEST_CASE("attention: F16 and Q8_0 caches (grouped GQA path), windows and sinks, vs float64", "[ops][cpu][attention]") {
  for (KvType kv : {KvType::F16, KvType::Q8_0}) {
    for (int64_t hkv : {int64_t(1), int64_t(2), int64_t(4)}) {  // groups of 8, 4, 2 q heads
      AttnCase c{32, 32, 8, hkv, false, 0, false, {0, 1, 2, 3, 5, 6, 9, 10, 11}, kv};
      INFO("kv " << kv_type_name(kv) << " kv heads " << hkv);
      check_attention(c, 61 + static_cast<uint32_t>(hkv), 2);
      c.window = 4;
      c.sinks = true;
      CHECK(check_attention(c, 71 + static_cast<uint32_t>(hkv), 3) > 0);
    }
  }
}
