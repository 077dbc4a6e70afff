// CUDA kernels at the Qwen3-30B-A3B shapes (n_embd 2048, 32 q / 4 kv heads of 128, 128
// experts, 8 used, expert ff 768, vocabulary 151936): decode mat-vecs per weight type and the
// routed expert groups (gate/up + SwiGLU, down + combine), the prefill expert products
// (MatMulId at 512 tokens), the MoE layer (router, top-k, experts, combine) at batch 1 and 512, dense prefill products and
// attention decode / prefill (and MLA attention at the GLM-4.7-Flash shape). Each iteration replays the one-op graph on the context's stream
// (captured as a CUDA graph like a decode step) and is timed with CUDA events. Counters:
// weight GB/s (decode), TFLOP/s (prefill), tokens/s. Without a CUDA device every benchmark
// reports "skipped: no CUDA device".
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "../tests/support/graph_runner.h"
#include "backends/backend.h"
#include "engine/weight_upload.h"
#include "graph/compiler.h"
#include "kv/kv_cache.h"
#include "model/arch/blocks.h"
#include "tiled_weight.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

using namespace moe;
using moe_bench::tiled_weight;

namespace {

constexpr int64_t kEmbd = 2048, kExperts = 128, kUsed = 8, kFf = 768, kHd = 128, kHeads = 32, kKvHeads = 4;

#ifdef MOEINFER_WITH_CUDA
// One compiled graph on the GPU with uploaded weights; run() enqueues it and returns the
// milliseconds the GPU spent between two events around it.
struct GpuRun {
  BackendRegistry reg;
  CudaBackend *gpu = nullptr;
  std::unique_ptr<CompiledPlan> plan;
  std::unique_ptr<DeviceBuffer> arena;
  std::unique_ptr<DeviceWeights> weights;
  std::unique_ptr<Executor> exec;
  cudaEvent_t ev[2] = {nullptr, nullptr};

  bool init(Graph g) {
    gpu = dynamic_cast<CudaBackend *>(reg.find("cuda"));
    if (!gpu) return false;
    CompileOptions o;
    o.devices = {gpu};
    o.allow_fallback = false;
    plan = compile_graph(std::move(g), o);
    arena = gpu->alloc(plan->arena_bytes[0] ? plan->arena_bytes[0] : 64, "bench");
    std::vector<const GgufTensorInfo *> ts;
    for (const Node &n : plan->graph.nodes())
      if (n.leaf == LeafKind::Weight && n.op == Op::Leaf) ts.push_back(n.weight);
    weights = DeviceWeights::upload(ts, *gpu);
    void *bases[1] = {arena->data()};
    bind_plan(*plan, bases, [&](const Node &n) { return weights->find(n.weight); });
    exec = gpu->make_executor(1, GpuTuning{});
    gpu->set_current();
    cudaEventCreate(&ev[0]);
    cudaEventCreate(&ev[1]);
    return true;
  }
  ~GpuRun() {
    for (cudaEvent_t e : ev)
      if (e) cudaEventDestroy(e);
  }
  void set_input(int node, const void *src, size_t bytes) { arena->upload(plan->graph.node(node).offset, src, bytes); }
  double run_ms(const ExecEnv &env = {}) {
    cudaEventRecord(ev[0], gpu->stream());
    exec->run(plan->graph, 0, static_cast<int>(plan->graph.nodes().size()), env);
    exec->synchronize();
    cudaEventRecord(ev[1], gpu->stream());
    cudaEventSynchronize(ev[1]);
    float ms = 0;
    cudaEventElapsedTime(&ms, ev[0], ev[1]);
    return ms;
  }
};

std::vector<float> randv(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (auto &x : v) x = nd(rng);
  return v;
}

// Runs the graph under the benchmark loop (two warm-up runs: eager, then captured).
void time_graph(benchmark::State &state, GpuRun &r, const ExecEnv &env = {}) {
  r.run_ms(env);
  r.run_ms(env);
  for (auto _ : state) state.SetIterationTime(r.run_ms(env) / 1e3);
}

#define MOE_NEED_GPU(run, graph)                        \
  if (!(run).init(graph)) {                             \
    state.SkipWithError("skipped: no CUDA device");     \
    return;                                             \
  }
#else
struct GpuRun {};
#define MOE_NEED_GPU(run, graph)                                      \
  (void)(run);                                                        \
  state.SkipWithError("skipped: built without the CUDA backend");     \
  return;
#endif

const DType kTypes[] = {DType::F32, DType::F16, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::MXFP4};

// Dense product of a K x M weight with N activation columns.
void BM_CudaMatmul(benchmark::State &state) {
  const DType t = kTypes[state.range(0)];
  const int64_t K = state.range(1), M = state.range(2), N = state.range(3);
  moe_test::WeightStore ws;
  const GgufTensorInfo *w = tiled_weight(ws, "w", t, {K, M});
  Graph g;
  int x = g.input("x", DType::F32, {K, N});
  g.mark_output(g.matmul(g.weight(w), x), "y");
  GpuRun r;
  MOE_NEED_GPU(r, std::move(g));
#ifdef MOEINFER_WITH_CUDA
  auto xv = randv(static_cast<size_t>(K * N), 1);
  r.set_input(x, xv.data(), xv.size() * 4);
  time_graph(state, r);
  state.SetLabel(dtype_name(t));
  state.counters["weight_GB/s"] = benchmark::Counter(static_cast<double>(w->nbytes) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * K * M * N / 1e12, benchmark::Counter::kIsIterationInvariantRate);
#endif
}

// One expert product (MatMulId) of T tokens routed to `used` of E experts at random
// (distinct per token): the prefill GEMM of a MoE layer's gate / up (X = 1: every slot
// reads the token's row) or down (X = used: one input row per slot) projection, including
// its activation rounding and routing-table launches.
void BM_CudaMatmulId(benchmark::State &state) {
  const DType t = kTypes[state.range(0)];
  const int64_t K = state.range(1), M = state.range(2), X = state.range(3), T = state.range(4), E = state.range(5), used = state.range(6);
  moe_test::WeightStore ws;
  const GgufTensorInfo *w = tiled_weight(ws, "experts", t, {K, M, E});
  Graph g;
  int x = g.input("x", DType::F32, {K, X, T});
  int ids = g.input("ids", DType::I32, {used, T});
  g.mark_output(g.matmul_id(g.weight(w), x, ids), "y");
  GpuRun r;
  MOE_NEED_GPU(r, std::move(g));
#ifdef MOEINFER_WITH_CUDA
  auto xv = randv(static_cast<size_t>(K * X * T), 5);
  r.set_input(x, xv.data(), xv.size() * 4);
  std::mt19937 rng(6);
  std::vector<int32_t> idv(static_cast<size_t>(used * T)), perm(static_cast<size_t>(E));
  for (int64_t tok = 0; tok < T; ++tok) {
    for (int64_t e = 0; e < E; ++e) perm[static_cast<size_t>(e)] = static_cast<int32_t>(e);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy(perm.begin(), perm.begin() + used, idv.begin() + tok * used);
  }
  r.set_input(ids, idv.data(), idv.size() * 4);
  time_graph(state, r);
  state.SetLabel(dtype_name(t));
  const double touched = std::min<double>(static_cast<double>(E), static_cast<double>(used * T));  // experts read
  const double touched_bytes = static_cast<double>(w->nbytes) / static_cast<double>(E) * touched;
  state.counters["weight_GB/s"] = benchmark::Counter(touched_bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * K * M * used * T / 1e12, benchmark::Counter::kIsIterationInvariantRate);
#endif
}

// The MoE FFN of one layer (router, softmax top-8, experts Q4_K gate/up + Q6_K down, combine).
void BM_CudaMoeLayer(benchmark::State &state) {
  const int64_t T = state.range(0);
  moe_test::WeightStore ws;
  MoeWeights mw;
  Graph g;
  mw.router = g.weight(tiled_weight(ws, "router", DType::F32, {kEmbd, kExperts}));
  const GgufTensorInfo *gate = tiled_weight(ws, "gate", DType::Q4_K, {kEmbd, kFf, kExperts});
  const GgufTensorInfo *up = tiled_weight(ws, "up", DType::Q4_K, {kEmbd, kFf, kExperts});
  const GgufTensorInfo *down = tiled_weight(ws, "down", DType::Q6_K, {kFf, kEmbd, kExperts});
  mw.gate = g.weight(gate);
  mw.up = g.weight(up);
  mw.down = g.weight(down);
  int x = g.input("x", DType::F32, {kEmbd, T});
  g.mark_output(moe_ffn_softmax(g, x, mw, kUsed, true), "y");
  GpuRun r;
  MOE_NEED_GPU(r, std::move(g));
#ifdef MOEINFER_WITH_CUDA
  auto xv = randv(static_cast<size_t>(kEmbd * T), 2);
  r.set_input(x, xv.data(), xv.size() * 4);
  time_graph(state, r);
  const double per_expert = static_cast<double>(gate->nbytes + up->nbytes + down->nbytes) / kExperts;
  const double touched = std::min<double>(kExperts, kUsed * static_cast<double>(T));
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(T), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] = benchmark::Counter(per_expert * touched / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["TFLOP/s"] =
      benchmark::Counter(2.0 * 3 * kEmbd * kFf * kUsed * T / 1e12, benchmark::Counter::kIsIterationInvariantRate);
#endif
}

// One token's routed expert products alone (ids fixed, 8 distinct experts): gate/up + SwiGLU
// (Q4_K, one fused launch) or down + MoeCombine (Q6_K); the decode mat-vecs' largest groups.
void BM_CudaExpertMatvec(benchmark::State &state) {
  const bool down = state.range(0) != 0;
  const DType t = down ? DType::Q6_K : DType::Q4_K;
  const int64_t K = down ? kFf : kEmbd, M = down ? kEmbd : kFf;
  moe_test::WeightStore ws;
  const GgufTensorInfo *w1 = tiled_weight(ws, "w1", t, {K, M, kExperts});
  const GgufTensorInfo *w2 = down ? nullptr : tiled_weight(ws, "w2", t, {K, M, kExperts});
  Graph g;
  int ids = g.input("ids", DType::I32, {kUsed, 1});
  int x = g.input("x", DType::F32, {K, down ? kUsed : 1, 1});
  int cw = down ? g.input("cw", DType::F32, {kUsed, 1}) : -1;
  int y;
  if (down) {
    y = g.moe_combine(g.matmul_id(g.weight(w1), x, ids), cw);
  } else {
    int up = g.matmul_id(g.weight(w2), x, ids);
    y = g.swiglu(g.matmul_id(g.weight(w1), x, ids), up);
  }
  g.mark_output(y, "y");
  GpuRun r;
  MOE_NEED_GPU(r, std::move(g));
#ifdef MOEINFER_WITH_CUDA
  const int32_t idv[kUsed] = {3, 17, 40, 64, 77, 90, 101, 120};
  r.set_input(ids, idv, sizeof idv);
  auto xv = randv(static_cast<size_t>(K * (down ? kUsed : 1)), 5);
  r.set_input(x, xv.data(), xv.size() * 4);
  if (down) {
    const std::vector<float> cwv(kUsed, 0.125f);
    r.set_input(cw, cwv.data(), cwv.size() * 4);
  }
  time_graph(state, r);
  state.SetLabel(down ? "down+combine q6_K" : "gate/up+swiglu q4_K");
  const double bytes = static_cast<double>(w1->nbytes + (w2 ? w2->nbytes : 0)) / kExperts * kUsed;
  state.counters["weight_GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
#endif
}

// Causal GQA attention of T new tokens over a cache already holding `depth` tokens (F16, or
// Q8_0 when the third argument is 1).
void BM_CudaAttention(benchmark::State &state) {
  const int32_t T = static_cast<int32_t>(state.range(0)), depth = static_cast<int32_t>(state.range(1));
  GpuRun r;
  Graph g;
  int q = g.input("q", DType::F32, {kHd, kHeads, T});
  int k = g.input("k", DType::F32, {kHd, kKvHeads, T});
  int v = g.input("v", DType::F32, {kHd, kKvHeads, T});
  const uint32_t n_cells = static_cast<uint32_t>(depth + T);
  GraphBuildParams gp;
  gp.n_cells = n_cells;
  g.mark_output(attention_block(g, q, k, v, 0, kHd, 0.088f, gp), "a");
  MOE_NEED_GPU(r, std::move(g));
#ifdef MOEINFER_WITH_CUDA
  const KvType kt = state.range(2) ? KvType::Q8_0 : KvType::F16;
  KvCache kv(n_cells, 1, kt, {KvLayerDims{kHd * kKvHeads, kHd * kKvHeads}}, *r.gpu);
  moe_bench::FilledCache fc(kv, static_cast<int32_t>(n_cells), T);
  auto qv = randv(static_cast<size_t>(kHd * kHeads * T), 3), kvv = randv(static_cast<size_t>(kHd * kKvHeads * T), 4);
  r.set_input(q, qv.data(), qv.size() * 4);
  r.set_input(k, kvv.data(), kvv.size() * 4);
  r.set_input(v, kvv.data(), kvv.size() * 4);
  ExecEnv env{&fc.ub, &kv};
  time_graph(state, r, env);
  const double flops = 4.0 * kHd * kHeads * T * (depth + (T + 1) / 2.0);
  state.counters["TFLOP/s"] = benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["kv_GB/s"] = benchmark::Counter(static_cast<double>(kv.bytes()) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
#endif
}

// MLA attention at the GLM-4.7-Flash shape (20 q heads over one latent KV head: K rows of
// 576 = latent 512 + rope 64, V = the latent) of T new tokens over `depth` cached ones (F16).
void BM_CudaMlaAttention(benchmark::State &state) {
  constexpr int64_t kMlaK = 576, kMlaV = 512, kMlaHeads = 20;
  const int32_t T = static_cast<int32_t>(state.range(0)), depth = static_cast<int32_t>(state.range(1));
  GpuRun r;
  Graph g;
  int q = g.input("q", DType::F32, {kMlaK, kMlaHeads, T});
  int k = g.input("k", DType::F32, {kMlaK, 1, T});
  const uint32_t n_cells = static_cast<uint32_t>(depth + T);
  int ks = g.kv_store(k, 0, 0);
  AttentionOptions o;
  o.v_from_k = true;
  int a = g.attention_ext(q, ks, ks, kMlaV, 0.072f, o);
  g.node(a).ip[1] = static_cast<int32_t>(n_cells);
  g.mark_output(a, "a");
  MOE_NEED_GPU(r, std::move(g));
#ifdef MOEINFER_WITH_CUDA
  KvCache kv(n_cells, 1, KvType::F16, {KvLayerDims{kMlaK, 0}}, *r.gpu);
  moe_bench::FilledCache fc(kv, static_cast<int32_t>(n_cells), T);
  auto qv = randv(static_cast<size_t>(kMlaK * kMlaHeads * T), 3), kvv = randv(static_cast<size_t>(kMlaK * T), 4);
  r.set_input(q, qv.data(), qv.size() * 4);
  r.set_input(k, kvv.data(), kvv.size() * 4);
  ExecEnv env{&fc.ub, &kv};
  time_graph(state, r, env);
  const double flops = 2.0 * (kMlaK + kMlaV) * kMlaHeads * T * (depth + (T + 1) / 2.0);
  state.counters["TFLOP/s"] = benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["kv_GB/s"] = benchmark::Counter(static_cast<double>(kv.bytes()) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
#endif
}

}  // namespace

// type index into kTypes, K, M, columns
BENCHMARK(BM_CudaMatmul)
    ->ArgNames({"type", "K", "M", "N"})
    ->Args({3, kEmbd, kHd * kHeads, 1})          // attn_q Q4_K
    ->Args({3, kHd * kHeads, kEmbd, 1})          // attn_output Q4_K
    ->Args({4, kEmbd, kHd * kKvHeads, 1})        // attn_v Q6_K
    ->Args({0, kEmbd, kExperts, 1})              // router F32
    ->Args({4, kEmbd, 151936, 1})                // LM head Q6_K
    ->Args({1, kEmbd, kHd * kHeads, 1})          // F16
    ->Args({2, kEmbd, kHd * kHeads, 1})          // Q8_0
    ->Args({5, 2880, 2880, 1})                   // MXFP4 (gpt-oss width)
    ->Args({3, kEmbd, kHd * kHeads, 512})        // prefill attn_q Q4_K
    ->Args({3, kHd * kHeads, kEmbd, 512})        // prefill attn_output Q4_K
    ->Args({4, kEmbd, kHd * kKvHeads, 512})      // prefill attn_v Q6_K
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime();
// type index into kTypes, K, M, input rows per token (1 or used), tokens, experts, used
BENCHMARK(BM_CudaMatmulId)
    ->ArgNames({"type", "K", "M", "X", "T", "E", "used"})
    ->Args({3, kEmbd, kFf, 1, 512, kExperts, kUsed})        // gate / up Q4_K
    ->Args({3, kFf, kEmbd, kUsed, 512, kExperts, kUsed})    // down Q4_K
    ->Args({4, kFf, kEmbd, kUsed, 512, kExperts, kUsed})    // down Q6_K
    ->Args({5, 2880, 2880, 1, 512, 32, 4})                  // gpt-oss-20b gate / up MXFP4
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime();

BENCHMARK(BM_CudaExpertMatvec)->ArgNames({"down"})->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseManualTime();
BENCHMARK(BM_CudaMoeLayer)->ArgNames({"batch"})->Arg(1)->Arg(512)->Unit(benchmark::kMicrosecond)->UseManualTime();
// Decode (1 token) and prefill (512) at a short and a deep cache.
static void attention_args(benchmark::internal::Benchmark *b) {
  b->ArgNames({"tokens", "depth"})->Args({1, 512})->Args({1, 4096})->Args({512, 0})->Args({512, 4096});
  b->Unit(benchmark::kMicrosecond)->UseManualTime();
}
// The grouped decode kernel across its range counts (depth 128: 2 ranges, 512: 8, 4096: 64),
// a Q8_0 cache, 4 tokens; then prefill.
static void gqa_attention_args(benchmark::internal::Benchmark *b) {
  b->ArgNames({"tokens", "depth", "q8_0"})->Args({1, 128, 0})->Args({1, 512, 0})->Args({1, 4096, 0})->Args({1, 512, 1})->Args({4, 512, 0});
  b->Args({512, 0, 0})->Args({512, 4096, 0})->Unit(benchmark::kMicrosecond)->UseManualTime();
}
BENCHMARK(BM_CudaAttention)->Apply(gqa_attention_args);
BENCHMARK(BM_CudaMlaAttention)->Apply(attention_args);
