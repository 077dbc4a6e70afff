// Checks the kernels of quant_extra.cu (included before this file by gen_quant_extra.py) for
// the twelve extra weight types against the CPU, on random block bytes (every grid index, sign
// and scale code; f16 fields made finite) and on rows our quantizers wrote:
//   * GetRows and the f16 dequantization: the CPU's dequantize_row bit for bit (a bad id: zeros
//     and a report);
//   * the activation rounding: the CPU's quantize_row(vec_dot_type) blocks bit for bit;
//   * the integer-dot kernel: the CPU's scalar dot kernel (vec_dot_extra_scalar.cpp) on the
//     CPU-rounded activations, to float rounding: dense 1 / 3 / 17 columns, one token's experts
//     from ids (X = 1 and X = n_used, one bad id), routed tiles of up to 8 entries per expert,
//     MatMulHeads (1 and 5 tokens, a padded output token stride);
//   * the one-token fused group kernels (gate/up + SwiGLU, down + combine [+ Add], MatMul + Add,
//     MatVecs of 3 segments, one with its Add):
//     the unfused kernels' values (rounding, dot, then SwiGLU / combine / Add) bit for bit, with
//     X = 1 and X = n_used activation rows, a bad expert id (zeros / no contribution, reported)
//     and nothing written past the outputs.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backends/cpu/kernels/vec_dot_impl.h"
#include "core/fp16.h"

namespace {
using namespace moe;

int g_fail = 0;
#define EXPECT(cond, ...)                    \
  do {                                       \
    if (!(cond)) {                           \
      if (g_fail++ < 20) {                   \
        std::printf("FAIL %s:%d ", __FILE__, __LINE__); \
        std::printf(__VA_ARGS__);            \
        std::printf("\n");                   \
      }                                      \
    }                                        \
  } while (0)

const DType kTypes[] = {DType::Q4_1,   DType::Q5_0,    DType::Q5_1,  DType::IQ4_NL, DType::IQ4_XS,  DType::IQ3_S,
                        DType::IQ3_XXS, DType::IQ2_S, DType::IQ2_XS, DType::IQ2_XXS, DType::IQ1_S, DType::IQ1_M};

uint16_t finite_half(std::mt19937 &rng) {  // |h| in [2^-6, 4), random sign
  const uint16_t h = static_cast<uint16_t>(rng() & 0x83FF);
  return static_cast<uint16_t>(h | ((9 + rng() % 8) << 10));
}

// Rows of random block bytes with finite scales.
std::vector<uint8_t> random_rows(DType t, int64_t K, int64_t rows, std::mt19937 &rng) {
  const TypeTraits &tr = type_traits(t);
  const int64_t nb = K / tr.block_size * rows;
  std::vector<uint8_t> w(static_cast<size_t>(nb) * tr.type_size);
  for (auto &b : w) b = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t *blk = w.data() + i * tr.type_size;
    auto put = [&](int at, uint16_t h) { std::memcpy(blk + at, &h, 2); };
    if (t == DType::IQ1_M) {  // the f16 scale in the top nibbles of the four scale words
      const uint16_t h = finite_half(rng);
      for (int k = 0; k < 4; ++k) {
        uint16_t sc;
        std::memcpy(&sc, blk + 48 + 2 * k, 2);
        put(48 + 2 * k, static_cast<uint16_t>((sc & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12)));
      }
    } else {
      put(0, finite_half(rng));
      if (t == DType::Q4_1 || t == DType::Q5_1) put(2, finite_half(rng));
    }
  }
  return w;
}

std::vector<uint8_t> quantized_rows(DType t, int64_t K, int64_t rows, std::mt19937 &rng) {
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<float> x(static_cast<size_t>(K));
  std::vector<uint8_t> w(row_size(t, K) * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto &v : x) v = nd(rng);
    quantize_row(t, x.data(), w.data() + r * row_size(t, K), K);
  }
  return w;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

void check_rows_and_f16(DType t, const std::vector<uint8_t> &w, int64_t K, int64_t M) {
  const size_t rb = row_size(t, K);
  // GetRows: table [K, M], ids with one bad entry.
  const std::vector<int32_t> ids = {2, 0, static_cast<int32_t>(M - 1), 5, -1, 3};
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<float> out(static_cast<size_t>(K * n), 7.0f);
  TView tab{const_cast<uint8_t *>(w.data()), {K, M, 1, 1}, {0, static_cast<int64_t>(rb), 0, 0}};
  TView idv{const_cast<int32_t *>(ids.data()), {n, 1, 1, 1}, {4, 4 * n, 0, 0}};
  TView dv{out.data(), {K, n, 1, 1}, {4, 4 * K, 0, 0}};
  unsigned err[4] = {0, 0, 0, 0};
  const int64_t n_sub = K / 32;
  const dim3 grid(static_cast<unsigned>((n_sub + 127) / 128), static_cast<unsigned>(n));
  switch (t) {
#define ROWS_CASE(TY) \
  case TY: emu_launch(grid, 128, extra_get_rows_kernel<TY>, tab, idv, dv, n_sub, err); break;
    MOE_EXTRA_TYPES(ROWS_CASE)
#undef ROWS_CASE
    default: break;
  }
  std::vector<float> ref(static_cast<size_t>(K));
  for (int64_t r = 0; r < n; ++r) {
    const int32_t id = ids[static_cast<size_t>(r)];
    if (id >= 0) dequantize_row(t, w.data() + id * rb, ref.data(), K);
    int bad = 0;
    for (int64_t k = 0; k < K; ++k) bad += !same_bits(out[static_cast<size_t>(r * K + k)], id >= 0 ? ref[static_cast<size_t>(k)] : 0.0f);
    EXPECT(bad == 0, "%s get_rows row %lld (id %d): %d values differ from the CPU's", dtype_name(t), (long long)r, id, bad);
  }
  EXPECT(err[0] != 0, "%s get_rows: the bad id was not reported", dtype_name(t));
  // f16 dequantization of the whole matrix.
  std::vector<__half> w16(static_cast<size_t>(K * M));
  launch_dequant_f16_extra(t, nullptr, w.data(), static_cast<int64_t>(rb), static_cast<int>(K), static_cast<int>(M), w16.data());
  int bad = 0;
  for (int64_t m = 0; m < M; ++m) {
    dequantize_row(t, w.data() + m * rb, ref.data(), K);
    for (int64_t k = 0; k < K; ++k) {
      const __half h = __float2half_rn(ref[static_cast<size_t>(k)]);
      bad += std::memcmp(&h, &w16[static_cast<size_t>(m * K + k)], 2) != 0;
    }
  }
  EXPECT(bad == 0, "%s f16 dequantization: %d values differ", dtype_name(t), bad);
}

// Activations [K, N] rounded on the "device" and on the CPU (vdt blocks, also returned).
void round_acts(DType t, const std::vector<float> &x, int64_t K, int64_t N, std::vector<int8_t> &q, std::vector<float2> &ds,
                std::vector<uint8_t> &cpu) {
  const DType vdt = type_traits(t).vec_dot_type;
  q.assign(static_cast<size_t>(K * N), 0);
  ds.assign(static_cast<size_t>(K / 32 * N), make_float2(0, 0));
  const int64_t units = N * ((K + 255) / 256);
  TView xv{const_cast<float *>(x.data()), {K, N, 1, 1}, {4, 4 * K, 4 * K * N, 4 * K * N}};
  emu_launch(dim3(static_cast<unsigned>((units + kQuantWarps - 1) / kQuantWarps)), kQuantWarps * 32, quantize_acts_kernel, xv,
             static_cast<int>(K), units, vdt == DType::Q8_K, false, q.data(), ds.data());
  {  // the int8 MMQ's layout (per16): the same integers, (d, s) then (d, 0) per 32
    std::vector<int8_t> q16(q.size());
    std::vector<float2> ds16(static_cast<size_t>(K / 16 * N));
    emu_launch(dim3(static_cast<unsigned>((units + kQuantWarps - 1) / kQuantWarps)), kQuantWarps * 32, quantize_acts_kernel, xv,
               static_cast<int>(K), units, vdt == DType::Q8_K, true, q16.data(), ds16.data());
    EXPECT(q16 == q, "%s: per16 rounding changed the integers", dtype_name(t));
    for (size_t j = 0; j < ds.size(); ++j) {
      const float2 a = ds16[2 * j], b = ds16[2 * j + 1];
      EXPECT(a.x == ds[j].x && b.x == ds[j].x && a.y == ds[j].y && b.y == 0.0f, "%s: per16 scales of block %zu", dtype_name(t), j);
    }
  }
  const size_t vrb = row_size(vdt, K);
  cpu.assign(vrb * static_cast<size_t>(N), 0);
  int bad = 0;
  for (int64_t n = 0; n < N; ++n) {
    uint8_t *row = cpu.data() + n * vrb;
    quantize_row(vdt, x.data() + n * K, row, K);
    for (int64_t b = 0; b < K / 32; ++b) {
      const int8_t *qs;
      float d, s = 0.0f;
      if (vdt == DType::Q8_K) {
        const BlockQ8_K *blk = reinterpret_cast<const BlockQ8_K *>(row) + b / 8;
        d = blk->d;
        qs = blk->qs + 32 * (b % 8);
      } else if (vdt == DType::Q8_1) {
        const BlockQ8_1 *blk = reinterpret_cast<const BlockQ8_1 *>(row) + b;
        d = fp16_to_fp32(blk->d);
        s = fp16_to_fp32(blk->s);
        qs = blk->qs;
      } else {
        const BlockQ8_0 *blk = reinterpret_cast<const BlockQ8_0 *>(row) + b;
        d = fp16_to_fp32(blk->d);
        qs = blk->qs;
      }
      const float2 got = ds[static_cast<size_t>(n * (K / 32) + b)];
      bad += !same_bits(got.x, d) || (vdt == DType::Q8_1 && !same_bits(got.y, s));
      for (int j = 0; j < 32; ++j) bad += q[static_cast<size_t>(n * K + 32 * b + j)] != qs[j];
    }
  }
  EXPECT(bad == 0, "%s activation rounding (%s): %d values or scales differ from the CPU's", dtype_name(t), dtype_name(vdt), bad);
}

// Y [rows][M] against the CPU dot of expert e_of(row)'s weights with activation row x_of(row).
template <class EOf, class XOf>
void compare_dots(DType t, const char *what, const std::vector<uint8_t> &w, int64_t K, int64_t M, const std::vector<uint8_t> &xcpu,
                  const std::vector<float> &y, int64_t rows, EOf e_of, XOf x_of) {
  const VecDotFn dot = vec_dot_extra_kernel_scalar(t);
  const size_t rb = row_size(t, K), vrb = row_size(type_traits(t).vec_dot_type, K);
  double worst = 0, scale = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int e = e_of(r);
    if (e < 0) continue;
    for (int64_t m = 0; m < M; ++m) {
      float ref;
      dot(static_cast<int>(K), &ref, w.data() + (e * M + m) * rb, xcpu.data() + x_of(r) * vrb);
      worst = std::max(worst, std::fabs(double(y[static_cast<size_t>(r * M + m)]) - ref));
      scale = std::max(scale, std::fabs(double(ref)));
    }
  }
  EXPECT(worst <= 2e-6 * scale + 1e-30, "%s %s: max |gpu - cpu| %g of max |cpu| %g", dtype_name(t), what, worst, scale);
}

void check_dots(DType t, const std::vector<uint8_t> &w, int64_t K, int64_t M, int64_t E, std::mt19937 &rng) {
  const size_t rb = row_size(t, K);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t N = 17;
  std::vector<float> x(static_cast<size_t>(K * N));
  for (auto &v : x) v = nd(rng);
  std::vector<int8_t> q;
  std::vector<float2> ds;
  std::vector<uint8_t> xcpu;
  round_acts(t, x, K, N, q, ds, xcpu);
  const unsigned gx = static_cast<unsigned>((M + kXWarps - 1) / kXWarps);
  // Dense, expert 0.
  for (int64_t n : {1, 3, 17}) {
    std::vector<float> y(static_cast<size_t>(n * M), -1.0f);
    XCols cols{};
    cols.ncols = static_cast<int>(n);
    if (n == 1) launch_dot<1>(t, dim3(gx, 1), nullptr, w.data(), rb, 0, K, M, q.data(), ds.data(), y.data(), cols);
    else launch_dot<kXTile>(t, dim3(gx, static_cast<unsigned>((n + kXTile - 1) / kXTile)), nullptr, w.data(), rb, 0, K, M, q.data(), ds.data(), y.data(), cols);
    compare_dots(t, n == 1 ? "dense 1" : "dense", w, K, M, xcpu, y, n, [](int64_t) { return 0; }, [](int64_t r) { return r; });
  }
  // One token, n_used = 3 slots, experts from ids (slot 1 bad: its rows keep their value).
  const int n_used = 3;
  const std::vector<int32_t> ids = {2, static_cast<int32_t>(E + 4), 0};
  for (int X : {1, n_used}) {
    std::vector<float> y(static_cast<size_t>(n_used * M), -1.0f);
    unsigned err[4] = {0, 0, 0, 0};
    XCols cols{};
    cols.ids = ids.data();
    cols.X = X;
    cols.E = static_cast<int>(E);
    cols.err = err;
    launch_dot<1>(t, dim3(gx, n_used), nullptr, w.data(), rb, static_cast<int64_t>(M * rb), K, M, q.data(), ds.data(), y.data(), cols);
    compare_dots(t, X == 1 ? "one token, shared x" : "one token, x per slot", w, K, M, xcpu, y, n_used,
                 [&](int64_t r) { return r == 1 ? -1 : ids[static_cast<size_t>(r)]; }, [&](int64_t r) { return X == 1 ? 0 : r; });
    bool kept = true;
    for (int64_t m = 0; m < M; ++m) kept &= y[static_cast<size_t>(M + m)] == -1.0f;
    EXPECT(kept && err[0] != 0, "%s one token: the bad expert id was not skipped and reported", dtype_name(t));
  }
  // MatMulHeads: head h = expert h (E heads), x [K, E, T] (row t E + h), out rows at h M + t (E M + 5)
  // (a padded token stride).
  for (int Th : {1, 5}) {
    if (Th * E > N) break;
    const int nt = Th == 1 ? 1 : kXTile;
    const int64_t ynb2 = E * M + 5;
    std::vector<float> y(static_cast<size_t>(Th * ynb2), -1.0f);
    XCols cols{};
    cols.H = static_cast<int>(E);
    cols.T = Th;
    cols.tiles_per_head = (Th + nt - 1) / nt;
    cols.y_nb1 = M;
    cols.y_nb2 = ynb2;
    const dim3 grid(gx, static_cast<unsigned>(E * cols.tiles_per_head));
    if (nt == 1) launch_dot<1>(t, grid, nullptr, w.data(), rb, static_cast<int64_t>(M * rb), K, M, q.data(), ds.data(), y.data(), cols);
    else launch_dot<kXTile>(t, grid, nullptr, w.data(), rb, static_cast<int64_t>(M * rb), K, M, q.data(), ds.data(), y.data(), cols);
    std::vector<float> yd(static_cast<size_t>(Th * E * M));  // (t, h) -> dense row t E + h
    for (int tk = 0; tk < Th; ++tk)
      for (int64_t h = 0; h < E; ++h)
        for (int64_t m = 0; m < M; ++m) yd[static_cast<size_t>((tk * E + h) * M + m)] = y[static_cast<size_t>(tk * ynb2 + h * M + m)];
    compare_dots(t, "heads", w, K, M, xcpu, yd, Th * E, [&](int64_t r) { return static_cast<int>(r % E); }, [](int64_t r) { return r; });
  }
  // Routed: T = 6 tokens x 2 slots (x per slot: X = 2, activation row 2t + j), tiles of <= 8.
  const int T = 6, nu = 2;
  std::vector<int> tok_e(static_cast<size_t>(T * nu));
  for (int i = 0; i < T * nu; ++i) tok_e[static_cast<size_t>(i)] = i % nu == 0 ? static_cast<int>(E - 1) : static_cast<int>(rng() % E);
  std::vector<int2> entries;
  std::vector<int4> tiles;
  for (int e = 0; e < E; ++e) {
    const int first = static_cast<int>(entries.size());
    for (int i = 0; i < T * nu; ++i)
      if (tok_e[static_cast<size_t>(i)] == e) entries.push_back(make_int2(i, i));  // X = nu: activation row t nu + j = i
    for (int k = first; k < static_cast<int>(entries.size()); k += kXTile)
      tiles.push_back(make_int4(e, k, std::min(kXTile, static_cast<int>(entries.size()) - k), 0));
  }
  tiles.push_back(make_int4(0, 0, 0, 0));  // an idle tile
  std::vector<float> y(static_cast<size_t>(T * nu * M), -1.0f);
  XCols cols{};
  cols.tiles = tiles.data();
  cols.entries = entries.data();
  launch_dot<kXTile>(t, dim3(gx, static_cast<unsigned>(tiles.size())), nullptr, w.data(), rb, static_cast<int64_t>(M * rb), K, M, q.data(),
                     ds.data(), y.data(), cols);
  compare_dots(t, "routed", w, K, M, xcpu, y, T * nu, [&](int64_t r) { return tok_e[static_cast<size_t>(r)]; }, [](int64_t r) { return r; });
}

// ---- the one-token fused group kernels against the unfused kernels, bit for bit ----------

// Activation rows [K, N] rounded by quantize_acts_kernel (the unfused launch's scratch).
void device_round(DType t, const std::vector<float> &x, int64_t K, int64_t N, std::vector<int8_t> &q, std::vector<float2> &ds) {
  q.assign(static_cast<size_t>(K * N), 0);
  ds.assign(static_cast<size_t>(K / 32 * N), make_float2(0, 0));
  const int64_t units = N * ((K + 255) / 256);
  TView xv{const_cast<float *>(x.data()), {K, N, 1, 1}, {4, 4 * K, 4 * K * N, 4 * K * N}};
  emu_launch(dim3(static_cast<unsigned>((units + kQuantWarps - 1) / kQuantWarps)), kQuantWarps * 32, quantize_acts_kernel, xv,
             static_cast<int>(K), units, type_traits(t).vec_dot_type == DType::Q8_K, false, q.data(), ds.data());
}

// The unfused one-token MatMulId (X activation rows, ids per slot; a bad id leaves its rows at 0).
std::vector<float> unfused_ids(DType t, const std::vector<uint8_t> &w, int64_t K, int64_t M, int64_t E, const std::vector<float> &x, int X,
                               const std::vector<int32_t> &ids, unsigned *err) {
  std::vector<int8_t> q;
  std::vector<float2> ds;
  device_round(t, x, K, X, q, ds);
  const int n_used = static_cast<int>(ids.size());
  std::vector<float> y(static_cast<size_t>(n_used * M), 0.0f);
  XCols cols{};
  cols.ids = ids.data();
  cols.X = X;
  cols.E = static_cast<int>(E);
  cols.err = err;
  const size_t rb = row_size(t, K);
  launch_dot<1>(t, dim3(static_cast<unsigned>((M + kXWarps - 1) / kXWarps), n_used), nullptr, w.data(), rb, static_cast<int64_t>(M * rb),
                K, M, q.data(), ds.data(), y.data(), cols);
  return y;
}

int differing(const std::vector<float> &a, const std::vector<float> &b) {
  int bad = a.size() != b.size();
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) bad += !same_bits(a[i], b[i]);
  return bad;
}

void check_fused(DType t, const std::vector<uint8_t> &w, int64_t K, int64_t M, int64_t E, std::mt19937 &rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t rb = row_size(t, K);
  const bool q8k = type_traits(t).vec_dot_type == DType::Q8_K;
  const std::vector<uint8_t> wu = random_rows(t, K, M * E, rng);
  const int n_used = 3;
  std::vector<float> x(static_cast<size_t>(K * n_used)), r(static_cast<size_t>(M));
  for (auto &v : x) v = nd(rng);
  for (auto &v : r) v = nd(rng);
  const std::vector<float> cw = {0.5f, -1.25f, 0.3f};
  for (bool bad : {false, true}) {
    const std::vector<int32_t> ids = {2, bad ? static_cast<int32_t>(E + 4) : 0, 1};
    for (int X : {1, n_used}) {
      // gate/up + SwiGLU: out[j M + row] = ref_swiglu(gate, up, row, M); a bad slot: zeros.
      unsigned e0[4] = {0, 0, 0, 0}, e1[4] = {0, 0, 0, 0};
      const auto yg = unfused_ids(t, w, K, M, E, x, X, ids, e0), yu = unfused_ids(t, wu, K, M, E, x, X, ids, e0);
      std::vector<float> want(static_cast<size_t>(n_used * M)), got(want.size() + 5, -7.0f);
      for (int j = 0; j < n_used; ++j)
        for (int64_t m = 0; m < M; ++m) {
          const size_t i = static_cast<size_t>(j * M + m);
          want[i] = bad && j == 1 ? 0.0f : ref_swiglu(yg[i], yu[i], m, M);
        }
      const dim3 grid(static_cast<unsigned>((M + kFWarps - 1) / kFWarps), n_used);
      switch (t) {
#define GU_CASE(TY)                                                                                                                      \
  case TY:                                                                                                                               \
    emu_launch(grid, kFWarps * 32, extra_gate_up_kernel<TY>, w.data(), wu.data(), static_cast<int64_t>(rb), static_cast<int64_t>(M * rb), \
               static_cast<int>(K), static_cast<int>(M), x.data(), K, X, ids.data(), static_cast<int>(E), e1, q8k, got.data(), M);          \
    break;
        MOE_EXTRA_TYPES(GU_CASE)
#undef GU_CASE
        default: break;
      }
      bool tail = true;
      for (int k = 0; k < 5; ++k) tail &= got[want.size() + static_cast<size_t>(k)] == -7.0f;
      got.resize(want.size());
      EXPECT(differing(got, want) == 0 && tail, "%s fused gate/up (X=%d, bad id %d): %d values differ from the unfused kernels'",
             dtype_name(t), X, bad, differing(got, want));
      EXPECT((e1[0] != 0) == bad, "%s fused gate/up: bad id reported %u, expected %d", dtype_name(t), e1[0], bad);
      // down + combine [+ Add]: the slots' products (bad: 0) combined in slot order, then + r.
      for (bool with_add : {false, true}) {
        unsigned e2[4] = {0, 0, 0, 0};
        const auto yd = unfused_ids(t, w, K, M, E, x, X, ids, e0);
        std::vector<float> dwant(static_cast<size_t>(M)), dgot(static_cast<size_t>(M) + 3, -7.0f);
        for (int64_t m = 0; m < M; ++m) {
          float acc = __fmul_rn(yd[static_cast<size_t>(m)], cw[0]);
          for (int j = 1; j < n_used; ++j) acc = __fadd_rn(acc, __fmul_rn(yd[static_cast<size_t>(j * M + m)], cw[static_cast<size_t>(j)]));
          dwant[static_cast<size_t>(m)] = with_add ? __fadd_rn(acc, r[static_cast<size_t>(m)]) : acc;
        }
        const dim3 dgrid(static_cast<unsigned>((M + kFDownRows - 1) / kFDownRows));
        switch (t) {
#define DOWN_CASE(TY)                                                                                                               \
  case TY:                                                                                                                          \
    emu_launch(dgrid, kFWarps * 32, extra_down_kernel<TY>, w.data(), static_cast<int64_t>(rb), static_cast<int64_t>(M * rb),        \
               static_cast<int>(K), static_cast<int>(M), x.data(), K, X, ids.data(), n_used, static_cast<int>(E), e2, q8k, cw.data(), \
               with_add ? r.data() : nullptr, dgot.data());                                                                         \
    break;
          MOE_EXTRA_TYPES(DOWN_CASE)
#undef DOWN_CASE
          default: break;
        }
        bool dtail = true;
        for (int k = 0; k < 3; ++k) dtail &= dgot[static_cast<size_t>(M + k)] == -7.0f;
        dgot.resize(static_cast<size_t>(M));
        EXPECT(differing(dgot, dwant) == 0 && dtail, "%s fused down (X=%d, bad id %d, add %d): %d values differ from the unfused kernels'",
               dtype_name(t), X, bad, with_add, differing(dgot, dwant));
        EXPECT((e2[0] != 0) == bad, "%s fused down: bad id reported %u, expected %d", dtype_name(t), e2[0], bad);
      }
    }
  }
  // MatMul + Add (dense, expert 0): the unfused dot, then + r.
  std::vector<int8_t> q;
  std::vector<float2> ds;
  device_round(t, x, K, 1, q, ds);
  std::vector<float> y(static_cast<size_t>(M)), want(static_cast<size_t>(M)), got(static_cast<size_t>(M) + 2, -7.0f);
  XCols cols{};
  cols.ncols = 1;
  launch_dot<1>(t, dim3(static_cast<unsigned>((M + kXWarps - 1) / kXWarps), 1), nullptr, w.data(), rb, 0, K, M, q.data(), ds.data(), y.data(),
                cols);
  for (int64_t m = 0; m < M; ++m) want[static_cast<size_t>(m)] = __fadd_rn(y[static_cast<size_t>(m)], r[static_cast<size_t>(m)]);
  const dim3 grid(static_cast<unsigned>((M + kFWarps - 1) / kFWarps));
  switch (t) {
#define MMA_CASE(TY)                                                                                                                         \
  case TY:                                                                                                                                   \
    emu_launch(grid, kFWarps * 32, extra_matmul_add_kernel<TY>, w.data(), static_cast<int64_t>(rb), static_cast<int>(K), static_cast<int>(M), \
               x.data(), q8k, r.data(), got.data());                                                                                       \
    break;
    MOE_EXTRA_TYPES(MMA_CASE)
#undef MMA_CASE
    default: break;
  }
  const bool tail = got[static_cast<size_t>(M)] == -7.0f && got[static_cast<size_t>(M) + 1] == -7.0f;
  got.resize(static_cast<size_t>(M));
  EXPECT(differing(got, want) == 0 && tail, "%s fused matmul + add: %d values differ from the unfused kernels'", dtype_name(t),
         differing(got, want));
  // MatVecs: the E matrices of w as segments of M, M - 5 and M rows (the second with + r), one launch.
  std::vector<std::vector<float>> outs(static_cast<size_t>(E));
  XSegs segs{};
  int blocks = 0;
  for (int64_t e = 0; e < E && e < kMaxFusedMatVecs; ++e) {
    const int Me = static_cast<int>(e == 1 ? M - 5 : M);
    outs[static_cast<size_t>(e)].assign(static_cast<size_t>(Me) + 2, -7.0f);
    segs.s[segs.n++] = XSeg{w.data() + e * M * rb, static_cast<int64_t>(rb), outs[static_cast<size_t>(e)].data(), e == 1 ? r.data() : nullptr, Me, blocks};
    blocks += (Me + kFWarps - 1) / kFWarps;
  }
  switch (t) {
#define MV_CASE(TY) \
  case TY: emu_launch(dim3(static_cast<unsigned>(blocks)), kFWarps * 32, extra_matvecs_kernel<TY>, segs, static_cast<int>(K), x.data(), q8k); break;
    MOE_EXTRA_TYPES(MV_CASE)
#undef MV_CASE
    default: break;
  }
  for (int k = 0; k < segs.n; ++k) {
    const int Me = segs.s[k].M;
    std::vector<float> ye(static_cast<size_t>(Me)), we(static_cast<size_t>(Me));
    XCols c1{};
    c1.ncols = 1;
    launch_dot<1>(t, dim3(static_cast<unsigned>((Me + kXWarps - 1) / kXWarps), 1), nullptr, segs.s[k].w, rb, 0, K, Me, q.data(), ds.data(),
                  ye.data(), c1);
    for (int m = 0; m < Me; ++m) we[static_cast<size_t>(m)] = k == 1 ? __fadd_rn(ye[static_cast<size_t>(m)], r[static_cast<size_t>(m)]) : ye[static_cast<size_t>(m)];
    std::vector<float> &o = outs[static_cast<size_t>(k)];
    const bool otail = o[static_cast<size_t>(Me)] == -7.0f && o[static_cast<size_t>(Me) + 1] == -7.0f;
    o.resize(static_cast<size_t>(Me));
    EXPECT(differing(o, we) == 0 && otail, "%s fused matvecs segment %d: %d values differ from the unfused kernels'", dtype_name(t), k,
           differing(o, we));
  }
}

}  // namespace

int main(int argc, char **argv) {
  std::mt19937 rng(argc > 1 ? static_cast<uint32_t>(std::atoi(argv[1])) : 7u);
  for (DType t : kTypes) {
    const bool b256 = type_traits(t).block_size == 256;
    for (int64_t K : b256 ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{96, 1056}) {
      const int64_t M = 13, E = 3;
      std::printf("%s K=%lld\n", dtype_name(t), (long long)K);
      std::fflush(stdout);
      const auto wr = random_rows(t, K, M * E, rng);
      check_rows_and_f16(t, wr, K, M);
      check_dots(t, wr, K, M, E, rng);
      check_fused(t, wr, K, M, E, rng);
      const auto wq = quantized_rows(t, K, M * E, rng);
      check_rows_and_f16(t, wq, K, M);
      check_dots(t, wq, K, M, E, rng);
      check_fused(t, wq, K, M, E, rng);
    }
  }
  std::printf(g_fail ? "quant_extra: %d FAILED checks\n" : "quant_extra: all checks passed\n", g_fail);
  return g_fail ? 1 : 0;
}
