// CUDA backend vs CPU backend on random inputs: every IR op, every weight type, odd shapes,
// batch 1 and > 1, MoE routing edge cases, the KV cache types, and an engine-level decode
// (greedy ids, logits, at most one host synchronisation per step, graphs on/off).
// Without a CUDA build or device every case WARNs and returns (tag [cuda]).
#include <chrono>
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <utility>
#include <random>
#include <unistd.h>

#include "backends/backend.h"
#include "engine/engine.h"
#include "engine/weight_upload.h"
#include "graph/compiler.h"
#include "kv/kv_cache.h"
#include "model/synth/synth_model.h"
#include "support/cuda_counts.h"
#include "support/device_graph.h"
#include "support/graph_runner.h"
#include "support/greedy_run.h"
#include "support/random_data.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_ops.h"
#endif

using namespace moe;
using moe_test::as_f32;
using moe_test::gpu_or_skip;
using moe_test::in;
using moe_test::Input;
using moe_test::max_abs_diff;
using moe_test::random_ids;
using moe_test::randn;
using moe_test::rel_err;
using moe_test::run_on;
using moe_test::WeightStore;

namespace {


// CUDA output close enough to the CPU's: every kernel, the tensor-core ones included,
// rounds only in f32 (quantized weights meet their Q8-rounded activations as exact integer
// products on the tensor cores, matmul_mmq.cu; F16 / BF16 ones meet activations rounded
// to their own type), so they all agree with the CPU to float rounding.
bool close_to_cpu(const std::vector<uint8_t> &gpu, const std::vector<uint8_t> &cpu, double tol = 1e-4) {
  const double e = rel_err(gpu, cpu);
  UNSCOPED_INFO("relative error " << e);
  return e < tol;
}

// GPU options under which batches from 16 tokens reach the tensor-core and tiled kernels (by
// default batches up to kRefOrderMaxTokens keep the CPU's order on the warp-per-row kernels
// where the graph asks for it, as test graphs do) and dense quantized products of >= blas_min
// columns take cuBLAS (0: none, the int8 MMQ).
GpuTuning tensor_core_batches(int blas_min = kGpuBlasMinTokens) {
  GpuTuning t;
  t.ref_order_max_tokens = 0;
  t.blas_min_tokens = blas_min;
  return t;
}

// Dense matmul of a K x M weight of type t on N random columns, CUDA vs CPU (tn: the GPU's options).
bool dense_case(BackendRegistry &reg, Backend &gpu, DType t, int64_t K, int64_t M, int64_t N, uint32_t seed, double tol = 1e-4,
                const GpuTuning &tn = GpuTuning{}) {
  WeightStore ws;
  const GgufTensorInfo *w = ws.add("w", t, {K, M}, randn(static_cast<size_t>(K * M), seed, 0.5f));
  auto build = [&](int &x, int &y) {
    Graph g;
    x = g.input("x", DType::F32, {K, N});
    y = g.matmul(g.weight(w), x);
    g.mark_output(y, "y");
    return g;
  };
  auto xv = randn(static_cast<size_t>(K * N), seed + 1);
  int x, y;
  Graph gc = build(x, y), gg = build(x, y);
  auto r_cpu = run_on(*reg.cpu(), std::move(gc), {in(x, xv)}, {y});
  auto r_gpu = run_on(gpu, std::move(gg), {in(x, xv)}, {y}, {}, 1, tn);
  return close_to_cpu(r_gpu[0], r_cpu[0], tol);
}

// A dense K x M product of type t on N columns on the GPU against float64 sums of the CPU's
// dequantized weights and the inputs rounded through t's activation format by the CPU's
// quantizer (relative error of the whole output).
double dense_vs_f64(Backend &gpu, DType t, int64_t K, int64_t M, int64_t N, uint32_t seed, const GpuTuning &tn) {
  WeightStore ws;
  const GgufTensorInfo *w = ws.add("w", t, {K, M}, randn(static_cast<size_t>(K * M), seed, 0.5f));
  auto xv = randn(static_cast<size_t>(K * N), seed + 1);
  Graph g;
  const int x = g.input("x", DType::F32, {K, N});
  const int y = g.matmul(g.weight(w), x);
  g.mark_output(y, "y");
  auto r = run_on(gpu, std::move(g), {in(x, xv)}, {y}, {}, 1, tn);
  const size_t rb = row_size(t, K);
  std::vector<float> wd(static_cast<size_t>(K * M));
  for (int64_t m = 0; m < M; ++m) dequantize_row(t, w->data + static_cast<size_t>(m) * rb, wd.data() + m * K, K);
  const DType vdt = type_traits(t).vec_dot_type;
  std::vector<uint8_t> xq(row_size(vdt, K));
  for (int64_t n = 0; n < N; ++n) {
    quantize_row(vdt, xv.data() + n * K, xq.data(), K);
    dequantize_row(vdt, xq.data(), xv.data() + n * K, K);  // after the GPU ran on the raw inputs
  }
  std::vector<double> ref(static_cast<size_t>(M * N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(wd[static_cast<size_t>(m * K + k)]) * xv[static_cast<size_t>(n * K + k)];
      ref[static_cast<size_t>(n * M + m)] = s;
    }
  const std::vector<float> got = as_f32(r[0]);
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}


const DType kAllTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q8_0, DType::Q2_K,
                           DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4};

int64_t k_for(DType t, bool odd) {
  if (type_traits(t).block_size == 256) return odd ? 768 : 512;
  if (type_traits(t).block_size == 32) return odd ? 96 : 64;
  return odd ? 37 : 64;
}


// dense_case for every weight type, even and odd shapes (k_for; M_even / M_odd rows), each
// of the column counts Ns.
void dense_sweep(BackendRegistry &reg, Backend &gpu, std::initializer_list<int64_t> Ns, int64_t M_even, int64_t M_odd, uint32_t seed,
                 const GpuTuning &tn = GpuTuning{}) {
  for (DType t : kAllTypes)
    for (bool odd : {false, true})
      for (int64_t N : Ns) {
        const int64_t K = k_for(t, odd), M = odd ? M_odd : M_even;
        INFO("type " << dtype_name(t) << " K=" << K << " M=" << M << " N=" << N);
        CHECK(dense_case(reg, gpu, t, K, M, N, seed, 1e-4, tn));
        seed += 2;
      }
}

}  // namespace

TEST_CASE("cuda op: matmul matches the CPU for every weight type, odd shapes, batch 1 and >1", "[ops][cuda]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  dense_sweep(reg, *gpu, {1, 3, 17}, 64, 37, 1);
  // F32 weights on many columns (routers at T > 1): the tiled GEMM, K split over blocks.
  CHECK(dense_case(reg, *gpu, DType::F32, 2048, 128, 512, 77));
  CHECK(dense_case(reg, *gpu, DType::F32, 2000, 100, 300, 79));
  CHECK(dense_case(reg, *gpu, DType::F32, 24, 65, 70, 81));
}

// Dense quantized products of >= 256 columns (prompts) take cuBLAS over f16-dequantized weights
// (ops/matmul_blas.h): f16 weights, activations rounded through the weight type's activation
// format (Q8_K / Q8_0) and then to f16, f32 sums. Against float64 sums of the same rounded
// activations they must be as close as f16 rounding allows, and so against the CPU.
TEST_CASE("cuda op: dense quantized products on cuBLAS (>= 256 columns), every block type", "[ops][cuda][mma]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  GpuTuning tn;
  tn.blas_min_tokens = 256;
  uint32_t seed = 900;
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::MXFP4, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K})
    for (auto kmn : {std::array<int64_t, 3>{2048, 130, 256}, std::array<int64_t, 3>{768, 203, 300}, std::array<int64_t, 3>{512, 64, 512}}) {
      INFO("type " << dtype_name(t) << " K=" << kmn[0] << " M=" << kmn[1] << " N=" << kmn[2]);
      const double e = dense_vs_f64(*gpu, t, kmn[0], kmn[1], kmn[2], seed, tn);
      UNSCOPED_INFO("relative error against float64 " << e);
      CHECK(e < 2e-3);
      CHECK(dense_case(reg, *gpu, t, kmn[0], kmn[1], kmn[2], seed, 2e-3, tn));
      seed += 2;
    }
  // Below the threshold the same product stays on the int8 MMQ: bit-level agreement with the
  // CPU's Q8_K products (1e-4), which the f16 path cannot reach; this shows the switch works.
  CHECK(dense_case(reg, *gpu, DType::Q4_K, 2048, 130, 255, seed, 1e-4, tn));
}

TEST_CASE("cuda op: tensor-core matmul (>= 16 columns), every weight type, odd shapes, real shapes", "[ops][cuda][mma]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const GpuTuning tn = tensor_core_batches(0);  // this case checks the int8 MMQ; the cuBLAS path has its own below
  // M = 203: a partial 128-row tile; K odd: a partial 64-wide K step (and for plain types a
  // K that is not a multiple of 8, off the 16-byte load path).
  dense_sweep(reg, *gpu, {16, 77, 512}, 128, 203, 500, tn);
  uint32_t seed = 600;
  // The shapes of Qwen3-30B-A3B's expert projections (gate/up and down) as dense products,
  // for every fold of the exact-product kernel (per-32 and per-16 scales, with and without
  // a min term).
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::MXFP4, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K})
    for (auto km : {std::pair<int64_t, int64_t>{2048, 768}, std::pair<int64_t, int64_t>{768, 2048}}) {
      INFO("type " << dtype_name(t) << " K=" << km.first << " M=" << km.second << " N=512");
      CHECK(dense_case(reg, *gpu, t, km.first, km.second, 512, seed, 1e-4, tn));
      seed += 2;
    }
  // One or two blocks without a split: the int8 kernel splits K 8 ways (k/v projection
  // shapes at few tokens); 40 columns also take its narrow-tile path (two warp groups
  // on alternate sub-blocks).
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K})
    for (int64_t N : {16, 40, 100}) {
      INFO("type " << dtype_name(t) << " K=2048 M=130 N=" << N << " (split K)");
      CHECK(dense_case(reg, *gpu, t, 2048, 130, N, seed, 1e-4, tn));
      seed += 2;
    }
}

namespace {

// MoE matmul_id with given ids, compared with the CPU (close_to_cpu).
bool moe_case(BackendRegistry &reg, Backend &gpu, DType t, int64_t K, int64_t M, int64_t E, int64_t k, int64_t T, int64_t X,
              const std::vector<int32_t> &ids, uint32_t seed, double tol = 1e-4, const GpuTuning &tn = GpuTuning{}) {
  WeightStore ws;
  const GgufTensorInfo *w = ws.add("experts", t, {K, M, E}, randn(static_cast<size_t>(K * M * E), seed, 0.3f));
  auto build = [&](int &x, int &id, int &y) {
    Graph g;
    x = g.input("x", DType::F32, {K, X, T});
    id = g.input("ids", DType::I32, {k, T});
    y = g.matmul_id(g.weight(w), x, id);
    g.mark_output(y, "y");
    return g;
  };
  auto xv = randn(static_cast<size_t>(K * X * T), seed + 1);
  int x, id, y;
  Graph gc = build(x, id, y), gg = build(x, id, y);
  auto r_cpu = run_on(*reg.cpu(), std::move(gc), {in(x, xv), in(id, ids)}, {y});
  auto r_gpu = run_on(gpu, std::move(gg), {in(x, xv), in(id, ids)}, {y}, {}, 1, tn);
  return close_to_cpu(r_gpu[0], r_cpu[0], tol);
}

}  // namespace

TEST_CASE("cuda op: matmul_id for every weight type (grouped by expert on the device)", "[ops][cuda][moe]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 100;
  for (DType t : kAllTypes)
    for (int64_t T : {1, 4})
      for (int64_t X : {int64_t(1), int64_t(3)}) {
        const int64_t K = k_for(t, true), M = 24, E = 6, k = 3;
        std::vector<int32_t> ids = {0, 5, 2, 5, 5, 5, 1, 0, 3, 2, 2, 0};
        ids.resize(static_cast<size_t>(k * T));
        INFO("type " << dtype_name(t) << " T=" << T << " X=" << X);
        CHECK(moe_case(reg, *gpu, t, K, M, E, k, T, X, ids, seed++));
      }
}

// F16 weights with one activation column, and every F16 expert product, accumulate in half
// precision like the reference (f16_halfsum_dot.h); an f32-accumulating kernel misses the CPU
// by ~1e-3 here, the half-precision one matches it to the last bit.
TEST_CASE("cuda op: F16 one-column and expert products round like the CPU's half-precision sums", "[ops][cuda][moe]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 300;
  for (int64_t K : {128, 256, 300, 1000}) {
    const int64_t M = 29;
    INFO("dense F16 K=" << K);
    CHECK(dense_case(reg, *gpu, DType::F16, K, M, 1, seed++, 1e-6));
    for (int64_t T : {1, 5}) {
      std::vector<int32_t> ids = {3, 0, 3, 1, 2, 2, 0, 1, 3, 3};
      ids.resize(static_cast<size_t>(2 * T));
      INFO("MoE F16 K=" << K << " T=" << T);
      CHECK(moe_case(reg, *gpu, DType::F16, K, M, 4, 2, T, T == 1 ? 1 : 2, ids, seed++, 1e-6));
    }
  }
}

TEST_CASE("cuda op: MoE routing edge cases match the CPU", "[ops][cuda][moe][routing]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  SECTION("all tokens to one expert") {
    std::vector<int32_t> ids(static_cast<size_t>(2 * 40), 3);
    for (size_t i = 1; i < ids.size(); i += 2) ids[i] = 3;
    CHECK(moe_case(reg, *gpu, DType::Q8_0, 64, 32, 8, 2, 40, 1, ids, 7));
  }
  SECTION("unused experts and duplicate ids for one token") {
    std::vector<int32_t> ids = {1, 1, 1, 1, 6, 6, 6, 1, 1, 6, 1, 6};
    CHECK(moe_case(reg, *gpu, DType::Q4_K, 256, 16, 16, 4, 3, 4, ids, 8));
  }
  SECTION("batch 512 with 128 experts, 8 per token") {
    const std::vector<int32_t> ids = random_ids(512, 128, 8, 5);
    CHECK(moe_case(reg, *gpu, DType::Q8_0, 64, 16, 128, 8, 512, 1, ids, 9));
    CHECK(moe_case(reg, *gpu, DType::Q4_K, 256, 8, 128, 8, 512, 8, ids, 10));
  }
}

TEST_CASE("cuda op: tensor-core matmul_id (>= 64 routed entries), every weight type, skew, real shapes", "[ops][cuda][moe][mma]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const GpuTuning tn = tensor_core_batches(0);  // its dense products check the int8 MMQ
  uint32_t seed = 700;
  SECTION("every weight type, 100 tokens x 4 of 16 experts, shared and per-slot inputs") {
    // M = 200: a partial 128-row tile; ~25 entries per expert: partial 64-column tiles.
    for (DType t : kAllTypes)
      for (int64_t X : {int64_t(1), int64_t(4)}) {
        const int64_t K = k_for(t, true), M = 200, E = 16, k = 4, T = 100;
        INFO("type " << dtype_name(t) << " X=" << X);
        CHECK(moe_case(reg, *gpu, t, K, M, E, k, T, X, random_ids(T, E, k, seed), seed, 1e-4, tn));
        seed += 2;
      }
  }
  SECTION("512 tokens x 8 of 128 experts, random and skewed") {
    std::vector<int32_t> ids = random_ids(512, 128, 8, 11);
    for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::MXFP4, DType::Q4_0, DType::Q2_K, DType::Q3_K, DType::Q5_K}) {
      INFO("random routing, type " << dtype_name(t));
      CHECK(moe_case(reg, *gpu, t, 256, 72, 128, 8, 512, 1, ids, seed, 1e-4, tn));
      seed += 2;
    }
    // Slot 0 of every token to expert 3 (512 entries = 8 full tiles of one expert); the
    // other slots keep their (distinct) random experts, swapped if one of them was 3.
    for (int64_t tok = 0; tok < 512; ++tok) {
      int32_t *row = ids.data() + tok * 8;
      for (int j = 1; j < 8; ++j)
        if (row[j] == 3) row[j] = row[0];
      row[0] = 3;
    }
    for (DType t : {DType::Q4_K, DType::Q6_K}) {
      INFO("skewed routing, type " << dtype_name(t));
      CHECK(moe_case(reg, *gpu, t, 256, 200, 128, 8, 512, 8, ids, seed, 1e-4, tn));
      seed += 2;
    }
  }
  SECTION("Q4_K and Q6_K (the kernels from raw fragments): 512 tokens x 8 of 128 experts, an unused expert, odd M, 1-8 K steps") {
    std::vector<int32_t> ids = random_ids(512, 128, 8, 17);
    for (int64_t tok = 0; tok < 512; ++tok) {  // expert 5 gets no token: its slots move to an expert the token lacks
      int32_t *row = ids.data() + tok * 8;
      for (int j = 0; j < 8; ++j)
        if (row[j] == 5)
          for (int32_t e = 6;; ++e)
            if (std::find(row, row + 8, e) == row + 8) {
              row[j] = e;
              break;
            }
    }
    // Q6_K's 210-byte blocks put the rows (and the experts of odd M) at every 2-byte offset
    // modulo 16; the dense products split K (few row blocks).
    for (DType t : {DType::Q4_K, DType::Q6_K})
      for (auto km : {std::pair<int64_t, int64_t>{256, 77}, std::pair<int64_t, int64_t>{1280, 77}, std::pair<int64_t, int64_t>{2048, 203}}) {
        INFO("type " << dtype_name(t) << " K=" << km.first << " M=" << km.second);
        CHECK(moe_case(reg, *gpu, t, km.first, km.second, 128, 8, 512, 1, ids, seed, 1e-4, tn));
        CHECK(dense_case(reg, *gpu, t, km.first, km.second, 70, seed + 1, 1e-4, tn));  // a full and a narrow column tile
        seed += 2;
      }
  }
  SECTION("Qwen3-30B-A3B expert shapes: K=2048 M=768 (gate/up) and K=768 M=2048 (down)") {
    // 16 experts instead of 128 keep the CPU reference fast; 512 tokens x 4 slots.
    const std::vector<int32_t> ids = random_ids(512, 16, 4, 13);
    for (DType t : {DType::Q4_K, DType::Q6_K}) {
      INFO("type " << dtype_name(t) << " gate/up");
      CHECK(moe_case(reg, *gpu, t, 2048, 768, 16, 4, 512, 1, ids, seed, 1e-4, tn));
      INFO("type " << dtype_name(t) << " down");
      CHECK(moe_case(reg, *gpu, t, 768, 2048, 16, 4, 512, 4, ids, seed + 1, 1e-4, tn));
      seed += 2;
    }
  }
}

// The int8 MMQ's cp.async pipeline (matmul_mmq_i8.cu: 3-4 stages of 64-wide K steps) on
// edge shapes: fewer K steps than stages (one step, a Q4_0 / Q8_0 K tail), M not a multiple
// of the 128-row tile, Q6_K / MXFP4 rows at every alignment modulo 16 (630-byte rows, 17-byte
// blocks), and routing
// with experts of 0, 1, 20 (narrow tile), 45 (wide) and 90 (two tiles) entries.
TEST_CASE("cuda op: int8 MMQ pipeline edge cases (K steps vs stages, odd M, 0/1/many tokens per expert)", "[ops][cuda][moe][mma]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const GpuTuning tn = tensor_core_batches();
  const int64_t T = 100, E = 8, k = 2;
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t) {
    ids[static_cast<size_t>(t * k)] = t < 90 ? 0 : 3;  // 90 entries: a full and a partial tile
    ids[static_cast<size_t>(t * k + 1)] = t == 0 ? 1 : t <= 20 ? 4 : t <= 65 ? 5 : 6;  // 1, 20, 45, 34; experts 2, 7: none
  }
  uint32_t seed = 800;
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::MXFP4, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const bool kq = type_traits(t).block_size == 256;
    // K-quants: 1, 2 and 3 256-blocks (the Q4_K raw kernel's 3-stage pipeline: fewer steps than stages, as many)
    for (int64_t K : kq ? std::vector<int64_t>{256, 512, 768} : std::vector<int64_t>{32, 96, 2048})
      for (int64_t M : {int64_t(77), int64_t(200)}) {
        INFO("type " << dtype_name(t) << " K=" << K << " M=" << M);
        CHECK(moe_case(reg, *gpu, t, K, M, E, k, T, 2, ids, seed, 1e-4, tn));
        CHECK(dense_case(reg, *gpu, t, K, M, 40, seed + 1, 1e-4, tn));
        seed += 2;
      }
  }
}

// The multi-column mat-vec (ops/matvec_cols.cu): dense products of 2..15 columns and MatMulId
// under 64 routed entries, where the graph does not ask for the CPU's order (tuning
// ref_order_max_tokens 0 here; cpu_float_order graphs keep the reference-order kernels, see the
// plan test below). Every weight type, odd M, K a multiple of 256 (4608: three 2048-element
// chunks, the last partial) and for the 32-blocks also 32 x odd; plain types also K % 8 != 0
// (the scalar path). MatMulId at T = 2, 3, 4, 8 with random ids, one expert chosen by every
// token (at T = 8 with 4 slots: a full route tile), X = 1 and X = n_used, and the
// Qwen3-30B-A3B shapes (router, gate/up, down) at 4 tokens.
TEST_CASE("cuda op: multi-column mat-vec (2..15 columns, MatMulId under the MMQ threshold), every weight type", "[ops][cuda][mcol]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const GpuTuning tn = tensor_core_batches();
  uint32_t seed = 900;
  for (DType t : kAllTypes) {
    const int bs = type_traits(t).block_size;
    std::vector<int64_t> ks = {512};
    if (bs == 256) ks.push_back(4608);
    if (bs == 32) ks.insert(ks.end(), {96, 2080});
    if (bs == 1) ks.push_back(100);
    for (int64_t K : ks)
      for (int64_t N : {2, 3, 4, 5, 7, 8, 9, 15}) {
        INFO("dense type " << dtype_name(t) << " K=" << K << " M=37 N=" << N);
        CHECK(dense_case(reg, *gpu, t, K, 37, N, seed++, 1e-4, tn));
      }
    const int64_t E = 8, k = 4;
    for (int64_t T : {2, 3, 4, 8})
      for (int64_t X : {int64_t(1), k}) {
        std::vector<int32_t> ids = random_ids(T, E, k, seed);
        for (int64_t tok = 0; tok < T; ++tok)  // expert 5 in every token's first slot (the slots stay distinct)
          for (int64_t j = 0; j < k; ++j)
            if (ids[static_cast<size_t>(tok * k + j)] == 5) std::swap(ids[static_cast<size_t>(tok * k + j)], ids[static_cast<size_t>(tok * k)]);
        for (int64_t tok = 0; tok < T; ++tok)
          if (ids[static_cast<size_t>(tok * k)] != 5) ids[static_cast<size_t>(tok * k)] = 5;
        INFO("moe type " << dtype_name(t) << " K=" << ks.back() << " T=" << T << " X=" << X);
        CHECK(moe_case(reg, *gpu, t, ks.back(), 37, E, k, T, X, ids, seed++, 1e-4, tn));
      }
  }
  // Qwen3-30B-A3B at 4 sequences: router F32 [2048 x 128], gate/up Q4_K [2048 -> 768] and down
  // Q6_K [768 -> 2048] of 128 experts with 8 per token, a dense Q4_K projection.
  CHECK(dense_case(reg, *gpu, DType::F32, 2048, 128, 4, seed++, 1e-4, tn));
  CHECK(dense_case(reg, *gpu, DType::Q4_K, 2048, 512, 4, seed++, 1e-4, tn));
  CHECK(moe_case(reg, *gpu, DType::Q4_K, 2048, 768, 128, 8, 4, 1, random_ids(4, 128, 8, seed), seed, 1e-4, tn));
  CHECK(moe_case(reg, *gpu, DType::Q6_K, 768, 2048, 128, 8, 4, 8, random_ids(4, 128, 8, seed + 1), seed + 1, 1e-4, tn));
  // Q4_K takes the int8 tensor-core kernel by default (GpuTuning::mcol_tensor_cores); the dp4a
  // kernel it replaces stays checked at the same shapes.
  GpuTuning dp4a = tn;
  dp4a.mcol_tensor_cores = false;
  for (const GpuTuning &tu : {tn, dp4a}) {
    INFO("Q4_K, tensor cores " << tu.mcol_tensor_cores);
    for (int64_t N : {2, 4, 8, 15}) CHECK(dense_case(reg, *gpu, DType::Q4_K, 4608, 77, N, seed++, 1e-4, tu));
    CHECK(dense_case(reg, *gpu, DType::Q4_K, 2048, 4096, 4, seed++, 1e-4, tu));  // the q projection: K split over 4 warps
    CHECK(moe_case(reg, *gpu, DType::Q4_K, 768, 2048, 128, 8, 4, 8, random_ids(4, 128, 8, seed), seed, 1e-4, tu));  // down
    ++seed;
  }
  // Q6_K on the tensor cores (GpuTuning::mcol_tensor_cores_q6k, default on) and on the dp4a
  // kernel: odd rows (630-byte rows of K 768: 2-byte aligned words), the down and v shapes.
  GpuTuning q6_dp4a = tn;
  q6_dp4a.mcol_tensor_cores_q6k = false;
  for (const GpuTuning &tu : {tn, q6_dp4a}) {
    INFO("Q6_K, tensor cores " << tu.mcol_tensor_cores_q6k);
    for (int64_t N : {2, 4, 8, 15}) CHECK(dense_case(reg, *gpu, DType::Q6_K, 768, 77, N, seed++, 1e-4, tu));
    CHECK(dense_case(reg, *gpu, DType::Q6_K, 2048, 512, 4, seed++, 1e-4, tu));
    CHECK(moe_case(reg, *gpu, DType::Q6_K, 768, 2048, 128, 8, 4, 8, random_ids(4, 128, 8, seed), seed, 1e-4, tu));
    ++seed;
  }
  // Repeated ids in a token's slots (no router writes them, but they are valid input): at
  // T <= 4 the 4-column kernel then meets a tile of 7 entries of expert 5 and runs it in passes.
  for (DType t : {DType::Q4_K, DType::Q8_0, DType::Q6_K, DType::MXFP4}) {
    std::vector<int32_t> ids(8, 5);
    ids[7] = 1;
    INFO("repeated ids, type " << dtype_name(t));
    CHECK(moe_case(reg, *gpu, t, 512, 37, 8, 4, 2, 4, ids, seed++, 1e-4, tn));
    CHECK(moe_case(reg, *gpu, t, 512, 37, 8, 4, 2, 1, ids, seed++, 1e-4, tn));
  }
}

#ifdef MOEINFER_WITH_CUDA
// The planner's choice for few-column products (no GPU needed: shape_of is host code): the
// multi-column mat-vec where the graph does not ask for the CPU's order, the reference-order
// kernels where it does, the one-token mat-vec and the tensor cores outside the window; and the
// planned scratch is the launch's (int8 activations + scales for quantized types, none for plain).
TEST_CASE("cuda plan: few-column products take the multi-column mat-vec unless the graph asks for the CPU's order", "[cuda][mcol]") {
  const CudaPaths h200 = cuda_select_paths(90, 90, 232448);
  const GpuTuning tn;  // defaults: ref_order_max_tokens 128
  WeightStore ws;
  auto dense = [&](DType t, int64_t K, int64_t M, int64_t N, bool cpu_order, size_t *work = nullptr) {
    const GgufTensorInfo *w = ws.add("w" + std::to_string(ws.infos.size()), t, {K, M}, randn(static_cast<size_t>(K * M), 1, 0.5f));
    Graph g;
    g.cpu_float_order = cpu_order;
    const int y = g.matmul(g.weight(w), g.input("x", DType::F32, {K, N}));
    if (work) *work = cuda_work_size(g, y, tn, h200);
    return std::string(cuda_matmul_path(g, g.node(y), tn, h200));
  };
  auto moe = [&](DType t, int64_t K, int64_t M, int64_t k, int64_t T, bool cpu_order) {
    const GgufTensorInfo *w = ws.add("e" + std::to_string(ws.infos.size()), t, {K, M, 16}, randn(static_cast<size_t>(K * M * 16), 2, 0.5f));
    Graph g;
    g.cpu_float_order = cpu_order;
    const int y = g.matmul_id(g.weight(w), g.input("x", DType::F32, {K, 1, T}), g.input("ids", DType::I32, {k, T}));
    return std::string(cuda_matmul_path(g, g.node(y), tn, h200));
  };
  for (int64_t N : {2, 4, 8, 15}) {
    INFO("N=" << N);
    CHECK(dense(DType::Q4_K, 512, 64, N, false) == "mcol");
    CHECK(dense(DType::Q6_K, 512, 64, N, false) == "mcol");
    CHECK(dense(DType::Q4_0, 512, 64, N, false) == "mcol");
    CHECK(dense(DType::F32, 2048, 128, N, false) == "mcol");  // the router
    CHECK(dense(DType::BF16, 512, 64, N, false) == "mcol");
    CHECK(dense(DType::Q4_K, 512, 64, N, true) == "ref");      // cpu_float_order: today's choice
    CHECK(dense(DType::Q8_0, 512, 64, N, true) == "ref");
    CHECK(dense(DType::F32, 2048, 128, N, true) == "ref_f32");
    CHECK(dense(DType::Q4_0, 512, 64, N, true) == "tile");
  }
  CHECK(dense(DType::Q4_K, 512, 64, 1, false) == "matvec");
  CHECK(dense(DType::Q4_K, 512, 64, 16, false) == "mmq");
  CHECK(dense(DType::F32, 2048, 128, 16, false) == "sgemm");
  CHECK(moe(DType::Q4_K, 256, 64, 8, 4, false) == "mcol");  // 32 entries
  CHECK(moe(DType::Q4_K, 256, 64, 8, 7, false) == "mcol");  // 56
  CHECK(moe(DType::Q5_K, 256, 64, 8, 8, false) == "mmq");   // 64: the GEMM's threshold
  // Q4_K and Q6_K on the few-column tensor-core kernel up to 8 entries per expert (16 experts: 128).
  CHECK(moe(DType::Q6_K, 256, 64, 8, 15, false) == "mcol");  // 120
  CHECK(moe(DType::Q6_K, 256, 64, 8, 16, false) == "mmq");   // 128
  CHECK(moe(DType::Q4_K, 256, 64, 8, 8, false) == "mcol");
  CHECK(moe(DType::Q4_K, 256, 64, 8, 15, false) == "mcol");  // 120
  CHECK(moe(DType::Q4_K, 256, 64, 8, 16, false) == "mmq");   // 128
  CHECK(moe(DType::Q4_K, 256, 64, 8, 4, true) == "ref");
  CHECK(moe(DType::Q4_K, 256, 64, 8, 1, false) == "matvec");
  CHECK(moe(DType::F16, 256, 64, 8, 4, false) == "f16_halfsum");
  // Scratch: K x N int8 integers, then (scale, sum) per 16 (each 256-byte aligned); plain: none.
  size_t work = 1;
  CHECK(dense(DType::Q4_K, 512, 64, 4, false, &work) == "mcol");
  CHECK(work == 2048 + 1024);
  CHECK(dense(DType::F32, 2048, 128, 4, false, &work) == "mcol");
  CHECK(work == 0);
}
#endif

TEST_CASE("cuda op: elementwise, norms, softmax, routing helpers, rope, get_rows", "[ops][cuda]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  for (int64_t T : {1, 7}) {
    const int64_t n = 300, E = 40, k = 6;
    WeightStore ws;
    const GgufTensorInfo *nw = ws.add("nw", DType::F32, {n}, randn(static_cast<size_t>(n), 3));
    int a, b, r;
    std::vector<int> outs;
    auto build = [&]() {
      Graph g;
      outs.clear();
      a = g.input("a", DType::F32, {n, T});
      b = g.input("b", DType::F32, {n, T});
      r = g.input("r", DType::F32, {E, T});
      int x = g.mul(g.rms_norm(a, 1e-6f), g.weight(nw));
      outs.push_back(g.add(x, b));
      outs.push_back(g.scale(a, 0.5f, 0.25f));
      outs.push_back(g.softmax(a));
      outs.push_back(g.sigmoid(b));
      outs.push_back(g.swiglu(a, b));
      outs.push_back(g.copy(g.view(a, {n * T})));
      int probs = g.softmax(r);
      int ids = g.top_k(probs, static_cast<int>(k));
      int wts = g.norm_sum(g.gather_cols(probs, ids));
      outs.push_back(ids);
      outs.push_back(wts);
      int ex = g.view(g.copy(g.view(g.input("ex", DType::F32, {n * k * T}), {n * k * T})), {n, k, T});
      outs.push_back(g.moe_combine(ex, wts));
      for (int o : outs) g.mark_output(o, "o" + std::to_string(o));
      return g;
    };
    Graph g1 = build();
    const int ex_in = g1.find_input("ex");
    auto av = randn(static_cast<size_t>(n * T), 1), bv = randn(static_cast<size_t>(n * T), 2), rv = randn(static_cast<size_t>(E * T), 3);
    auto exv = randn(static_cast<size_t>(n * k * T), 4);
    rv[5] = rv[9];  // a tie: the lower index wins
    std::vector<Input> ins = {in(a, av), in(b, bv), in(r, rv), in(ex_in, exv)};
    auto outs_c = outs;
    auto rc = run_on(*reg.cpu(), std::move(g1), ins, outs_c);
    Graph g2 = build();
    auto rg = run_on(*gpu, std::move(g2), ins, outs);
    for (size_t i = 0; i < outs.size(); ++i) {
      INFO("output " << i << " T=" << T);
      if (i == 6) CHECK(rc[i] == rg[i]);  // top-k ids exactly
      else CHECK(rel_err(rg[i], rc[i]) < 1e-5);
    }
  }
  // RoPE: NeoX, normal, partial rotation, YaRN.
  for (int variant = 0; variant < 4; ++variant) {
    const int64_t hd = 64, nh = 3, T = 5;
    RopeParams p;
    p.n_rot = variant == 2 ? 32 : 64;
    p.neox = variant != 1;
    p.freq_base = 10000.0f;
    if (variant == 3) { p.freq_scale = 0.25f; p.ext_factor = 1.0f; p.n_ctx_orig = 4096; p.attn_factor = 1.0f; }
    int x, pos, y;
    auto build = [&]() {
      Graph g;
      x = g.input("x", DType::F32, {hd, nh, T});
      pos = g.input("pos", DType::I32, {T});
      y = g.rope(x, pos, p);
      g.mark_output(y, "y");
      return g;
    };
    auto xv = randn(static_cast<size_t>(hd * nh * T), 11);
    std::vector<int32_t> pv = {0, 1, 17, 300, 4000};
    Graph gc = build(), gg = build();
    auto rc = run_on(*reg.cpu(), std::move(gc), {in(x, xv), in(pos, pv)}, {y});
    auto rg = run_on(*gpu, std::move(gg), {in(x, xv), in(pos, pv)}, {y});
    INFO("rope variant " << variant);
    CHECK(rel_err(rg[0], rc[0]) < 1e-5);
  }
  // GetRows for every table type.
  for (DType t : kAllTypes) {
    const int64_t K = k_for(t, true), rows = 9;
    WeightStore ws;
    const GgufTensorInfo *tab = ws.add("tab", t, {K, rows}, randn(static_cast<size_t>(K * rows), 12));
    int ids, y;
    auto build = [&]() {
      Graph g;
      ids = g.input("ids", DType::I32, {4});
      y = g.get_rows(g.weight(tab), ids);
      g.mark_output(y, "y");
      return g;
    };
    std::vector<int32_t> iv = {8, 0, 3, 3};
    Graph gc = build(), gg = build();
    auto rc = run_on(*reg.cpu(), std::move(gc), {in(ids, iv)}, {y});
    auto rg = run_on(*gpu, std::move(gg), {in(ids, iv)}, {y});
    INFO("get_rows " << dtype_name(t));
    CHECK(rel_err(rg[0], rc[0]) < 1e-6);
  }
}

// Same-shape contiguous operands run as flat arrays (ew_flat_kernel): 16-byte vectors when
// aligned and the count is a multiple of 4, else scalars (a 4-byte offset view, odd counts;
// rows of 45 put row ends inside a vector: SwiGLU's column);
// the per-element function is the row kernel's, so the results equal the CPU's like it does.
TEST_CASE("cuda op: elementwise on flat operands (vector and scalar paths, SwiGLU tails)", "[ops][cuda]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  struct Shape { int64_t n, T; };
  for (const Shape &sh : {Shape{2048, 512}, Shape{768, 9}, Shape{301, 3}, Shape{45, 4}, Shape{45, 1}})
    for (size_t off : {size_t(0), size_t(4)}) {
      const int64_t n = sh.n, T = sh.T, N = n * T;
      int a_in, b_in;
      std::vector<int> outs;
      auto build = [&]() {
        Graph g;
        outs.clear();
        a_in = g.input("a", DType::F32, {N + 1});
        b_in = g.input("b", DType::F32, {N + 1});
        const int a = g.view(a_in, {n, T}, off), b = g.view(b_in, {n, T}, off);
        outs.push_back(g.add(a, b));
        outs.push_back(g.mul(a, b));
        outs.push_back(g.scale(a, 0.5f, 0.25f));
        outs.push_back(g.sigmoid(b));
        outs.push_back(g.swiglu(a, b));
        outs.push_back(g.swiglu_oai(a, b, 1.702f, 0.8f));
        for (int o : outs) g.mark_output(o, "o" + std::to_string(o));
        return g;
      };
      Graph g1 = build();
      const std::vector<Input> ins = {in(a_in, randn(static_cast<size_t>(N + 1), 51)), in(b_in, randn(static_cast<size_t>(N + 1), 52))};
      auto outs_c = outs;
      auto rc = run_on(*reg.cpu(), std::move(g1), ins, outs_c);
      Graph g2 = build();
      auto rg = run_on(*gpu, std::move(g2), ins, outs);
      for (size_t i = 0; i < outs.size(); ++i) {
        INFO("output " << i << " n=" << n << " T=" << T << " offset " << off);
        if (i < 2) CHECK(rc[i] == rg[i]);  // add, mul: exact
        else CHECK(rel_err(rg[i], rc[i]) < 1e-5);
      }
    }
}

// With a ubatch, RoPE takes cos/sin from the host table the executor builds with the CPU's
// rope_cache_init, and rotates like rope_rot0 / rope_rot1: equal to the CPU bit for bit for
// NeoX, normal, partial rotation (deepseek2), YaRN (gpt-oss) and two configurations in one
// graph. Positions that differ from the ubatch's take the device angles (close, not exact).
TEST_CASE("cuda op: rope from the ubatch's host cos/sin table equals the CPU bit for bit", "[ops][cuda][reforder]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  for (int variant = 0; variant < 5; ++variant)
    for (int64_t T : {1, 7}) {
      const int64_t hd = variant == 4 ? 192 : 128, nh = 3;
      RopeParams p, p2;
      p.n_rot = variant == 2 ? 64 : variant == 4 ? 64 : 128;
      p.neox = variant != 1 && variant != 4;
      p.freq_base = variant == 0 ? 1e6f : 10000.0f;
      if (variant == 3 || variant == 4) { p.freq_scale = 1.0f / 32; p.ext_factor = 1.0f; p.n_ctx_orig = 4096; p.beta_fast = 32; p.beta_slow = 1; }
      if (variant == 3) p.attn_factor = 1.3f;
      p2 = p;
      p2.freq_base = 500000.0f;  // a second configuration (its own table)
      int x, pos, y, y2;
      auto build = [&]() {
        Graph g;
        x = g.input("x", DType::F32, {hd, nh, T});
        pos = g.input("pos", DType::I32, {T});
        y = g.rope(x, pos, p);
        y2 = g.rope(x, pos, p2);
        g.mark_output(y, "y");
        g.mark_output(y2, "y2");
        return g;
      };
      auto xv = randn(static_cast<size_t>(hd * nh * T), 13 + static_cast<uint32_t>(variant));
      std::vector<int32_t> pv = {4000};
      if (T == 7) pv = {0, 1, 17, 300, 4095, 70000, 5};
      UbatchInfo ub;
      ub.n_tokens = static_cast<int32_t>(T);
      ub.pos = pv.data();
      const ExecEnv env{&ub, nullptr};
      Graph gc = build(), gg = build(), gco = build(), ggo = build();  // node ids set before the inputs name them
      auto rc = run_on(*reg.cpu(), std::move(gc), {in(x, xv), in(pos, pv)}, {y, y2}, env);
      auto rg = run_on(*gpu, std::move(gg), {in(x, xv), in(pos, pv)}, {y, y2}, env);
      INFO("rope variant " << variant << " T " << T);
      CHECK(rg[0] == rc[0]);
      CHECK(rg[1] == rc[1]);
      std::vector<int32_t> other = pv;  // the op's positions are not the ubatch's: device angles
      other[0] += 1;
      auto rco = run_on(*reg.cpu(), std::move(gco), {in(x, xv), in(pos, other)}, {y}, env);
      auto rgo = run_on(*gpu, std::move(ggo), {in(x, xv), in(pos, other)}, {y}, env);
      CHECK(rel_err(rgo[0], rco[0]) < 1e-5);
    }
}

TEST_CASE("cuda op: slice, concat, swiglu_oai, add_id, grouped_top_k, matmul_heads", "[ops][cuda]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  for (int64_t T : {1, 5}) {
    const int64_t n = 96, k = 4, E = 64, H = 3;
    WeightStore ws;
    const GgufTensorInfo *bias = ws.add("bias", DType::F32, {n, E}, randn(static_cast<size_t>(n * E), 21));
    int a, b, r, ids;
    std::vector<int> outs;
    auto build = [&]() {
      Graph g;
      outs.clear();
      a = g.input("a", DType::F32, {n, k, T});
      b = g.input("b", DType::F32, {n, k, T});
      r = g.input("r", DType::F32, {E, T});
      ids = g.input("ids", DType::I32, {k, T});
      outs.push_back(g.slice(a, 5, 40));
      outs.push_back(g.concat(g.slice(a, 0, 30), g.slice(b, 7, 50)));
      outs.push_back(g.swiglu_oai(a, b, 1.702f, 0.8f));
      outs.push_back(g.add_id(a, g.weight(bias), ids));
      outs.push_back(g.grouped_top_k(r, 6, 8, 3));
      for (int o : outs) g.mark_output(o, "o" + std::to_string(o));
      return g;
    };
    Graph g1 = build();
    auto av = randn(static_cast<size_t>(n * k * T), 22), bv = randn(static_cast<size_t>(n * k * T), 23), rv = randn(static_cast<size_t>(E * T), 24);
    std::vector<int32_t> iv(static_cast<size_t>(k * T));
    for (size_t i = 0; i < iv.size(); ++i) iv[i] = static_cast<int32_t>((i * 37) % E);
    std::vector<Input> ins = {in(a, av), in(b, bv), in(r, rv), in(ids, iv)};
    auto outs_c = outs;
    auto rc = run_on(*reg.cpu(), std::move(g1), ins, outs_c);
    Graph g2 = build();
    auto rg = run_on(*gpu, std::move(g2), ins, outs);
    for (size_t i = 0; i < outs.size(); ++i) {
      INFO("output " << i << " T=" << T);
      if (i == 4) CHECK(rc[i] == rg[i]);
      else CHECK(rel_err(rg[i], rc[i]) < 1e-6);
    }
    for (DType t : {DType::F16, DType::Q8_0, DType::Q4_K}) {
      const int64_t K = t == DType::Q4_K ? 256 : 64, M = 40;
      WeightStore hw;
      const GgufTensorInfo *w = hw.add("wh", t, {K, M, H}, randn(static_cast<size_t>(K * M * H), 25, 0.5f));
      int x, y;
      auto bh = [&]() {
        Graph g;
        x = g.input("x", DType::F32, {K, H, T});
        y = g.matmul_heads(g.weight(w), x);
        g.mark_output(y, "y");
        return g;
      };
      Graph gc = bh(), gg = bh();
      auto xv = randn(static_cast<size_t>(K * H * T), 26);
      auto hc = run_on(*reg.cpu(), std::move(gc), {in(x, xv)}, {y});
      auto hg = run_on(*gpu, std::move(gg), {in(x, xv)}, {y});
      INFO("matmul_heads " << dtype_name(t) << " T=" << T);
      CHECK(rel_err(hg[0], hc[0]) < 1e-4);
    }
  }
}

namespace {

// MatMulHeads of H weight matrices K x M (type t) on T tokens, CUDA vs CPU (close_to_cpu).
bool heads_case(BackendRegistry &reg, Backend &gpu, DType t, int64_t K, int64_t M, int64_t H, int64_t T, uint32_t seed,
                const GpuTuning &tn = GpuTuning{}) {
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
  auto xv = randn(static_cast<size_t>(K * H * T), seed + 1);
  auto hc = run_on(*reg.cpu(), std::move(gc), {in(x, xv)}, {y});
  auto hg = run_on(gpu, std::move(gg), {in(x, xv)}, {y}, {}, 1, tn);
  return close_to_cpu(hg[0], hc[0]);
}

}  // namespace

// T >= 16 runs on the tensor-core GEMMs (ops/matmul_heads.cu: heads as experts), fewer
// tokens and F32 weights on the warp-per-row kernel.
TEST_CASE("cuda op: matmul_heads at 1..512 tokens, every weight type, MLA shapes", "[ops][cuda][mma][heads]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 900;
  // M = 203 / 37: partial 128-row tiles; T = 100: a partial 64-token tile per head.
  for (DType t : kAllTypes)
    for (int64_t H : {3, 20})
      for (int64_t T : {1, 7, 16, 100}) {
        const bool odd = H == 3;
        const int64_t K = k_for(t, odd), M = odd ? 203 : 37;
        INFO("type " << dtype_name(t) << " K=" << K << " M=" << M << " H=" << H << " T=" << T);
        CHECK(heads_case(reg, *gpu, t, K, M, H, T, seed));
        seed += 2;
      }
  // GLM-4.7-Flash's k_b (Q8_0 in the Q4_K_M file, K 192 -> M 512) and v_b (Q4_K, 512 -> 256),
  // 20 heads, and the F16 file's k_b, on a 64- and a 512-token ubatch.
  struct Shape { DType t; int64_t K, M; };
  for (const Shape &sh : {Shape{DType::Q8_0, 192, 512}, Shape{DType::Q4_K, 512, 256}, Shape{DType::F16, 192, 512}})
    for (int64_t T : {64, 512}) {
      INFO("MLA shape " << dtype_name(sh.t) << " K=" << sh.K << " M=" << sh.M << " H=20 T=" << T);
      CHECK(heads_case(reg, *gpu, sh.t, sh.K, sh.M, 20, T, seed));
      seed += 2;
    }
}

namespace {

struct AttnSetup {
  KvType kt = KvType::F32;
  int64_t hd = 64, hd_v = 64, n_head = 4, n_head_kv = 2;
  uint32_t n_cells = 300;
  int32_t window = 0;
  bool sinks = false, mla = false;
  std::vector<int64_t> batches;  // tokens per batch, sequences 0 .. n_seqs - 1 interleaved
  int32_t n_seqs = 2;            // (a batch of n_seqs tokens: one token of each sequence)
  bool one_seq = false;          // every token in sequence 0 (cells in position order until a freed cell is refilled)
  int32_t pos0 = 0;              // the first position of each sequence
  int32_t rm0 = 10, rm1 = 20;    // sequence 0 loses these positions after batch 1 is claimed
  bool exact = false;            // batches of <= 16 tokens must equal the CPU bit for bit (F32 cache)
  bool share_seq0 = false;       // after batch 0 every sequence also sees sequence 0's cells (seq_cp)
  GpuTuning tuning;              // the GPU's options
};

// Largest ||a - b|| / ||b|| over rows of n floats (one (token, head) output each). The row
// norm is floored at 1% of the mean row norm: a head whose sink takes nearly all the weight
// has outputs near 1e-7, where the CPU's f16-rounded probabilities (F16 cache, like the
// reference) are subnormal and only absolutely, not relatively, close.
double worst_row_err(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b, int64_t n) {
  auto x = as_f32(a), y = as_f32(b);
  double total = 0;
  for (float v : y) total += double(v) * v;
  const double rows = static_cast<double>(y.size()) / static_cast<double>(n);
  const double floor_den = rows > 0 ? 1e-4 * total / rows : 0;
  double worst = 0;
  for (size_t r = 0; r + static_cast<size_t>(n) <= x.size(); r += static_cast<size_t>(n)) {
    double num = 0, den = 0;
    for (size_t i = r; i < r + static_cast<size_t>(n); ++i) {
      num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      den += double(y[i]) * y[i];
    }
    den = std::max(den, floor_den);
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

// Runs the batches through KvStore + Attention on the CPU and on the GPU, each with its own
// cache in the same cell state, and compares every batch's output as a whole and row by row
// (a mask error confined to a few rows still fails). Freed cells are refilled by later
// batches, so cell order is not position order.
void attention_case(BackendRegistry &reg, Backend &gpu, const AttnSetup &s, const std::string &what) {
  const int64_t hd = s.hd, nh = s.n_head, nkv = s.n_head_kv, hd_v = s.hd_v;
  const std::vector<KvLayerDims> dims = {{hd * nkv, s.mla ? 0 : hd * nkv}};
  KvCache kv_c(s.n_cells, static_cast<uint32_t>(s.n_seqs), s.kt, dims, *reg.cpu());
  KvCache kv_g(s.n_cells, static_cast<uint32_t>(s.n_seqs), s.kt, dims, gpu);
  std::mt19937 rng(3);
  std::vector<int32_t> next_pos(static_cast<size_t>(s.n_seqs), s.pos0);
  std::vector<float> sinks(static_cast<size_t>(nh));
  for (int64_t h = 0; h < nh; ++h) sinks[static_cast<size_t>(h)] = std::vector<float>{0.5f, -1.0f, 3.0f, 20.0f}[static_cast<size_t>(h % 4)];
  const double tol = s.kt == KvType::F16 ? 2e-3 : 1e-4;
  for (size_t step = 0; step < s.batches.size(); ++step) {
    const int64_t nt = s.batches[step];
    int qq, kk, vv, oo;
    auto build = [&]() {
      Graph g;
      qq = g.input("q", DType::F32, {hd, nh, nt});
      kk = g.input("k", DType::F32, {hd, nkv, nt});
      vv = g.input("v", DType::F32, {hd, nkv, nt});
      int ks = g.kv_store(kk, 0, 0);
      int vs = s.mla ? ks : g.kv_store(vv, 0, 1);
      AttentionOptions o;
      o.window = s.window;
      o.v_from_k = s.mla;
      if (s.sinks) o.sinks = g.input("sinks", DType::F32, {nh});
      oo = g.attention_ext(qq, ks, vs, hd_v, 0.125f, o);
      g.node(oo).ip[1] = static_cast<int32_t>(s.n_cells);
      g.mark_output(oo, "o");
      return g;
    };
    std::vector<int32_t> cells(static_cast<size_t>(nt)), pos(static_cast<size_t>(nt)), seq(static_cast<size_t>(nt));
    for (int64_t i = 0; i < nt; ++i) {
      const int32_t sq = s.one_seq ? 0 : static_cast<int32_t>(i % s.n_seqs);
      seq[static_cast<size_t>(i)] = sq;
      pos[static_cast<size_t>(i)] = next_pos[static_cast<size_t>(sq)]++;
    }
    REQUIRE(kv_c.find_slots(static_cast<uint32_t>(nt), cells.data()));
    kv_c.claim(cells.data(), pos.data(), seq.data(), static_cast<uint32_t>(nt));
    kv_g.claim(cells.data(), pos.data(), seq.data(), static_cast<uint32_t>(nt));
    if (step == 1) {
      kv_c.seq_rm(0, s.rm0, s.rm1);
      kv_g.seq_rm(0, s.rm0, s.rm1);
    }
    if (step == 0 && s.share_seq0)
      for (int32_t q = 1; q < s.n_seqs; ++q) {
        kv_c.seq_cp(0, q, -1, -1);
        kv_g.seq_cp(0, q, -1, -1);
      }
    auto qv = randn(static_cast<size_t>(hd * nh * nt), static_cast<uint32_t>(rng())), kvv = randn(static_cast<size_t>(hd * nkv * nt), static_cast<uint32_t>(rng())),
         vvv = randn(static_cast<size_t>(hd * nkv * nt), static_cast<uint32_t>(rng()));
    UbatchInfo ub;
    ub.n_tokens = static_cast<int32_t>(nt);
    ub.cells = cells.data();
    ub.pos = pos.data();
    ub.seq = seq.data();
    ub.n_kv = kv_c.n_kv();
    ub.cell_state = kv_c.cells();
    ExecEnv ec{&ub, &kv_c};
    Graph g1 = build(), g2 = build();
    std::vector<Input> ins = {in(qq, qv), in(kk, kvv)};
    if (!s.mla) ins.push_back(in(vv, vvv));
    if (s.sinks) ins.push_back(in(g1.find_input("sinks"), sinks));
    auto rc = run_on(*reg.cpu(), std::move(g1), ins, {oo}, ec);
    UbatchInfo ubg = ub;
    ubg.cell_state = kv_g.cells();
    ExecEnv eg{&ubg, &kv_g};
    auto rg = run_on(gpu, std::move(g2), ins, {oo}, eg, 1, s.tuning);
    INFO(what << " kv " << kv_type_name(s.kt) << " hd " << hd << " heads " << nh << "/" << nkv << " window " << s.window << " sinks "
              << s.sinks << " mla " << s.mla << " one sequence " << s.one_seq << " sequences " << s.n_seqs << " batch " << step << " (" << nt
              << " tokens, n_kv "
              << ub.n_kv << ")");
    if (s.exact && nt <= 16) {
      CHECK(rg[0] == rc[0]);
    } else {
      CHECK(rel_err(rg[0], rc[0]) < tol);
      CHECK(worst_row_err(rg[0], rc[0], hd_v) < 10 * tol);
    }
  }
}

// The decode kernels' sweep shape: 2 KV heads, a 520-cell cache of two sequences whose
// holes the last batches refill (cell ranges of several cells per warp); variant 0 plain,
// 1 a sliding window, 2 sinks.
AttnSetup grouped_decode_setup(KvType kt, int64_t hd, int64_t group, int64_t T, int variant) {
  AttnSetup s;
  s.kt = kt;
  s.hd = s.hd_v = hd;
  s.n_head_kv = 2;
  s.n_head = 2 * group;
  s.window = variant == 1 ? 29 : 0;
  s.sinks = variant == 2;
  s.n_cells = 520;
  s.batches = {257, 130, T, T};
  return s;
}

}  // namespace

TEST_CASE("cuda op: kv store + attention (F32/F16/Q8_0 cache, GQA, several sequences)", "[ops][cuda][attention]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  for (int variant = 0; variant < 4; ++variant)  // plain, sliding window, sinks, MLA latent-as-V
    for (KvType kt : {KvType::F32, KvType::F16, KvType::Q8_0})
      for (int64_t T : {1, 6}) {
        if (variant > 0 && kt == KvType::F16) continue;
        AttnSetup s;
        s.kt = kt;
        s.n_head_kv = variant == 3 ? 1 : 2;
        s.hd_v = variant == 3 ? 32 : 64;
        s.window = variant == 1 ? 37 : 0;
        s.sinks = variant == 2;
        s.mla = variant == 3;
        s.batches = {100, 100, T};
        attention_case(reg, *gpu, s, "decode / per-token paths");
      }
}

// An F32 cache without sinks takes the CPU's reference order (ops/attention_ref_order.cu) up
// to 16 tokens: one token with the 64-lane KQV, several with the 16-lane one; head sizes with
// a dot tail (80, 200: n % 64 != 0), GQA 1/2/4, a sliding window, cells freed and refilled,
// n_kv past 64 (the batch of 17 takes the tiled kernel: compared with a tolerance).
TEST_CASE("cuda op: F32-cache attention in the CPU's reference order, bit for bit", "[ops][cuda][attention][reforder]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const int64_t hds[] = {64, 80, 128, 200}, groups[] = {1, 2, 4}, Ts[] = {1, 2, 3, 17};
  for (int hi = 0; hi < 4; ++hi)
    for (int gi = 0; gi < 3; ++gi)
      for (int ti = 0; ti < 4; ++ti) {
        AttnSetup s;
        s.kt = KvType::F32;
        s.hd = s.hd_v = hds[hi];
        s.n_head_kv = 2;
        s.n_head = 2 * groups[gi];
        s.window = (hi + gi + ti) % 3 == 1 ? 23 : 0;
        s.rm0 = 5;
        s.rm1 = 15;
        s.exact = true;
        s.batches = {16, 15, 16, 16, Ts[ti], 9, 1};  // batch 3 on refills freed cells, then one more token
        attention_case(reg, *gpu, s, "reference order");
      }
}

// T >= 8 with head dims 64 / 128 takes the tiled kernels (tensor cores for F16, f32 FMA for
// F32 / Q8_0), with the cells split over blocks when the chunk has few rows.
TEST_CASE("cuda op: tiled prefill attention (GQA 1/4/8, window, sinks, every cache type)", "[ops][cuda][attention]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const GpuTuning tn = tensor_core_batches();
  const KvType kts[] = {KvType::F32, KvType::F16, KvType::Q8_0};
  const int64_t hds[] = {64, 128}, groups[] = {1, 4, 8}, Ts[] = {8, 33, 200};
  for (int ki = 0; ki < 3; ++ki)
    for (int hi = 0; hi < 2; ++hi)
      for (int gi = 0; gi < 3; ++gi)
        for (int ti = 0; ti < 3; ++ti) {
          const int variant = (ki + hi + gi + ti) % 3;  // plain, sliding window, sinks: each cache type meets all three
          AttnSetup s;
          s.tuning = tn;
          s.kt = kts[ki];
          s.hd = s.hd_v = hds[hi];
          s.n_head_kv = 2;
          s.n_head = 2 * groups[gi];
          s.window = variant == 1 ? 17 : 0;
          s.sinks = variant == 2;
          s.rm0 = 5;
          s.rm1 = 15;
          s.batches = {37, 50, Ts[ti]};  // the last batch first refills the freed cells
          attention_case(reg, *gpu, s, "tiled");
        }
  for (KvType kt : kts) {  // GQA 2 (the conformance files' shape), first batches on an empty cache
    AttnSetup s;
    s.tuning = tn;
    s.kt = kt;
    s.hd = s.hd_v = 64;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.batches = {13, 16, 3, 40};
    attention_case(reg, *gpu, s, "tiled, GQA 2");
  }
  for (KvType kt : kts) {  // deeper cache: many cell tiles per block and per split
    AttnSetup s;
    s.tuning = tn;
    s.kt = kt;
    s.hd = s.hd_v = 128;
    s.n_head = 16;
    s.n_head_kv = 2;
    s.n_cells = 700;
    s.window = kt == KvType::Q8_0 ? 100 : 0;
    s.sinks = kt == KvType::F32;
    s.batches = {301, 256, 9};
    attention_case(reg, *gpu, s, "tiled, deep");
  }
  // Head dim 256 (Qwen3-Next / Qwen3.5: 16 heads over 2 KV heads): the tensor-core kernel with
  // its output dims split over two blocks (F16), the per-(head, token) kernel otherwise.
  for (KvType kt : kts)
    for (int64_t group : {1, 8})
      for (int64_t T : {8, 33, 200}) {
        AttnSetup s;
        s.tuning = tn;
        s.kt = kt;
        s.hd = s.hd_v = 256;
        s.n_head_kv = 2;
        s.n_head = 2 * group;
        s.window = T == 33 ? 17 : 0;
        s.sinks = T == 8 && group == 8;
        s.rm0 = 5;
        s.rm1 = 15;
        s.batches = {37, 50, T};
        attention_case(reg, *gpu, s, "tiled, head dim 256");
      }
  {
    AttnSetup s;  // many 32-cell tiles per block and per split
    s.tuning = tn;
    s.kt = KvType::F16;
    s.hd = s.hd_v = 256;
    s.n_head = 16;
    s.n_head_kv = 2;
    s.n_cells = 700;
    s.batches = {301, 256, 9};
    attention_case(reg, *gpu, s, "tiled, head dim 256, deep");
  }
}

// MLA (deepseek2 / GLM-4.7-Flash dims: one KV head, K rows of 576 = latent 512 + rope 64, V =
// the latent) takes attention_mla.cu on an F16 cache at any T (cells split over blocks for
// short chunks and decode); F32 / Q8_0 caches and other dims keep the older kernels.
// The GLM-4.7-Flash attention shape: one latent KV head, K 576, V 512 (its first values).
static AttnSetup mla_setup(KvType kt, int64_t n_head) {
  AttnSetup s;
  s.kt = kt;
  s.mla = true;
  s.hd = 576;
  s.hd_v = 512;
  s.n_head = n_head;
  s.n_head_kv = 1;
  return s;
}

TEST_CASE("cuda op: MLA attention (K 576 / V 512 latent, F16 cache, prefill and decode, window, sinks)", "[ops][cuda][attention]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const int64_t heads[] = {20, 3, 16}, Ts[] = {8, 33, 200};
  for (int hi = 0; hi < 3; ++hi)
    for (int ti = 0; ti < 3; ++ti) {
      const int variant = (hi + ti) % 3;  // plain, sliding window, sinks
      AttnSetup s = mla_setup(KvType::F16, heads[hi]);
      s.window = variant == 1 ? 17 : 0;
      s.sinks = variant == 2;
      s.rm0 = 5;
      s.rm1 = 15;
      s.batches = {37, 50, Ts[ti]};  // the last batch first refills the freed cells
      attention_case(reg, *gpu, s, "MLA tiled");
    }
  for (int64_t T : {1, 3, 5}) {  // decode and short chunks: one row tile, many splits, idle warps
    AttnSetup s = mla_setup(KvType::F16, 20);
    s.n_cells = 520;
    s.window = T == 3 ? 29 : 0;
    s.sinks = T == 5;
    s.batches = {257, 130, T, T};
    attention_case(reg, *gpu, s, "MLA decode");
  }
  {  // deeper cache: many cell tiles per block, heavy blocks first
    AttnSetup s = mla_setup(KvType::F16, 20);
    s.n_cells = 700;
    s.batches = {301, 256, 9};
    attention_case(reg, *gpu, s, "MLA tiled, deep");
  }
  for (KvType kt : {KvType::F32, KvType::Q8_0}) {  // the per-token fallback at the same dims
    AttnSetup s = mla_setup(kt, 4);
    s.batches = {37, 50, 12};
    attention_case(reg, *gpu, s, "MLA per-token");
  }
}

// T <= 4 with head dims 64 / 128 / 256 takes the grouped decode kernel (one block per KV head
// and cell range; groups above 8 query heads span several blocks).
TEST_CASE("cuda op: grouped decode attention (head dims 64/128/256, GQA 1/8/12, every cache type)", "[ops][cuda][attention]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  int variant = 0;
  for (KvType kt : {KvType::F32, KvType::F16, KvType::Q8_0})
    for (int64_t hd : {64, 128, 256})
      for (int64_t group : {1, 8, 12})
        for (int64_t T : {1, 3}) {
          variant = (variant + 1) % 3;  // plain, sliding window, sinks
          attention_case(reg, *gpu, grouped_decode_setup(kt, hd, group, T, variant), "grouped decode");
        }
  // A deep cache: every cell range in use, each longer than the minimum (64 cells), merged by
  // the last block of each KV head; then a short context of one range (written directly).
  for (KvType kt : {KvType::F16, KvType::Q8_0}) {
    AttnSetup s;
    s.kt = kt;
    s.hd = s.hd_v = 128;
    s.n_head_kv = 2;
    s.n_head = 16;
    s.sinks = kt == KvType::Q8_0;
    s.n_cells = 4300;
    s.batches = {2100, 2000, 1, 3};
    attention_case(reg, *gpu, s, "grouped decode, deep");
    s.n_cells = 64;
    s.batches = {5, 1, 1};
    attention_case(reg, *gpu, s, "grouped decode, short");
  }
}

// The grouped decode kernel's cell ranges follow n_kv on the device (defaults: ranges of >= 32
// cells, at most 32): one range (output written by its block) up to 32 cells, ranges of 32
// cells up to 1024, then 32 longer ones (8257: 259 cells, 65 per warp, so a warp reads three
// mask windows). Depths on both sides of each boundary; the deep ones with a sliding window
// (cheap CPU reference; most ranges then see no cell, their partials weigh 0).
TEST_CASE("cuda op: grouped decode attention at its cell-range boundaries", "[ops][cuda][attention]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  for (KvType kt : {KvType::F16, KvType::Q8_0})
    for (int64_t n_kv : {31, 32, 33, 63, 64, 65, 128, 129, 513, 1024, 1025, 4096, 4097, 8257}) {
      AttnSetup s;
      s.kt = kt;
      s.hd = s.hd_v = 128;
      s.n_head_kv = 1;
      s.n_head = 8;
      s.window = n_kv > 600 ? 300 : 0;
      s.sinks = n_kv % 2 == 0;
      const int64_t T = n_kv % 3 == 0 ? 3 : 1;
      s.n_cells = static_cast<uint32_t>(n_kv + 8);
      s.batches.push_back(n_kv - T);
      s.batches.push_back(T);  // the decode batch fills the cache up to n_kv cells
      attention_case(reg, *gpu, s, "grouped decode, range boundary");
    }
}

// Several sequences decoding one token each (3, 5, 16, 64 tokens of as many sequences): the
// grouped decode kernel walks each token's cell list (DevUbatch::seq_cells,
// attn_decode_seqs_launch), the cells of each sequence interleaved with the others' (prompts of
// all sequences in one batch, then one cell per sequence per step). Head dims 64/128/256, GQA
// 1/8/12, every cache type, windows and sinks; with at most 2 cell ranges (bench
// --decode-split 2,64): longer ranges, merged; and with sequence 0's cells shared by all
// (seq_cp: a cell in every token's list).
TEST_CASE("cuda op: decode attention of several sequences, one token each (5 / 16 / 64 sequences)", "[ops][cuda][attention][seqdec]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  int i = 0;
  for (int32_t n_seqs : {3, 5, 16, 64})
    for (KvType kt : {KvType::F16, KvType::Q8_0, KvType::F32})
      for (int64_t hd : {64, 128, 256}) {
        const int64_t group = std::vector<int64_t>{1, 8, 12}[static_cast<size_t>(i % 3)];
        AttnSetup s;
        s.kt = kt;
        s.hd = s.hd_v = hd;
        s.n_head_kv = 2;
        s.n_head = 2 * group;
        s.n_seqs = n_seqs;
        s.window = i % 4 == 1 ? 9 : 0;
        s.sinks = i % 4 == 2 || kt == KvType::F32;  // (F32 without sinks: the reference order up to 16 tokens)
        s.rm0 = 1;
        s.rm1 = 3;
        s.n_cells = static_cast<uint32_t>(n_seqs * 16);
        s.batches = {n_seqs * 12, n_seqs, n_seqs, n_seqs};
        if (i % 5 == 3) s.tuning.decode_max_ranges = 2;
        s.share_seq0 = i % 7 == 4;
        ++i;
        attention_case(reg, *gpu, s, "several sequences, one token each");
      }
}

// Short cell ranges, the default (>= 32 cells, at most 32) and bench --decode-split 64,16, for
// every head size, cache type and 1..4 tokens: one cell; 31 / 32 / 33 (one range or two);
// 530 (17 ranges of 32 / 34 of 16, the last one short); 2049 (32 of 65 / 63 of 33: a warp's
// share ends inside a batch); 4100 (32 of 129 / 64 of 65, the last of 5). Deep ones with a
// window (cheap CPU reference), then one deep cache with every cell visible in 64 ranges (every
// range's partials weigh in the merge).
TEST_CASE("cuda op: grouped decode attention with short cell ranges (head dims 64/128/256, 1..4 tokens)", "[ops][cuda][attention][decsplit]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const KvType kts[] = {KvType::F16, KvType::Q8_0, KvType::F32, KvType::F16};  // F32 with sinks (i even): the grouped kernel, not the reference order
  int i = 0;
  for (int64_t hd : {64, 128, 256})
    for (int min_chunk : {16, 32})
      for (int64_t n_kv : {1, 31, 32, 33, 530, 2049, 4100}) {
        ++i;
        AttnSetup s;
        s.tuning.decode_min_chunk = min_chunk;
        s.tuning.decode_max_ranges = min_chunk == 16 ? 64 : 32;
        s.kt = kts[i % 4];
        s.hd = s.hd_v = hd;
        s.n_head_kv = 2;
        s.n_head = 16;
        s.window = n_kv > 600 ? 300 : 0;
        s.sinks = i % 2 == 0;
        const int64_t T = std::min<int64_t>(n_kv, 1 + i % 4);
        s.n_cells = static_cast<uint32_t>(n_kv + 8);
        if (n_kv > T) s.batches.push_back(n_kv - T);
        s.batches.push_back(T);  // the decode batch fills the cache up to n_kv cells
        attention_case(reg, *gpu, s, "grouped decode, short ranges");
      }
  AttnSetup s;  // Qwen3.5's shape at depth, every cell visible: 64 ranges of 65 cells
  s.tuning.decode_max_ranges = 64;
  s.kt = KvType::F16;
  s.hd = s.hd_v = 256;
  s.n_head_kv = 2;
  s.n_head = 16;
  s.n_cells = 4108;
  s.batches = {2100, 1998, 2};
  attention_case(reg, *gpu, s, "grouped decode, short ranges, deep");
}

// Where the cells are in position order (one sequence, DevUbatch::cell_pos_base), the grouped
// decode kernel cuts only the cells a token's window can see into ranges (gpt-oss: window 128,
// sinks, head dim 64, 8 query heads per KV head). Depths around the window and the 64-cell
// ranges, 1 and 2 tokens (their spans differ by a cell); positions starting at 1000 (B != 0);
// a window wider than the context; ranges of 16 cells. Then the fallback to the n_kv split:
// two sequences interleaved, and a hole (still in order: bounded) that the next token refills
// (order broken: that token's own cell is at the hole).
TEST_CASE("cuda op: grouped decode attention bounded by the visible span (window, sinks, one sequence)", "[ops][cuda][attention][span]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  auto oss = [](KvType kt, int32_t window) {
    AttnSetup s;
    s.kt = kt;
    s.hd = s.hd_v = 64;
    s.n_head_kv = 2;
    s.n_head = 16;
    s.window = window;
    s.sinks = true;
    s.one_seq = true;
    s.rm0 = s.rm1 = 0;  // no hole
    return s;
  };
  for (KvType kt : {KvType::F16, KvType::Q8_0})
    for (int64_t n_kv : {1, 127, 128, 129, 600, 4097})
      for (int64_t T : {1, 2}) {
        if (n_kv < T) continue;
        AttnSetup s = oss(kt, 128);
        s.pos0 = n_kv == 600 ? 1000 : 0;
        s.n_cells = static_cast<uint32_t>(n_kv + 8);
        if (n_kv > T) s.batches.push_back(n_kv - T);
        s.batches.push_back(T);  // the decode batch fills the cache up to n_kv cells
        attention_case(reg, *gpu, s, "span, one sequence in order");
      }
  {
    AttnSetup s = oss(KvType::F16, 4096);  // the window wider than the context: every cell seen
    s.n_cells = 608;
    s.batches = {598, 2, 1};
    attention_case(reg, *gpu, s, "span, window past n_kv");
    s = oss(KvType::F16, 128);  // 8 ranges of 16 inside the window
    s.tuning.decode_min_chunk = 16;
    s.n_cells = 608;
    s.batches = {599, 1, 2};
    attention_case(reg, *gpu, s, "span, 16-cell ranges");
  }
  for (int64_t T : {1, 2}) {
    AttnSetup s = oss(KvType::F16, 128);  // fallback: two sequences interleaved
    s.one_seq = false;
    s.n_cells = 700;
    s.batches = {598, T, T};
    attention_case(reg, *gpu, s, "span fallback, two sequences");
    // A hole (in order) inside the window (550) or before it (300), then refilled (out of
    // order): at 300 the refilling token's own cell lies outside any span of the old order.
    s = oss(KvType::F16, 128);
    s.rm0 = T == 1 ? 550 : 300;
    s.rm1 = s.rm0 + 1;
    s.n_cells = 700;
    s.batches = {599, 1, T, T};
    attention_case(reg, *gpu, s, "span, hole then refilled");
  }
}

// The tensor-core decode kernel (GpuTuning::tc_decode_attention, off by default; it runs where
// the device has sm_80+ code, otherwise the grouped kernel does): F16 cache, head dims 128 /
// 256, 16 query rows (token, head) per block, so groups of 1 / 4 / 8 / 16 heads and 1..4 tokens
// fill row tiles in every way (group 16 x 4 tokens: 4 tiles). Then depths on both sides of the
// cell-range boundaries, with ranges of >= 16 cells (per-warp shares that end inside a tile).
TEST_CASE("cuda op: tensor-core decode attention (opt-in; head dims 128/256, GQA 1/4/8/16, window, sinks)", "[ops][cuda][attention][tcdec]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  GpuTuning tn;
  tn.tc_decode_attention = true;
  int variant = 0;
  for (int64_t hd : {128, 256})
    for (int64_t group : {1, 4, 8, 16})
      for (int64_t T : {1, 2, 4}) {
        variant = (variant + 1) % 3;  // plain, sliding window, sinks
        AttnSetup s = grouped_decode_setup(KvType::F16, hd, group, T, variant);
        s.tuning = tn;
        attention_case(reg, *gpu, s, "tensor-core decode");
      }
  for (int64_t n_kv : {63, 64, 65, 513, 4097}) {
    AttnSetup s;
    s.tuning = tn;
    s.tuning.decode_min_chunk = n_kv == 513 ? 16 : 64;
    s.kt = KvType::F16;
    s.hd = s.hd_v = n_kv % 2 ? 128 : 256;
    s.n_head_kv = 2;
    s.n_head = 16;
    s.window = n_kv > 600 ? 300 : 0;
    s.sinks = n_kv % 3 == 0;
    const int64_t T = n_kv % 3 == 0 ? 3 : 1;
    s.n_cells = static_cast<uint32_t>(n_kv + 8);
    s.batches = {n_kv - T, T};  // the decode batch fills the cache up to n_kv cells
    attention_case(reg, *gpu, s, "tensor-core decode, range boundary");
  }
}

TEST_CASE("cuda engine: tiny model decodes like the CPU, one sync per step, graphs on/off agree", "[cuda][engine]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  // "small" has head dim 64, so its 8-token prompt takes the tiled prefill attention (split
  // over cells, then combined); "tiny" (head dim 32) the per-token kernel.
  const std::pair<const char *, const char *> models[] = {{"tiny", "q8_0"}, {"tiny", "q4_k_m"}, {"small", "q8_0"}};
  for (const auto &[preset, mix] : models) {
    const std::string path = (std::filesystem::temp_directory_path() /
                              (std::string("moe-cuda-engine-") + preset + "-" + mix + "-" + std::to_string(::getpid()) + ".gguf")).string();
    SynthSpec spec;
    spec.preset = preset;
    spec.type_mix = mix;
    write_synthetic_model(spec, path);
    {
      auto model = Model::load(path, ModelLoadParams{});
      std::map<std::string, std::vector<int32_t>> greedy;
      std::map<std::string, std::vector<float>> first_logits;
      for (const char *dev : {"cpu", "cuda", "cuda-nograph"}) {
        ContextParams cp;
        cp.n_ctx = 128;
        cp.n_threads = 2;
        cp.device = std::string(dev) == "cpu" ? "cpu" : "cuda";
        cp.gpu_graphs = std::string(dev) != "cuda-nograph";
        // F32 cache: with F16 the CPU rounds attention probabilities to f16 (the reference
        // does), CUDA's online softmax keeps them in f32; that alone moves logits ~1e-2.
        cp.kv_type = KvType::F32;
        auto ctx = Context::create(*model, cp);
        const moe_test::GreedyRun run =
            moe_test::greedy_run(*ctx, {510, 1, 300, 42, 77, 5, 9, 100}, 12, [&](int step, const std::function<void()> &decode) {
              const uint64_t before = moe_test::cuda_counts(*ctx).syncs;
              decode();
              const uint64_t syncs = moe_test::cuda_counts(*ctx).syncs - before;
              if (cp.device != "cpu" && step >= 3) {
                INFO(dev << " step " << step << ": host synchronisations in one decode step");
                CHECK(syncs <= 1);
              }
            });
        first_logits[dev] = run.first_logits;
        greedy[dev] = run.ids;
      }
      INFO("preset " << preset << " mix " << mix);
      CHECK(greedy["cuda"] == greedy["cpu"]);
      CHECK(greedy["cuda-nograph"] == greedy["cuda"]);
      std::vector<uint8_t> a(first_logits["cuda"].size() * 4), b(a.size());
      std::memcpy(a.data(), first_logits["cuda"].data(), a.size());
      std::memcpy(b.data(), first_logits["cpu"].data(), b.size());
      CHECK(rel_err(a, b) < 1e-3);
    }
    std::remove(path.c_str());
  }
#endif
}

// gpt-oss's attention shape (head dim 64, 8 query heads per KV head, sinks, a 16-cell window
// on every other layer): one sequence decodes in cell order, so the grouped decode kernel
// bounds its windowed layers' ranges by the span (DevUbatch::cell_pos_base); 40 steps take
// the context well past the window. Graph replays must read each step's span from the device.
// "cuda-chunk8": ranges of >= 8 cells, so the windowed layers merge 2 ranges (default: one).
TEST_CASE("cuda engine: gpt-oss (head dim 64, window 16) decodes past its window like the CPU", "[cuda][engine][span]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  const std::string path = (std::filesystem::temp_directory_path() / ("moe-cuda-oss-span-" + std::to_string(::getpid()) + ".gguf")).string();
  SynthSpec spec;
  spec.preset = "tiny-gpt-oss-hd64";
  spec.type_mix = "q8_0";
  write_synthetic_model(spec, path);
  {
    auto model = Model::load(path, ModelLoadParams{});
    std::map<std::string, std::vector<int32_t>> greedy;
    for (const char *dev : {"cpu", "cuda", "cuda-nograph", "cuda-chunk8"}) {
      ContextParams cp;
      cp.n_ctx = 128;
      cp.n_threads = 2;
      cp.device = std::string(dev) == "cpu" ? "cpu" : "cuda";
      cp.gpu_graphs = std::string(dev) != "cuda-nograph";
      if (std::string(dev) == "cuda-chunk8") cp.gpu_tuning.decode_min_chunk = 8;
      cp.kv_type = KvType::F32;  // see the tiny-model test above
      auto ctx = Context::create(*model, cp);
      greedy[dev] = moe_test::greedy_run(*ctx, {505, 1, 300, 42, 77, 5, 9, 100}, 40).ids;
    }
    CHECK(greedy["cpu"].size() == 40);
    CHECK(greedy["cuda"] == greedy["cpu"]);
    CHECK(greedy["cuda-nograph"] == greedy["cpu"]);
    CHECK(greedy["cuda-chunk8"] == greedy["cpu"]);
  }
  std::remove(path.c_str());
#endif
}

TEST_CASE("cuda engine: a 40-token prompt matches the CPU on the tensor cores (default) and in the CPU's order (cpu_float_order)",
          "[cuda][engine]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  // 40 tokens: dense products >= 16 columns and MatMulId >= 64 routed entries, so the default
  // context runs them on the int8 MMQ and cpu_float_order = 1 on the reference-order kernels.
  const std::string path = (std::filesystem::temp_directory_path() / ("moe-cuda-order-" + std::to_string(::getpid()) + ".gguf")).string();
  SynthSpec spec;
  spec.preset = "small";
  spec.type_mix = "q4_k_m";
  write_synthetic_model(spec, path);
  {
    auto model = Model::load(path, ModelLoadParams{});
    auto first_logits = [&](const char *dev, bool cpu_order) {
      ContextParams cp;
      cp.n_ctx = 128;
      cp.n_threads = 2;
      cp.device = dev;
      cp.kv_type = KvType::F32;
      cp.cpu_float_order = cpu_order;
      auto ctx = Context::create(*model, cp);
      std::vector<BatchToken> prompt;
      for (int32_t i = 0; i < 40; ++i) prompt.push_back({(i * 37 + 11) % 500 + 2, i, 0, i == 39});
      ctx->decode(prompt.data(), prompt.size());
      return std::vector<float>(ctx->logits(-1), ctx->logits(-1) + ctx->n_vocab());
    };
    const auto cpu = first_logits("cpu", false), fast = first_logits("cuda", false), ordered = first_logits("cuda", true);
    const double d_fast = moe_test::max_rel_diff(fast, cpu), d_ordered = moe_test::max_rel_diff(ordered, cpu);
    std::printf("40-token prompt vs the CPU: tensor cores max rel %.2e, CPU order %.2e\n", d_fast, d_ordered);
    CHECK(d_ordered < 1e-4);
    CHECK(d_fast < 2e-2);  // exact integer sums, another f32 fold order (amplified by the network)
  }
  std::remove(path.c_str());
#endif
}

// Hidden ([.]): per-op kernel time on a big model, run by tests/cuda/device_check.sh after
// it generates /tmp/q3.gguf (moeinfer-cli mkmodel --preset qwen3-30b-a3b --type q4_k_m).
TEST_CASE("cuda profile: per-op time of pp512 and tg on /tmp/q3.gguf (or MOE_PROFILE_MODEL)", "[.cuda-profile]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  // MOE_PROFILE_MODEL picks another file (the device script profiles other architectures too).
  const char *env = std::getenv("MOE_PROFILE_MODEL");
  const std::string path = env && *env ? env : "/tmp/q3.gguf";
  if (!std::filesystem::exists(path)) { WARN(path << " missing: skipped"); return; }
  auto model = Model::load(path, ModelLoadParams{});
  // MOE_PROFILE_DEPTH: prompt length before the decode steps (default 512; 4096 for "at depth").
  const char *depth_env = std::getenv("MOE_PROFILE_DEPTH");
  const int32_t depth = depth_env && *depth_env ? std::max(1, std::atoi(depth_env)) : 512;
  ContextParams cp;
  cp.n_ctx = static_cast<uint32_t>(depth + 512);
  cp.device = "cuda";
  cp.gpu_graphs = false;
  // MOE_PROFILE_TC=1: decode attention on the tensor-core kernel (bench --tc-decode-attn).
  const char *tc_env = std::getenv("MOE_PROFILE_TC");
  cp.gpu_tuning.tc_decode_attention = tc_env && *tc_env == '1';
  auto ctx = Context::create(*model, cp);
  std::vector<BatchToken> prompt;
  for (int32_t i = 0; i < depth; ++i) prompt.push_back({(i * 7919) % 1000 + 10, i, 0, i == depth - 1});
  // The prompt in batches of at most 512 tokens (the context's n_batch).
  auto feed = [&] {
    for (size_t i = 0; i < prompt.size(); i += 512) ctx->decode(prompt.data() + i, std::min<size_t>(512, prompt.size() - i));
  };
  feed();  // warm-up
  ctx->kv_clear();
  CudaProfile &prof = moe_test::cuda_backends(*ctx).at(0)->profile();
  prof.enable(true);
  feed();
  std::printf("---- prompt of %d tokens, eager, per-op kernel time\n%s", depth, prof.report(true).c_str());
  for (int step = 0; step < 32; ++step) {
    BatchToken t{42 + step, depth + step, 0, true};
    ctx->decode(&t, 1);
  }
  std::printf("---- 32 decode steps (n_kv %d..%d), eager, per-op kernel time\n%s", depth, depth + 32,
              prof.report(true).c_str());
#endif
}

// The paths of older GPUs, emulated on this one (a registry's GpuEmulation), against the CPU: sm_75 (no tensor-core code,
// 64 KB per block: the f32 tile kernels, reference-order and FMA attention, cuBLAS for long
// dense batches) and sm_86 / sm_89 / sm_120 (99 KB per block: Q4_K's int8 MMQ on its generic
// kernel instead of the 112 KB raw one; MLA attention on the older kernels).
TEST_CASE("cuda op: the paths of older GPUs (sm_75, 99 KB sm_86) emulated on this one match the CPU", "[ops][cuda][mma][paths]") {
#ifdef MOEINFER_WITH_CUDA
  struct Emu {
    int arch, smem;
  };
  for (const Emu emu : {Emu{75, 65536}, Emu{86, 101376}}) {
    BackendRegistry reg("", GpuEmulation{emu.arch, emu.smem});  // its CUDA backend takes the older GPU's paths
    Backend *gpu = gpu_or_skip(reg);
    if (!gpu) return;
    INFO("emulated sm_" << emu.arch << ", " << emu.smem << " bytes of shared memory per block");
    const CudaPaths p = static_cast<const CudaBackend *>(gpu)->paths();
    REQUIRE(p.device_arch <= emu.arch);
    CHECK(p.tensor_cores == (emu.arch >= 80));
    CHECK_FALSE(p.pdl);
    CHECK(p.smem_optin <= emu.smem);
    uint32_t seed = 1300;
    {
      const GpuTuning int8_only = tensor_core_batches(0);
      dense_sweep(reg, *gpu, {16, 77}, 128, 203, seed, int8_only);
      for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::F16})
        for (int64_t N : {40, 512}) {
          INFO("type " << dtype_name(t) << " K=2048 M=768 N=" << N);
          CHECK(dense_case(reg, *gpu, t, 2048, 768, N, seed, 1e-4, int8_only));
          seed += 2;
        }
      for (DType t : kAllTypes) {
        const int64_t K = k_for(t, true), M = 200, E = 16, k = 4, T = 100;
        INFO("matmul_id type " << dtype_name(t));
        CHECK(moe_case(reg, *gpu, t, K, M, E, k, T, 1, random_ids(T, E, k, seed), seed, 1e-4, int8_only));
        seed += 2;
      }
      for (DType t : {DType::Q8_0, DType::Q4_K, DType::F16}) {
        INFO("matmul_heads type " << dtype_name(t));
        CHECK(heads_case(reg, *gpu, t, 512, 256, 20, 100, seed, int8_only));
        seed += 2;
      }
    }
    // No tensor-core GEMM needed for cuBLAS.
    CHECK(dense_case(reg, *gpu, DType::Q4_K, 2048, 130, 300, seed, 2e-3, tensor_core_batches(256)));
    for (KvType kt : {KvType::F16, KvType::Q8_0}) {
      AttnSetup s;
      s.tuning = tensor_core_batches();
      s.kt = kt;
      s.hd = s.hd_v = 128;
      s.n_head = 8;
      s.n_head_kv = 2;
      s.window = kt == KvType::Q8_0 ? 17 : 0;
      s.batches = {37, 50, 200};
      attention_case(reg, *gpu, s, "tiled, emulated device");
    }
    {
      AttnSetup s = mla_setup(KvType::F16, 20);
      s.tuning = tensor_core_batches();
      s.batches = {37, 50, 12, 1};
      attention_case(reg, *gpu, s, "MLA, emulated device");
    }
  }
#endif
}

// Hidden ([.]): per-op kernel time of decode steps of B sequences together (bench --parallel),
// B = 4, 16 and 64, each sequence after its own 128-token prompt.
TEST_CASE("cuda profile: per-op time of B-sequence decode steps on /tmp/q3.gguf (or MOE_PROFILE_MODEL)", "[.cuda-profile-par]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  const char *env = std::getenv("MOE_PROFILE_MODEL");
  const std::string path = env && *env ? env : "/tmp/q3.gguf";
  if (!std::filesystem::exists(path)) { WARN(path << " missing: skipped"); return; }
  auto model = Model::load(path, ModelLoadParams{});
  for (int32_t B : {4, 16, 64}) {
    ContextParams cp;
    cp.n_ctx = std::max<uint32_t>(4096, static_cast<uint32_t>(B) * 160);  // each sequence: 128 prompt + 17 steps
    cp.n_seq_max = static_cast<uint32_t>(B);
    cp.device = "cuda";
    cp.gpu_graphs = false;
    // MOE_PROFILE_NO_SEQS_ATTN set: attention of these steps on the tiled kernels (the A/B of
    // GpuTuning::seqs_decode_attention).
    if (const char *o = std::getenv("MOE_PROFILE_NO_SEQS_ATTN"); o && *o) cp.gpu_tuning.seqs_decode_attention = false;
    auto ctx = Context::create(*model, cp);
    for (int32_t s = 0; s < B; ++s) {
      std::vector<BatchToken> prompt;
      for (int32_t i = 0; i < 128; ++i) prompt.push_back({(i * 7919 + s * 131) % 1000 + 10, i, s, i == 127});
      ctx->decode(prompt.data(), prompt.size());
    }
    auto step = [&](int k) {
      std::vector<BatchToken> b;
      for (int32_t s = 0; s < B; ++s) b.push_back({42 + k + s, 128 + k, s, true});
      ctx->decode(b.data(), b.size());
    };
    step(0);  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 1; k <= 8; ++k) step(k);
    const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 8;
    CudaProfile &prof = moe_test::cuda_backends(*ctx).at(0)->profile();  // this context's alone
    prof.enable(true);
    for (int k = 9; k <= 16; ++k) step(k);
    std::printf("---- %d sequences: %.2f ms per step eager wall (unprofiled); 8 profiled steps, per-op kernel time\n%s", B,
                wall, prof.report(true).c_str());
  }
#endif
}
