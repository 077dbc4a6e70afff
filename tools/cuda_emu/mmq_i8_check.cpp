// Checks the int8 MMQ kernel (matmul_mmq_i8.cu), run through emu.h / emu_int8.h, against a
// float64 product of dequant32's weights (the extra types, Q4_1 ... IQ1_M: the CPU's
// dequantize_row) and the int8 activations, dense and with routing tiles, on random blocks; Q4_K and Q6_K also through the kernels from raw fragments
// (mmq_q4k_raw.cuh, mmq_q6k_raw.cuh), bit for bit against mmq_i8_kernel (random bytes: every scale and min code, Q6_K's -128 included;
// only the f16 block scales are set to sane values). Args: SEED [TYPE]; exit status 1 on failure.
#include "emu_int8.h"
#include "backends/cuda/ops/mma_common.cuh"
#include "backends/cuda/ops/mmq_i8_fold.cuh"
#include "backends/cuda/ops/mmq_i8_weights.cuh"
#include "backends/cuda/ops/mmq_q4k_raw.cuh"
#include "backends/cuda/ops/mmq_q6k_raw.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/quant.cuh"
#include <cstdio>
#include <random>

#include "quant/dtype.h"

namespace moe {
#include "mmq_i8_emu.inc"
#include "mmq_i8_old.inc"
}
using namespace moe;

static uint16_t f16bits(float x) { __half h = __float2half_rn(x); uint16_t b; std::memcpy(&b, &h, 2); return b; }

template <DType T> struct Layout;
template <> struct Layout<DType::Q4_0> { static constexpr int qk = 32, bytes = 18, d[2] = {0, -1}; };
template <> struct Layout<DType::Q8_0> { static constexpr int qk = 32, bytes = 34, d[2] = {0, -1}; };
template <> struct Layout<DType::MXFP4> { static constexpr int qk = 32, bytes = 17, d[2] = {-1, -1}; };  // E8M0 byte 0
template <> struct Layout<DType::Q4_K> { static constexpr int qk = 256, bytes = 144, d[2] = {0, 2}; };
template <> struct Layout<DType::Q5_K> { static constexpr int qk = 256, bytes = 176, d[2] = {0, 2}; };
template <> struct Layout<DType::Q6_K> { static constexpr int qk = 256, bytes = 210, d[2] = {208, -1}; };
// The extra types: f16 d at 0 (and Q4_1 / Q5_1's m at 2); IQ1_M's d is set by fix_iq1m.
template <DType T> struct ExtraLayout {
  static constexpr int qk = extra_qk<T>, bytes = extra_bytes<T>(), d[2] = {T == DType::IQ1_M ? -1 : 0, extra_has_min<T> ? 2 : -1};
};
#define MOE_EXTRA_LAYOUT(TY) \
  template <> struct Layout<TY> : ExtraLayout<TY> {};
MOE_EXTRA_LAYOUT(DType::Q4_1)
MOE_EXTRA_LAYOUT(DType::Q5_0)
MOE_EXTRA_LAYOUT(DType::Q5_1)
MOE_EXTRA_LAYOUT(DType::IQ4_NL)
MOE_EXTRA_LAYOUT(DType::IQ4_XS)
MOE_EXTRA_LAYOUT(DType::IQ3_S)
MOE_EXTRA_LAYOUT(DType::IQ3_XXS)
MOE_EXTRA_LAYOUT(DType::IQ2_S)
MOE_EXTRA_LAYOUT(DType::IQ2_XS)
MOE_EXTRA_LAYOUT(DType::IQ2_XXS)
MOE_EXTRA_LAYOUT(DType::IQ1_S)
MOE_EXTRA_LAYOUT(DType::IQ1_M)
#undef MOE_EXTRA_LAYOUT

// IQ1_M keeps its f16 scale in the top nibbles of its four scale words (bytes 48..55).
static void fix_iq1m(uint8_t *blk, uint16_t h) {
  for (int k = 0; k < 4; ++k) {
    uint16_t sc;
    std::memcpy(&sc, blk + 48 + 2 * k, 2);
    sc = static_cast<uint16_t>((sc & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12));
    std::memcpy(blk + 48 + 2 * k, &sc, 2);
  }
}

// One case: E experts of M x K weights; tiles == empty: dense over N columns (K split into
// k_len ranges, partial results summed here in order), else routed.
template <DType T>
static bool run_case(const char *name, int M, int K, int N, int E, std::vector<int4> tiles, std::vector<int2> entries, uint32_t seed,
                     int k_len = 0) {
  using L = Layout<T>;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), q8(-127, 127);
  std::uniform_real_distribution<float> ud(0.25f, 1.0f);
  const int64_t row_bytes = static_cast<int64_t>(K / L::qk) * L::bytes, expert_bytes = row_bytes * M;
  // 16 bytes past the tensor: a 16-byte chunk holding its last byte (the cp.async cover of
  // the last row of 2-byte aligned blocks) lies on the device inside the allocation's page.
  std::vector<uint8_t> W(static_cast<size_t>(expert_bytes * E) + 16);
  for (auto &b : W) b = static_cast<uint8_t>(byte(rng));
  for (size_t blk = 0; blk < W.size() / L::bytes; ++blk)
    for (int f = 0; f < 2; ++f)
      if (L::d[f] >= 0) {
        const uint16_t b = f16bits(ud(rng) * (f ? 0.02f : 0.01f));
        std::memcpy(&W[blk * L::bytes + L::d[f]], &b, 2);
      }
  if (T == DType::IQ1_M)
    for (size_t blk = 0; blk < W.size() / L::bytes; ++blk) fix_iq1m(&W[blk * L::bytes], f16bits(ud(rng) * 0.01f));
  if (T == DType::MXFP4)  // scales 2^-11 .. 2^4
    for (size_t blk = 0; blk < W.size() / L::bytes; ++blk) W[blk * L::bytes] = static_cast<uint8_t>(117 + rng() % 16);
  const int cblk = L::qk == 256 ? 256 : 32;  // Q8_K or Q8_0 activation blocks
  std::vector<int8_t> Xq(static_cast<size_t>(N) * K);
  std::vector<float2> Xs(static_cast<size_t>(N) * K / 16);
  std::vector<float> c(static_cast<size_t>(N) * K / cblk);
  for (auto &v : c) v = ud(rng) * 0.01f;
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) Xq[static_cast<size_t>(n) * K + k] = static_cast<int8_t>(k % 97 == 5 ? (k & 1 ? 127 : -127) : q8(rng));
  for (int n = 0; n < N; ++n)
    for (int g = 0; g < K / 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += Xq[static_cast<size_t>(n) * K + 16 * g + i];
      const float cn = c[static_cast<size_t>(n) * (K / cblk) + 16 * g / cblk];
      Xs[static_cast<size_t>(n) * (K / 16) + g] = make_float2(cn, static_cast<float>(sum));
    }
  if constexpr (mmq::i8_min32<T>)  // quant_extra.cu's layout: the 32-block's s = c X in its first group, 0 in the second
    for (size_t g = 0; g < Xs.size(); g += 2) {
      Xs[g].y = Xs[g].x * (Xs[g].y + Xs[g + 1].y);
      Xs[g + 1].y = 0.0f;
    }
  const bool dense = tiles.empty();
  if (dense)
    for (int n = 0; n < N; ++n) entries.push_back(make_int2(n, n));
  const int n_out = static_cast<int>(entries.size());
  if (k_len <= 0) k_len = K;
  const int nz = (K + k_len - 1) / k_len;
  const int64_t y_split = nz > 1 ? static_cast<int64_t>(n_out) * M : 0;
  std::vector<float> part(static_cast<size_t>(n_out) * M * nz, -777.0f), Y(static_cast<size_t>(n_out) * M);
  const int n_col_tiles = dense ? (N + 63) / 64 : static_cast<int>(tiles.size());
  const dim3 grid(static_cast<unsigned>((M + 127) / 128), static_cast<unsigned>(n_col_tiles), static_cast<unsigned>(nz));
  auto launch = [&](auto kernel, std::vector<float> &out) {
    emu_launch(grid, 256, kernel, static_cast<const uint8_t *>(W.data()), row_bytes, dense ? int64_t(0) : expert_bytes, K, M,
               static_cast<const int8_t *>(Xq.data()), static_cast<const float2 *>(Xs.data()), out.data(), dense ? N : 0,
               dense ? static_cast<const int4 *>(nullptr) : static_cast<const int4 *>(tiles.data()),
               dense ? static_cast<const int2 *>(nullptr) : static_cast<const int2 *>(entries.data()), k_len, y_split);
  };
  launch(mmq_i8_emu::mmq_i8_kernel<T>, part);
  int differ = 0;  // outputs not bit-identical with the OLD revision's kernel (or, Q4_K / Q6_K, the raw-fragment kernel's)
  if constexpr (T == DType::Q4_K || T == DType::Q6_K) {
    if ((reinterpret_cast<uintptr_t>(W.data()) & 15) != 0) std::abort();  // the launchers' condition for the raw kernels
    auto check_raw = [&](auto kernel, const char *what) {
      std::vector<float> part_raw(part.size(), -777.0f);
      launch(kernel, part_raw);
      int d = 0;
      for (size_t i = 0; i < part.size(); ++i) d += std::memcmp(&part[i], &part_raw[i], 4) != 0;
      if (d) std::printf("  %s: %d outputs of the raw-fragment kernel (%s) differ from mmq_i8_kernel's\n", name, d, what);
      differ += d;
    };
    if constexpr (T == DType::Q4_K) {  // the launcher's stage count, and 2 stages (the loop's other case)
      static_assert(mmq::kQ4kRawStages != 2, "check another stage count too");
      check_raw(mmq::mmq_q4k_raw_kernel<T, mmq::kQ4kRawStages>, "launcher's stages");
      check_raw(mmq::mmq_q4k_raw_kernel<T, 2>, "2 stages");
    } else {
      check_raw(mmq::mmq_q6k_raw_kernel<T>, "2 stages");
    }
  }
#ifdef MMQ_I8_OLD
  if constexpr (T != DType::MXFP4 && !mmq::i8_extra<T>) {  // new on this kernel (before: the f16 MMQ, matmul_mmq.cu; the dp4a kernel)
    std::vector<float> part_old(part.size(), -777.0f);
    launch(mmq_i8_old::mmq_i8_kernel<T>, part_old);
    for (size_t i = 0; i < part.size(); ++i) differ += std::memcmp(&part[i], &part_old[i], 4) != 0;
  }
#endif
  for (size_t i = 0; i < Y.size(); ++i) {
    Y[i] = part[i];
    for (int z = 1; z < nz; ++z) Y[i] += part[static_cast<size_t>(z) * Y.size() + i];
  }
  // Reference: expert of each entry from the tiles.
  std::vector<int> expert_of(static_cast<size_t>(n_out), 0);
  for (const int4 &t : tiles)
    for (int i = 0; i < t.z; ++i) expert_of[static_cast<size_t>(t.y + i)] = t.x;
  std::vector<float> w(static_cast<size_t>(K));
  double worst = 0;
  int bad = 0;
  for (int e = 0; e < n_out; ++e) {
    const int xrow = entries[static_cast<size_t>(e)].x, yrow = entries[static_cast<size_t>(e)].y;
    for (int m = 0; m < M; ++m) {
      const uint8_t *row = W.data() + expert_of[static_cast<size_t>(e)] * expert_bytes + m * row_bytes;
      if constexpr (mmq::i8_extra<T>)
        dequantize_row(T, row, w.data(), K);
      else
        for (int s = 0; s < K / 32; ++s) dequant32<T>(row, s, w.data() + 32 * s);
      double ref = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        const double x = double(Xq[static_cast<size_t>(xrow) * K + k]) * c[static_cast<size_t>(xrow) * (K / cblk) + k / cblk];
        ref += double(w[static_cast<size_t>(k)]) * x;
        mag += std::fabs(double(w[static_cast<size_t>(k)]) * x);
      }
      const double err = std::fabs(double(Y[static_cast<size_t>(yrow) * M + m]) - ref) / (mag + 1e-30);
      worst = std::max(worst, err);
      if (!(err < 2e-6) && bad++ < 5) std::printf("  %s: out %d row %d: %g vs %g\n", name, yrow, m, Y[static_cast<size_t>(yrow) * M + m], ref);
    }
  }
  std::printf("%-32s %s (worst error / sum |w x| = %.2e; %d of %zu outputs differ from OLD's)\n", name, bad || differ ? "FAIL" : "ok", worst,
              differ, part.size());
  return bad == 0 && differ == 0;
}

// Routing tiles over E experts: entries grouped by expert, tiles of <= 64, plus an empty
// tile. Expert 0 takes ~60% of the entries, so there are full, wide and narrow (<= 32) tiles.
static void routing(int E, int n_tok, int N, uint32_t seed, std::vector<int4> &tiles, std::vector<int2> &entries) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int>> by_e(static_cast<size_t>(E));
  for (int t = 0; t < n_tok; ++t) {
    const int e = rng() % 10 < 6 ? 0 : 1 + static_cast<int>(rng() % (E - 1));
    by_e[static_cast<size_t>(e)].push_back(static_cast<int>(rng() % N));
  }
  for (int e = 0; e < E; ++e) {
    const auto &v = by_e[static_cast<size_t>(e)];
    for (size_t i = 0; i < v.size(); i += 64) {
      const int first = static_cast<int>(entries.size()), cnt = static_cast<int>(std::min<size_t>(64, v.size() - i));
      for (int j = 0; j < cnt; ++j) entries.push_back(make_int2(v[i + j], static_cast<int>(entries.size())));
      tiles.push_back(make_int4(e, first, cnt, 0));
    }
  }
  tiles.push_back(make_int4(0, 0, 0, 0));
}

// Routing tiles of fixed sizes: expert e gets counts[e] entries (0: none, 1, narrow <= 32,
// wide, several tiles), activation rows drawn at random from N.
static void fixed_routing(const std::vector<int> &counts, int N, uint32_t seed, std::vector<int4> &tiles, std::vector<int2> &entries) {
  std::mt19937 rng(seed);
  for (size_t e = 0; e < counts.size(); ++e)
    for (int i = 0; i < counts[e]; i += 64) {
      const int first = static_cast<int>(entries.size()), cnt = std::min(64, counts[e] - i);
      for (int j = 0; j < cnt; ++j) entries.push_back(make_int2(static_cast<int>(rng() % N), static_cast<int>(entries.size())));
      tiles.push_back(make_int4(static_cast<int>(e), first, cnt, 0));
    }
}

template <DType T> static bool type_cases(const char *tn, uint32_t seed) {
  constexpr bool kq = Layout<T>::qk == 256;
  bool ok = true;
  char name[64];
  std::snprintf(name, sizeof name, "%s dense M=203 N=77", tn);
  ok &= run_case<T>(name, 203, kq ? 512 : 96, 77, 1, {}, {}, seed);
  std::snprintf(name, sizeof name, "%s dense M=64 N=16", tn);
  ok &= run_case<T>(name, 64, kq ? 256 : 160, 16, 1, {}, {}, seed + 1);
  std::snprintf(name, sizeof name, "%s dense K split 3 ways", tn);
  ok &= run_case<T>(name, 40, 768, 20, 1, {}, {}, seed + 4, 256);
  std::vector<int4> tiles;
  std::vector<int2> entries;
  routing(3, 150, 40, seed + 2, tiles, entries);
  std::snprintf(name, sizeof name, "%s routed E=3 M=136", tn);
  ok &= run_case<T>(name, 136, kq ? 256 : 64, 40, 3, tiles, entries, seed + 3);
  // Experts with 1, 0, 20 (narrow), 45 (wide) and 100 (two tiles) entries; more K steps
  // than pipeline stages, and (Q4_0 / Q8_0) an odd K tail.
  tiles.clear();
  entries.clear();
  fixed_routing({1, 0, 20, 45, 100}, 60, seed + 5, tiles, entries);
  std::snprintf(name, sizeof name, "%s routed 1/0/20/45/100 M=70", tn);
  ok &= run_case<T>(name, 70, kq ? 512 : 352, 60, 5, tiles, entries, seed + 6);
  if (T == DType::Q6_K) {  // the raw-fragment kernel: K of 1..8 blocks (every row alignment modulo 16), odd M, narrow tiles
    for (int kb : {1, 2, 3, 5, 8}) {
      std::snprintf(name, sizeof name, "%s dense K=%d M=77 N=70", tn, 256 * kb);
      ok &= run_case<T>(name, 77, 256 * kb, 70, 1, {}, {}, seed + 20 + kb);
    }
    tiles.clear();
    entries.clear();
    fixed_routing({0, 64, 33, 32, 7, 1, 100, 0}, 90, seed + 12, tiles, entries);
    std::snprintf(name, sizeof name, "%s routed 0/64/33/32/7/1/100/0 K=768", tn);
    ok &= run_case<T>(name, 203, 768, 90, 8, tiles, entries, seed + 13);
    std::snprintf(name, sizeof name, "%s dense K=1792 split 3 ways", tn);
    ok &= run_case<T>(name, 129, 1792, 33, 1, {}, {}, seed + 14, 768);
    std::snprintf(name, sizeof name, "%s dense K=512 M=1 N=5", tn);
    ok &= run_case<T>(name, 1, 512, 5, 1, {}, {}, seed + 15);
  }
  if (T == DType::Q4_K) {  // the raw-fragment kernel's pipeline: 1..5 and 8 steps (fewer than, as many as, more than the stages)
    for (int kb : {3, 4, 5}) {
      std::snprintf(name, sizeof name, "%s dense K=%d M=77 N=70", tn, 256 * kb);
      ok &= run_case<T>(name, 77, 256 * kb, 70, 1, {}, {}, seed + 8 + 100 * kb);
    }
    tiles.clear();
    entries.clear();
    fixed_routing({0, 64, 33, 32, 7}, 90, seed + 9, tiles, entries);
    std::snprintf(name, sizeof name, "%s routed 0/64/33/32/7 K=2048", tn);
    ok &= run_case<T>(name, 150, 2048, 90, 5, tiles, entries, seed + 10);
    std::snprintf(name, sizeof name, "%s dense K=2048 split 3 ways", tn);
    ok &= run_case<T>(name, 129, 2048, 33, 1, {}, {}, seed + 11, 768);
  }
  if (!kq) {  // one K step, a K tail only: fewer steps than the pipeline's stages
    std::snprintf(name, sizeof name, "%s dense K=32 M=130 N=33", tn);
    ok &= run_case<T>(name, 130, 32, 33, 1, {}, {}, seed + 7);
  }
  return ok;
}

int main(int argc, char **argv) {
  const uint32_t seed = argc > 1 ? static_cast<uint32_t>(std::atoi(argv[1])) : 1;
  const char *only = argc > 2 ? argv[2] : nullptr;  // one type's cases (as named here)
  auto want = [&](const char *tn) { return only == nullptr || std::strcmp(only, tn) == 0; };
  bool ok = true;
  if (want("Q4_0")) ok &= type_cases<DType::Q4_0>("Q4_0", seed * 100);
  if (want("Q8_0")) ok &= type_cases<DType::Q8_0>("Q8_0", seed * 100 + 10);
  if (want("MXFP4")) ok &= type_cases<DType::MXFP4>("MXFP4", seed * 100 + 50);
  if (want("Q4_K")) ok &= type_cases<DType::Q4_K>("Q4_K", seed * 100 + 20);
  if (want("Q5_K")) ok &= type_cases<DType::Q5_K>("Q5_K", seed * 100 + 30);
  if (want("Q6_K")) ok &= type_cases<DType::Q6_K>("Q6_K", seed * 100 + 40);
  if (want("Q4_1")) ok &= type_cases<DType::Q4_1>("Q4_1", seed * 100 + 60);
  if (want("Q5_0")) ok &= type_cases<DType::Q5_0>("Q5_0", seed * 100 + 61);
  if (want("Q5_1")) ok &= type_cases<DType::Q5_1>("Q5_1", seed * 100 + 62);
  if (want("IQ4_NL")) ok &= type_cases<DType::IQ4_NL>("IQ4_NL", seed * 100 + 63);
  if (want("IQ4_XS")) ok &= type_cases<DType::IQ4_XS>("IQ4_XS", seed * 100 + 64);
  if (want("IQ3_S")) ok &= type_cases<DType::IQ3_S>("IQ3_S", seed * 100 + 65);
  if (want("IQ3_XXS")) ok &= type_cases<DType::IQ3_XXS>("IQ3_XXS", seed * 100 + 66);
  if (want("IQ2_S")) ok &= type_cases<DType::IQ2_S>("IQ2_S", seed * 100 + 67);
  if (want("IQ2_XS")) ok &= type_cases<DType::IQ2_XS>("IQ2_XS", seed * 100 + 68);
  if (want("IQ2_XXS")) ok &= type_cases<DType::IQ2_XXS>("IQ2_XXS", seed * 100 + 69);
  if (want("IQ1_S")) ok &= type_cases<DType::IQ1_S>("IQ1_S", seed * 100 + 70);
  if (want("IQ1_M")) ok &= type_cases<DType::IQ1_M>("IQ1_M", seed * 100 + 71);
  std::printf(ok ? "all passed\n" : "FAILED\n");
  return ok ? 0 : 1;
}
