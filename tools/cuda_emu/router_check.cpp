// Checks the fused router kernel of fused.cu (router_mv_kernel: the F32 mat-vec, optionally
// behind RmsNorm -> Mul, the last block routing; run through emu.h) against a float64
// reference: normalised row, logits, probabilities, top-k ids (rows 3 and 7 tie: 3 first),
// renormalised weights, and the counter back at zero after each launch. Exit status 1 on any
// failure. (Bit-identity with the unfused kernels is the GPU tests' part.) The probabilities
// must also be the CPU Softmax op's bits for the emulated logits (its vector expf per 16,
// their sum tree; the tail's expf is the host's in both here).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backends/cpu/kernels/ref_math.h"
#include "router_data.h"

namespace moe {  // router_emu.cpp (generated from fused.cu)
void emu_router(const float *w, int64_t w_rs, const float *x, const float *nw, float *normed, float *logits, float *probs, unsigned *sync,
                int K, int E, int k, int32_t *ids, float *weights, const float *side_w, int side_rows, float *side_out);
void emu_router_sigmoid(const float *w, int64_t w_rs, const float *x, const float *nw, float *normed, float *logits, float *probs,
                        float *selected, const float *bias, float sc0, unsigned *sync, int K, int E, int k, int32_t *ids, float *scaled);
}

// deepseek2's sigmoid router behind the normalised mat-vec, against host loops over the
// kernel's own logits (sigmoid against float64; the biased scores, the selection, the gather,
// NormSum and Scale exactly as the unfused ops compute them). Returns the number of failures.
static int sigmoid_cases() {
  int fails = 0;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0, 1);
  struct Case { int K, E, k; };
  for (const Case &c : {Case{2048, 64, 4}, Case{64, 40, 6}, Case{768, 300, 8}, Case{2056, 512, 8}}) {
    const int K = c.K, E = c.E, k = c.k;
    std::vector<float> w(static_cast<size_t>(K) * E), x(K), nw(K), bias(E);
    for (auto &v : w) v = 0.05f * nd(rng);
    for (auto &v : x) v = nd(rng);
    for (auto &v : nw) v = 1.0f + 0.1f * nd(rng);
    for (auto &v : bias) v = 0.1f * nd(rng);
    bool ok = true;
    unsigned sync = 0;
    for (int rep = 0; rep < 2; ++rep) {
      std::vector<float> normed(K, NAN), logits(E, NAN), probs(E, NAN), sel(E, NAN), scaled(k, NAN);
      std::vector<int32_t> ids(k, -1);
      moe::emu_router_sigmoid(w.data(), K, x.data(), nw.data(), normed.data(), logits.data(), probs.data(), sel.data(), bias.data(), 1.8f, &sync,
                              K, E, k, ids.data(), scaled.data());
      ok = ok && sync == 0;
      for (int e = 0; e < E; ++e) {
        ok = ok && std::fabs(probs[e] - 1.0 / (1.0 + std::exp(-double(logits[e])))) < 1e-6;
        ok = ok && sel[e] == probs[e] + bias[e];
      }
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int i, int j) { return sel[i] > sel[j]; });
      float s = 0.0f;
      for (int j = 0; j < k; ++j) {
        ok = ok && ids[j] == order[j];
        s += probs[order[j]];
      }
      for (int j = 0; j < k; ++j) ok = ok && scaled[j] == (probs[order[j]] / s) * 1.8f;
    }
    fails += !ok;
    std::printf("%s sigmoid K=%d E=%d k=%d\n", ok ? "ok  " : "FAIL", K, E, k);
    std::fflush(stdout);
  }
  return fails;
}

static double rel(const std::vector<float> &a, const std::vector<double> &b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

int main() {
  // side: rows of a side product of the same row (qwen3next's shared-expert gate logit), in the
  // launch's last block(s): alone there (E % 8 == 0) or beside logit rows (E = 300, 33, 17).
  struct Case { int K, E, k, pad; bool norm; int side; };
  const Case cases[] = {{64, 40, 6, 0, false, 0},   {64, 40, 6, 8, true, 1},    {2048, 128, 8, 0, true, 0}, {768, 300, 8, 8, false, 3},
                        {2056, 512, 8, 0, true, 0}, {8, 16, 4, 0, true, 0},     {4096, 64, 4, 16, true, 0}, {2048, 128, 8, 0, false, 0},
                        {1000, 33, 5, 0, true, 8},  {4104, 17, 3, 0, false, 0}, {2048, 256, 8, 0, true, 1}};
  int fails = 0;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0, 1);
  for (const Case &c : cases) {
    const int K = c.K, E = c.E, k = c.k;
    const int64_t rs = K + c.pad;
    RouterRows rows = router_rows(rng, nd, K, E, rs);
    const std::vector<float> &w = rows.w, &x = rows.x, &nw = rows.nw;
    std::vector<float> side_w(static_cast<size_t>(K) * c.side);
    std::mt19937 side_rng(static_cast<unsigned>(K + E));  // (its own stream: the other cases' data as before)
    for (auto &v : side_w) v = 0.05f * nd(side_rng);
    const std::vector<double> a = router_input(rows, c.norm, 1e-6);  // reference input row
    tie_rows_3_7(rows, rs, a);
    std::vector<double> lg(E), p(E);
    for (int e = 0; e < E; ++e) {
      double s = 0;
      for (int i = 0; i < K; ++i) s += double(w[static_cast<size_t>(e) * rs + i]) * a[i];
      lg[e] = s;
    }
    const double mx = *std::max_element(lg.begin(), lg.end());
    double den = 0;
    for (int e = 0; e < E; ++e) den += std::exp(lg[e] - mx);
    for (int e = 0; e < E; ++e) p[e] = std::exp(lg[e] - mx) / den;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int i, int j) { return p[i] > p[j] || (p[i] == p[j] && i < j); });
    std::vector<double> wt(k);
    double ws = 0;
    for (int j = 0; j < k; ++j) ws += p[order[j]];
    for (int j = 0; j < k; ++j) wt[j] = p[order[j]] / ws;

    bool ok = true;
    unsigned sync = 0;
    for (int rep = 0; rep < 2; ++rep) {
      std::vector<float> normed(K, NAN), logits(E, NAN), probs(E, NAN), weights(k, NAN), side_out(c.side + 1, NAN);
      std::vector<int32_t> ids(k, -1);
      moe::emu_router(w.data(), rs, x.data(), c.norm ? nw.data() : nullptr, c.norm ? normed.data() : nullptr, logits.data(), probs.data(), &sync,
                      K, E, k, ids.data(), weights.data(), c.side ? side_w.data() : nullptr, c.side, side_out.data());
      ok = ok && sync == 0;
      if (c.norm) ok = ok && rel(normed, a) < 1e-6;
      ok = ok && rel(logits, lg) < 1e-5 && rel(probs, p) < 1e-5 && rel(weights, wt) < 1e-5;
      const std::vector<float> cpu_p = cpu_softmax(logits);
      // The logits: the CPU's one-token F32 dot (refmath::dot_f32_vec) of each row and the
      // (normalised) activation row, bit for bit.
      const float *xin = c.norm ? normed.data() : x.data();
      for (int e = 0; e < E; ++e) {
        const float want = moe::refmath::dot_f32_vec(K, w.data() + e * rs, 1, xin, 1);
        ok = ok && std::memcmp(&want, &logits[e], 4) == 0;
      }
      // The side rows: the same dot of their own weight rows, bit for bit; nothing past them.
      for (int r = 0; r < c.side; ++r) {
        const float want = moe::refmath::dot_f32_vec(K, side_w.data() + static_cast<size_t>(r) * K, 1, xin, 1);
        ok = ok && std::memcmp(&want, &side_out[r], 4) == 0;
      }
      ok = ok && std::isnan(side_out[c.side]);
      ok = ok && std::memcmp(cpu_p.data(), probs.data(), E * sizeof(float)) == 0;
      for (int j = 0; j < k; ++j) ok = ok && ids[j] == order[j];
      ok = ok && ids[0] == 3 && ids[1] == 7;
    }
    fails += !ok;
    std::printf("%s K=%d E=%d k=%d pad=%d norm=%d side=%d\n", ok ? "ok  " : "FAIL", K, E, k, c.pad, c.norm ? 1 : 0, c.side);
    std::fflush(stdout);
  }
  fails += sigmoid_cases();
  std::printf("%d failures\n", fails);
  return fails != 0;
}
