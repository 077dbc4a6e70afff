// The twelve extra weight types on CUDA (Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS,
// IQ2_S, IQ2_XS, IQ2_XXS, IQ1_S, IQ1_M: src/backends/cuda/ops/quant_extra.h) against the CPU
// backend on random weights written by our quantizers and random activations: GetRows, the
// one-token mat-vec, small batches, prompt products (the int8 tensor-core MMQ and cuBLAS),
// MatMulId over several experts (dp4a and MMQ), the MMQ's staging decoded back to weights, the
// paths of older GPUs (emulated), MatMulHeads; a type without a kernel refused at compile time;
// synthetic models in these mixes decoding the same greedy tokens as on the CPU.
// Without a CUDA build or device every case WARNs and returns (tags [cuda][newtypes]).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <map>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "engine/engine.h"
#include "graph/compiler.h"
#include "model/synth/synth_model.h"
#include "support/device_graph.h"
#include "support/fusion_runs.h"
#include "support/graph_runner.h"
#include "support/greedy_run.h"
#include "support/random_data.h"
#include "support/temp_files.h"
#include "support/tiny_model.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_fusion.h"
#include "backends/cuda/cuda_paths.h"
#include "backends/cuda/ops/matmul_mma.h"
#endif

using namespace moe;
using moe_test::gpu_or_skip;
using moe_test::in;
using moe_test::Input;
using moe_test::randn;
using moe_test::rel_err;
using moe_test::run_on;
using moe_test::WeightStore;

namespace {

const DType kNewTypes[] = {DType::Q4_1,   DType::Q5_0,    DType::Q5_1,  DType::IQ4_NL, DType::IQ4_XS,  DType::IQ3_S,
                           DType::IQ3_XXS, DType::IQ2_S, DType::IQ2_XS, DType::IQ2_XXS, DType::IQ1_S, DType::IQ1_M};

// Rows of 3 blocks (an odd count of 32-value blocks, or 3 super-blocks), or longer ones.
int64_t k_for(DType t, bool longer) {
  if (type_traits(t).block_size == 256) return longer ? 2048 : 768;
  return longer ? 2048 + 32 : 96;
}

// The products agree with the CPU's to float rounding: both round the activations into the
// same Q8 blocks (Q8_1, Q8_0 or Q8_K: the type's vec_dot_type) and sum exact integer products
// per block; only the order of the float sums differs. cuBLAS's f16 path: f16 rounding (2e-3,
// as the K-quants' cuBLAS test in test_cuda_ops.cpp).
constexpr double kIntTol = 1e-4, kBlasTol = 2e-3;

// blas_min: the context option GpuTuning::blas_min_tokens of the GPU run (0: never cuBLAS).
double dense_err(BackendRegistry &reg, Backend &gpu, DType t, int64_t K, int64_t M, int64_t N, uint32_t seed,
                 int blas_min = kGpuBlasMinTokens) {
  WeightStore ws;
  const GgufTensorInfo *w = ws.add("w", t, {K, M}, randn(static_cast<size_t>(K * M), seed, 0.5f));
  auto build = [&](int &x, int &y) {
    Graph g;
    x = g.input("x", DType::F32, {K, N});
    y = g.matmul(g.weight(w), x);
    g.mark_output(y, "y");
    return g;
  };
  const auto xv = randn(static_cast<size_t>(K * N), seed + 1);
  int x, y;
  Graph gc = build(x, y), gg = build(x, y);
  const auto r_cpu = run_on(*reg.cpu(), std::move(gc), {in(x, xv)}, {y});
  GpuTuning tuning;
  tuning.blas_min_tokens = blas_min;
  const auto r_gpu = run_on(gpu, std::move(gg), {in(x, xv)}, {y}, {}, 1, tuning);
  const double e = rel_err(r_gpu[0], r_cpu[0]);
  UNSCOPED_INFO("relative error " << e);
  return e;
}

double moe_err(BackendRegistry &reg, Backend &gpu, DType t, int64_t K, int64_t M, int64_t E, int64_t k, int64_t T, int64_t X,
               uint32_t seed) {
  WeightStore ws;
  const GgufTensorInfo *w = ws.add("experts", t, {K, M, E}, randn(static_cast<size_t>(K * M * E), seed, 0.3f));
  std::mt19937 rng(seed);  // k distinct experts per token
  std::vector<int32_t> ids(static_cast<size_t>(k * T)), order(static_cast<size_t>(E));
  for (int64_t tk = 0; tk < T; ++tk) {
    for (int64_t i = 0; i < E; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t j = 0; j < k; ++j) ids[static_cast<size_t>(tk * k + j)] = order[static_cast<size_t>(j)];
  }
  auto build = [&](int &x, int &id, int &y) {
    Graph g;
    x = g.input("x", DType::F32, {K, X, T});
    id = g.input("ids", DType::I32, {k, T});
    y = g.matmul_id(g.weight(w), x, id);
    g.mark_output(y, "y");
    return g;
  };
  const auto xv = randn(static_cast<size_t>(K * X * T), seed + 1);
  int x, id, y;
  Graph gc = build(x, id, y), gg = build(x, id, y);
  const auto r_cpu = run_on(*reg.cpu(), std::move(gc), {in(x, xv), in(id, ids)}, {y});
  const auto r_gpu = run_on(gpu, std::move(gg), {in(x, xv), in(id, ids)}, {y});
  const double e = rel_err(r_gpu[0], r_cpu[0]);
  UNSCOPED_INFO("relative error " << e);
  return e;
}

}  // namespace

TEST_CASE("cuda new types: get_rows equals the CPU's dequantized rows", "[cuda][newtypes]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  for (DType t : kNewTypes)
    for (bool longer : {false, true}) {
      const int64_t K = k_for(t, longer), rows = 11;
      WeightStore ws;
      const GgufTensorInfo *tab = ws.add("tab", t, {K, rows}, randn(static_cast<size_t>(K * rows), 12));
      int ids, y;
      auto build = [&]() {
        Graph g;
        ids = g.input("ids", DType::I32, {5});
        y = g.get_rows(g.weight(tab), ids);
        g.mark_output(y, "y");
        return g;
      };
      const std::vector<int32_t> iv = {10, 0, 3, 3, 7};
      Graph gc = build(), gg = build();
      const auto rc = run_on(*reg.cpu(), std::move(gc), {in(ids, iv)}, {y});
      const auto rg = run_on(*gpu, std::move(gg), {in(ids, iv)}, {y});
      INFO("get_rows " << dtype_name(t) << " K=" << K);
      CHECK(rg[0] == rc[0]);  // the same float operations as the CPU's dequantize_row
    }
}

TEST_CASE("cuda new types: matmul at 1 token and small batches (integer kernel) matches the CPU", "[cuda][newtypes]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 1;
  for (DType t : kNewTypes)
    for (bool longer : {false, true})
      for (int64_t N : {1, 2, 5, 8, 15}) {  // below kMmaMinCols: the dp4a kernel on every device
        const int64_t K = k_for(t, longer), M = longer ? 256 : 37;
        INFO("type " << dtype_name(t) << " K=" << K << " M=" << M << " N=" << N);
        CHECK(dense_err(reg, *gpu, t, K, M, N, seed, 0) < kIntTol);  // 0: every column count on the integer kernel
        seed += 2;
      }
}

// Dense prompts without cuBLAS (blas min 0): on sm_80+ the int8 tensor-core MMQ (partial row,
// column and K tiles; 300 columns: 5 column tiles; K split where the grid is small), else the
// dp4a kernel. The same tolerance as the integer kernel: the same integers, the CPU's float
// steps per block, another order of the block sums.
TEST_CASE("cuda new types: prompt products (16, 77, 300 columns) on the int8 MMQ match the CPU", "[cuda][newtypes][mmq]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 1100;
  for (DType t : kNewTypes)
    for (bool longer : {false, true})
      for (int64_t N : {16, 77, 300}) {
        const int64_t K = k_for(t, longer), M = longer ? 256 : 203;
        INFO("type " << dtype_name(t) << " K=" << K << " M=" << M << " N=" << N);
        CHECK(dense_err(reg, *gpu, t, K, M, N, seed, 0) < kIntTol);
        seed += 2;
      }
}

// MatMulId at prompt sizes (64 and 100 tokens of 3 experts among 6: every expert repeated by
// many tokens, tiles full, wide and narrow; X = 3: one activation row per slot) on the MMQ.
TEST_CASE("cuda new types: matmul_id at 64 and 100 tokens on the int8 MMQ matches the CPU", "[cuda][newtypes][mmq]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 1300;
  for (DType t : kNewTypes)
    for (int64_t T : {64, 100})
      for (int64_t X : {int64_t(1), int64_t(3)}) {
        const int64_t K = k_for(t, T == 100), M = 130, E = 6, k = 3;
        INFO("type " << dtype_name(t) << " K=" << K << " T=" << T << " X=" << X);
        CHECK(moe_err(reg, *gpu, t, K, M, E, k, T, X, seed++) < kIntTol);
      }
}

// The MMQ's staging of each sub-block (int8 integers, integer scales, (d k, m)) decoded back to
// weights on the device equals the CPU's dequantize_row, on rows our quantizers wrote with
// scales varied per 256 values.
TEST_CASE("cuda new types: the int8 MMQ staging decodes to the CPU's dequantized weights", "[cuda][newtypes][mmq]") {
  BackendRegistry reg;
  if (!gpu_or_skip(reg)) return;
#ifdef MOEINFER_WITH_CUDA
  const int64_t K = 2048;
  const int n_sub = static_cast<int>(K / 32);
  uint32_t seed = 1500;
  for (DType t : kNewTypes) {
    std::vector<float> x = randn(static_cast<size_t>(K), seed++);
    for (int64_t i = 0; i < K; ++i) x[static_cast<size_t>(i)] *= std::ldexp(1.0f, static_cast<int>((i / 256) % 7) - 3);
    std::vector<uint8_t> row(row_size(t, K));
    quantize_row(t, x.data(), row.data(), K);
    std::vector<float> ref(static_cast<size_t>(K)), staged(static_cast<size_t>(K));
    dequantize_row(t, row.data(), ref.data(), K);
    uint8_t *d_row = nullptr;
    float *d_w = nullptr, *d_ab = nullptr, *d_st = nullptr;
    int *d_q = nullptr;
    REQUIRE(cudaMalloc(&d_row, row.size()) == cudaSuccess);
    REQUIRE(cudaMalloc(&d_w, static_cast<size_t>(K) * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&d_q, static_cast<size_t>(K) * sizeof(int)) == cudaSuccess);
    REQUIRE(cudaMalloc(&d_ab, static_cast<size_t>(4 * n_sub) * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&d_st, static_cast<size_t>(K) * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemcpy(d_row, row.data(), row.size(), cudaMemcpyHostToDevice) == cudaSuccess);
    cuda_i8_unpack_check_launch(t, d_row, n_sub, d_w, d_q, d_ab, d_st, nullptr);
    REQUIRE(cudaMemcpy(staged.data(), d_st, static_cast<size_t>(K) * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    for (void *p : {static_cast<void *>(d_row), static_cast<void *>(d_w), static_cast<void *>(d_q), static_cast<void *>(d_ab),
                    static_cast<void *>(d_st)})
      cudaFree(p);
    int bad = 0;
    for (int s = 0; s < n_sub; ++s) {
      double scale = 0;
      for (int l = 0; l < 32; ++l) scale = std::max(scale, std::fabs(double(ref[static_cast<size_t>(32 * s + l)])));
      for (int l = 0; l < 32; ++l) {
        const size_t i = static_cast<size_t>(32 * s + l);
        if (!(std::fabs(double(staged[i]) - ref[i]) <= 1e-6 * scale + 1e-30) && bad++ < 3)
          UNSCOPED_INFO("element " << i << ": staged " << staged[i] << ", CPU " << ref[i]);
      }
    }
    INFO("type " << dtype_name(t));
    CHECK(bad == 0);
  }
#endif
}

// sm_75 (no int8 MMQ: prompts stay on the dp4a kernel) and a 99 KB sm_86 (every extra type's
// MMQ kernel must fit its shared memory, the largest at 99,072 + 2,048 bytes) against the CPU.
TEST_CASE("cuda new types: prompts on the paths of older GPUs (sm_75, 99 KB sm_86) match the CPU", "[cuda][newtypes][mmq][paths]") {
#ifdef MOEINFER_WITH_CUDA
  for (const int arch : {75, 86}) {
    BackendRegistry reg("", GpuEmulation{arch, arch == 75 ? 65536 : 101376});  // its CUDA backend takes the older GPU's paths
    Backend *gpu = gpu_or_skip(reg);
    if (!gpu) return;
    const CudaPaths p = static_cast<const CudaBackend *>(gpu)->paths();
    INFO("emulated sm_" << arch);
    REQUIRE(p.device_arch <= arch);
    uint32_t seed = 1700;
    for (DType t : kNewTypes) {
      INFO("type " << dtype_name(t));
      CHECK(cuda_mmq_i8_extra_gemm(t, p) == (arch >= 80));
      CHECK(dense_err(reg, *gpu, t, k_for(t, true), 203, 77, seed, 0) < kIntTol);
      CHECK(moe_err(reg, *gpu, t, k_for(t, true), 130, 6, 3, 100, 1, seed + 1) < kIntTol);
      seed += 2;
    }
  }
#else
  BackendRegistry reg;
  gpu_or_skip(reg);
#endif
}

TEST_CASE("cuda new types: prompt products (>= 128 columns) on cuBLAS over f16 weights", "[cuda][newtypes]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 500;
  for (DType t : kNewTypes)
    for (int64_t N : {129, 300}) {
      const int64_t K = k_for(t, N == 300), M = 203;
      INFO("type " << dtype_name(t) << " K=" << K << " M=" << M << " N=" << N);
      CHECK(dense_err(reg, *gpu, t, K, M, N, seed) < kBlasTol);
      seed += 2;
    }
}

TEST_CASE("cuda new types: matmul_id over several experts (1 token, a few, a prompt) matches the CPU", "[cuda][newtypes][moe]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 100;
  for (DType t : kNewTypes)
    for (int64_t T : {1, 4, 70})
      for (int64_t X : {int64_t(1), int64_t(3)}) {
        const int64_t K = k_for(t, T == 70), M = 45, E = 6, k = 3;
        INFO("type " << dtype_name(t) << " K=" << K << " T=" << T << " X=" << X);
        CHECK(moe_err(reg, *gpu, t, K, M, E, k, T, X, seed++) < kIntTol);
      }
}

TEST_CASE("cuda new types: matmul_heads (MLA's per-head matrices) at 1, 7 and 20 tokens matches the CPU", "[cuda][newtypes][heads]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 700;
  for (DType t : kNewTypes)
    for (int64_t T : {1, 7, 20}) {
      const int64_t K = k_for(t, false), M = 37, H = 5;
      WeightStore ws;
      const GgufTensorInfo *w = ws.add("wh", t, {K, M, H}, randn(static_cast<size_t>(K * M * H), seed, 0.5f));
      int x, y;
      auto build = [&]() {
        Graph g;
        x = g.input("x", DType::F32, {K, H, T});
        y = g.matmul_heads(g.weight(w), x);
        g.mark_output(y, "y");
        return g;
      };
      Graph gc = build(), gg = build();
      const auto xv = randn(static_cast<size_t>(K * H * T), seed + 1);
      const auto hc = run_on(*reg.cpu(), std::move(gc), {in(x, xv)}, {y});
      const auto hg = run_on(*gpu, std::move(gg), {in(x, xv)}, {y});
      INFO("type " << dtype_name(t) << " T=" << T);
      CHECK(rel_err(hg[0], hc[0]) < kIntTol);
      seed += 2;
    }
}

// A weight type the CUDA backend has no kernel for (Q8_1, an activation format) is refused when
// the graph is compiled, with the op and the type in the message, never run with a wrong result.
TEST_CASE("cuda new types: a weight type without a CUDA kernel is refused at compile time, naming op and type", "[cuda][newtypes]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const int64_t K = 64, M = 8;
  WeightStore ws;
  const GgufTensorInfo *w = ws.add("w", DType::Q8_1, {K, M}, randn(static_cast<size_t>(K * M), 3));
  Graph g;
  const int x = g.input("x", DType::F32, {K, 1});
  const int y = g.matmul(g.weight(w), x);
  g.mark_output(y, "y");
  CompileOptions o;
  o.devices = {gpu};
  o.allow_fallback = false;
  std::string msg;
  try {
    compile_graph(std::move(g), o);
  } catch (const Error &e) {
    msg = e.what();
  }
  INFO("message: " << msg);
  CHECK(msg.find("matmul") != std::string::npos);
  CHECK(msg.find("q8_1") != std::string::npos);
}

namespace {

// Greedy decoding of a prompt and 10 steps on the CPU and on CUDA: the same tokens, and the
// prompt's last logits close (F32 KV cache: see test_cuda_ops.cpp's engine test).
void check_model_greedy(const std::string &path, DType type) {
  auto model = Model::load(path, ModelLoadParams{});
  std::map<std::string, std::vector<int32_t>> greedy;
  std::map<std::string, std::vector<float>> first;
  for (const char *dev : {"cpu", "cuda"}) {
    ContextParams cp;
    cp.n_ctx = 64;
    cp.n_threads = 2;
    cp.device = dev;
    cp.kv_type = KvType::F32;
    auto ctx = Context::create(*model, cp);
    const moe_test::GreedyRun run = moe_test::greedy_run(*ctx, {510, 1, 300, 42, 77, 5, 9, 100}, 10);
    first[dev] = run.first_logits;
    greedy[dev] = run.ids;
  }
  INFO("model " << path << " type " << dtype_name(type));
  CHECK(greedy["cuda"] == greedy["cpu"]);
  std::vector<uint8_t> a(first["cuda"].size() * 4), b(a.size());
  std::memcpy(a.data(), first["cuda"].data(), a.size());
  std::memcpy(b.data(), first["cpu"].data(), b.size());
  CHECK(rel_err(a, b) < 1e-3);
}

}  // namespace

TEST_CASE("cuda new types: tiny models in the 32-value mixes decode the CPU's greedy tokens", "[cuda][newtypes][engine]") {
  BackendRegistry reg;
  if (!gpu_or_skip(reg)) return;
  for (const char *mix : {"q4_1", "q5_0", "q5_1", "iq4_nl"}) {
    DType type = DType::F32;
    REQUIRE(dtype_from_name(mix, &type));
    check_model_greedy(moe_test::tiny_model(mix), type);  // experts and the embedding in the mix's type
  }
  // deepseek2 (MLA): its per-head k_b / v_b are MatMulHeads in the mix's type.
  for (const char *mix : {"q4_1", "q5_0"}) {
    DType type = DType::F32;
    REQUIRE(dtype_from_name(mix, &type));
    const std::string path = moe_test::temp_name(std::string("tiny-deepseek2-") + mix + ".gguf");
    SynthSpec spec;
    spec.preset = "tiny-deepseek2";
    spec.type_mix = mix;
    spec.seed = 5;
    write_synthetic_model(spec, path);
    moe_test::remove_at_exit(path);
    check_model_greedy(path, type);
  }
}

TEST_CASE("cuda new types: small models (rows of 256) in the i-quant mixes decode the CPU's greedy tokens", "[cuda][newtypes][engine]") {
  BackendRegistry reg;
  if (!gpu_or_skip(reg)) return;
  // Two layers keep the i-quant search that writes the files short.
  for (const char *mix : {"iq4_xs", "iq3_s", "iq3_xxs", "iq2_s", "iq2_xs", "iq2_xxs", "iq1_s", "iq1_m"}) {
    DType type = DType::F32;
    REQUIRE(dtype_from_name(mix, &type));
    const std::string path = moe_test::temp_name(std::string("small2-") + mix + ".gguf");
    SynthSpec spec;
    spec.preset = "small";
    spec.type_mix = mix;
    spec.seed = 5;
    spec.n_layer = 2;
    write_synthetic_model(spec, path);
    moe_test::remove_at_exit(path);
    check_model_greedy(path, type);
  }
}

#ifdef MOEINFER_WITH_CUDA
namespace {

// The one-token decode groups of the extra types (cuda_fusion.h; quant_extra.h's
// cuda_extra_fused_*): gate/up MatMulId + SwiGLU, dense gate/up MatMul x2 + SwiGLU, down
// MatMulId + MoeCombine + Add, MatMul + Add, three MatMuls of one activation (q, k, v).
enum class FusedShape { GateUp, DenseGateUp, DownAdd, MatMulAdd, Qkv };

const char *fused_label(FusedShape shape) {
  switch (shape) {
    case FusedShape::GateUp: return "fused:matmul_id+matmul_id+swiglu";
    case FusedShape::DenseGateUp: return "fused:matmul+matmul+swiglu";
    case FusedShape::Qkv: return "fused:matmul+matmul+matmul";
    case FusedShape::DownAdd: return "fused:matmul_id+moe_combine+add";
    default: return "fused:matmul+add";
  }
}

// A group's graph over weights written once by our quantizers (E = 6 experts of K x M, or one
// K x M matrix); its inputs are random except the ids (one slot each; the down's activation
// has a row per slot).
struct FusedCase {
  FusedShape shape;
  int64_t K, M, k;
  std::vector<const GgufTensorInfo *> w;
  std::vector<Input> ins;
  int out = -1, ids = -1;
  std::vector<int> more;  // Qkv: q and k (out: v)

  FusedCase(FusedShape s, WeightStore &ws, DType t, int64_t K_, int64_t M_, int64_t k_, uint32_t seed) : shape(s), K(K_), M(M_), k(k_) {
    const bool dense = s == FusedShape::MatMulAdd || s == FusedShape::DenseGateUp || s == FusedShape::Qkv;
    const int64_t E = 6, n = dense ? K * M : K * M * E;
    const std::vector<int64_t> ne = dense ? std::vector<int64_t>{K, M} : std::vector<int64_t>{K, M, E};
    w.push_back(ws.add("w0", t, ne, randn(static_cast<size_t>(n), seed, 0.3f)));
    if (s == FusedShape::GateUp || s == FusedShape::DenseGateUp || s == FusedShape::Qkv)
      w.push_back(ws.add("w1", t, ne, randn(static_cast<size_t>(n), seed + 1, 0.3f)));
    if (s == FusedShape::Qkv) w.push_back(ws.add("w2", t, {K, M - 13}, randn(static_cast<size_t>(K * (M - 13)), seed + 4, 0.3f)));
    (void)graph(seed);  // the input nodes' ids
  }
  // The graph; the first call also makes the inputs from seed.
  Graph graph(uint32_t seed = 0) {
    Graph g;
    const bool first = ins.empty();
    auto input = [&](const char *name, DType dt, std::vector<int64_t> ne, std::vector<float> v) {
      const int id = g.input(name, dt, ne);
      if (first && dt == DType::F32) ins.push_back(in(id, v));
      return id;
    };
    if (shape == FusedShape::MatMulAdd) {
      const int x = input("x", DType::F32, {K, 1}, randn(static_cast<size_t>(K), seed + 2));
      const int r = input("r", DType::F32, {M, 1}, randn(static_cast<size_t>(M), seed + 3));
      out = g.add(g.matmul(g.weight(w[0]), x), r);
    } else if (shape == FusedShape::Qkv) {  // (one output: the three products side by side in a Concat would be another group)
      const int x = input("x", DType::F32, {K, 1}, randn(static_cast<size_t>(K), seed + 2));
      const int q = g.matmul(g.weight(w[0]), x), k_ = g.matmul(g.weight(w[1]), x), v = g.matmul(g.weight(w[2]), x);
      g.mark_output(q, "q");
      g.mark_output(k_, "k");
      more = {q, k_};
      out = v;
    } else if (shape == FusedShape::DenseGateUp) {
      const int x = input("x", DType::F32, {K, 1}, randn(static_cast<size_t>(K), seed + 2));
      out = g.swiglu(g.matmul(g.weight(w[0]), x), g.matmul(g.weight(w[1]), x));
    } else if (shape == FusedShape::GateUp) {
      const int x = input("x", DType::F32, {K, 1, 1}, randn(static_cast<size_t>(K), seed + 2));
      ids = input("ids", DType::I32, {k, 1}, {});
      out = g.swiglu(g.matmul_id(g.weight(w[0]), x, ids), g.matmul_id(g.weight(w[1]), x, ids));
    } else {
      std::vector<float> wv(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j) wv[static_cast<size_t>(j)] = 0.2f + 0.3f * static_cast<float>(j);
      const int act = input("act", DType::F32, {K, k, 1}, randn(static_cast<size_t>(K * k), seed + 2));
      ids = input("ids", DType::I32, {k, 1}, {});
      const int wts = input("weights", DType::F32, {k, 1}, wv);
      const int r = input("r", DType::F32, {M, 1}, randn(static_cast<size_t>(M), seed + 3));
      out = g.add(g.moe_combine(g.matmul_id(g.weight(w[0]), act, ids), wts), r);
    }
    g.mark_output(out, "y");
    return g;
  }
  std::vector<Input> inputs(const std::vector<int32_t> &id) const {
    std::vector<Input> v = ins;
    if (ids >= 0) v.push_back(in(ids, id));
    return v;
  }
};

// The graph's fusion plan on gpu holds the shape's group.
bool plans_group(Backend &gpu, Graph g, FusedShape shape) {
  for (const FusedGroup &grp : moe_test::plan_on(gpu, std::move(g)).groups)
    if (grp.label == fused_label(shape)) return true;
  return false;
}

}  // namespace
#endif

TEST_CASE("cuda new types: one-token decode groups in one launch equal the unfused kernels bit for bit and the CPU", "[cuda][newtypes][fused]") {
#ifdef MOEINFER_WITH_CUDA
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 900;
  const std::vector<int32_t> ids = {4, 0, 5};
  for (DType t : kNewTypes)
    for (FusedShape shape : {FusedShape::GateUp, FusedShape::DenseGateUp, FusedShape::DownAdd, FusedShape::MatMulAdd, FusedShape::Qkv})
      for (bool longer : {false, true}) {
        const int64_t K = k_for(t, longer), M = longer ? 77 : 45;
        INFO("type " << dtype_name(t) << " group " << fused_label(shape) << " K=" << K << " M=" << M);
        WeightStore ws;
        FusedCase fc(shape, ws, t, K, M, static_cast<int64_t>(ids.size()), seed++);
        const auto ins = fc.inputs(ids);
        std::vector<int> outs = {fc.out};
        outs.insert(outs.end(), fc.more.begin(), fc.more.end());
        const auto r_cpu = run_on(*reg.cpu(), fc.graph(), ins, outs);
        CHECK(plans_group(*gpu, fc.graph(), shape));
        const moe_test::FusedRun fused = moe_test::run_gpu(*gpu, fc.graph(), ins, outs, ExecEnv{}, true);
        const moe_test::FusedRun unfused = moe_test::run_gpu(*gpu, fc.graph(), ins, outs, ExecEnv{}, false);
        const auto &r_f = fused.out, &r_u = unfused.out;
        CHECK(fused.launches < unfused.launches);  // one launch for the group (unfused: rounding, dots, SwiGLU / combine / Add)
        for (size_t o = 0; o < outs.size(); ++o) {
          INFO("output " << o);
          CHECK(r_f[o] == r_u[o]);  // bit for bit
          const double e = rel_err(r_f[o], r_cpu[o]);
          INFO("relative error vs the CPU " << e);
          CHECK(e < kIntTol);
        }
      }
#endif
}

TEST_CASE("cuda new types: an expert id out of range in a fused decode group is reported, not a crash", "[cuda][newtypes][fused]") {
#ifdef MOEINFER_WITH_CUDA
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  for (DType t : {DType::Q4_1, DType::IQ4_XS, DType::IQ2_XS})
    for (FusedShape shape : {FusedShape::GateUp, FusedShape::DownAdd}) {
      INFO("type " << dtype_name(t) << " group " << fused_label(shape));
      WeightStore ws;
      FusedCase fc(shape, ws, t, k_for(t, false), 45, 3, 950);
      CHECK(plans_group(*gpu, fc.graph(), shape));
      moe_test::BoundGraph bg(*gpu, fc.graph());
      const std::string msg = moe_test::error_after_run(bg, fc.inputs({4, 9, 5}), fc.out);
      UNSCOPED_INFO("message: " << msg);
      CHECK(msg.find("MatMulId") != std::string::npos);
      CHECK(msg.find("index 9 outside [0, 6)") != std::string::npos);
      for (const float v : moe_test::as_f32(bg.read(fc.out))) CHECK(std::isfinite(v));  // the bad slot: zeros / no contribution
      CHECK(moe_test::error_after_run(bg, fc.inputs({4, 2, 5}), fc.out).empty());  // the next pass, good ids: no report
    }
#endif
}
