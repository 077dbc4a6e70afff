// Gated DeltaNet ops on the CPU backend against naive float64 references: the causal
// convolution with its per-sequence tail and the gated delta rule over the per-sequence
// matrix state, both fed as the engine feeds them (ubatches that interleave two sequences, a
// later ubatch continuing them, a failed ubatch that must leave the committed state alone),
// plus L2Norm and Softplus.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "backends/backend.h"
#include "backends/cpu/kernels/vec_dot.h"
#include "kv/kv_cache.h"
#include "support/graph_runner.h"
#include "support/random_data.h"

using namespace moe;
using moe_test::max_abs_diff;
using moe_test::randn;
using moe_test::unit_rows;
using moe_test::GraphRun;
using moe_test::WeightStore;

namespace {

struct Dims {
  int64_t C = 40, K = 4;                   // conv channels, kernel width
  int64_t d = 8, n_k = 2, n_v = 6;         // DeltaNet head size, key / value heads
  int head_map = 0;                        // 0: h / r, 1: h % n_k
};

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// Float64 model of one sequence's layer: conv tail and matrix states, advanced per token.
struct RefSeq {
  std::vector<std::vector<double>> hist;   // conv inputs so far
  std::vector<std::vector<double>> S;      // per value head, S[j * d + i] = S_ij
};

struct Step {  // one token's inputs
  int32_t seq, pos;
  std::vector<float> x, q, k, v, gb;
};

struct Ref {
  Dims D;
  std::vector<float> w;
  std::map<int32_t, RefSeq> seqs;
  // Returns conv output [C] and DeltaNet output [d * n_v] for one token.
  void token(const Step &s, std::vector<double> &conv, std::vector<double> &o) {
    RefSeq &r = seqs[s.seq];
    if (r.S.empty()) r.S.assign(static_cast<size_t>(D.n_v), std::vector<double>(static_cast<size_t>(D.d * D.d), 0.0));
    r.hist.emplace_back(s.x.begin(), s.x.end());
    conv.assign(static_cast<size_t>(D.C), 0.0);
    const int64_t n = static_cast<int64_t>(r.hist.size());
    for (int64_t c = 0; c < D.C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < D.K; ++j) {
        const int64_t t = n - D.K + j;  // j = 0 oldest
        if (t >= 0) acc += static_cast<double>(w[static_cast<size_t>(c * D.K + j)]) * r.hist[static_cast<size_t>(t)][static_cast<size_t>(c)];
      }
      conv[static_cast<size_t>(c)] = silu(acc);
    }
    o.assign(static_cast<size_t>(D.d * D.n_v), 0.0);
    const int64_t rr = D.n_v / D.n_k, d = D.d;
    for (int64_t h = 0; h < D.n_v; ++h) {
      const int64_t kh = D.head_map == 0 ? h / rr : h % D.n_k;
      std::vector<double> &S = r.S[static_cast<size_t>(h)];
      const double decay = std::exp(static_cast<double>(s.gb[static_cast<size_t>(h)])), beta = s.gb[static_cast<size_t>(D.n_v + h)];
      auto q = [&](int64_t i) { return static_cast<double>(s.q[static_cast<size_t>(kh * d + i)]); };
      auto k = [&](int64_t i) { return static_cast<double>(s.k[static_cast<size_t>(kh * d + i)]); };
      for (double &e : S) e *= decay;
      std::vector<double> delta(static_cast<size_t>(d));
      for (int64_t j = 0; j < d; ++j) {
        double sk = 0;
        for (int64_t i = 0; i < d; ++i) sk += S[static_cast<size_t>(j * d + i)] * k(i);
        delta[static_cast<size_t>(j)] = beta * (s.v[static_cast<size_t>(h * d + j)] - sk);
      }
      for (int64_t j = 0; j < d; ++j)
        for (int64_t i = 0; i < d; ++i) S[static_cast<size_t>(j * d + i)] += k(i) * delta[static_cast<size_t>(j)];
      for (int64_t j = 0; j < d; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < d; ++i) acc += S[static_cast<size_t>(j * d + i)] * q(i);
        o[static_cast<size_t>(h * d + j)] = acc / std::sqrt(static_cast<double>(d));
      }
    }
  }
};


Step random_step(const Dims &D, int32_t seq, int32_t pos, uint32_t seed) {
  Step s{seq, pos, randn(static_cast<size_t>(D.C), seed), unit_rows(randn(static_cast<size_t>(D.d * D.n_k), seed + 1), D.d),
         unit_rows(randn(static_cast<size_t>(D.d * D.n_k), seed + 2), D.d), randn(static_cast<size_t>(D.d * D.n_v), seed + 3), {}};
  std::mt19937 rng(seed + 4);
  std::uniform_real_distribution<float> g(-1.5f, -0.01f), b(0.05f, 0.95f);
  for (int64_t h = 0; h < D.n_v; ++h) s.gb.push_back(g(rng));
  for (int64_t h = 0; h < D.n_v; ++h) s.gb.push_back(b(rng));
  return s;
}

struct Outputs {
  std::vector<float> conv, o;
};

// One ubatch through SsmConv and DeltaNet of layer 0 (cells = next free ones).
Outputs run_ubatch(KvCache &kv, const Dims &D, const std::vector<float> &w, const std::vector<Step> &steps, int threads,
                   bool chunked = false) {
  auto cpu = make_cpu_backend();
  const int64_t T = static_cast<int64_t>(steps.size());
  WeightStore ws;
  Graph g;
  const int x = g.input("x", DType::F32, {D.C, T});
  const int q = g.input("q", DType::F32, {D.d, D.n_k, T});
  const int k = g.input("k", DType::F32, {D.d, D.n_k, T});
  const int v = g.input("v", DType::F32, {D.d, D.n_v, T});
  const int gb = g.input("gb", DType::F32, {2 * D.n_v, T});
  const int conv = g.ssm_conv(x, g.weight(ws.add("conv", DType::F32, {D.K, D.C}, w)), 0);
  const int o = g.delta_net(q, k, v, gb, 0, D.head_map, 1.0f / std::sqrt(static_cast<float>(D.d)), chunked);
  g.mark_output(conv, "conv");
  g.mark_output(o, "o");
  GraphRun run(std::move(g), *cpu, threads);
  std::vector<float> xs, qs, ks, vs, gbs;
  std::vector<int32_t> pos, seq;
  for (const Step &s : steps) {
    xs.insert(xs.end(), s.x.begin(), s.x.end());
    qs.insert(qs.end(), s.q.begin(), s.q.end());
    ks.insert(ks.end(), s.k.begin(), s.k.end());
    vs.insert(vs.end(), s.v.begin(), s.v.end());
    gbs.insert(gbs.end(), s.gb.begin(), s.gb.end());
    pos.push_back(s.pos);
    seq.push_back(s.seq);
  }
  run.set_input(x, xs.data(), xs.size() * 4);
  run.set_input(q, qs.data(), qs.size() * 4);
  run.set_input(k, ks.data(), ks.size() * 4);
  run.set_input(v, vs.data(), vs.size() * 4);
  run.set_input(gb, gbs.data(), gbs.size() * 4);
  std::vector<int32_t> cells(static_cast<size_t>(T));
  REQUIRE(kv.find_slots(static_cast<uint32_t>(T), cells.data()));
  kv.claim(cells.data(), pos.data(), seq.data(), static_cast<uint32_t>(T));
  UbatchInfo ub;
  ub.n_tokens = static_cast<int32_t>(T);
  ub.cells = cells.data();
  ub.pos = pos.data();
  ub.seq = seq.data();
  ub.n_kv = kv.n_kv();
  ub.cell_state = kv.cells();
  ExecEnv env{&ub, &kv};
  run.run(env);
  return {run.output(conv), run.output(o)};
}

KvCache make_cache(const Dims &D, Backend &cpu) {
  KvLayerDims l;
  l.conv_state = (D.K - 1) * D.C;
  l.ssm_state = D.n_v * D.d * D.d;
  return KvCache(512, 4, KvType::F32, {l}, cpu);
}

// Feeds `calls` (each a decode call of one or more ubatches) and checks every output.
void check_calls(const Dims &D, const std::vector<std::vector<std::vector<Step>>> &calls, int threads, bool chunked = false) {
  auto cpu = make_cpu_backend();
  KvCache kv = make_cache(D, *cpu);
  const std::vector<float> w = randn(static_cast<size_t>(D.C * D.K), 99, 0.5f);
  Ref ref{D, w, {}};
  double worst_conv = 0, worst_o = 0;
  for (const auto &call : calls) {
    for (const auto &ubatch : call) {
      Outputs got = run_ubatch(kv, D, w, ubatch, threads, chunked && ubatch.size() > 1);
      kv.end_ubatch();
      for (size_t t = 0; t < ubatch.size(); ++t) {
        std::vector<double> conv, o;
        ref.token(ubatch[t], conv, o);
        worst_conv = std::max(worst_conv, max_abs_diff(std::vector<float>(got.conv.begin() + static_cast<long>(t * static_cast<size_t>(D.C)),
                                                                          got.conv.begin() + static_cast<long>((t + 1) * static_cast<size_t>(D.C))), conv));
        const size_t no = static_cast<size_t>(D.d * D.n_v);
        worst_o = std::max(worst_o, max_abs_diff(std::vector<float>(got.o.begin() + static_cast<long>(t * no), got.o.begin() + static_cast<long>((t + 1) * no)), o));
      }
    }
    kv.commit_recurrent();
  }
  CHECK(worst_conv < 1e-5);
  CHECK(worst_o < 1e-4);
}

}  // namespace

TEST_CASE("delta_net ops: conv and gated delta rule match float64 over interleaved sequences and ubatches", "[delta_net]") {
  const CpuIsa best = detect_cpu_isa();
  for (CpuIsa isa : {best, CpuIsa::Scalar})  // the SIMD one-token step and the scalar one
  for (int head_map : {0, 1})
    for (int threads : {1, 2}) {
      set_cpu_isa(isa);
      Dims D;
      D.head_map = head_map;
      D.d = 12;  // a SIMD body and a tail
      INFO("isa " << cpu_isa_name(isa) << " head_map " << head_map << " threads " << threads);
      uint32_t seed = 1000;
      auto st = [&](int32_t s, int32_t p) { return random_step(D, s, p, seed += 10); };
      // Call 1: a 7-token prompt of sequence 0 interleaved with 5 of sequence 2 in one ubatch,
      // then a second ubatch of the same call continuing both. Call 2: one token each.
      std::vector<Step> u1, u2;
      for (int i = 0, p0 = 0, p2 = 0; i < 12; ++i) u1.push_back(i % 3 == 1 && p2 < 5 ? st(2, p2++) : st(0, p0++));
      u2 = {st(0, 8), st(2, 4), st(0, 9)};
      check_calls(D, {{u1, u2}, {{st(2, 5)}}, {{st(0, 10)}}, {{st(0, 11), st(2, 6)}}}, threads);
      set_cpu_isa(best);
    }
}

TEST_CASE("delta_net ops: the chunked form equals the recurrence (chunk boundaries, two sequences, continued state)", "[delta_net]") {
  for (int head_map : {0, 1}) {
    Dims D;
    D.head_map = head_map;
    D.d = 16;
    uint32_t seed = 4000;
    auto st = [&](int32_t s, int32_t p) { return random_step(D, s, p, seed += 10); };
    // 150 tokens: sequence 1 gets every third (50: one full chunk and a partial one),
    // sequence 0 the rest (100: a full chunk and 36); then the prompt continues in a second
    // call (state from the chunked call), one-token steps, and another chunked ubatch.
    std::vector<Step> u1, u3;
    for (int i = 0, p0 = 0, p1 = 0; i < 150; ++i) u1.push_back(i % 3 == 2 ? st(1, p1++) : st(0, p0++));
    for (int i = 0; i < 70; ++i) u3.push_back(st(0, 101 + i));
    INFO("head_map " << head_map);
    check_calls(D, {{u1}, {{st(0, 100), st(1, 50)}}, {u3}}, 2, /*chunked=*/true);
  }
}

TEST_CASE("delta_net ops: odd shapes (kernel 2, one key head, head size 5)", "[delta_net]") {
  Dims D;
  D.C = 13, D.K = 2, D.d = 5, D.n_k = 1, D.n_v = 3;
  uint32_t seed = 50;
  auto st = [&](int32_t s, int32_t p) { return random_step(D, s, p, seed += 10); };
  check_calls(D, {{{st(1, 0), st(1, 1), st(1, 2)}}, {{st(1, 3)}}, {{st(1, 4)}}}, 2);
  check_calls(D, {{{st(1, 0), st(1, 1), st(1, 2)}}, {{st(1, 3)}}, {{st(1, 4), st(1, 5)}}}, 1, /*chunked=*/true);
}

TEST_CASE("delta_net ops: a released (failed) ubatch leaves the committed state as it was", "[delta_net]") {
  auto cpu = make_cpu_backend();
  Dims D;
  KvCache kv = make_cache(D, *cpu);
  const std::vector<float> w = randn(static_cast<size_t>(D.C * D.K), 7, 0.5f);
  uint32_t seed = 3;
  std::vector<Step> prompt;
  for (int p = 0; p < 5; ++p) prompt.push_back(random_step(D, 0, p, seed += 10));
  run_ubatch(kv, D, w, prompt, 2);
  kv.end_ubatch();
  kv.commit_recurrent();
  const Step next = random_step(D, 0, 5, 777);
  // A call that runs and then fails (e.g. aborted in a later layer): its cells are released.
  Outputs first = run_ubatch(kv, D, w, {next}, 2);
  kv.release(std::vector<int32_t>{5}.data(), 1);
  Outputs again = run_ubatch(kv, D, w, {next}, 2);
  CHECK(first.conv == again.conv);
  CHECK(first.o == again.o);
}

TEST_CASE("delta_net ops: l2_norm and softplus match float64", "[delta_net]") {
  auto cpu = make_cpu_backend();
  Graph g;
  const int64_t n = 37, rows = 5;
  const int x = g.input("x", DType::F32, {n, rows});
  const int l2 = g.l2_norm(x, 1e-6f);
  const int sp = g.softplus(x);
  g.mark_output(l2, "l2");
  g.mark_output(sp, "sp");
  GraphRun run(std::move(g), *cpu, 2);
  std::vector<float> xv = randn(static_cast<size_t>(n * rows), 11, 8.0f);
  for (int64_t i = 0; i < n; ++i) xv[static_cast<size_t>(n + i)] = 0.0f;  // a zero row: eps keeps it finite (zero)
  xv[3] = 25.0f;                                                           // softplus(x > 20) = x
  run.set_input(x, xv.data(), xv.size() * 4);
  run.run();
  std::vector<double> want_l2(xv.size()), want_sp(xv.size());
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(xv[static_cast<size_t>(r * n + i)]) * xv[static_cast<size_t>(r * n + i)];
    for (int64_t i = 0; i < n; ++i) want_l2[static_cast<size_t>(r * n + i)] = xv[static_cast<size_t>(r * n + i)] / std::max(std::sqrt(s), 1e-6);
  }
  for (size_t i = 0; i < xv.size(); ++i) want_sp[i] = xv[i] > 20 ? xv[i] : std::log1p(std::exp(static_cast<double>(xv[i])));
  CHECK(max_abs_diff(run.output(l2), want_l2) < 1e-6);
  CHECK(max_abs_diff(run.output(sp), want_sp) < 1e-5);
}

TEST_CASE("delta_net ops: a recurrent layer holds two state copies per sequence and no cells", "[delta_net]") {
  KvLayerDims l;
  l.conv_state = 8;
  l.ssm_state = 16;
  auto cpu = make_cpu_backend();
  KvCache kv(8, 3, KvType::F32, {l, KvLayerDims{4, 4}}, *cpu);
  CHECK(kv.layer_bytes(0) == 2 * 3 * 24 * sizeof(float));
  CHECK(kv.layer_bytes(1) == 8 * 8 * sizeof(float));
  CHECK(kv.has_recurrent());
}
