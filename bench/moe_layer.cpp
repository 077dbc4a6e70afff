// MoE FFN layer at the Qwen3-30B-A3B layer shape (n_embd 2048, 128 experts, 8 used,
// expert ff 768, Q4_K gate/up, Q6_K down) on the CPU backend, batch 1/8/64/512, plus
// causal attention decode over an F16 KV cache at several depths.
// Reports tokens/s and the weight bytes streamed per second.
#include <benchmark/benchmark.h>

#include <random>

#include "../tests/support/graph_runner.h"
#include "backends/backend.h"
#include "backends/cpu/thread_pool.h"
#include "kv/kv_cache.h"
#include "model/arch/blocks.h"
#include "tiled_weight.h"

using namespace moe;
using moe_bench::tiled_weight;

namespace {

constexpr int64_t kEmbd = 2048, kExperts = 128, kUsed = 8, kFf = 768;

struct MoeLayer {
  moe_test::WeightStore ws;
  const GgufTensorInfo *router, *gate, *up, *down;
  MoeLayer() {
    router = tiled_weight(ws, "router", DType::F32, {kEmbd, kExperts});
    gate = tiled_weight(ws, "gate", DType::Q4_K, {kEmbd, kFf, kExperts});
    up = tiled_weight(ws, "up", DType::Q4_K, {kEmbd, kFf, kExperts});
    down = tiled_weight(ws, "down", DType::Q6_K, {kFf, kEmbd, kExperts});
  }
};

MoeLayer &layer() {
  static MoeLayer l;
  return l;
}

void BM_MoeLayer(benchmark::State &state) {
  const int64_t T = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  auto cpu = make_cpu_backend();
  MoeLayer &L = layer();
  Graph g;
  int x = g.input("x", DType::F32, {kEmbd, T});
  MoeWeights w{g.weight(L.router), g.weight(L.gate), g.weight(L.up), g.weight(L.down)};
  int y = moe_ffn_softmax(g, x, w, kUsed, true);
  g.mark_output(y, "y");
  moe_test::GraphRun run(std::move(g), *cpu, threads);
  std::vector<float> xv(static_cast<size_t>(kEmbd * T));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto &v : xv) v = nd(rng);
  run.set_input(x, xv.data(), xv.size() * 4);
  for (auto _ : state) run.run();
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(T), benchmark::Counter::kIsIterationInvariantRate);
  // Weight bytes one token touches: its 8 experts' rows (distinct experts grow with T).
  const double per_expert = static_cast<double>(L.gate->nbytes + L.up->nbytes + L.down->nbytes) / kExperts;
  const double experts_touched = std::min<double>(kExperts, kUsed * static_cast<double>(T));
  state.counters["weight_GB/s"] = benchmark::Counter(per_expert * experts_touched / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AttentionDecode(benchmark::State &state) {
  const int32_t depth = static_cast<int32_t>(state.range(0));
  const int64_t hd = 128, n_head = 32, n_kv = 4;
  auto cpu = make_cpu_backend();
  KvCache kv(static_cast<uint32_t>(depth + 1), 1, KvType::F16, {KvLayerDims{hd * n_kv, hd * n_kv}}, *cpu);
  moe_bench::FilledCache fc(kv, depth + 1, 1);
  Graph g;
  int q = g.input("q", DType::F32, {hd, n_head, 1});
  int k = g.input("k", DType::F32, {hd, n_kv, 1});
  int v = g.input("v", DType::F32, {hd, n_kv, 1});
  GraphBuildParams gp;
  gp.n_cells = kv.n_cells();
  int a = attention_block(g, q, k, v, 0, hd, 0.088f, gp);
  g.mark_output(a, "a");
  moe_test::GraphRun run(std::move(g), *cpu, static_cast<int>(state.range(1)));
  std::vector<float> qv(static_cast<size_t>(hd * n_head), 0.1f), kvv(static_cast<size_t>(hd * n_kv), 0.2f);
  run.set_input(q, qv.data(), qv.size() * 4);
  run.set_input(k, kvv.data(), kvv.size() * 4);
  run.set_input(v, kvv.data(), kvv.size() * 4);
  ExecEnv env{&fc.ub, &kv};
  for (auto _ : state) run.run(env);
  state.counters["kv_GB/s"] = benchmark::Counter(static_cast<double>(kv.bytes()) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_MoeLayer)->ArgNames({"batch", "threads"})->Args({1, 2})->Args({8, 2})->Args({64, 2})->Args({512, 2})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttentionDecode)->ArgNames({"depth", "threads"})->Args({512, 2})->Args({4096, 2})->Args({16384, 2})->Unit(benchmark::kMicrosecond)->UseRealTime();
