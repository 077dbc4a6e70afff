// Checks the fused op-sequence kernel of fused_sequence.cu (sequence_kernel: one block runs a
// group's ops in order) through emu.h on deepseek2's MLA glue (q slices + rope, kv slices +
// rope + latent RmsNorm -> Mul; then the two concats and the K store, F32 / F16 / Q8_0
// cache) and its sigmoid router tail (sigmoid, bias add, top-k, gather, NormSum, Scale),
// against host loops: copies exactly, the rope and the norm against float64, the router's
// selection against a host top-k of the kernel's own biased scores. Odd shapes, several
// tokens, a rope in place; bad KV cells and gather ids reported. (The GPU tests tie the kernel to the unfused ops bit for bit.)
// Included at the end of the generated sequence_emu.cpp (gen_sequence.py). Exit status 1 on
// any failure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

using namespace moe;

TView tv(void *p, std::initializer_list<int64_t> dims, size_t esize = 4) {
  TView v{p, {1, 1, 1, 1}, {0, 0, 0, 0}};
  int d = 0;
  for (int64_t n : dims) v.ne[d++] = n;
  int64_t nb = static_cast<int64_t>(esize);
  for (d = 0; d < 4; ++d) { v.nb[d] = nb; nb *= v.ne[d]; }
  return v;
}

SeqStep step(int op, int ew, TView d, TView a, TView b) {
  SeqStep s{};
  s.op = op;
  s.ew = ew;
  s.d = d;
  s.a = a;
  s.b = b;
  return s;
}

RopeArgs rope_args(int n_rot) {
  RopeArgs r{};
  r.n_rot = n_rot;
  r.neox = 0;
  r.freq_scale = 1.0f;
  r.attn_factor = 1.0f;
  r.theta_scale = std::pow(10000.0f, -2.0f / static_cast<float>(n_rot));
  return r;
}

int g_fails = 0;
void expect(bool ok, const char *what, const char *name) {
  if (!ok) {
    std::printf("FAIL %s: %s\n", name, what);
    ++g_fails;
  }
}

// Normal-pairing rope of rows [n, rows] at position p, float64.
double rope_err(const float *x, const float *y, int64_t n, int64_t rows, int n_rot, int32_t p) {
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int k = 0; k < n_rot / 2; ++k) {
      const double th = p * std::pow(10000.0, -2.0 * k / n_rot);
      const double x0 = x[r * n + 2 * k], x1 = x[r * n + 2 * k + 1];
      const double y0 = x0 * std::cos(th) - x1 * std::sin(th), y1 = x0 * std::sin(th) + x1 * std::cos(th);
      worst = std::max({worst, std::fabs(y0 - y[r * n + 2 * k]), std::fabs(y1 - y[r * n + 2 * k + 1])});
    }
  return worst;
}

size_t kv_row_bytes(DType t, int64_t n) {
  return t == DType::F32 ? static_cast<size_t>(n) * 4 : t == DType::F16 ? static_cast<size_t>(n) * 2 : static_cast<size_t>(n / 32) * 34;
}

float kv_value(const uint8_t *row, int64_t i, DType t) {
  if (t == DType::F32) return reinterpret_cast<const float *>(row)[i];
  if (t == DType::F16) return __half2float(reinterpret_cast<const __half *>(row)[i]);
  const uint8_t *blk = row + (i / 32) * 34;
  return __half2float(*reinterpret_cast<const __half *>(blk)) * static_cast<float>(static_cast<int8_t>(blk[2 + i % 32]));
}

// alias: the latent's slice over the k_pe slice's buffer (another row layout: a serial part).
// blocks_a / blocks_b: the expected block counts of the two launches (0: not checked).
void mla_case(const char *name, int64_t H, int64_t nope, int64_t P, int64_t R, int64_t T, DType kt, bool rope_in_place, std::mt19937 &rng,
              bool alias = false, int blocks_a = 0, int blocks_b = 0) {
  std::normal_distribution<float> nd(0, 1);
  auto rnd = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float &x : v) x = nd(rng);
    return v;
  };
  const int64_t hd = nope + P, L = R + P;
  std::vector<float> q = rnd(hd * H * T), kv = rnd(L * T), w = rnd(R), q_abs = rnd(R * H * T);
  std::vector<float> q_nope(nope * H * T, NAN), q_pe_s(P * H * T, NAN), q_pe(P * H * T, NAN), kpe_s(P * T, NAN), k_pe(P * T, NAN);
  std::vector<float> lat_s_own(R * T, NAN), lat_n(R * T, NAN), latent(R * T, NAN), qk(L * H * T, NAN), kk(L * T, NAN);
  if (alias) kpe_s.resize(static_cast<size_t>(std::max(P, R) * T), NAN);
  float *lat_s = alias ? kpe_s.data() : lat_s_own.data();
  std::vector<int32_t> pos(T), cells(T);
  for (int64_t t = 0; t < T; ++t) { pos[t] = static_cast<int32_t>(5 + 3 * t); cells[t] = static_cast<int32_t>((3 * t + 1) % (T + 2)); }
  const size_t rb = kv_row_bytes(kt, L);
  std::vector<uint8_t> cache(rb * static_cast<size_t>(T + 2), 0xAB);
  float *pe_out = rope_in_place ? q_pe_s.data() : q_pe.data();

  SeqArgs a{};
  a.cells = cells.data();
  a.n_cells = static_cast<int>(T + 2);
  SeqStep s = step(kSqEw, kSlice, tv(q_nope.data(), {nope, H, T}), tv(q.data(), {hd, H, T}), TView{});
  a.s[0] = s;
  s = step(kSqEw, kSlice, tv(q_pe_s.data(), {P, H, T}), tv(q.data(), {hd, H, T}), TView{});
  s.start = nope;
  a.s[1] = s;
  s = step(kSqRope, 0, tv(pe_out, {P, H, T}), tv(q_pe_s.data(), {P, H, T}), TView{});
  s.ra = rope_args(static_cast<int>(P));
  s.pos = pos.data();
  a.s[2] = s;
  s = step(kSqEw, kSlice, tv(kpe_s.data(), {P, T}), tv(kv.data(), {L, T}), TView{});
  s.start = R;
  a.s[3] = s;
  s = step(kSqRope, 0, tv(k_pe.data(), {P, 1, T}), tv(kpe_s.data(), {P, 1, T}), TView{});
  s.ra = rope_args(static_cast<int>(P));
  s.pos = pos.data();
  a.s[4] = s;
  a.s[5] = step(kSqEw, kSlice, tv(lat_s, {R, T}), tv(kv.data(), {L, T}), TView{});
  s = step(kSqRmsNorm, 0, tv(lat_n.data(), {R, T}), tv(lat_s, {R, T}), TView{});
  s.f0 = 1e-6f;
  s.nthr = row_threads(R);
  a.s[6] = s;
  a.s[7] = step(kSqEw, kMul, tv(latent.data(), {R, T}), tv(lat_n.data(), {R, T}), tv(w.data(), {R}));
  a.n = 8;
  const int got_a = plan_blocks(a);
  launch_sequence(a, nullptr);

  SeqArgs b{};
  b.cells = cells.data();
  b.n_cells = static_cast<int>(T + 2);
  b.s[0] = step(kSqEw, kConcat, tv(qk.data(), {L, H, T}), tv(q_abs.data(), {R, H, T}), tv(pe_out, {P, H, T}));
  b.s[1] = step(kSqEw, kConcat, tv(kk.data(), {L, 1, T}), tv(latent.data(), {R, 1, T}), tv(k_pe.data(), {P, 1, T}));
  s = step(kSqKvStore, 0, TView{}, tv(kk.data(), {L, 1, T}), TView{});
  s.kv = cache.data();
  s.kv_rb = rb;
  s.kv_type = static_cast<int>(kt);
  s.kv_row = L;
  b.s[2] = s;
  b.n = 3;
  const int got_b = plan_blocks(b);
  launch_sequence(b, nullptr);
  expect((!blocks_a || got_a == blocks_a) && (!blocks_b || got_b == blocks_b), "block counts of the launches", name);

  bool copies = true;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float *qr = q.data() + (t * H + h) * hd;
      for (int64_t i = 0; i < nope; ++i) copies &= q_nope[(t * H + h) * nope + i] == qr[i];
      if (!rope_in_place)
        for (int64_t i = 0; i < P; ++i) copies &= q_pe_s[(t * H + h) * P + i] == qr[nope + i];
      for (int64_t i = 0; i < L; ++i)
        copies &= qk[(t * H + h) * L + i] == (i < R ? q_abs[(t * H + h) * R + i] : pe_out[(t * H + h) * P + i - R]);
    }
  for (int64_t t = 0; t < T; ++t) {
    if (!alias)
      for (int64_t i = 0; i < P; ++i) copies &= kpe_s[t * P + i] == kv[t * L + R + i];
    for (int64_t i = 0; i < R; ++i) copies &= lat_s[t * R + i] == kv[t * L + i] && latent[t * R + i] == lat_n[t * R + i] * w[i];
    for (int64_t i = 0; i < L; ++i) copies &= kk[t * L + i] == (i < R ? latent[t * R + i] : k_pe[t * P + i - R]);
  }
  expect(copies, "slices / concats / mul are exact copies", name);
  double err = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      std::vector<float> x(q.begin() + (t * H + h) * hd + nope, q.begin() + (t * H + h) * hd + hd);
      err = std::max(err, rope_err(x.data(), pe_out + (t * H + h) * P, P, 1, static_cast<int>(P), pos[t]));
    }
    err = std::max(err, rope_err(kv.data() + t * L + R, k_pe.data() + t * P, P, 1, static_cast<int>(P), pos[t]));
    double ss = 0;
    for (int64_t i = 0; i < R; ++i) ss += double(kv[t * L + i]) * kv[t * L + i];
    const double sc = 1.0 / std::sqrt(ss / double(R) + 1e-6);
    for (int64_t i = 0; i < R; ++i) err = std::max(err, std::fabs(kv[t * L + i] * sc - lat_n[t * R + i]) / (std::fabs(kv[t * L + i] * sc) + 1e-3));
  }
  expect(err < 2e-5, "rope / rms_norm against float64", name);
  double kv_err = 0;
  const double tol = kt == DType::F32 ? 0 : kt == DType::F16 ? 1e-3 : 2e-2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < L; ++i) {
      const double ref = kk[t * L + i];
      kv_err = std::max(kv_err, std::fabs(kv_value(cache.data() + cells[t] * rb, i, kt) - ref) / std::max(1.0, std::fabs(ref)));
    }
  expect(kv_err <= tol * 4, "K cache rows", name);
  std::printf("%s: blocks %d + %d, rope/norm err %.2e, kv err %.2e\n", name, got_a, got_b, err, kv_err);
}

void router_case(const char *name, int64_t E, int64_t k, int64_t T, std::mt19937 &rng) {
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> logits(E * T), bias(E);
  for (float &x : logits) x = nd(rng);
  for (float &x : bias) x = 0.1f * nd(rng);
  logits[3] = logits[7];  // a tie: the lower index wins
  std::vector<float> probs(E * T, NAN), sel(E * T, NAN), g(k * T, NAN), wn(k * T, NAN), out(k * T, NAN);
  std::vector<int32_t> ids(k * T, -7);
  SeqArgs a{};
  a.s[0] = step(kSqEw, kSigmoid, tv(probs.data(), {E, T}), tv(logits.data(), {E, T}), TView{});
  a.s[1] = step(kSqEw, kAdd, tv(sel.data(), {E, T}), tv(probs.data(), {E, T}), tv(bias.data(), {E}));
  a.s[2] = step(kSqTopK, 0, tv(ids.data(), {k, T}), tv(sel.data(), {E, T}), TView{});
  a.s[3] = step(kSqGatherCols, 0, tv(g.data(), {k, T}), tv(probs.data(), {E, T}), tv(ids.data(), {k, T}));
  a.s[4] = step(kSqNormSum, 0, tv(wn.data(), {k, T}), tv(g.data(), {k, T}), TView{});
  SeqStep s = step(kSqEw, kScale, tv(out.data(), {k, T}), tv(wn.data(), {k, T}), TView{});
  s.f0 = 1.8f;
  a.s[5] = s;
  a.n = 6;
  launch_sequence(a, nullptr);
  bool ok = true;
  double perr = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      perr = std::max(perr, std::fabs(probs[t * E + e] - 1.0 / (1.0 + std::exp(-double(logits[t * E + e])))));
      ok &= sel[t * E + e] == probs[t * E + e] + bias[e];
    }
    std::vector<int32_t> order(E);
    for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return sel[t * E + x] > sel[t * E + y]; });
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      ok &= ids[t * k + j] == order[j];
      ok &= g[t * k + j] == probs[t * E + order[j]];
      sum += g[t * k + j];
    }
    for (int64_t j = 0; j < k; ++j) ok &= wn[t * k + j] == g[t * k + j] / sum && out[t * k + j] == wn[t * k + j] * 1.8f;
  }
  expect(ok, "selection, gather, norm, scale", name);
  expect(perr < 1e-6, "sigmoid against float64", name);
  std::printf("%s: sigmoid err %.2e\n", name, perr);
}

// gpt-oss's router tail: top-k of the raw logits, gather of the chosen, softmax over them,
// scale; against a host top-k and a float64 softmax.
void softmax_tail_case(const char *name, int64_t E, int64_t k, int64_t T, std::mt19937 &rng) {
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> logits(E * T);
  for (float &x : logits) x = nd(rng);
  logits[2] = logits[5];  // a tie: the lower index wins
  std::vector<float> g(k * T, NAN), sm(k * T, NAN), out(k * T, NAN);
  std::vector<int32_t> ids(k * T, -7);
  SeqArgs a{};
  a.s[0] = step(kSqTopK, 0, tv(ids.data(), {k, T}), tv(logits.data(), {E, T}), TView{});
  a.s[1] = step(kSqGatherCols, 0, tv(g.data(), {k, T}), tv(logits.data(), {E, T}), tv(ids.data(), {k, T}));
  SeqStep s = step(kSqSoftmax, 0, tv(sm.data(), {k, T}), tv(g.data(), {k, T}), TView{});
  s.nthr = row_threads(k);
  a.s[2] = s;
  s = step(kSqEw, kScale, tv(out.data(), {k, T}), tv(sm.data(), {k, T}), TView{});
  s.f0 = 0.5f;
  a.s[3] = s;
  a.n = 4;
  const int blocks = plan_blocks(a);
  launch_sequence(a, nullptr);
  bool ok = blocks == static_cast<int>(T);  // one part: each step reads the previous one's rows
  double err = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> order(E);
    for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return logits[t * E + x] > logits[t * E + y]; });
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      ok &= ids[t * k + j] == order[j] && g[t * k + j] == logits[t * E + order[j]];
      mx = std::max(mx, double(g[t * k + j]));
    }
    for (int64_t j = 0; j < k; ++j) sum += std::exp(double(g[t * k + j]) - mx);
    for (int64_t j = 0; j < k; ++j) {
      err = std::max(err, std::fabs(sm[t * k + j] - std::exp(double(g[t * k + j]) - mx) / sum));
      ok &= out[t * k + j] == sm[t * k + j] * 0.5f;
    }
  }
  expect(ok, "blocks, selection, gather, scale", name);
  expect(err < 1e-6, "softmax against float64", name);
  std::printf("%s: blocks %d, softmax err %.2e\n", name, blocks, err);
}

// Bad indices (cuda_kernel_errors.h): a KV store with one cell outside the cache stores the
// other token and skips that one; a gather with an id outside the row writes 0 there; both
// are reported in the error words, the first report with its index and bound.
void bad_index_case(const char *name) {
  const int64_t n = 32, T = 2, E = 8;
  std::vector<float> rows(n * T), probs(E * T), g(2 * T, NAN);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i) + 0.5f;
  for (size_t i = 0; i < probs.size(); ++i) probs[i] = static_cast<float>(i);
  std::vector<int32_t> cells = {1, 9}, ids = {3, 8, 0, -1};
  std::vector<uint8_t> cache(4 * n * 4, 0xAB);
  unsigned err[kKernelErrorWords] = {0, 0, 0, 0};
  SeqArgs a{};
  a.cells = cells.data();
  a.n_cells = 4;
  a.err = err;
  SeqStep s = step(kSqKvStore, 0, TView{}, tv(rows.data(), {n, 1, T}), TView{});
  s.kv = cache.data();
  s.kv_rb = static_cast<size_t>(n) * 4;
  s.kv_type = static_cast<int>(DType::F32);
  s.kv_row = n;
  a.s[0] = s;
  a.s[1] = step(kSqGatherCols, 0, tv(g.data(), {2, T}), tv(probs.data(), {E, T}), tv(ids.data(), {2, T}));
  a.n = 2;
  launch_sequence(a, nullptr);
  bool stored = std::memcmp(cache.data() + n * 4, rows.data(), static_cast<size_t>(n) * 4) == 0;
  for (size_t i = 0; i < cache.size(); ++i)
    if (i < static_cast<size_t>(n) * 4 || i >= static_cast<size_t>(2 * n) * 4) stored &= cache[i] == 0xAB;
  expect(stored, "the good cell stored, nothing else touched", name);
  expect(g[0] == probs[3] && g[1] == 0.0f && g[2] == probs[E] && g[3] == 0.0f, "bad gather ids give 0", name);
  expect(err[0] == (kKernelErrKvCell | kKernelErrRouteId), "both kinds reported", name);
  expect(err[1] == kKernelErrKvCell && err[2] == 9u && err[3] == 4u, "the first report's kind, index, bound", name);
  std::printf("%s: error words %#x %#x %d %u\n", name, err[0], err[1], static_cast<int>(err[2]), err[3]);
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  mla_case("MLA glue, odd dims, one token, F32", 3, 13, 6, 20, 1, DType::F32, false, rng);
  mla_case("MLA glue, three tokens, rope in place, F16", 5, 24, 8, 40, 3, DType::F16, true, rng);
  mla_case("MLA glue, Q8_0 rows of 96, two tokens", 2, 24, 32, 64, 2, DType::Q8_0, false, rng);
  // 42 = 20 q_nope rows + 20 q_pe rows (slice -> rope) + k_pe (slice -> rope) + latent (slice
  // -> norm -> mul); 21 = 20 qk rows + the kk row (concat -> K store).
  mla_case("MLA glue, GLM-4.7-Flash dims, one token", 20, 192, 64, 512, 1, DType::F16, false, rng, false, 42, 21);
  mla_case("MLA glue, GLM-4.7-Flash dims, rope in place, two tokens", 20, 192, 64, 512, 2, DType::Q8_0, true, rng, false, 84, 42);
  mla_case("MLA glue, 50 heads, three tokens: 150 rows dealt to 128 blocks", 50, 16, 8, 32, 3, DType::F16, false, rng, false, 262, 131);
  // 17 = 8 q_nope rows + 8 q_pe rows + one block for the k_pe and latent chains, which meet
  // with another row layout (a serial part).
  mla_case("MLA glue, latent slice over the k_pe slice: a serial part", 4, 16, 8, 32, 2, DType::F32, false, rng, true, 17, 10);
  router_case("sigmoid router tail, 64 experts, 4 used, one token", 64, 4, 1, rng);
  router_case("sigmoid router tail, 300 experts, 8 used, 5 tokens", 300, 8, 5, rng);
  router_case("sigmoid router tail, 16 experts, 4 used, 37 tokens (warps loop)", 16, 4, 37, rng);
  softmax_tail_case("gpt-oss router tail, 32 experts, 4 used, one token", 32, 4, 1, rng);
  softmax_tail_case("gpt-oss router tail, 128 experts, 4 used, three tokens", 128, 4, 3, rng);
  softmax_tail_case("router tail, 300 experts, 20 used (softmax rows past 16), two tokens", 300, 20, 2, rng);
  bad_index_case("bad KV cell and gather ids");
  std::printf("%d failures\n", g_fails);
  return g_fails ? 1 : 0;
}
