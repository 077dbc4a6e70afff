// Decode mat-vec on CUDA (ops/matvec.cu) against the CPU ops on random inputs: one-token
// MatMul / MatMulId through the executor (long rows that take several chunks, many rows),
// and the fused launchers (MatMul + Add, gate/up + SwiGLU, down + MoeCombine [+ Add])
// called directly on device copies of a graph's tensors, compared with the unfused CPU
// sequence. Every weight type; odd row counts; 1, 2 and 8 experts per token; duplicate and
// out-of-range expert ids. Without a CUDA build or device every case WARNs and returns.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "support/device_graph.h"
#include "support/graph_runner.h"
#include "support/random_data.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_ops.h"
#endif

using namespace moe;
using moe_test::as_f32;
using moe_test::gpu_or_skip;
using moe_test::in;
using moe_test::rel_err;
using moe_test::run_on;
using moe_test::randn;
using moe_test::WeightStore;

namespace {

const DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q8_0, DType::Q2_K,
                        DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4};

// Row lengths: short (one partial chunk) and long (several chunks, the last partial). F16
// stays below 128: the CPU's one-token F16 dot accumulates in half precision from there.
int64_t short_k(DType t) {
  const int64_t b = type_traits(t).block_size;
  return b == 256 ? 768 : b == 32 ? 96 : 37;
}
int64_t long_k(DType t) {
  const int64_t b = type_traits(t).block_size;
  return b == 256 ? 2304 : b == 32 ? 2080 : t == DType::F16 ? 120 : 2056;
}
int64_t longer_k(DType t) {  // more than two 2048-element chunks
  const int64_t b = type_traits(t).block_size;
  return b == 256 ? 4352 : b == 32 ? 4160 : t == DType::F16 ? 112 : 4104;
}
// An even number of blocks, halves longer than a 2048-element chunk: with few rows the
// quantized mat-vec takes one row per warp in two K halves.
int64_t even_k(DType t) {
  const int64_t b = type_traits(t).block_size;
  return b == 256 ? 4608 : b == 32 ? 4224 : t == DType::F16 ? 96 : 4096;
}

// Types whose one-token products fold in the CPU's reference order (ops/matvec_ref_order.cuh,
// F32: ref_math.cuh): CUDA must give the CPU's bits, not just its values to rounding.
bool ref_exact(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q8_0 || t == DType::F32; }

// max |gpu - cpu| / max |cpu| of raw f32 outputs (max_rel_diff): a final output (the LM head)
// in CUDA's own order differs from the CPU's order by float rounding of the sums only (~1e-7
// of the largest value; kOwnOrderTol allowed).
double max_rel_diff(const std::vector<uint8_t> &gpu, const std::vector<uint8_t> &cpu) {
  const double r = moe_test::max_rel_diff(as_f32(gpu), as_f32(cpu));
  UNSCOPED_INFO("max |gpu - cpu| / max |cpu| " << r);
  return r;
}
constexpr double kOwnOrderTol = 1e-5;

}  // namespace

TEST_CASE("cuda mat-vec: Q4_K / Q5_K / Q6_K / Q8_0 one-token products are bit-identical with the CPU", "[ops][cuda][reforder]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const GpuTuning cpu_order = moe_test::cpu_order_final_outputs();  // the outputs are the products themselves
  uint32_t seed = 700;
  // (K, M): Q4_K's plain vec_dot order (M % 8 != 0) and its repacked gemv order (M % 8 == 0);
  // one, several and partial chunks; 2048 x 4096 takes K halves (each half one chunk).
  const int64_t shapes[][2] = {{768, 37}, {768, 40}, {2304, 301}, {4096, 2048}, {4352, 2200}, {4096, 40}};
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0})
    for (const auto &sh : shapes) {
      const int64_t K = sh[0], M = sh[1], Me = M > 400 ? 48 : M;  // experts: fewer rows (quantizing them is slow)
      WeightStore ws;
      const GgufTensorInfo *w = ws.add("w", t, {K, M}, randn(static_cast<size_t>(K * M), seed++, 0.5f));
      const GgufTensorInfo *we = ws.add("e", t, {K, Me, 5}, randn(static_cast<size_t>(K * Me * 5), seed++, 0.5f));
      auto build = [&](int &x, int &xs, int &ids, int &y, int &ye, int &ye1) {
        Graph g;
        x = g.input("x", DType::F32, {K, 1});
        xs = g.input("xs", DType::F32, {K, 3, 1});
        ids = g.input("ids", DType::I32, {3, 1});
        y = g.matmul(g.weight(w), x);
        ye = g.matmul_id(g.weight(we), xs, ids);  // one activation per expert slot
        ye1 = g.matmul_id(g.weight(we), x, ids);  // one shared activation
        g.mark_output(y, "y");
        g.mark_output(ye, "ye");
        g.mark_output(ye1, "ye1");
        return g;
      };
      auto xv = randn(static_cast<size_t>(K), seed++), xsv = randn(static_cast<size_t>(K * 3), seed++);
      const std::vector<int32_t> idv = {4, 1, 3};
      int x, xs, ids, y, ye, ye1;
      Graph gc = build(x, xs, ids, y, ye, ye1), gg = build(x, xs, ids, y, ye, ye1);
      const std::vector<moe_test::Input> inputs = {in(x, xv), in(xs, xsv), in(ids, idv)};
      auto r_cpu = run_on(*reg.cpu(), std::move(gc), inputs, {y, ye, ye1});
      auto r_gpu = run_on(*gpu, std::move(gg), inputs, {y, ye, ye1}, {}, 1, cpu_order);
      INFO("type " << dtype_name(t) << " K=" << K << " M=" << M);
      CHECK(r_gpu[0] == r_cpu[0]);
      CHECK(r_gpu[1] == r_cpu[1]);
      CHECK(r_gpu[2] == r_cpu[2]);
    }
}

TEST_CASE("graph compiler: final_output marks the outputs that no node reads", "[graph]") {
  BackendRegistry reg;
  WeightStore ws;
  const GgufTensorInfo *w = ws.add("w", DType::F32, {64, 8}, randn(64 * 8, 5, 0.5f));
  Graph g;
  const int x = g.input("x", DType::F32, {64, 1});
  const int y = g.matmul(g.weight(w), x);     // read by z: not final
  const int z = g.scale(y, 2.0f);             // final
  const int h = g.matmul(g.weight(w), x);     // final (the LM head's shape)
  const int u = g.matmul(g.weight(w), x);     // not an output
  g.mark_output(y, "y");
  g.mark_output(z, "z");
  g.mark_output(h, "h");
  CompileOptions o;
  o.devices = {reg.cpu()};
  auto plan = compile_graph(std::move(g), o);
  CHECK_FALSE(plan->graph.node(y).final_output);
  CHECK(plan->graph.node(z).final_output);
  CHECK(plan->graph.node(h).final_output);
  CHECK_FALSE(plan->graph.node(u).final_output);
  CHECK_FALSE(plan->graph.node(x).final_output);
}

// The LM head (a product whose output no node reads) in CUDA's own order at every batch size:
// one token (matvec_rows8_kernel's own-order instances), 2..15 columns (the f32 tile kernel),
// 16+ (tensor cores). Within kOwnOrderTol of the CPU's largest value for the types whose
// order changes, the usual tolerance for the others (their paths are unchanged). The same
// product read by another node keeps the CPU's bits.
TEST_CASE("cuda LM head: a final output takes CUDA's own order, within 1e-5 of the largest value, every type", "[ops][cuda][lmhead]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 950;
  for (DType t : kTypes)
    for (int shape = 0; shape < 2; ++shape) {
      // Many rows of a hidden-size K (row pairs per warp), few rows of an even block count (K halves).
      const int64_t K = shape == 0 ? long_k(t) : even_k(t), M = shape == 0 ? 3001 : 301;
      WeightStore ws;
      const GgufTensorInfo *w = ws.add("w", t, {K, M}, randn(static_cast<size_t>(K * M), seed++, 0.5f));
      for (int64_t N : {1, 2, 5, 17, 40}) {
        auto build = [&](int &x, int &y, int &yr, int &c) {
          Graph g;
          x = g.input("x", DType::F32, {K, N});
          y = g.matmul(g.weight(w), x);              // final
          yr = g.matmul(g.weight(w), g.copy(x));     // read by c: the CPU's order (its own activation: no MatVecs group with y)
          c = g.copy(yr);
          g.mark_output(y, "y");
          g.mark_output(yr, "yr");
          g.mark_output(c, "c");
          return g;
        };
        auto xv = randn(static_cast<size_t>(K * N), seed++);
        int x, y, yr, c;
        Graph gc = build(x, y, yr, c), gg = build(x, y, yr, c);
        auto r_cpu = run_on(*reg.cpu(), std::move(gc), {in(x, xv)}, {y, yr});
        auto r_gpu = run_on(*gpu, std::move(gg), {in(x, xv)}, {y, yr});
        INFO("type " << dtype_name(t) << " K=" << K << " M=" << M << " N=" << N);
        CHECK(rel_err(r_gpu[0], r_cpu[0]) < 1e-4);
        if (ref_exact(t)) {
          CHECK(max_rel_diff(r_gpu[0], r_cpu[0]) < kOwnOrderTol);
          CHECK(r_gpu[1] == r_cpu[1]);  // (up to kRefOrderMaxTokens columns keep the CPU's order)
        }
      }
    }
}

TEST_CASE("cuda matmul: small batches of Q4_K / Q5_K / Q6_K / Q8_0 are bit-identical with the CPU", "[ops][cuda][reforder]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const GpuTuning cpu_order = moe_test::cpu_order_final_outputs();  // the outputs are the products themselves
  uint32_t seed = 800;
  // Dense 2..kRefOrderMaxTokens columns (Q4_K with rows % 8 == 0: the CPU's gemm order on
  // full groups of 4, gemv on the rest) and MatMulId of as many tokens (matmul_ref_order.cu;
  // 40 and 128 tokens x 3 slots used to take the tensor cores).
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0})
    for (int64_t M : {int64_t(37), int64_t(64)})
      for (int64_t N : {2, 3, 4, 7, 13, 40, 128}) {
        const int64_t K = type_traits(t).block_size == 256 ? 1280 : 1056, E = 5, k = 3;
        WeightStore ws;
        const GgufTensorInfo *w = ws.add("w", t, {K, M}, randn(static_cast<size_t>(K * M), seed++, 0.5f));
        const GgufTensorInfo *we = ws.add("e", t, {K, M, E}, randn(static_cast<size_t>(K * M * E), seed++, 0.5f));
        auto build = [&](int &x, int &ids, int &y, int &ye) {
          Graph g;
          x = g.input("x", DType::F32, {K, N});
          ids = g.input("ids", DType::I32, {k, N});
          y = g.matmul(g.weight(w), x);
          ye = g.matmul_id(g.weight(we), g.view(x, {K, 1, N}), ids);
          g.mark_output(y, "y");
          g.mark_output(ye, "ye");
          return g;
        };
        auto xv = randn(static_cast<size_t>(K * N), seed++);
        std::vector<int32_t> idv;
        for (int64_t i = 0; i < k * N; ++i) idv.push_back(static_cast<int32_t>((i * 7 + i / k) % E));
        int x, ids, y, ye;
        Graph gc = build(x, ids, y, ye), gg = build(x, ids, y, ye);
        const std::vector<moe_test::Input> inputs = {in(x, xv), in(ids, idv)};
        auto r_cpu = run_on(*reg.cpu(), std::move(gc), inputs, {y, ye});
        auto r_gpu = run_on(*gpu, std::move(gg), inputs, {y, ye}, {}, 1, cpu_order);
        INFO("type " << dtype_name(t) << " K=" << K << " M=" << M << " N=" << N);
        CHECK(r_gpu[0] == r_cpu[0]);
        CHECK(r_gpu[1] == r_cpu[1]);
      }
}

TEST_CASE("cuda matmul: small batches of F32 weights are bit-identical with the CPU", "[ops][cuda][reforder]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const GpuTuning cpu_order = moe_test::cpu_order_final_outputs();  // the outputs are the products themselves
  uint32_t seed = 850;
  // The CPU's batched GEMM order for K % 16 == 0 and M % 4 == 0, its vec_dot order otherwise.
  for (int64_t K : {int64_t(1280), int64_t(100)})
    for (int64_t M : {int64_t(37), int64_t(64)})
      for (int64_t N : {2, 3, 7, 13, 17, 128}) {
        WeightStore ws;
        const GgufTensorInfo *w = ws.add("w", DType::F32, {K, M}, randn(static_cast<size_t>(K * M), seed++, 0.5f));
        auto build = [&](int &x, int &y) {
          Graph g;
          x = g.input("x", DType::F32, {K, N});
          y = g.matmul(g.weight(w), x);
          g.mark_output(y, "y");
          return g;
        };
        auto xv = randn(static_cast<size_t>(K * N), seed++);
        int x, y;
        Graph gc = build(x, y), gg = build(x, y);
        auto r_cpu = run_on(*reg.cpu(), std::move(gc), {in(x, xv)}, {y});
        auto r_gpu = run_on(*gpu, std::move(gg), {in(x, xv)}, {y}, {}, 1, cpu_order);
        INFO("K=" << K << " M=" << M << " N=" << N);
        CHECK(r_gpu[0] == r_cpu[0]);
      }
}

TEST_CASE("cuda softmax: the CPU's bits when rows are 16-element chunks (vector expf, its sum tree)", "[ops][cuda][reforder]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  for (int64_t n : {int64_t(16), int64_t(128), int64_t(160)}) {
    auto xv = randn(static_cast<size_t>(n * 4), 910, 3.0f);
    xv[5] = -INFINITY;  // a masked logit
    auto build = [&](int &x, int &y) {
      Graph g;
      x = g.input("x", DType::F32, {n, 4});
      y = g.softmax(x);
      g.mark_output(y, "y");
      return g;
    };
    int x, y;
    Graph gc = build(x, y), gg = build(x, y);
    auto r_cpu = run_on(*reg.cpu(), std::move(gc), {in(x, xv)}, {y});
    auto r_gpu = run_on(*gpu, std::move(gg), {in(x, xv)}, {y});
    INFO("n " << n);
    CHECK(r_gpu[0] == r_cpu[0]);
  }
}

TEST_CASE("cuda swiglu: the CPU's bits on 16-element chunks (vector silu)", "[ops][cuda][reforder]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  for (int64_t n : {int64_t(48), int64_t(768), int64_t(45)}) {
    auto gv = randn(static_cast<size_t>(n * 3), 900, 4.0f), uv = randn(static_cast<size_t>(n * 3), 901);
    gv[0] = 0.0f;
    gv[1] = -100.0f;  // exp underflow / overflow ends of the vector expf
    gv[2] = 100.0f;
    auto build = [&](int &a, int &b, int &y) {
      Graph g;
      a = g.input("g", DType::F32, {n, 3});
      b = g.input("u", DType::F32, {n, 3});
      y = g.swiglu(a, b);
      g.mark_output(y, "y");
      return g;
    };
    int a, b, y;
    Graph gc = build(a, b, y), gg = build(a, b, y);
    const std::vector<moe_test::Input> inputs = {in(a, gv), in(b, uv)};
    auto r_cpu = as_f32(run_on(*reg.cpu(), std::move(gc), inputs, {y})[0]);
    auto r_gpu = as_f32(run_on(*gpu, std::move(gg), inputs, {y})[0]);
    INFO("n " << n);
    int64_t differ = 0;
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t i = 0; i < (n & ~int64_t{15}); ++i) differ += std::memcmp(&r_cpu[r * n + i], &r_gpu[r * n + i], 4) != 0;
    CHECK(differ == 0);
  }
}

TEST_CASE("cuda mat-vec: one-token matmul and matmul_id, long rows and many rows", "[ops][cuda]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 300;
  for (DType t : kTypes)
    for (int shape = 0; shape < 5; ++shape) {
      // Plain types with few rows split K over a block's warps; 2200 rows take row pairs per
      // warp; quantized ones with few rows and an even block count take K halves (shape 4).
      const int64_t K = shape == 1 ? long_k(t) : shape == 3 ? longer_k(t) : shape == 4 ? even_k(t) : short_k(t),
                    M = shape == 2 ? 2200 : 301;
      WeightStore ws;
      const GgufTensorInfo *w = ws.add("w", t, {K, M}, randn(static_cast<size_t>(K * M), seed++, 0.5f));
      const GgufTensorInfo *we = ws.add("e", t, {K, M, 5}, randn(static_cast<size_t>(K * M * 5), seed++, 0.5f));
      auto build = [&](int &x, int &xs, int &ids, int &y, int &ye) {
        Graph g;
        x = g.input("x", DType::F32, {K, 1});
        xs = g.input("xs", DType::F32, {K, 3, 1});
        ids = g.input("ids", DType::I32, {3, 1});
        y = g.matmul(g.weight(w), x);
        ye = g.matmul_id(g.weight(we), xs, ids);  // one activation per expert slot
        g.mark_output(y, "y");
        g.mark_output(ye, "ye");
        return g;
      };
      auto xv = randn(static_cast<size_t>(K), seed++), xsv = randn(static_cast<size_t>(K * 3), seed++);
      const std::vector<int32_t> idv = {4, 1, 4};
      int x, xs, ids, y, ye;
      Graph gc = build(x, xs, ids, y, ye), gg = build(x, xs, ids, y, ye);
      const std::vector<moe_test::Input> inputs = {in(x, xv), in(xs, xsv), in(ids, idv)};
      auto r_cpu = run_on(*reg.cpu(), std::move(gc), inputs, {y, ye});
      std::vector<std::vector<uint8_t>> r_gpu;
      r_gpu = run_on(*gpu, std::move(gg), inputs, {y, ye}, {}, 1, moe_test::cpu_order_final_outputs());
      // The outputs are final (no node reads them): by default CUDA's own order.
      auto r_own = run_on(*gpu, build(x, xs, ids, y, ye), inputs, {y, ye});
      INFO("type " << dtype_name(t) << " K=" << K << " M=" << M);
      CHECK(rel_err(r_gpu[0], r_cpu[0]) < 1e-4);
      CHECK(rel_err(r_gpu[1], r_cpu[1]) < 1e-4);
      CHECK(rel_err(r_own[0], r_cpu[0]) < 1e-4);
      CHECK(rel_err(r_own[1], r_cpu[1]) < 1e-4);
      if (ref_exact(t)) {
        CHECK(r_gpu[0] == r_cpu[0]);
        CHECK(r_gpu[1] == r_cpu[1]);
        CHECK(max_rel_diff(r_own[0], r_cpu[0]) < kOwnOrderTol);
        CHECK(max_rel_diff(r_own[1], r_cpu[1]) < kOwnOrderTol);
      }
    }
}

#ifdef MOEINFER_WITH_CUDA

namespace {

// Device copies of a graph's tensors for calling a launcher directly: every buffer is
// padded to 256 bytes like DeviceWeights; outputs start as NaN bytes.
class DeviceTensors {
public:
  explicit DeviceTensors(const GpuTuning &t = GpuTuning{}) : tuning_(t) { REQUIRE(cudaStreamCreate(&stream_) == cudaSuccess); }
  ~DeviceTensors() {
    for (void *p : ptrs_) cudaFree(p);
    cudaStreamDestroy(stream_);
  }
  void put(Graph &g, int node, const void *src, size_t n) {
    void *p = nullptr;
    REQUIRE(cudaMalloc(&p, (n + 255) / 256 * 256 + 256) == cudaSuccess);
    ptrs_.push_back(p);
    if (src) REQUIRE(cudaMemcpy(p, src, n, cudaMemcpyHostToDevice) == cudaSuccess);
    else REQUIRE(cudaMemset(p, 0xFF, n) == cudaSuccess);
    g.node(node).data = p;
  }
  void put_weight(Graph &g, int node) { put(g, node, g.node(node).weight->data, g.node(node).weight->nbytes); }
  template <typename T> void put_vec(Graph &g, int node, const std::vector<T> &v) { put(g, node, v.data(), v.size() * sizeof(T)); }
  void put_out(Graph &g, int node) { put(g, node, nullptr, g.node(node).nbytes()); }
  // n_sm: the launchers' multiprocessor count; small values make them put two logical
  // blocks in a thread block (block_groups in matvec.cu: about 2 to 6 logical blocks per SM).
  CudaOpCtx ctx(const Graph &g, int last, int n_sm) const {
    const CudaPaths p = cuda_current_paths();
    return CudaOpCtx{LaunchStream{stream_, false, p.smem_optin}, g, g.node(last), DevUbatch{}, nullptr, n_sm, tuning_, nullptr, p};
  }
  std::vector<uint8_t> get(const Graph &g, int node) {
    REQUIRE(cudaStreamSynchronize(stream_) == cudaSuccess);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    std::vector<uint8_t> b(g.node(node).nbytes());
    REQUIRE(cudaMemcpy(b.data(), g.node(node).data, b.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    return b;
  }

private:
  cudaStream_t stream_ = nullptr;
  GpuTuning tuning_;
  std::vector<void *> ptrs_;
};

// Out-of-range ids on the CPU: the op reports an error, so the reference runs with the
// slot's id replaced by 0 (and, for the combine, its weight by 0).
std::vector<int32_t> valid_ids(std::vector<int32_t> ids, int64_t E) {
  for (auto &e : ids)
    if (e < 0 || e >= E) e = 0;
  return ids;
}

// The GPU's output of x W + r (its bytes; *cpu_err: its relative error to the CPU's).
std::vector<uint8_t> matmul_add_run(Backend &cpu, DType t, int64_t K, int64_t M, bool mm_first, uint32_t seed, int n_sm, const GpuTuning &tuning,
                                    double *cpu_err) {
  WeightStore ws;
  const GgufTensorInfo *w = ws.add("w", t, {K, M}, randn(static_cast<size_t>(K * M), seed, 0.5f));
  int wn, x, r, mm, add;
  auto build = [&] {
    Graph g;
    wn = g.weight(w);
    x = g.input("x", DType::F32, {K, 1});
    r = g.input("r", DType::F32, {M, 1});
    mm = g.matmul(wn, x);
    add = mm_first ? g.add(mm, r) : g.add(r, mm);
    g.mark_output(add, "y");
    return g;
  };
  auto xv = randn(static_cast<size_t>(K), seed + 1), rv = randn(static_cast<size_t>(M), seed + 2);
  Graph gc = build();  // sets the node ids used below
  auto r_cpu = run_on(cpu, std::move(gc), {in(x, xv), in(r, rv)}, {add});
  Graph g = build();
  DeviceTensors d(tuning);
  d.put_weight(g, wn);
  d.put_vec(g, x, xv);
  d.put_vec(g, r, rv);
  d.put_out(g, add);
  cuda_fused_matmul_add(d.ctx(g, add, n_sm), g.node(mm), g.node(add));
  std::vector<uint8_t> got = d.get(g, add);
  *cpu_err = rel_err(got, r_cpu[0]);
  return got;
}
double matmul_add_case(Backend &cpu, DType t, int64_t K, int64_t M, bool mm_first, uint32_t seed, int n_sm) {
  double err = 0;
  matmul_add_run(cpu, t, K, M, mm_first, seed, n_sm, GpuTuning{}, &err);
  return err;
}

// gate/up + SwiGLU; a slot whose id is out of range must come out as zeros.
double gate_up_case(Backend &cpu, DType t, int64_t K, int64_t M, int64_t E, const std::vector<int32_t> &ids, uint32_t seed,
                    int n_sm = 132) {
  const int64_t k = static_cast<int64_t>(ids.size());
  WeightStore ws;
  const GgufTensorInfo *wg = ws.add("gate", t, {K, M, E}, randn(static_cast<size_t>(K * M * E), seed, 0.3f));
  const GgufTensorInfo *wu = ws.add("up", t, {K, M, E}, randn(static_cast<size_t>(K * M * E), seed + 1, 0.3f));
  int gn, un, x, id, gate, up, sw;
  auto build = [&] {
    Graph g;
    gn = g.weight(wg);
    un = g.weight(wu);
    x = g.input("x", DType::F32, {K, 1, 1});
    id = g.input("ids", DType::I32, {k, 1});
    gate = g.matmul_id(gn, x, id);
    up = g.matmul_id(un, x, id);
    sw = g.swiglu(gate, up);
    g.mark_output(sw, "y");
    return g;
  };
  auto xv = randn(static_cast<size_t>(K), seed + 2);
  Graph gc = build();  // sets the node ids used below
  auto r_cpu = run_on(cpu, std::move(gc), {in(x, xv), in(id, valid_ids(ids, E))}, {sw});
  Graph g = build();
  DeviceTensors d;
  d.put_weight(g, gn);
  d.put_weight(g, un);
  d.put_vec(g, x, xv);
  d.put_vec(g, id, ids);
  d.put_out(g, sw);
  cuda_fused_gate_up_swiglu(d.ctx(g, sw, n_sm), g.node(up), g.node(gate), g.node(sw));
  auto got = as_f32(d.get(g, sw)), want = as_f32(r_cpu[0]);
  double num = 0, den = 0;
  for (int64_t j = 0; j < k; ++j)
    for (int64_t i = 0; i < M; ++i) {
      const double a = got[static_cast<size_t>(j * M + i)], b = want[static_cast<size_t>(j * M + i)];
      if (ids[static_cast<size_t>(j)] < 0 || ids[static_cast<size_t>(j)] >= E) {
        if (a != 0.0) return 1e30;  // an out-of-range expert's slot is zero
        continue;
      }
      if (!std::isfinite(a)) return 1e30;
      num += (a - b) * (a - b);
      den += b * b;
    }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Dense (or shared-expert) gate/up: two MatMuls + SwiGLU.
double dense_gate_up_case(Backend &cpu, DType t, int64_t K, int64_t M, uint32_t seed, int n_sm) {
  WeightStore ws;
  const GgufTensorInfo *wg = ws.add("gate", t, {K, M}, randn(static_cast<size_t>(K * M), seed, 0.3f));
  const GgufTensorInfo *wu = ws.add("up", t, {K, M}, randn(static_cast<size_t>(K * M), seed + 1, 0.3f));
  int gn, un, x, gate, up, sw;
  auto build = [&] {
    Graph g;
    gn = g.weight(wg);
    un = g.weight(wu);
    x = g.input("x", DType::F32, {K, 1});
    gate = g.matmul(gn, x);
    up = g.matmul(un, x);
    sw = g.swiglu(gate, up);
    g.mark_output(sw, "y");
    return g;
  };
  auto xv = randn(static_cast<size_t>(K), seed + 2);
  Graph gc = build();  // sets the node ids used below
  auto r_cpu = run_on(cpu, std::move(gc), {in(x, xv)}, {sw});
  Graph g = build();
  DeviceTensors d;
  d.put_weight(g, gn);
  d.put_weight(g, un);
  d.put_vec(g, x, xv);
  d.put_out(g, sw);
  cuda_fused_gate_up_swiglu(d.ctx(g, sw, n_sm), g.node(up), g.node(gate), g.node(sw));
  return rel_err(d.get(g, sw), r_cpu[0]);
}

// down + MoeCombine, then optionally + residual (residual_mode 0: none, 1: combine first, 2: residual first).
// settled: the ids read before the kernel's wait (FusedGroup::ids_settled; here they are uploaded before the launch).
double down_case(Backend &cpu, DType t, int64_t K, int64_t M, int64_t E, const std::vector<int32_t> &ids, int residual_mode,
                 uint32_t seed, int n_sm = 132, bool settled = false) {
  const int64_t k = static_cast<int64_t>(ids.size());
  WeightStore ws;
  const GgufTensorInfo *w = ws.add("down", t, {K, M, E}, randn(static_cast<size_t>(K * M * E), seed, 0.3f));
  int wn, x, id, cw, r = -1, down, comb, add = -1;
  auto build = [&] {
    Graph g;
    wn = g.weight(w);
    x = g.input("act", DType::F32, {K, k, 1});
    id = g.input("ids", DType::I32, {k, 1});
    cw = g.input("cw", DType::F32, {k, 1});
    // Inputs come before the compute nodes (an input declared later may share memory with
    // earlier nodes' outputs in the plan, and it is uploaded before the run).
    if (residual_mode) r = g.input("r", DType::F32, {M, 1});
    down = g.matmul_id(wn, x, id);
    comb = g.moe_combine(down, cw);
    int out = comb;
    if (residual_mode) out = add = residual_mode == 1 ? g.add(comb, r) : g.add(r, comb);
    g.mark_output(out, "y");
    return g;
  };
  auto xv = randn(static_cast<size_t>(K * k), seed + 1), rv = randn(static_cast<size_t>(M), seed + 2);
  auto cwv = randn(static_cast<size_t>(k), seed + 3, 0.5f);
  auto cw_cpu = cwv;
  for (int64_t j = 0; j < k; ++j)
    if (ids[static_cast<size_t>(j)] < 0 || ids[static_cast<size_t>(j)] >= E) cw_cpu[static_cast<size_t>(j)] = 0.0f;
  Graph gc = build();
  const int out = residual_mode ? add : comb;
  std::vector<moe_test::Input> inputs = {in(x, xv), in(id, valid_ids(ids, E)), in(cw, cw_cpu)};
  if (residual_mode) inputs.push_back(in(r, rv));
  auto r_cpu = run_on(cpu, std::move(gc), inputs, {out});
  Graph g = build();
  DeviceTensors d;
  d.put_weight(g, wn);
  d.put_vec(g, x, xv);
  d.put_vec(g, id, ids);
  d.put_vec(g, cw, cwv);
  if (residual_mode) d.put_vec(g, r, rv);
  d.put_out(g, out);
  cuda_fused_down_combine(d.ctx(g, out, n_sm), g.node(down), g.node(comb), residual_mode ? &g.node(add) : nullptr, settled);
  return rel_err(d.get(g, out), r_cpu[0]);
}

}  // namespace

// F16 weights never take the fused mat-vecs (half-precision sums, matmul_f16_halfsum.cu).
static bool fused_type(DType t) { return t != DType::F16; }

// Multiprocessor counts for the launchers: the real one, and small ones under which the
// grids of these shapes get two logical blocks per thread block.
static const int kNsm[] = {132, 1, 2, 4, 16};

TEST_CASE("cuda fused: matmul + add at one token matches the CPU", "[ops][cuda][fusion]") {
  BackendRegistry reg;
  if (!gpu_or_skip(reg)) return;
  uint32_t seed = 400;
  for (DType t : kTypes)
    if (fused_type(t))
    for (int kind = 0; kind < 3; ++kind)
      for (int64_t M : {int64_t(37), int64_t(301)})
        for (int n_sm : kNsm) {
          const int64_t K = kind == 0 ? short_k(t) : kind == 1 ? long_k(t) : even_k(t);
          INFO("type " << dtype_name(t) << " K=" << K << " M=" << M << " n_sm " << n_sm);
          const double limit = ref_exact(t) ? 0.0 : 1e-4;  // the reference-order types: the CPU's bits
          CHECK(matmul_add_case(*reg.cpu(), t, K, M, true, seed++, n_sm) <= limit);
          CHECK(matmul_add_case(*reg.cpu(), t, K, M, false, seed++, n_sm) <= limit);
        }
}

// GpuTuning::lean_rows: a lone mat-vec whose grid has 2..3 logical blocks per SM runs in
// matvec_lean_kernel (8-warp blocks, one chunk in flight): the same bytes as the 16-warp launch.
// M 2880 at K 4096 is gpt-oss's o-proj (K halves: 360 logical blocks on 132 SMs); the small
// multiprocessor counts put the other shapes' grids in the lean range.
TEST_CASE("cuda fused: matmul + add in the lean launch equals the 16-warp launch", "[ops][cuda][fusion]") {
  BackendRegistry reg;
  if (!gpu_or_skip(reg)) return;
  GpuTuning lean, wide;
  lean.lean_rows = true;
  wide.lean_rows = false;
  uint32_t seed = 450;
  for (DType t : kTypes)
    if (fused_type(t) && type_traits(t).is_quantized)
      for (int kind = 0; kind < 3; ++kind)
        for (int64_t M : {int64_t(37), int64_t(301), int64_t(2880)})
          for (int n_sm : {2, 8, 16, 132}) {
            const int64_t K = kind == 0 ? short_k(t) : kind == 1 ? long_k(t) : even_k(t);
            INFO("type " << dtype_name(t) << " K=" << K << " M=" << M << " n_sm " << n_sm);
            double e_lean = 0, e_wide = 0;
            const auto y_lean = matmul_add_run(*reg.cpu(), t, K, M, true, seed, n_sm, lean, &e_lean);
            const auto y_wide = matmul_add_run(*reg.cpu(), t, K, M, true, seed, n_sm, wide, &e_wide);
            ++seed;
            CHECK(y_lean == y_wide);
            CHECK(e_lean <= (ref_exact(t) ? 0.0 : 1e-4));
          }
}

TEST_CASE("cuda fused: gate/up + swiglu at one token matches the CPU", "[ops][cuda][fusion][moe]") {
  BackendRegistry reg;
  if (!gpu_or_skip(reg)) return;
  uint32_t seed = 500;
  const std::vector<std::vector<int32_t>> id_sets = {{3}, {5, 0}, {2, 5, 2, 0, 1, 4, 3, 2}};
  for (DType t : kTypes)
    if (fused_type(t))
    for (bool longk : {false, true})
      for (const auto &ids : id_sets)
        for (int n_sm : kNsm) {
          const int64_t K = longk ? long_k(t) : short_k(t), M = longk ? 37 : 70;
          INFO("type " << dtype_name(t) << " K=" << K << " M=" << M << " n_used=" << ids.size() << " n_sm " << n_sm);
          CHECK(gate_up_case(*reg.cpu(), t, K, M, 6, ids, seed++, n_sm) < 1e-4);
        }
  SECTION("dense gate/up (two MatMuls)") {
    for (DType t : kTypes) {
      if (!fused_type(t)) continue;
      INFO("type " << dtype_name(t));
      for (int n_sm : kNsm) CHECK(dense_gate_up_case(*reg.cpu(), t, short_k(t), 53, seed++, n_sm) < 1e-4);
    }
  }
  SECTION("out-of-range expert ids give zero columns") {
    for (DType t : {DType::Q4_K, DType::Q8_0, DType::F32}) {
      INFO("type " << dtype_name(t));
      CHECK(gate_up_case(*reg.cpu(), t, short_k(t), 45, 6, {1, 6, 2, -1}, seed++) < 1e-4);
    }
  }
}

TEST_CASE("cuda fused: down + moe_combine (+ residual) at one token matches the CPU", "[ops][cuda][fusion][moe]") {
  BackendRegistry reg;
  if (!gpu_or_skip(reg)) return;
  uint32_t seed = 600;
  const std::vector<std::vector<int32_t>> id_sets = {{3}, {5, 0}, {2, 5, 2, 0, 1, 4, 3, 2}, {1, 1, 1, 1, 1}};
  for (DType t : kTypes)
    if (fused_type(t))
    for (bool longk : {false, true})
      for (size_t s = 0; s < id_sets.size(); ++s)
        for (int n_sm : kNsm) {
          const int64_t K = longk ? long_k(t) : short_k(t), M = longk ? 37 : 129;
          const int mode = static_cast<int>(s % 3);
          INFO("type " << dtype_name(t) << " K=" << K << " M=" << M << " n_used=" << id_sets[s].size() << " residual " << mode
                       << " n_sm " << n_sm);
          // The reference-order types: the CPU's bits (products, then MoeCombine's multiply-then-add).
          CHECK(down_case(*reg.cpu(), t, K, M, 6, id_sets[s], mode, seed++, n_sm) <= (ref_exact(t) ? 0.0 : 1e-4));
          if (n_sm == 132)  // settled ids: the same bits
            CHECK(down_case(*reg.cpu(), t, K, M, 6, id_sets[s], mode, seed++, n_sm, true) <= (ref_exact(t) ? 0.0 : 1e-4));
        }
  SECTION("out-of-range expert ids contribute nothing") {
    for (DType t : {DType::Q4_K, DType::Q6_K, DType::BF16}) {
      INFO("type " << dtype_name(t));
      CHECK(down_case(*reg.cpu(), t, short_k(t), 45, 6, {-3, 2, 6, 2}, 1, seed++) < 1e-4);
    }
  }
}

TEST_CASE("cuda fused: expert mat-vecs at Qwen3-30B-A3B shapes (8 experts per token) match the CPU", "[ops][cuda][fusion][moe]") {
  BackendRegistry reg;
  if (!gpu_or_skip(reg)) return;
  uint32_t seed = 650;
  // 8-warp blocks of matvec_expert_kernel: gate/up K 2048 x M 768 (Q4_K: the repacked order
  // from aligned rows), M 767 (Q4_K's vec_dot order, staged); down K 768 x M 2048 / 2047 with
  // 8 slots (two warps per row), 6 and 10 slots (the second warp with fewer passes, a
  // duplicate and an out-of-range id), and 4 slots (one warp per row). 10 experts instead of
  // 128 keep the CPU reference fast.
  const std::vector<int32_t> ids8 = {7, 2, 9, 0, 4, 1, 8, 3};
  const std::vector<std::vector<int32_t>> down_sets = {ids8, {5, 9, 5, 1, 0, 6}, {3, 1, 12, 7, 0, 2, 9, 4, 6, 8}, {6, 0, 9, 2}};
  for (DType t : {DType::Q4_K, DType::Q6_K}) {  // Qwen3's types (quantizing 16M weights a case is slow)
    for (int64_t M : {int64_t(768), int64_t(767)}) {
      INFO("type " << dtype_name(t) << " gate/up M=" << M);
      CHECK(gate_up_case(*reg.cpu(), t, 2048, M, 10, ids8, seed++) < 1e-4);
    }
    for (int64_t M : {int64_t(2048), int64_t(2047)})
      for (size_t s = 0; s < (M == 2048 ? down_sets.size() : 1); ++s) {  // (odd M: 8 slots only, quantizing is slow)
        INFO("type " << dtype_name(t) << " down M=" << M << " n_used=" << down_sets[s].size());
        CHECK(down_case(*reg.cpu(), t, 768, M, 10, down_sets[s], s == 0 ? 1 : 0, seed++) <= (ref_exact(t) ? 0.0 : 1e-4));
      }
  }
}

#endif  // MOEINFER_WITH_CUDA
