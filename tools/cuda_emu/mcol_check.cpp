// Runs the multi-column mat-vec (ops/matvec_cols.cu, included before this file by
// run_mcol.sh) through emu.h and checks it against float64 sums of the CPU's dequantized
// weights and its rounding of the activations (Q8_0 / Q8_K integers as act_round_kernel
// writes them for the int8 paths; F16 / BF16 elementwise; F32 none), for every weight type:
// dense 2..15 columns (one and two column tiles, partial ones), K across chunk boundaries
// (K-quants 4608 = 2048 + 2048 + 512, Q8_0-rounded types 2080 = 32 x 65) and short K (one
// partial chunk; 32 x odd), odd M (a partial last block); plain types on 1 / 2 / 8 warps per
// row and the scalar path (K % 8 != 0); quantized on one multiprocessor (several chunk groups
// of 1..8 rows per warp, a short last one); MatMulId from host-built route tables (matmul_route.h)
// with repeated experts, an expert chosen by every token (12 entries: a full and a partial
// tile), idle tiles, X = 1 and X = n_used. Every output must be written (NaN-filled before).
// Exit status 1 on any failure.
#include <cstdio>
#include <memory>
#include <string>

#include "check_data.h"

using namespace emu_check;

namespace {

int failures = 0, checks = 0;
unsigned use_tc = 0;  // launch_mcol's tensor_cores (the Q4_K / Q6_K int8 mma kernels)

DType act_of(DType t) { return t == DType::Q4_0 || t == DType::Q8_0 || t == DType::MXFP4 ? DType::Q8_0 : DType::Q8_K; }

// Activation rows as the kernel reads them, and the CPU's rounded values (float64 reference).
struct Acts {
  int64_t K;
  std::vector<float> x, xr;  // raw; rounded through the weight type's activation format
  std::vector<int8_t> q;
  std::vector<float> s;      // (scale, integer sum) per 16
  Acts(DType t, int64_t K_, int64_t rows) : K(K_), x(randn(static_cast<size_t>(K_ * rows))), xr(x.size()), q(x.size()), s(x.size() / 8 + 2) {
    for (int64_t r = 0; r < rows; ++r) {
      const float *xs = x.data() + r * K;
      float *o = xr.data() + r * K;
      if (t == DType::F16) for (int64_t i = 0; i < K; ++i) o[i] = round_fp16(xs[i]);
      else if (t == DType::BF16) for (int64_t i = 0; i < K; ++i) o[i] = bf16_to_fp32(fp32_to_bf16(xs[i]));
      else if (t == DType::F32) for (int64_t i = 0; i < K; ++i) o[i] = xs[i];
      else {
        round_int8(act_of(t), xs, K, q.data() + r * K, s.data() + r * K / 8);
        for (int64_t i = 0; i < K; ++i) o[i] = s[static_cast<size_t>(r * K / 8 + 2 * (i / 16))] * q[static_cast<size_t>(r * K + i)];
      }
    }
  }
};

McolArgs args_for(DType t, const Buf &w, int64_t K, int64_t M, Acts &a, float *y) {
  McolArgs m{};
  m.w = w.p;
  m.rb = static_cast<int64_t>(row_size(t, K));
  m.K = static_cast<int>(K);
  m.M = static_cast<int>(M);
  m.xq = a.q.data();
  m.xs = reinterpret_cast<const float2 *>(a.s.data());
  const int64_t rows = static_cast<int64_t>(a.x.size()) / K;
  m.x = TView{a.x.data(), {K, rows, 1, 1}, {4, K * 4, K * rows * 4, K * rows * 4}};
  m.y = y;
  return m;
}

// y (out rows of M) against float64 dots of weight rows and rounded activation rows:
// want(o, m) = sum_k W[expert(o)][m][k] xr[xrow(o)][k].
template <class F>
void compare(const std::string &what, DType t, const Buf &w, int64_t K, int64_t M, const Acts &a, const std::vector<float> &y, int outs, F &&route) {
  ++checks;
  const size_t rb = row_size(t, K);
  std::vector<float> wd(static_cast<size_t>(K));
  double num = 0, den = 0;
  bool written = true;
  for (int o = 0; o < outs; ++o) {
    int e, xrow;
    route(o, e, xrow);
    for (int64_t m = 0; m < M; ++m) {
      dequantize_row(t, w.p + (static_cast<size_t>(e) * M + m) * rb, wd.data(), K);
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(wd[k]) * a.xr[static_cast<size_t>(xrow * K + k)];
      const double got = y[static_cast<size_t>(o * M + m)];
      written = written && std::isfinite(got);
      num += (got - s) * (got - s);
      den += s * s;
    }
  }
  const double rel = std::sqrt(num / den);
  const bool ok = written && rel < 1e-5;
  if (!ok) ++failures;
  std::printf("%-6s %-44s rel %.2e%s  %s\n", dtype_name(t), what.c_str(), rel, written ? "" : " (outputs not written)", ok ? "ok" : "FAIL");
}

void check_dense(DType t, int64_t K, int64_t M, int N, int n_sm) {
  std::unique_ptr<Buf> w(weights(t, K, M));
  Acts a(t, K, N);
  std::vector<float> y(static_cast<size_t>(M * N), NAN);
  McolArgs m = args_for(t, *w, K, M, a, y.data());
  m.ncols = N;
  launch_mcol(t, LaunchStream{}, m, (N + kMcolCols - 1) / kMcolCols, n_sm, N, use_tc);
  compare(std::string(use_tc ? "tc " : "") + "dense K " + std::to_string(K) + " M " + std::to_string(M) + " N " + std::to_string(N) + " sms " + std::to_string(n_sm), t, *w, K, M,
          a, y, N, [](int o, int &e, int &xrow) { e = 0; xrow = o; });
}

// MatMulId: T tokens of n_used slots over E experts; route tables built as route_kernel
// writes them (entries grouped by expert, tiles of <= kMcolCols, idle tiles after).
void check_moe(DType t, int64_t K, int64_t M, int E, int n_used, int T, int X, uint32_t seed, int n_sm = 132) {
  std::mt19937 r(seed);
  std::vector<int> ids(static_cast<size_t>(T * n_used));
  for (int i = 0; i < T * n_used; ++i) ids[static_cast<size_t>(i)] = static_cast<int>(r() % static_cast<unsigned>(E));
  for (int tk = 0; tk < T; ++tk) ids[static_cast<size_t>(tk * n_used)] = 0;  // expert 0: every token's first slot
  if (n_used > 2) ids[2] = ids[1];                                           // an expert twice for token 0
  std::vector<int2> entries;
  std::vector<int4> tiles;
  for (int e = 0; e < E; ++e) {
    const int first = static_cast<int>(entries.size());
    for (int i = 0; i < T * n_used; ++i)
      if (ids[static_cast<size_t>(i)] == e) {
        const int tk = i / n_used, j = i % n_used;
        entries.push_back(make_int2(X == 1 ? tk : tk * X + j, i));
      }
    for (int f = first; f < static_cast<int>(entries.size()); f += kMcolCols)
      tiles.push_back(make_int4(e, f, std::min(kMcolCols, static_cast<int>(entries.size()) - f), 0));
  }
  const int max_tiles = cuda_route_max_tiles(n_used, T, E, kMcolCols);
  tiles.resize(static_cast<size_t>(max_tiles), make_int4(0, 0, 0, 0));
  std::unique_ptr<Buf> w(weights(t, K, M * E));
  Acts a(t, K, static_cast<int64_t>(X) * T);
  std::vector<float> y(static_cast<size_t>(M * n_used * T), NAN);
  McolArgs m = args_for(t, *w, K, M, a, y.data());
  m.eb = m.rb * M;
  m.tiles = tiles.data();
  m.entries = entries.data();
  launch_mcol(t, LaunchStream{}, m, max_tiles, n_sm, std::min(T, kMcolCols), use_tc);  // (4 columns at T <= 4; token 0 names an expert twice)
  compare(std::string(use_tc ? "tc " : "") + "moe K " + std::to_string(K) + " M " + std::to_string(M) + " T " + std::to_string(T) + " X " + std::to_string(X) + " sms " + std::to_string(n_sm), t, *w, K, M, a, y,
          n_used * T, [&](int o, int &e, int &xrow) {
            e = ids[static_cast<size_t>(o)];
            xrow = X == 1 ? o / n_used : o;
          });
}

}  // namespace

int main(int argc, char **argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q8_0, DType::MXFP4,
                         DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  for (DType t : types)
    for (bool tc : {false, true}) {
    if ((!only.empty() && only != dtype_name(t)) || (tc && t != DType::Q4_K && t != DType::Q6_K)) continue;
    use_tc = tc ? kMcolTcQ4K | kMcolTcQ6K : 0u;
    const int bs = type_traits(t).block_size;
    const int64_t k_long = bs == 256 ? 4608 : bs == 32 ? 2080 : 2056, k_short = bs == 256 ? 512 : bs == 32 ? 96 : 100;
    for (int N : {2, 3, 8, 9, 15}) check_dense(t, k_short, 37, N, 132);
    for (int N : {4, 15}) check_dense(t, k_long, 37, N, 132);
    if (is_plain(t))
      for (int n_sm : {1, 4}) check_dense(t, 2048, 37, 5, n_sm);  // 1 / 2 warps per row (132 SMs: 8)
    for (int T : {2, 4}) {
      check_moe(t, k_short, 21, 6, 3, T, 1, 11u * T);
      check_moe(t, k_short, 21, 6, 3, T, 3, 13u * T);
    }
    check_moe(t, k_long, 13, 5, 3, 12, 1, 17);  // expert 0: 12 entries, two tiles
    if (!is_plain(t)) {  // one multiprocessor: several chunk groups per warp, short last ones
      check_dense(t, k_short, 301, 3, 1);
      check_dense(t, k_long, 301, 4, 1);
      check_moe(t, k_short, 75, 6, 3, 4, 1, 19, 1);
      check_moe(t, bs == 256 ? 768 : 224, 75, 6, 3, 4, 1, 23, 1);  // MoE down's shape: 3 rows per chunk (K-quants)
    }
    }
  std::printf("%d of %d checks failed\n", failures, checks);
  return failures ? 1 : 0;
}
