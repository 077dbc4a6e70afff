// Runs the small-batch reference-order kernel (ops/matmul_ref_order.cu, generated into a
// host build by run_mmv_ref.sh) through emu.h and checks every output bit for bit against
// the CPU's ref_order_dot_rows on the path ref_order_path gives its column: Q4_K, Q5_K,
// Q6_K, Q8_0 on random block bytes (every scale and min code), dense 2..13 columns (Q4_K's
// gemm order on full groups of 4 when rows % 8 == 0, its gemv order on the rest) and
// MatMulId tiles of several experts; dense F32 (the CPU's batched GEMM order or its vec_dot). Exit status 1 on any difference.
#include <cstdio>
#include <memory>
#include <string>

#include "check_data.h"
#include "matmul_ref_order_api.h"

using namespace moe;
using namespace emu_check;

namespace {

int failures = 0, checks = 0;
void same(const std::vector<float> &want, const std::vector<float> &got, const std::string &what) {
  ++checks;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&want[i], &got[i], 4) != 0) {
      ++failures;
      std::printf("DIFF %s at %zu: %.9g vs %.9g (CPU)\n", what.c_str(), i, got[i], want[i]);
      return;
    }
}

constexpr int kNT = 8;  // columns per tile (matmul.cu's kTile)

// Rounded activation rows (act_round_kernel's int8 form).
struct Acts {
  std::vector<float> x;
  std::vector<int8_t> q;
  std::vector<float> s;  // (scale, sum) per 16
  Acts(DType t, int64_t K, int64_t rows) : x(randn(static_cast<size_t>(K * rows))), q(static_cast<size_t>(K * rows)), s(static_cast<size_t>(K * rows / 8)) {
    for (int64_t r = 0; r < rows; ++r) round_int8(t, x.data() + r * K, K, q.data() + r * K, s.data() + r * K / 8);
  }
};

void check_dense(DType t, int64_t K, int64_t M, int N) {
  const std::string tag = std::string(dtype_name(t)) + " dense K " + std::to_string(K) + " M " + std::to_string(M) + " N " + std::to_string(N);
  std::unique_ptr<Buf> w(random_blocks(t, K, M));
  const size_t rb = row_size(t, K);
  Acts a(t, K, N);
  std::vector<float> y(static_cast<size_t>(M * N), NAN), want;
  const int gemm_cols = t == DType::Q4_K && M % 8 == 0 && N >= 4 ? N - N % 4 : 0;  // matmul.cu's rule
  emu_launch_mmv_ref(t, w->p, static_cast<int64_t>(rb), 0, static_cast<int>(K), static_cast<int>(M), a.q.data(), a.s.data(), y.data(), N,
                     gemm_cols, kNT, nullptr, nullptr, (N + kNT - 1) / kNT);
  for (int n = 0; n < N; ++n) {
    const auto col = cpu_rows_on(t, w->p, rb, M, K, a.x.data() + n * K, ref_order_path(t, K, M, N, n, false));
    want.insert(want.end(), col.begin(), col.end());
  }
  same(want, y, tag);
}

// MatMulId: T tokens, each with n_used expert slots (ids), X = 1 (a shared activation per
// token); tiles of <= kNT entries per expert, grouped as the routing kernel does.
void check_experts(DType t, int64_t K, int64_t M) {
  const std::string tag = std::string(dtype_name(t)) + " experts K " + std::to_string(K) + " M " + std::to_string(M);
  const int E = 4, T = 5, n_used = 2;
  const int ids[T][n_used] = {{0, 2}, {2, 3}, {2, 0}, {1, 2}, {2, 3}};
  std::unique_ptr<Buf> w(random_blocks(t, K, M * E));
  const size_t rb = row_size(t, K);
  Acts a(t, K, T);
  std::vector<int> tiles;   // (expert, first, count, 0)
  std::vector<int> entries;  // (activation row, output row)
  for (int e = 0; e < E; ++e) {
    std::vector<int> mine;
    for (int tk = 0; tk < T; ++tk)
      for (int j = 0; j < n_used; ++j)
        if (ids[tk][j] == e) mine.insert(mine.end(), {tk, tk * n_used + j});
    for (size_t f = 0; f < mine.size() / 2; f += kNT) {
      const int first = static_cast<int>(entries.size() / 2), cnt = static_cast<int>(std::min<size_t>(kNT, mine.size() / 2 - f));
      tiles.insert(tiles.end(), {e, first, cnt, 0});
      entries.insert(entries.end(), mine.begin() + 2 * f, mine.begin() + 2 * (f + cnt));
    }
  }
  tiles.insert(tiles.end(), {0, 0, 0, 0});  // an empty tile (capacity above the count)
  std::vector<float> y(static_cast<size_t>(M * T * n_used), NAN), want(y.size());
  emu_launch_mmv_ref(t, w->p, static_cast<int64_t>(rb), static_cast<int64_t>(rb * M), static_cast<int>(K), static_cast<int>(M), a.q.data(),
                     a.s.data(), y.data(), 0, 0, kNT, tiles.data(), entries.data(), static_cast<int>(tiles.size() / 4));
  for (int tk = 0; tk < T; ++tk)
    for (int j = 0; j < n_used; ++j) {
      const auto col = cpu_rows(t, w->p + ids[tk][j] * rb * M, rb, M, K, a.x.data() + tk * K, true);
      std::copy(col.begin(), col.end(), want.begin() + (tk * n_used + j) * M);
    }
  same(want, y, tag);
}

// Dense F32: the CPU's batched GEMM order where it takes it (K % 16 == 0, M % 4 == 0), else
// its one-token order; gemm16 as matmul.cu decides it.
void check_f32(int64_t K, int64_t M, int N) {
  const std::string tag = "f32 dense K " + std::to_string(K) + " M " + std::to_string(M) + " N " + std::to_string(N);
  std::unique_ptr<Buf> w(weights(DType::F32, K, M));
  const auto x = randn(static_cast<size_t>(K * N));
  std::vector<float> y(static_cast<size_t>(M * N), NAN), want;
  emu_launch_mmv_ref_f32(reinterpret_cast<const float *>(w->p), K, static_cast<int>(K), static_cast<int>(M), x.data(), y.data(), N, kNT,
                         K % 16 == 0 && M % 4 == 0);
  for (int n = 0; n < N; ++n) {
    const auto col = cpu_rows_on(DType::F32, w->p, static_cast<size_t>(K) * 4, M, K, x.data() + n * K, ref_order_path(DType::F32, K, M, N, n, false));
    want.insert(want.end(), col.begin(), col.end());
  }
  same(want, y, tag);
}

}  // namespace

int main() {
  for (int64_t K : {int64_t(96), int64_t(100), int64_t(2048)})
    for (int64_t M : {int64_t(37), int64_t(40)})
      for (int N : {2, 5, 13}) check_f32(K, M, N);
  std::printf("f32: %d checks, %d failures so far\n", checks, failures);
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0}) {
    const bool k256 = type_traits(t).block_size == 256;
    for (int64_t K : {k256 ? int64_t(768) : int64_t(96), k256 ? int64_t(2304) : int64_t(1056)})
      for (int64_t M : {int64_t(37), int64_t(40)}) {
        for (int N : {2, 3, 4, 5, 8, 13}) check_dense(t, K, M, N);
        check_experts(t, K, M);
      }
    std::printf("%s: %d checks, %d failures so far\n", dtype_name(t), checks, failures);
  }
  std::printf("%s: %d checks, %d failures\n", failures ? "FAILED" : "OK", checks, failures);
  return failures ? 1 : 0;
}
