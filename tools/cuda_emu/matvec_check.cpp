// Runs two versions of the mat-vec kernels (gen_matvec.py: "old", the last GPU-verified
// one, and "new", the working tree) through emu.h on quantized random weights and checks
// that every output is bit-identical: rows (MatMul, MatMulId), split-K plain rows, gate/up,
// down + combine, with one or two logical blocks per thread block, and the MatVecs group
// against single launches. Exit status 1 on any difference.
// Q4_K, Q5_K, Q6_K and Q8_0 fold in the CPU's reference order (matvec_ref_order.cuh): their
// outputs are checked bit for bit against ref_order_dot_rows on random block bytes (every
// scale and min code) instead of against the old version.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels/ref_math.h"
#include "check_data.h"
#include "matvec_api.h"

using namespace moe;
using namespace moe_emu_api;
using namespace emu_check;

uint8_t *moe_emu_api::emu_dyn_smem() {
  alignas(16) static uint8_t buf[64 * 1024];
  return buf;
}

namespace {

enum { kRows, kGateUp, kDown, kSplit, kHalves, kDownSettled };  // MvMode

int failures = 0, checks = 0;
void same(const float *a, const float *b, size_t n, const std::string &what) {
  ++checks;
  if (std::memcmp(a, b, n * 4) == 0) return;
  ++failures;
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, 4) != 0) {
      std::printf("DIFF %s at %zu: %.9g vs %.9g\n", what.c_str(), i, a[i], b[i]);
      return;
    }
}

// The emulation itself against float64 dot products of the dequantized rows: the relative
// error of the whole output stays at the activation rounding's level.
void near_reference(DType t, const uint8_t *w, size_t rb, const float *x, int64_t K, const float *y, int64_t M, const std::string &what) {
  ++checks;
  std::vector<float> row(static_cast<size_t>(K));
  double num = 0, den = 0;
  for (int64_t r = 0; r < M; ++r) {
    dequantize_row(t, w + r * rb, row.data(), K);
    double s = 0;
    for (int64_t i = 0; i < K; ++i) s += double(row[static_cast<size_t>(i)]) * x[i];
    num += (y[r] - s) * (y[r] - s);
    den += s * s;
  }
  const double err = std::sqrt(num / den);
  if (!(err < 2e-2)) {
    ++failures;
    std::printf("FAIL %s: relative error %.3g against the float64 reference\n", what.c_str(), err);
  }
}

unsigned cdiv(int64_t a, int b) { return static_cast<unsigned>((a + b - 1) / b); }
bool plain(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// One launch of the old version against the new one with 1 and 2 logical blocks per thread block.
void compare(DType t, bool down, unsigned gx, unsigned gy, EmuMv m, size_t ny, const std::string &what) {
  std::vector<float> yo(ny, NAN), yn(ny, NAN);
  m.y = yo.data();
  emu_old::launch_mv(t, down, gx, gy, 1, 0, m);
  for (int groups : {1, 2}) {
    if (groups == 2 && (plain(t) || m.mode == kSplit)) continue;
    std::fill(yn.begin(), yn.end(), NAN);
    m.y = yn.data();
    emu_new::launch_mv(t, down, gx, gy, groups, 0, m);
    same(yo.data(), yn.data(), ny, what + " groups " + std::to_string(groups));
  }
}

// The CPU's SwiGLU of element r of a row of M: the vector silu on 16-element chunks, libm's
// expf on the tail (the host's here, CUDA's on a GPU).
float cpu_swiglu(float g, float u, int64_t r, int64_t M) {
  return r < (M & ~int64_t{15}) ? refmath::silu_v(g) * u : g / (1.0f + std::exp(-g)) * u;
}

bool ref_type(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q8_0 || t == DType::F32; }

// One launch of the new version with 1 and 2 logical blocks per thread block against want.
void expect(DType t, bool down, unsigned gx, unsigned gy, EmuMv m, const std::vector<float> &want, const std::string &what) {
  // (want: the CPU's outputs, or for gate/up of the other types the CPU's SwiGLU of the new row products)
  std::vector<float> y(want.size());
  for (int groups : {1, 2}) {
    if (groups == 2 && plain(t)) continue;  // plain types: one logical block per thread block
    std::fill(y.begin(), y.end(), NAN);
    m.y = y.data();
    emu_new::launch_mv(t, down, gx, gy, groups, 0, m);
    same(want.data(), y.data(), y.size(), what + " groups " + std::to_string(groups) + " vs CPU");
  }
}

// Reference-order types: every mode against the CPU bit for bit; M 37 takes the plain
// vec_dot order for Q4_K, M 40 its repacked gemv order.
// The launch arguments of a dense one-token product of M rows (rb bytes each) of K elements
// against the f32 activations xs; the caller picks the weights, mode and output.
EmuMv one_token_args(size_t rb, int64_t K, int64_t M, const std::vector<float> &xs) {
  EmuMv m{};
  m.rb = static_cast<int64_t>(rb);
  m.K = static_cast<int>(K);
  m.M = static_cast<int>(M);
  m.x = reinterpret_cast<const uint8_t *>(xs.data());
  m.x_nb1 = K * 4;
  m.X = 1;
  m.E = 1;
  m.n_used = 1;
  return m;
}

// A final output in CUDA's own order against the CPU's order: max |a - b| <= 1e-5 max |b|
// (the GPU test's bound; float rounding of the sums only).
void near_cpu(const std::vector<float> &y, const std::vector<float> &want, const std::string &what) {
  ++checks;
  double m = 0, d = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    m = std::max(m, std::fabs(double(want[i])));
    d = std::max(d, std::isfinite(y[i]) ? std::fabs(double(y[i]) - want[i]) : 1e30);
  }
  if (!(d <= 1e-5 * m)) {
    ++failures;
    std::printf("FAIL %s: own order differs from the CPU by %.3g of max %.3g\n", what.c_str(), d, m);
  }
}

// The own-order instances (matvec_rows8_kernel<T, false>, the LM head): rows, K halves (any
// even block count), MatMulId with an out-of-range id, F32 split over K; against the CPU's
// outputs within near_cpu's bound, and the rows bit for bit against OLD, which ran these
// types in CUDA's order (the same per-lane sums: staging, unit_dot, warp_sum).
void check_own_order(DType t, const Buf &w, const Buf &we, EmuMv m, const std::vector<float> &dense, const std::vector<float> &want_id,
                     const std::string &tag) {
  const int64_t M = m.M, K = m.K, bs = type_traits(t).block_size;
  std::vector<float> y(static_cast<size_t>(M), NAN), yo(static_cast<size_t>(M), NAN);
  m.w = w.p;
  m.mode = kRows;
  m.y = y.data();
  if (!emu_new::launch_own(t, cdiv(M, 16), 1, m)) {
    ++failures;
    std::printf("FAIL %s: no own-order kernel\n", tag.c_str());
    return;
  }
  near_cpu(y, dense, tag + " own rows");
  near_reference(t, w.p, static_cast<size_t>(m.rb), reinterpret_cast<const float *>(m.x), K, y.data(), M, tag + " own rows");
  m.y = yo.data();
  emu_old::launch_mv(t, false, cdiv(M, 16), 1, 1, 0, m);
  same(yo.data(), y.data(), y.size(), tag + " own rows vs OLD");
  if (t != DType::F32 && K % (2 * bs) == 0) {
    m.mode = kHalves;
    std::fill(y.begin(), y.end(), NAN);
    m.y = y.data();
    emu_new::launch_own(t, cdiv(M, 8), 1, m);
    near_cpu(y, dense, tag + " own halves");
  }
  if (t == DType::F32) {
    m.mode = kSplit;
    std::fill(y.begin(), y.end(), NAN);
    m.y = y.data();
    emu_new::launch_own(t, cdiv(M, 2), 1, m);
    near_cpu(y, dense, tag + " own split");
  }
  const std::vector<int32_t> ids = {4, 1, 4, 7};
  std::vector<float> ye(want_id.size(), NAN);
  m.mode = kRows;
  m.w = we.p;
  m.eb = m.rb * M;
  m.E = 5;
  m.ids = ids.data();
  m.n_used = 4;
  m.X = 4;
  m.y = ye.data();
  emu_new::launch_own(t, cdiv(M, 16), 4, m);
  near_cpu(ye, want_id, tag + " own matmul_id");
}

// Expert slots of the down + combine checks: one pass of four (one warp per row), five
// (two warps per row, the second with one slot), eight (two full passes) and ten (three
// passes: the first warp of a row takes two), with out-of-range ids; shared: one activation
// for every slot (X = 1) instead of one per slot.
struct DownSet {
  std::vector<int32_t> ids;
  bool shared;
};
const DownSet kDownSets[] = {{{1, 2, 0, 2, -1}, false}, {{3, -1, 2, 2}, false}, {{1, 2, 0, 2, 4, 3, 1, 0}, false},
                             {{0, 1, 2, 3, 4, 0, 1, 9, 3, 4}, false}, {{4, 0, 3, 1, 2, 2, 0, 1}, true}};
constexpr int64_t kMaxSlots = 10;

// The launch arguments of down + combine (+ residual res) for one DownSet: weights we of E
// experts, activations xs (slot s at xs + s * K), combine weights cw (>= the slots).
EmuMv down_args(EmuMv m, const DownSet &d, const std::vector<float> &cw, const float *res) {
  m.ids = d.ids.data();
  m.n_used = static_cast<int>(d.ids.size());
  m.X = d.shared ? 1 : m.n_used;
  m.cw = cw.data();
  m.add = res;
  m.mode = kDown;
  return m;
}

// Whether the activation slots of a down launch fit the launcher's shared memory (48 KB:
// about 1.5 bytes per value plus staging); 5 x 4608 did before and still does.
bool fits(const EmuMv &m) { return static_cast<int64_t>(m.X) * m.K <= 5 * 4608; }

// MV_KS=768,2304 (environment): only the listed K of check_ref_type (one shape on a busy machine).
bool k_selected(int64_t K) {
  const char *e = std::getenv("MV_KS");
  if (!e || !*e) return true;
  const std::string list = std::string(",") + e + ",";
  return list.find("," + std::to_string(K) + ",") != std::string::npos;
}

void check_ref_type(DType t) {
  const int64_t bs = type_traits(t).block_size;
  const std::vector<int64_t> Ks = bs == 256 ? std::vector<int64_t>{768, 2304, 4096, 4608}
                                  : bs == 32 ? std::vector<int64_t>{96, 2080, 4160, 4096}
                                             : std::vector<int64_t>{100, 2080, 4160, 37};  // F32: tails of n % 64
  for (int64_t K : Ks)
    for (int64_t M : {int64_t(37), int64_t(40)}) {
      if (!k_selected(K)) continue;
      const std::string tag = std::string(dtype_name(t)) + " K " + std::to_string(K) + " M " + std::to_string(M);
      const int64_t E = 5;
      auto make = [&](int64_t rows) { return t == DType::F32 ? weights(t, K, rows) : random_blocks(t, K, rows); };
      std::unique_ptr<Buf> w(make(M)), we(make(M * E)), wu(make(M * E));
      const size_t rb = row_size(t, K);
      auto xs = randn(static_cast<size_t>(K * kMaxSlots));
      xs[3] = -xs[200 % K];  // a magnitude tie of opposite signs in one 256-group (Q8_K: first index wins)
      for (int64_t i = 0; i < 32 && 64 + i < K; ++i) xs[static_cast<size_t>(64 + i)] = 0.0f;  // a zero Q8_0 block
      EmuMv m = one_token_args(rb, K, M, xs);
      m.w = w->p;
      m.mode = kRows;
      const std::vector<float> dense = cpu_rows(t, w->p, rb, M, K, xs.data(), false);
      expect(t, false, cdiv(M, 16), 1, m, dense, tag + " rows");
      {
        std::vector<float> y(static_cast<size_t>(M), NAN);
        m.y = y.data();
        emu_new::launch_mv(t, false, cdiv(M, 16), 1, 1, 0, m);
        near_reference(t, w->p, rb, xs.data(), K, y.data(), M, tag + " rows");
      }
      if (!plain(t) && K % (2 * bs) == 0 && K <= 4096) {  // K halves (the host's rule for reference-order types)
        m.mode = kHalves;
        expect(t, false, cdiv(M, 8), 1, m, dense, tag + " halves");
        m.mode = kRows;
      }
      if (t == DType::Q4_K) {  // a tensor 4 bytes off 16-byte alignment: the staged path (no 16-byte block reads)
        std::unique_ptr<Buf> wo(new Buf(rb * M + 16));
        std::memcpy(wo->p + 4, w->p, rb * M);
        EmuMv mo = m;
        mo.w = wo->p + 4;
        expect(t, false, cdiv(M, 16), 1, mo, dense, tag + " rows, unaligned tensor");
      }
      // MatMul + residual: the CPU's Add after the product
      const auto res = randn(static_cast<size_t>(M));
      std::vector<float> want(dense);
      for (int64_t r = 0; r < M; ++r) want[r] = dense[r] + res[r];
      m.add = res.data();
      expect(t, false, cdiv(M, 16), 1, m, want, tag + " rows+add");
      m.add = nullptr;
      // MatMulId, one activation per slot, an out-of-range id
      const std::vector<int32_t> ids = {4, 1, 4, 7};
      m.w = we->p;
      m.eb = static_cast<int64_t>(rb * M);
      m.E = static_cast<int>(E);
      m.ids = ids.data();
      m.n_used = 4;
      m.X = 4;
      auto expert = [&](const Buf &b, int32_t e, int64_t slot) {
        return e >= 0 && e < E ? cpu_rows(t, b.p + e * rb * M, rb, M, K, xs.data() + slot * K, true) : std::vector<float>(M, 0.0f);
      };
      want.clear();
      for (int j = 0; j < 4; ++j) {
        const auto y = expert(*we, ids[j], j);
        want.insert(want.end(), y.begin(), y.end());
      }
      expect(t, false, cdiv(M, 16), 4, m, want, tag + " matmul_id");
      check_own_order(t, *w, *we, one_token_args(rb, K, M, xs), dense, want, tag);
      // gate/up + SwiGLU (shared activation): the CPU's SwiGLU (vector silu on 16-element
      // chunks; the tail's libm expf is the host's here, CUDA's on a GPU)
      m.X = 1;
      m.w2 = wu->p;
      m.rb2 = m.rb;
      m.eb2 = m.eb;
      m.mode = kGateUp;
      want.clear();
      for (int j = 0; j < 4; ++j) {
        const auto g = expert(*we, ids[j], 0), u = expert(*wu, ids[j], 0);
        for (int64_t r = 0; r < M; ++r) want.push_back(cpu_swiglu(g[r], u[r], r, M));
      }
      expect(t, false, cdiv(M, 8), 4, m, want, tag + " gate_up");
      // down + combine + residual: products added in slot order
      const auto cw = randn(kMaxSlots);
      for (const DownSet &d : kDownSets) {
        const EmuMv md = down_args(m, d, cw, res.data());
        if (!fits(md)) continue;
        want.assign(static_cast<size_t>(M), 0.0f);
        for (int j = 0; j < md.n_used; ++j) {
          if (d.ids[j] < 0 || d.ids[j] >= E) continue;
          const auto y = expert(*we, d.ids[j], d.shared ? 0 : j);
          for (int64_t r = 0; r < M; ++r) {
            const float p = y[r] * cw[j];
            want[r] = j == 0 ? p : want[r] + p;
          }
        }
        for (int64_t r = 0; r < M; ++r) want[r] += res[r];
        for (int mode : {kDown, kDownSettled}) {  // settled ids: read before the wait, the same bits
          EmuMv mm = md;
          mm.mode = mode;
          expect(t, true, cdiv(M, 8), 1, mm, want, tag + " down n_used " + std::to_string(md.n_used) + (d.shared ? " shared" : "") + (mode == kDownSettled ? " settled" : ""));
        }
      }
    }
}

const DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q8_0, DType::MXFP4,
                        DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};

void check_type(DType t) {
  const int64_t bs = type_traits(t).block_size;
  for (int64_t K : {bs == 256 ? int64_t(768) : bs == 32 ? int64_t(96) : int64_t(40), bs == 256 ? int64_t(2304) : int64_t(2080),
                    bs == 256 ? int64_t(4608) : bs == 32 ? int64_t(4160) : int64_t(48)}) {
    const std::string tag = std::string(dtype_name(t)) + " K " + std::to_string(K);
    const int64_t M = 37, E = 5;
    std::unique_ptr<Buf> w(weights(t, K, M)), we(weights(t, K, M * E)), wu(weights(t, K, M * E));
    const size_t rb = row_size(t, K);
    auto xs = randn(static_cast<size_t>(K * kMaxSlots));
    xs[3] = -xs[200 % K];  // a magnitude tie of opposite signs in one 256-group (Q8_K: first index wins)
    EmuMv m = one_token_args(rb, K, M, xs);
    // MatMul
    m.w = w->p;
    m.mode = kRows;
    compare(t, false, cdiv(M, 16), 1, m, M, tag + " rows");
    {
      std::vector<float> y(static_cast<size_t>(M), NAN);
      m.y = y.data();
      emu_new::launch_mv(t, false, cdiv(M, 16), 1, 1, 0, m);
      near_reference(t, w->p, rb, xs.data(), K, y.data(), M, tag + " rows");
      if (!plain(t) && K % (2 * bs) == 0) {  // one row per warp in two K halves (new only)
        std::vector<float> h1(static_cast<size_t>(M), NAN), h2(static_cast<size_t>(M), NAN);
        m.mode = kHalves;
        m.y = h1.data();
        emu_new::launch_mv(t, false, cdiv(M, 8), 1, 1, 0, m);
        m.y = h2.data();
        emu_new::launch_mv(t, false, cdiv(M, 8), 1, 2, 0, m);
        m.mode = kRows;
        same(h1.data(), h2.data(), static_cast<size_t>(M), tag + " halves groups 1 / 2");
        near_reference(t, w->p, rb, xs.data(), K, h1.data(), M, tag + " halves");
        ++checks;
        double num = 0, den = 0;
        for (int64_t r = 0; r < M; ++r) {
          num += double(h1[r] - y[r]) * (h1[r] - y[r]);
          den += double(y[r]) * y[r];
        }
        if (!(std::sqrt(num / den) < 1e-5)) {
          ++failures;
          std::printf("FAIL %s: halves differ from rows by %.3g\n", tag.c_str(), std::sqrt(num / den));
        }
      }
    }
    if (plain(t)) {
      m.mode = kSplit;
      compare(t, false, cdiv(M, 2), 1, m, M, tag + " split");
    }
    // MatMul + residual
    const auto res = randn(static_cast<size_t>(M));
    m.mode = kRows;
    m.add = res.data();
    compare(t, false, cdiv(M, 16), 1, m, M, tag + " rows+add");
    m.add = nullptr;
    // MatMulId, one activation per slot, an out-of-range id
    const std::vector<int32_t> ids = {4, 1, 4, 7};
    m.w = we->p;
    m.eb = static_cast<int64_t>(rb * M);
    m.E = static_cast<int>(E);
    m.ids = ids.data();
    m.n_used = 4;
    m.X = 4;
    compare(t, false, cdiv(M, 16), 4, m, M * 4, tag + " matmul_id");
    if (t == DType::F16) continue;  // F16 expert products take the half-sum kernel
    // gate/up + SwiGLU (shared activation)
    m.X = 1;
    m.w2 = wu->p;
    m.rb2 = m.rb;
    m.eb2 = m.eb;
    {  // the fused SwiGLU is the CPU's (ref_math.cuh), not the old version's: expect it on the new row products
      std::vector<float> g(static_cast<size_t>(M * 4)), u(g.size()), want(g.size());
      m.mode = kRows;
      m.y = g.data();
      emu_new::launch_mv(t, false, cdiv(M, 16), 4, 1, 0, m);
      m.w = wu->p;
      m.y = u.data();
      emu_new::launch_mv(t, false, cdiv(M, 16), 4, 1, 0, m);
      m.w = we->p;
      for (size_t i = 0; i < want.size(); ++i) want[i] = cpu_swiglu(g[i], u[i], static_cast<int64_t>(i) % M, M);
      m.mode = kGateUp;
      expect(t, false, cdiv(M, 8), 4, m, want, tag + " gate_up");
    }
    // down + combine + residual
    const auto cw = randn(kMaxSlots);
    for (const DownSet &d : kDownSets) {
      const EmuMv md = down_args(m, d, cw, res.data());
      if (!fits(md)) continue;
      compare(t, true, cdiv(M, 8), 1, md, M, tag + " down n_used " + std::to_string(md.n_used) + (d.shared ? " shared" : ""));
    }
  }
}

// The MatVecs group against single launches, for several SM counts (1 and
// 2 give two logical blocks per thread block, incl. a segment whose last one is half empty;
// lean_sm the lean 8-warp kernel, one chunk in flight). bias: each segment adds a row (gpt-oss's
// q / k / v biases), as does its single launch (MatMul + Add).
void check_group(const std::vector<DType> &types, const std::vector<int> &rows, int64_t K, int mode = kRows, bool bias = false) {
  const size_t n = types.size();
  std::vector<std::unique_ptr<Buf>> w;
  std::vector<std::vector<float>> y_old(n), y_new(n), adds(n);
  auto xs = randn(static_cast<size_t>(K));
  EmuMv base{};
  base.K = static_cast<int>(K);
  base.x = reinterpret_cast<const uint8_t *>(xs.data());
  base.x_nb1 = K * 4;
  base.X = 1;
  base.E = 1;
  base.n_used = 1;
  base.mode = kRows;
  std::string tag = std::string(bias ? "group + bias K " : "group K ") + std::to_string(K);
  for (size_t i = 0; i < n; ++i) {
    tag += std::string(" ") + dtype_name(types[i]) + "x" + std::to_string(rows[i]);
    w.emplace_back(ref_type(types[i]) ? random_blocks(types[i], K, rows[i]) : weights(types[i], K, rows[i]));
    EmuMv m = base;
    m.w = w[i]->p;
    m.rb = static_cast<int64_t>(row_size(types[i], K));
    m.M = rows[i];
    y_old[i].assign(static_cast<size_t>(rows[i]), NAN);
    m.y = y_old[i].data();
    m.mode = mode;
    if (bias) adds[i] = randn(static_cast<size_t>(rows[i]));
    m.add = bias ? adds[i].data() : nullptr;
    // The new single launches (checked against the old version or the CPU by check_type).
    emu_new::launch_mv(types[i], false, cdiv(rows[i], mode == kRows ? 16 : 8), 1, 1, 0, m);
    if (ref_type(types[i]) && !bias)
      same(cpu_rows(types[i], w[i]->p, static_cast<size_t>(m.rb), rows[i], K, xs.data(), false).data(), y_old[i].data(),
           y_old[i].size(), tag + " single launch vs CPU");
  }
  // (lean_sm: the SM count at which the group takes the lean 8-warp kernel, group_lean.)
  int64_t logical = 0;
  for (size_t i = 0; i < n; ++i) logical += (rows[i] + (mode == kRows ? 15 : 7)) / (mode == kRows ? 16 : 8);
  const int lean_sm = static_cast<int>((logical + 2) / 3);
  for (int n_sm : {132, 3, 2, 1, lean_sm}) {
    std::vector<EmuSeg> segs;
    for (size_t i = 0; i < n; ++i) {
      y_new[i].assign(static_cast<size_t>(rows[i]), NAN);
      segs.push_back(EmuSeg{w[i]->p, static_cast<int64_t>(row_size(types[i], K)), y_new[i].data(), rows[i], types[i], mode,
                            bias ? adds[i].data() : nullptr});
    }
    ++checks;
    if (!emu_new::launch_grp(base, segs.data(), static_cast<int>(n), n_sm)) {
      ++failures;
      std::printf("FAIL %s: not launched\n", tag.c_str());
      continue;
    }
    for (size_t i = 0; i < n; ++i) same(y_old[i].data(), y_new[i].data(), y_old[i].size(), tag + " n_sm " + std::to_string(n_sm) + " seg " + std::to_string(i));
  }
}

// gpt-oss's experts with their biases (matvec.cu: MvBias): the fused gate/up + SwiGLU-OAI and
// down + bias + combine + residual launches bit for bit against the unfused sequence: this
// version's MatMulId as cuda_matvec launches it at the H200's 132 SMs (unfused_product: K halves
// for the shapes of few rows), then AddId, SwiGLU-OAI and MoeCombine + Add in
// the float operations of their kernels (moe_route.cu: add_id_kernel, moe_combine4_kernel;
// ew_value.cuh: swiglu_oai_value), here on the host. Bias rows with a stride past their row
// length; out-of-range ids (the unfused MatMulId writes zeros, AddId copies them, the combine
// adds zero times the weight). Down shapes take the 16-warp kernel and (F 3072, eight slots)
// the 8-warp one with two warps per row.
float oai_ref(float x, float y, float alpha, float limit) {  // swiglu_oai_value's expression
  const float g = fminf(x, limit);
  const float u = fminf(fmaxf(y, -limit), limit);
  return g / (1.0f + expf(alpha * (-g))) * (u + 1.0f);
}

// The unfused MatMulId of one token as cuda_matvec launches it on the H200 (launch_rows: the
// mode rows_mode picks at 132 SMs, kModeHalves for few rows).
constexpr int kH200Sms = 132;
void unfused_product(DType t, const EmuMv &m, const std::string &tag) {
  if (!emu_new::launch_unfused(t, kH200Sms, m)) {
    ++failures;
    std::printf("FAIL %s: the unfused MatMulId did not launch\n", tag.c_str());
  }
}

void check_bias(DType t) {
  struct Shape {
    int64_t K, F, E;
    std::vector<int32_t> ids;
  };
  const float alpha = 1.702f, limit = 7.0f;
  const Shape shapes[] = {{256, 96, 6, {1, 4, -1, 0, 4}}, {2880, 32, 4, {3, 0, 2, 1}}, {96, 3072, 10, {1, 2, 0, 9, 4, 3, 12, 0}}};
  for (const Shape &sh : shapes) {
    const int64_t K = sh.K, F = sh.F, E = sh.E, n = static_cast<int64_t>(sh.ids.size());
    const std::string tag = std::string(dtype_name(t)) + " bias K " + std::to_string(K) + " F " + std::to_string(F) + " slots " + std::to_string(n);
    auto valid = [&](int64_t j) { return sh.ids[static_cast<size_t>(j)] >= 0 && sh.ids[static_cast<size_t>(j)] < E; };
    // gate/up: K activations, F rows per expert.
    {
      std::unique_ptr<Buf> wg(weights(t, K, F * E)), wu(weights(t, K, F * E));
      const size_t rb = row_size(t, K);
      const int64_t sF = F + 3;
      const auto bg = randn(static_cast<size_t>(E * sF)), bu = randn(static_cast<size_t>(E * sF));
      const auto xs = randn(static_cast<size_t>(K), 0.1f);
      EmuMv m = one_token_args(rb, K, F, xs);
      m.eb = static_cast<int64_t>(rb) * F;
      m.E = static_cast<int>(E);
      m.ids = sh.ids.data();
      m.n_used = static_cast<int>(n);
      m.mode = kRows;
      std::vector<float> yg(static_cast<size_t>(n * F), NAN), yu(yg), want(yg), act(yg);
      m.w = wg->p;
      m.y = yg.data();
      unfused_product(t, m, tag + " gate");
      m.w = wu->p;
      m.y = yu.data();
      unfused_product(t, m, tag + " up");
      for (int64_t j = 0; j < n; ++j)
        for (int64_t r = 0; r < F; ++r) {
          const size_t i = static_cast<size_t>(j * F + r), b = static_cast<size_t>(sh.ids[static_cast<size_t>(j)] * sF + r);
          const float g = valid(j) ? yg[i] + bg[b] : yg[i], u = valid(j) ? yu[i] + bu[b] : yu[i];
          want[i] = oai_ref(g, u, alpha, limit);
        }
      m.mode = kGateUp;
      m.w = wg->p;
      m.w2 = wu->p;
      m.rb2 = m.rb;
      m.eb2 = m.eb;
      m.y = act.data();
      ++checks;
      if (!emu_new::launch_bias(t, false, kH200Sms, m, EmuBias{bg.data(), bu.data(), sF, sF, alpha, limit})) {
        ++failures;
        std::printf("FAIL %s gate_up: not launched\n", tag.c_str());
      }
      same(want.data(), act.data(), act.size(), tag + " gate_up + swiglu_oai vs unfused");
    }
    // down: F activations per slot, K rows per expert.
    {
      std::unique_ptr<Buf> wd(weights(t, F, K * E));
      const size_t rb = row_size(t, F);
      const int64_t sK = K + 5;
      const auto bd = randn(static_cast<size_t>(E * sK)), cw = randn(static_cast<size_t>(n)), res = randn(static_cast<size_t>(K));
      const auto xs = randn(static_cast<size_t>(n * F));
      EmuMv m = one_token_args(rb, F, K, xs);
      m.w = wd->p;
      m.eb = static_cast<int64_t>(rb) * K;
      m.E = static_cast<int>(E);
      m.ids = sh.ids.data();
      m.n_used = static_cast<int>(n);
      m.X = static_cast<int>(n);
      m.mode = kRows;
      std::vector<float> yd(static_cast<size_t>(n * K), NAN), want(static_cast<size_t>(K)), out(want.size(), NAN);
      m.y = yd.data();
      unfused_product(t, m, tag + " down");
      for (int64_t r = 0; r < K; ++r) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          const size_t i = static_cast<size_t>(j * K + r);
          const float p = valid(j) ? yd[i] + bd[static_cast<size_t>(sh.ids[static_cast<size_t>(j)] * sK + r)] : yd[i];
          const float c = p * cw[static_cast<size_t>(j)];
          acc = j == 0 ? c : acc + c;
        }
        want[static_cast<size_t>(r)] = acc + res[static_cast<size_t>(r)];
      }
      const DownSet ds{sh.ids, false};  // (down_args keeps a pointer to its ids)
      EmuMv mo = down_args(m, ds, cw, res.data());
      mo.y = out.data();
      ++checks;
      if (!emu_new::launch_bias(t, true, kH200Sms, mo, EmuBias{bd.data(), nullptr, sK, 0, 0.0f, 0.0f})) {
        ++failures;
        std::printf("FAIL %s down: not launched\n", tag.c_str());
      }
      same(want.data(), out.data(), out.size(), tag + " down + bias + combine + residual vs unfused");
    }
  }
}

}  // namespace

int main(int argc, char **argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  for (DType t : kTypes) {
    if (!only.empty() && only != dtype_name(t) && only != "group" && only != "bias") continue;
    if (only != "group" && only != "bias") {
      if (ref_type(t)) check_ref_type(t);
      else check_type(t);
      std::printf("%s: %d checks, %d failures so far\n", dtype_name(t), checks, failures);
    }
  }
  if (only.empty() || only == "bias") {
    const std::string bias_only = only == "bias" && argc > 2 ? argv[2] : "";  // bias TYPE: that type only
    for (DType t : {DType::MXFP4, DType::Q8_0, DType::Q4_0})
      if (bias_only.empty() || bias_only == dtype_name(t)) check_bias(t);
    std::printf("bias: %d checks, %d failures\n", checks, failures);
  }
  if (only.empty() || only == "group") {
    check_group({DType::Q4_K, DType::Q4_K, DType::Q6_K}, {37, 5, 20}, 768);
    check_group({DType::Q5_K, DType::Q2_K, DType::Q3_K, DType::Q4_K}, {3, 17, 1, 40}, 2304);
    check_group({DType::Q8_0, DType::Q4_0, DType::MXFP4}, {33, 16, 2}, 2080);
    check_group({DType::Q4_K, DType::Q6_K, DType::Q5_K}, {9, 20, 3}, 1024, kHalves);
    check_group({DType::Q8_0, DType::MXFP4}, {17, 4}, 128, kHalves);
    check_group({DType::Q8_0, DType::Q8_0, DType::Q8_0}, {64, 8, 8}, 2880, kRows, true);  // gpt-oss's q, k, v (+ biases), fewer rows
    check_group({DType::Q8_0, DType::MXFP4, DType::Q4_0}, {33, 16, 2}, 2080, kRows, true);
    check_group({DType::Q8_0, DType::Q8_0}, {17, 4}, 128, kHalves, true);
    std::printf("group: %d checks, %d failures\n", checks, failures);
  }
  std::printf("%s: %d checks, %d failures\n", failures ? "FAILED" : "OK", checks, failures);
  return failures ? 1 : 0;
}
