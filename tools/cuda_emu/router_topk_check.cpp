// Checks gpt-oss's one-launch router (router_topk.cu: topk_router_kernel, run through emu.h;
// appended to the generated kernel slice by gen_router_topk.py) on random rows, bit for bit
// against host loops that do what the unfused ops do:
//   normed: RmsNorm -> Mul with the RmsNorm kernel's reduction order (threads of
//           row_threads(K), the xor butterfly per warp, warp sums in order);
//   logits: the CPU's one-token F32 dot (refmath::dot_f32_vec: ref_dot_f32_row's order) of
//           each row and the normalised row, plus the bias in one float add;
//   ids:    the k largest logits, the lower index first on ties (rows 3 and 7 tie);
//   the gathered logits, their softmax (the CPU Softmax op's bits) and its Scale;
// and within 1e-5 of a float64 forward; the last-block counter back at zero after each launch
// (two launches per case). Exit status 1 on any failure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backends/cpu/kernels/ref_math.h"
#include "router_data.h"

namespace {

// The unfused RmsNorm -> Mul of a row (elementwise.cu: rms_row_scale over row_threads(n)
// threads, blk_sum's order), in float / double exactly as the kernels compute it.
std::vector<float> rms_mul(const std::vector<float> &x, const std::vector<float> &w, float eps) {
  const int n = static_cast<int>(x.size()), nthr = moe::row_threads(n);
  std::vector<double> s(static_cast<size_t>(nthr), 0.0);
  for (int t = 0; t < nthr; ++t)
    for (int i = t; i < n; i += nthr) s[static_cast<size_t>(t)] += static_cast<double>(x[i] * x[i]);
  double tot = 0.0;
  for (int w0 = 0; w0 < nthr; w0 += 32) {
    std::vector<double> l(s.begin() + w0, s.begin() + w0 + 32);
    for (int o = 16; o > 0; o >>= 1) {
      std::vector<double> m(32);
      for (int j = 0; j < 32; ++j) m[j] = l[j] + l[j ^ o];
      l = m;
    }
    tot += l[0];
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(tot / static_cast<double>(n)) + eps);
  std::vector<float> y(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const float v = x[i] * scale;
    y[i] = v * w[i];
  }
  return y;
}

struct Out {
  std::vector<float> normed, logits, gathered, probs, scaled;
  std::vector<int32_t> ids;
};

void launch(const std::vector<float> &w, int64_t rs, const std::vector<float> &bias, const std::vector<float> &x, const float *nw, bool scale,
            int K, int E, int k, unsigned *sync, Out &o) {
  o.normed.assign(K, NAN);
  o.logits.assign(E, NAN);
  o.gathered.assign(k, NAN);
  o.probs.assign(k, NAN);
  o.scaled.assign(k, NAN);
  o.ids.assign(k, -1);
  moe::TopKRouterArgs a{};
  a.w = w.data();
  a.w_rs = rs;
  a.bias = bias.data();
  a.x = x.data();
  a.nw = nw;
  a.normed = nw ? o.normed.data() : nullptr;
  a.eps = 1e-5f;
  a.rms_nthr = moe::row_threads(K);
  a.logits = o.logits.data();
  a.ids = o.ids.data();
  a.gathered = o.gathered.data();
  a.probs = o.probs.data();
  a.scaled = scale ? o.scaled.data() : nullptr;
  a.sc0 = 1.7f;
  a.sc1 = 0.25f;
  a.sync = sync;
  a.K = K;
  a.E = E;
  a.k = k;
  a.sm_nthr = moe::row_threads(k);
  launch_pdl(moe::topk_router_kernel, dim3((E + moe::kTrWarps - 1) / moe::kTrWarps), dim3(moe::kTrThreads), 0, nullptr, a);
}

bool same_bits(const float *a, const float *b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

int main() {
  // gpt-oss-20b / 120b's router (K 2880 = 45 x 64: all of it in the preloaded chunks), K past
  // the preloaded chunks (4104, 8192: the loop), K with a tail past the last 64 (2056, 104),
  // E not a multiple of the 8 rows per block, k past 16 (the softmax's vector chunk), with and
  // without the norm and the Scale, a padded row stride.
  struct Case { int K, E, k, pad; bool norm, scale; };
  const Case cases[] = {{2880, 32, 4, 0, true, false}, {2880, 128, 4, 0, true, true}, {4104, 33, 5, 8, true, false}, {2056, 20, 20, 0, false, true},
                        {8192, 64, 8, 0, true, false}, {104, 9, 3, 4, false, false},  {3072, 40, 17, 0, true, true}};
  int fails = 0;
  std::mt19937 rng(29);
  std::normal_distribution<float> nd(0, 1);
  for (const Case &c : cases) {
    const int K = c.K, E = c.E, k = c.k;
    const int64_t rs = K + c.pad;
    RouterRows rows = router_rows(rng, nd, K, E, rs);
    const std::vector<float> &w = rows.w, &x = rows.x, &nw = rows.nw;
    std::vector<float> bias(E);
    for (auto &v : bias) v = 0.1f * nd(rng);
    // Rows 3 and 7 (and their biases) alike, ~3 sigma above the rest: a tie for the top two.
    const std::vector<double> a = router_input(rows, c.norm, 1e-5);
    if (E > 7) {
      tie_rows_3_7(rows, rs, a);
      bias[7] = bias[3];
    }
    // float64 forward
    std::vector<double> lg(E);
    for (int e = 0; e < E; ++e) {
      double s = bias[e];
      for (int i = 0; i < K; ++i) s += double(w[static_cast<size_t>(e) * rs + i]) * a[i];
      lg[e] = s;
    }
    bool ok = true;
    unsigned sync = 0;
    for (int rep = 0; rep < 2; ++rep) {
      Out o;
      launch(w, rs, bias, x, c.norm ? nw.data() : nullptr, c.scale, K, E, k, &sync, o);
      ok = ok && sync == 0;
      const std::vector<float> xin = c.norm ? rms_mul(x, nw, 1e-5f) : x;
      if (c.norm) ok = ok && same_bits(xin.data(), o.normed.data(), K);
      for (int e = 0; e < E; ++e) {
        const float want = moe::refmath::dot_f32_vec(K, w.data() + e * rs, 1, xin.data(), 1) + bias[e];
        ok = ok && same_bits(&want, &o.logits[e], 1);
        ok = ok && std::fabs(o.logits[e] - lg[e]) < 1e-4 * (1 + std::fabs(lg[e]));
      }
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int i, int j) { return o.logits[i] > o.logits[j]; });
      std::vector<float> g(k);
      for (int j = 0; j < k; ++j) {
        ok = ok && o.ids[j] == order[j];
        g[j] = o.logits[order[j]];
      }
      if (E > 7) ok = ok && o.ids[0] == 3 && o.ids[1] == 7;
      ok = ok && same_bits(g.data(), o.gathered.data(), k);
      const std::vector<float> p = cpu_softmax(g);
      ok = ok && same_bits(p.data(), o.probs.data(), k);
      double den = 0, mx = lg[order[0]];
      for (int j = 0; j < k; ++j) den += std::exp(lg[order[j]] - mx);
      for (int j = 0; j < k; ++j) ok = ok && std::fabs(o.probs[j] - std::exp(lg[order[j]] - mx) / den) < 1e-5;
      if (c.scale)
        for (int j = 0; j < k; ++j) {
          const float want = p[j] * 1.7f + 0.25f;
          ok = ok && same_bits(&want, &o.scaled[j], 1);
        }
    }
    fails += !ok;
    std::printf("%s K=%d E=%d k=%d pad=%d norm=%d scale=%d\n", ok ? "ok  " : "FAIL", K, E, k, c.pad, c.norm ? 1 : 0, c.scale ? 1 : 0);
    std::fflush(stdout);
  }
  std::printf("%d failures\n", fails);
  return fails != 0;
}
