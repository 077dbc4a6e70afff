// Gated DeltaNet ops on CUDA against the CPU backend on random inputs: SsmConv and DeltaNet fed
// as the engine feeds them (decode calls of one or more ubatches, sequences interleaved in one
// ubatch, one token per sequence, a state continued across calls), both forms of DeltaNet
// (recurrent and chunked), odd shapes (head size not a multiple of 32, odd channel counts,
// kernel widths 2, 3 and 4), and the states the two caches hold afterwards; L2Norm and
// Softplus. The GPU's per-shape graphs are kept across steps, so one-token steps are captured
// and replayed as CUDA graphs with the state copies changing underneath (DevUbatch::rs).
// Without a CUDA build or device every case WARNs and returns (tags [cuda][delta_net]).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>

#include "backends/backend.h"
#include "kv/kv_cache.h"
#include "support/device_graph.h"
#include "support/graph_runner.h"
#include "support/random_data.h"

using namespace moe;
using moe_test::BoundGraph;
using moe_test::gpu_or_skip;
using moe_test::in;
using moe_test::unit_rows;
using moe_test::scaled_diff;
using moe_test::Input;
using moe_test::randn;

namespace {

struct Dims {
  int64_t C, K, d, n_k, n_v;
  int head_map;
};

struct Tok {
  int32_t seq, pos;
};

// One graph per (token count, form): SsmConv and DeltaNet of layer 0 on fresh inputs.
struct OpGraph {
  int x, q, k, v, gb, conv, o;
  std::unique_ptr<BoundGraph> bound;
};

Graph build(const Dims &D, int64_t T, bool chunked, const GgufTensorInfo *w, OpGraph &og) {
  Graph g;
  og.x = g.input("x", DType::F32, {D.C, T});
  og.q = g.input("q", DType::F32, {D.d, D.n_k, T});
  og.k = g.input("k", DType::F32, {D.d, D.n_k, T});
  og.v = g.input("v", DType::F32, {D.d, D.n_v, T});
  og.gb = g.input("gb", DType::F32, {2 * D.n_v, T});
  og.conv = g.ssm_conv(og.x, g.weight(w), 0);
  og.o = g.delta_net(og.q, og.k, og.v, og.gb, 0, D.head_map, 1.0f / std::sqrt(static_cast<float>(D.d)), chunked);
  g.mark_output(og.conv, "conv");
  g.mark_output(og.o, "o");
  return g;
}



// The two backends with their own caches, fed the same calls.
struct Pair {
  Dims D;
  Backend &cpu, &gpu;
  KvCache kv_c, kv_g;
  const GgufTensorInfo *w;
  moe_test::WeightStore ws;
  std::map<std::pair<int64_t, bool>, OpGraph> cpu_graphs, gpu_graphs;
  uint32_t seed = 1;
  double worst_conv = 0, worst_o = 0;

  static KvLayerDims layer(const Dims &D) {
    KvLayerDims l;
    l.conv_state = (D.K - 1) * D.C;
    l.ssm_state = D.n_v * D.d * D.d;
    return l;
  }
  Pair(const Dims &d, Backend &c, Backend &g)
      : D(d), cpu(c), gpu(g), kv_c(256, 4, KvType::F32, {layer(d)}, c), kv_g(256, 4, KvType::F32, {layer(d)}, g) {
    w = ws.add("conv", DType::F32, {D.K, D.C}, randn(static_cast<size_t>(D.C * D.K), 99, 0.5f));
  }

  OpGraph &graph(std::map<std::pair<int64_t, bool>, OpGraph> &m, Backend &be, int64_t T, bool chunked) {
    OpGraph &og = m[{T, chunked}];
    if (!og.bound) og.bound = std::make_unique<BoundGraph>(be, build(D, T, chunked, w, og));
    return og;
  }

  void ubatch(const std::vector<Tok> &toks, bool chunked) {
    const int64_t T = static_cast<int64_t>(toks.size());
    std::mt19937 rng(seed++);
    auto r = [&](size_t n, float s = 1.0f) { return randn(n, static_cast<uint32_t>(rng()), s); };
    std::vector<float> x = r(static_cast<size_t>(D.C * T)), q = unit_rows(r(static_cast<size_t>(D.d * D.n_k * T)), D.d),
                       k = unit_rows(r(static_cast<size_t>(D.d * D.n_k * T)), D.d), v = r(static_cast<size_t>(D.d * D.n_v * T)), gb;
    std::uniform_real_distribution<float> gd(-1.5f, -0.01f), bd(0.05f, 0.95f);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < D.n_v; ++h) gb.push_back(gd(rng));
      for (int64_t h = 0; h < D.n_v; ++h) gb.push_back(bd(rng));
    }
    std::vector<int32_t> pos, seq, cells(static_cast<size_t>(T));
    for (const Tok &t : toks) { pos.push_back(t.pos); seq.push_back(t.seq); }
    REQUIRE(kv_c.find_slots(static_cast<uint32_t>(T), cells.data()));
    kv_c.claim(cells.data(), pos.data(), seq.data(), static_cast<uint32_t>(T));
    kv_g.claim(cells.data(), pos.data(), seq.data(), static_cast<uint32_t>(T));
    std::vector<float> out[2][2];
    int b = 0;
    for (auto *side : {&cpu_graphs, &gpu_graphs}) {
      KvCache &kv = b ? kv_g : kv_c;
      OpGraph &og = graph(*side, b ? gpu : cpu, T, chunked);
      UbatchInfo ub;
      ub.n_tokens = static_cast<int32_t>(T);
      ub.cells = cells.data();
      ub.pos = pos.data();
      ub.seq = seq.data();
      ub.n_kv = kv.n_kv();
      ub.cell_state = kv.cells();
      ExecEnv env{&ub, &kv};
      og.bound->run({in(og.x, x), in(og.q, q), in(og.k, k), in(og.v, v), in(og.gb, gb)}, env);
      out[b][0] = moe_test::as_f32(og.bound->read(og.conv));
      out[b][1] = moe_test::as_f32(og.bound->read(og.o));
      ++b;
    }
    kv_c.end_ubatch();
    kv_g.end_ubatch();
    worst_conv = std::max(worst_conv, scaled_diff(out[1][0], out[0][0]));
    worst_o = std::max(worst_o, scaled_diff(out[1][1], out[0][1]));
  }

  void commit() {
    kv_c.commit_recurrent();
    kv_g.commit_recurrent();
  }

  // The committed states of every sequence, GPU vs CPU.
  double state_diff() {
    const size_t n = static_cast<size_t>(kv_c.dims(0).recurrent());
    std::vector<float> a(n), b(n);
    double worst = 0;
    for (int32_t s = 0; s < 4; ++s) {
      kv_c.read_recurrent(0, s, a.data());
      kv_g.read_recurrent(0, s, b.data());
      worst = std::max(worst, scaled_diff(b, a));
    }
    return worst;
  }
};

// Call plan: a prompt of sequence 0 interleaved with sequence 2 in one ubatch and a second
// ubatch of the same call; one token of each sequence in one ubatch (replayed: several such
// steps); a prompt continuing sequence 0 alone; sequence 1 alone, one token.
void run_plan(const Dims &D, bool chunked) {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  INFO("C " << D.C << " K " << D.K << " d " << D.d << " heads " << D.n_k << "/" << D.n_v << " head_map " << D.head_map << " chunked "
            << chunked);
  Pair p(D, *reg.cpu(), *gpu);
  int32_t next[4] = {0, 0, 0, 0};
  auto tok = [&](int32_t s) { return Tok{s, next[s]++}; };
  std::vector<Tok> u1, u2;
  for (int i = 0; i < 12; ++i) u1.push_back(tok(i % 3 == 1 ? 2 : 0));
  u2 = {tok(0), tok(2), tok(0)};
  p.ubatch(u1, chunked);
  p.ubatch(u2, chunked);
  p.commit();
  for (int step = 0; step < 5; ++step) {  // the same 2-token graph: eager, captured, replayed
    p.ubatch({tok(0), tok(2)}, chunked);
    p.commit();
  }
  for (int step = 0; step < 4; ++step) {  // one token: eager, captured, replayed (sequence alternates)
    p.ubatch({tok(step % 2 ? 2 : 0)}, chunked);
    p.commit();
  }
  std::vector<Tok> u3;
  for (int i = 0; i < 70; ++i) u3.push_back(tok(0));
  p.ubatch(u3, chunked);
  p.commit();
  // A prompt-sized batch (the per-token conv kernel) where sequence 2 has one token and
  // sequence 3 starts with one: their history is all tail.
  std::vector<Tok> u4;
  for (int i = 0; i < 9; ++i) u4.push_back(tok(i == 3 ? 2 : i == 6 ? 3 : 0));
  p.ubatch(u4, chunked);
  p.commit();
  p.ubatch({tok(1)}, chunked);
  p.commit();
  CHECK(p.worst_conv < 1e-5);
  CHECK(p.worst_o < 2e-4);
  CHECK(p.state_diff() < 2e-4);
}

}  // namespace

TEST_CASE("cuda delta_net: SsmConv and DeltaNet match the CPU over interleaved sequences, calls and replayed steps", "[cuda][delta_net]") {
  for (bool chunked : {false, true}) {
    run_plan({40, 4, 128, 2, 4, 0}, chunked);  // the models' head size
    run_plan({37, 4, 48, 2, 6, 1}, chunked);   // head size not a multiple of 32, odd channels
  }
}

TEST_CASE("cuda delta_net: odd shapes (kernel 2 and 3, one key head, head sizes 5 and 200)", "[cuda][delta_net]") {
  run_plan({13, 2, 5, 1, 3, 0}, false);
  run_plan({13, 3, 5, 1, 3, 1}, true);
  run_plan({9, 4, 200, 1, 2, 0}, false);
}

TEST_CASE("cuda delta_net: a released (failed) ubatch leaves the GPU's committed state as it was", "[cuda][delta_net]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  Pair p({16, 4, 32, 1, 2, 0}, *reg.cpu(), *gpu);
  p.ubatch({{0, 0}, {0, 1}, {0, 2}}, false);
  p.commit();
  const size_t n = static_cast<size_t>(p.kv_g.dims(0).recurrent());
  std::vector<float> before(n), after(n);
  p.kv_g.read_recurrent(0, 0, before.data());
  p.ubatch({{0, 3}}, false);  // runs, then the call fails: its cells are released
  const int32_t cell = 3;
  p.kv_c.release(&cell, 1);
  p.kv_g.release(&cell, 1);
  p.kv_g.read_recurrent(0, 0, after.data());
  CHECK(before == after);
  p.ubatch({{0, 3}}, false);  // the same step again from the committed state
  p.commit();
  CHECK(p.worst_o < 2e-4);
  CHECK(p.state_diff() < 2e-4);
}

TEST_CASE("cuda delta_net: sequence operations on GPU states (copy, remove, keep, clear, write/read)", "[cuda][delta_net]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  Pair p({16, 4, 32, 1, 2, 0}, *reg.cpu(), *gpu);
  p.ubatch({{0, 0}, {0, 1}, {1, 0}, {0, 2}}, false);
  p.commit();
  for (KvCache *kv : {&p.kv_c, &p.kv_g}) kv->seq_cp(0, 2, -1, -1);
  CHECK(p.state_diff() < 2e-4);
  p.ubatch({{2, 3}, {0, 3}}, false);  // both continue from the same state
  p.commit();
  for (KvCache *kv : {&p.kv_c, &p.kv_g}) CHECK(kv->seq_rm(1, -1, -1));
  for (KvCache *kv : {&p.kv_c, &p.kv_g}) kv->seq_keep(2);
  CHECK(p.state_diff() < 2e-4);
  const size_t n = static_cast<size_t>(p.kv_g.dims(0).recurrent());
  std::vector<float> s(n);
  p.kv_g.read_recurrent(0, 0, s.data());
  CHECK(std::all_of(s.begin(), s.end(), [](float v) { return v == 0.0f; }));  // seq 0 dropped by seq_keep
  p.kv_g.read_recurrent(0, 2, s.data());
  CHECK(std::any_of(s.begin(), s.end(), [](float v) { return v != 0.0f; }));
  std::vector<float> mine = randn(n, 5), back(n);
  p.kv_g.write_recurrent(0, 3, mine.data());
  p.kv_g.read_recurrent(0, 3, back.data());
  CHECK(back == mine);
  p.kv_g.clear();
  p.kv_g.read_recurrent(0, 2, s.data());
  CHECK(std::all_of(s.begin(), s.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("cuda delta_net: l2_norm and softplus match a float64 reference on the CPU and the GPU (odd rows, zero row, large inputs)",
          "[cuda][delta_net]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  for (int64_t n : {37, 128, 300}) {
    const int64_t rows = 5;
    int x = 0, l2 = 0, sp = 0;
    auto build_g = [&]() {
      Graph g;
      x = g.input("x", DType::F32, {n, rows});
      l2 = g.l2_norm(x, 1e-6f);
      sp = g.softplus(x);
      g.mark_output(l2, "l2");
      g.mark_output(sp, "sp");
      return g;
    };
    std::vector<float> xv = randn(static_cast<size_t>(n * rows), 11, 8.0f);
    for (int64_t i = 0; i < n; ++i) xv[static_cast<size_t>(n + i)] = 0.0f;
    xv[3] = 25.0f;
    xv[4] = -90.0f;
    // float64: x / max(||x||, eps) per row; log(1 + exp(x)), x itself past 20.
    std::vector<float> want_l2(xv.size()), want_sp(xv.size());
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += double(xv[static_cast<size_t>(r * n + i)]) * xv[static_cast<size_t>(r * n + i)];
      const double inv = 1.0 / std::max(std::sqrt(ss), 1e-6);
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = static_cast<size_t>(r * n + i);
        want_l2[k] = static_cast<float>(xv[k] * inv);
        want_sp[k] = xv[k] > 20.0f ? xv[k] : static_cast<float>(std::log1p(std::exp(double(xv[k]))));
      }
    }
    const std::vector<Input> ins = {in(x, xv)};
    std::vector<std::pair<const char *, Backend *>> sides = {{"cpu", reg.cpu()}};
    if (gpu) sides.push_back({"cuda", gpu});
    for (const auto &[name, be] : sides) {
      Graph g = build_g();  // first: it sets the ids the output list names
      const auto r = moe_test::run_on(*be, std::move(g), ins, {l2, sp});
      const auto got_l2 = moe_test::as_f32(r[0]), got_sp = moe_test::as_f32(r[1]);
      INFO(name << ", row " << n << ": l2 [0..2] " << got_l2[0] << " " << got_l2[1] << " " << got_l2[2] << " want " << want_l2[0]
                << " " << want_l2[1] << " " << want_l2[2] << "; softplus [0..2] " << got_sp[0] << " " << got_sp[1] << " " << got_sp[2]);
      CHECK(scaled_diff(got_l2, want_l2) < 1e-6);
      CHECK(scaled_diff(got_sp, want_sp) < 1e-6);
    }
  }
}
