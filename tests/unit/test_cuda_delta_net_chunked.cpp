// The chunked tensor-core DeltaNet kernel (src/backends/cuda/ops/delta_net_chunked.cu, taken
// for ubatches of 32+ tokens at d = 128 on sm_80+) against a float64 token-by-token
// recurrence, the CPU op and the token-sequential CUDA kernel (the same GPU with sm_75's paths,
// a registry with GpuEmulation{75}): prompts of 1..300 tokens in 1-3 sequences (in blocks or interleaved),
// a second ubatch continuing from the written state, decays from e^-8 to ~1, beta in (0, 1),
// both key-head maps and the models' 16 / 32 heads. Tolerance 1e-4 of max(1, max |want|)
// for outputs and states: the kernel's bf16 hi/lo products measured ~4e-6 in the host
// emulation (tools/cuda_emu/run_delta_chunk.sh), one-pass bf16 1e-3. Tags [cuda][delta_net][dnchunk].
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "backends/backend.h"
#include "kv/kv_cache.h"
#include "support/device_graph.h"
#include "support/graph_runner.h"
#include "support/random_data.h"

#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_paths.h"
#endif

using namespace moe;
using moe_test::BoundGraph;
using moe_test::gpu_or_skip;
using moe_test::in;
using moe_test::scaled_diff;

namespace {

struct Shape {
  int64_t n_k, n_v;
  int head_map;
};

#ifdef MOEINFER_WITH_CUDA
constexpr int64_t kD = 128;
constexpr int32_t kSeqs[3] = {1, 0, 3};  // in order of first appearance


// One backend with its own cache, running DeltaNet graphs of any token count.
struct Side {
  Backend &be;
  const char *label;
  KvCache kv;
  std::vector<std::pair<int64_t, std::unique_ptr<BoundGraph>>> graphs;
  int q = 0, k = 0, v = 0, gb = 0, o = 0;

  Side(Backend &b, const char *l, const Shape &s) : be(b), label(l), kv(1024, 4, KvType::F32, {layer(s)}, b) {}
  static KvLayerDims layer(const Shape &s) {
    KvLayerDims l;
    l.conv_state = 24;  // untouched here: the matrices start after it
    l.ssm_state = s.n_v * kD * kD;
    return l;
  }
  BoundGraph &graph(const Shape &s, int64_t T) {
    for (auto &[t, g] : graphs)
      if (t == T) return *g;
    Graph g;
    q = g.input("q", DType::F32, {kD, s.n_k, T});
    k = g.input("k", DType::F32, {kD, s.n_k, T});
    v = g.input("v", DType::F32, {kD, s.n_v, T});
    gb = g.input("gb", DType::F32, {2 * s.n_v, T});
    o = g.delta_net(q, k, v, gb, 0, s.head_map, 1.0f / std::sqrt(static_cast<float>(kD)), false);
    g.mark_output(o, "o");
    graphs.emplace_back(T, std::make_unique<BoundGraph>(be, std::move(g)));
    return *graphs.back().second;
  }
};

struct Inputs {
  std::vector<float> q, k, v, gb;
  std::vector<int32_t> seq, pos;
};

Inputs make_inputs(const Shape &s, int64_t T, int n_seq, bool interleave, int32_t (&next)[4], uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  Inputs x;
  auto unit_rows = [&](int64_t rows) {  // L2-normalised, as the model feeds q and k
    std::vector<float> r(static_cast<size_t>(rows * kD));
    for (int64_t i = 0; i < rows; ++i) {
      double ss = 0;
      for (int64_t j = 0; j < kD; ++j) ss += double(r[i * kD + j] = nd(rng)) * r[i * kD + j];
      for (int64_t j = 0; j < kD; ++j) r[i * kD + j] = static_cast<float>(r[i * kD + j] / std::sqrt(ss));
    }
    return r;
  };
  x.q = unit_rows(T * s.n_k);
  x.k = unit_rows(T * s.n_k);
  x.v.resize(static_cast<size_t>(T * s.n_v * kD));
  for (float &f : x.v) f = nd(rng);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < s.n_v; ++h) {  // log decays: a third near 0, a third down to -8, a third mild
      const float u = ud(rng);
      x.gb.push_back(u < 0.33f ? -1e-3f * ud(rng) : u < 0.66f ? -8.0f * ud(rng) : -0.5f * ud(rng));
    }
    for (int64_t h = 0; h < s.n_v; ++h) x.gb.push_back(0.02f + 0.96f * ud(rng));
    const int64_t i = interleave ? (t + t / 7) % n_seq : std::min<int64_t>(n_seq - 1, t * n_seq / T);
    x.seq.push_back(kSeqs[i]);
    x.pos.push_back(next[kSeqs[i]]++);
  }
  return x;
}

std::vector<float> run_ubatch(Side &side, const Shape &s, const Inputs &x, const std::vector<int32_t> &cells) {
  const int64_t T = static_cast<int64_t>(x.seq.size());
  BoundGraph &bg = side.graph(s, T);
  side.kv.claim(cells.data(), x.pos.data(), x.seq.data(), static_cast<uint32_t>(T));
  UbatchInfo ub;
  ub.n_tokens = static_cast<int32_t>(T);
  ub.cells = cells.data();
  ub.pos = x.pos.data();
  ub.seq = x.seq.data();
  ub.n_kv = side.kv.n_kv();
  ub.cell_state = side.kv.cells();
  ExecEnv env{&ub, &side.kv};
  bg.run({in(side.q, x.q), in(side.k, x.k), in(side.v, x.v), in(side.gb, x.gb)}, env);
  std::vector<float> o = moe_test::as_f32(bg.read(side.o));
  side.kv.end_ubatch();
  side.kv.commit_recurrent();
  return o;
}

// The float64 recurrence: states [seq][head][d x d] (row j: value dim), outputs [T][n_v][d].
std::vector<double> reference(const Shape &s, const Inputs &x, std::vector<double> &S) {
  const int64_t T = static_cast<int64_t>(x.seq.size()), r = s.n_v / s.n_k;
  std::vector<double> o(static_cast<size_t>(T * s.n_v * kD));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < s.n_v; ++h) {
      const int64_t kh = s.head_map == 0 ? h / r : h % s.n_k;
      double *M = &S[static_cast<size_t>((x.seq[t] * s.n_v + h) * kD * kD)];
      const float *kt = &x.k[(t * s.n_k + kh) * kD], *qt = &x.q[(t * s.n_k + kh) * kD], *vt = &x.v[(t * s.n_v + h) * kD];
      const double decay = std::exp(double(x.gb[t * 2 * s.n_v + h])), beta = x.gb[t * 2 * s.n_v + s.n_v + h];
      for (int64_t j = 0; j < kD; ++j) {
        double sk = 0, sq = 0;
        for (int64_t i = 0; i < kD; ++i) sk += (M[j * kD + i] *= decay) * kt[i];
        const double delta = beta * (vt[j] - sk);
        for (int64_t i = 0; i < kD; ++i) sq += (M[j * kD + i] += kt[i] * delta) * qt[i];
        o[static_cast<size_t>((t * s.n_v + h) * kD + j)] = sq / std::sqrt(double(kD));
      }
    }
  return o;
}

// Two ubatches (T1 then T2 tokens over the same sequences) on the GPU's chunked path, its
// sequential kernel and the CPU, each against float64; then every sequence's committed state.
void run_case(const Shape &s, int64_t T1, int64_t T2, int n_seq, bool interleave, uint32_t seed) {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  // sm_75's paths: the token-sequential kernel, beside reg's own paths in the same process.
  BackendRegistry reg_seq("", GpuEmulation{75, 65536});
  Backend *gpu_seq = reg_seq.find("cuda");
  REQUIRE(gpu_seq);
  INFO("heads " << s.n_k << "/" << s.n_v << " map " << s.head_map << ", T " << T1 << " then " << T2 << ", " << n_seq << " sequences"
                << (interleave ? " interleaved" : " in blocks"));
  Side chunked(*gpu, "chunked", s), sequential(*gpu_seq, "sequential", s), cpu(*reg.cpu(), "cpu", s);
  std::vector<double> S(static_cast<size_t>(4 * s.n_v * kD * kD), 0.0);
  int32_t next[4] = {0, 0, 0, 0};
  for (int64_t T : {T1, T2}) {
    const Inputs x = make_inputs(s, T, n_seq, interleave, next, seed++);
    std::vector<int32_t> cells(static_cast<size_t>(T));
    REQUIRE(cpu.kv.find_slots(static_cast<uint32_t>(T), cells.data()));
    const std::vector<double> want = reference(s, x, S);
    const std::vector<float> got = run_ubatch(chunked, s, x, cells), got_seq = run_ubatch(sequential, s, x, cells),
                             got_cpu = run_ubatch(cpu, s, x, cells);
    INFO("ubatch of " << T << " tokens: chunked " << scaled_diff(got, want) << ", sequential " << scaled_diff(got_seq, want) << ", cpu "
                      << scaled_diff(got_cpu, want));
    CHECK(scaled_diff(got, want) < 1e-4);
    CHECK(scaled_diff(got_seq, want) < 1e-4);
    CHECK(scaled_diff(got_cpu, want) < 1e-4);
    // The two GPU kernels round differently: equal outputs would mean the chunked path was not taken.
    if (T >= 32) CHECK(got != got_seq);
  }
  const size_t per = static_cast<size_t>(cpu.kv.dims(0).recurrent()), conv = static_cast<size_t>(cpu.kv.dims(0).conv_state);
  for (int i = 0; i < n_seq; ++i) {
    const int32_t sq = kSeqs[i];
    const auto first = S.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(sq) * (per - conv));
    const std::vector<double> want(first, first + static_cast<std::ptrdiff_t>(per - conv));
    for (Side *side : {&chunked, &sequential, &cpu}) {
      std::vector<float> st(per);
      side->kv.read_recurrent(0, sq, st.data());
      INFO("sequence " << sq << " state on " << side->label);
      CHECK(scaled_diff(std::vector<float>(st.begin() + static_cast<std::ptrdiff_t>(conv), st.end()), want) < 1e-4);
    }
  }
}
#else
void run_case(const Shape &, int64_t, int64_t, int, bool, uint32_t) { WARN("a build without CUDA: CUDA test skipped"); }
#endif

}  // namespace

TEST_CASE("cuda delta_net chunked: prompts of 1..300 tokens in 1-3 sequences match float64, the CPU and the sequential kernel",
          "[cuda][delta_net][dnchunk]") {
  struct C {
    int64_t T1, T2;
    int n_seq;
    bool interleave;
  };
  uint32_t seed = 100;
  for (const C c : {C{1, 33, 1, false}, C{31, 32, 1, false}, C{32, 5, 1, false}, C{33, 64, 1, false}, C{64, 65, 2, false},
                    C{65, 40, 3, true}, C{100, 97, 2, true}, C{129, 40, 3, false}, C{257, 31, 1, false}, C{300, 70, 3, true}}) {
    run_case({2, 4, int(c.T1 % 2)}, c.T1, c.T2, c.n_seq, c.interleave, seed);
    seed += 10;
  }
}

TEST_CASE("cuda delta_net chunked: the models' heads (16 key, 32 value heads, both maps) over a 300-token prompt",
          "[cuda][delta_net][dnchunk]") {
  run_case({16, 32, 0}, 300, 64, 1, false, 7);
  run_case({16, 32, 1}, 200, 45, 2, true, 8);
}
