// Checks the fused gated DeltaNet kernels of delta_net_fused.cu against a float64 reference:
// delta_in_kernel (the gate chain through qwen3next's ba slices or qwen35moe's plain beta /
// alpha, the conv over each sequence's tail with tokens of two sequences interleaved, one
// sequence advancing its state in place, the q / k rows L2-normalised, v) and gated_norm_kernel
// (silu(z) * rms_norm(x) * w) and shared_gate_kernel ((routed + shared * sigmoid(logit)) + res).
// Head sizes 128, 48, 5 and 200, conv widths 4 (the compiled-width
// kernel), 3 and 2. The conv tails written back are copies of inputs: compared exactly.
// Included at the end of the generated dnfuse_emu.cpp (gen_dnfuse.py). Exit status 1 on any failure.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

using namespace moe;

struct Case {
  int64_t d, n_k, n_v, K;
  bool next;
  std::vector<int32_t> seq;  // per token
};

TView view3(float *p, int64_t a, int64_t b, int64_t c) { return TView{p, {a, b, c, 1}, {4, a * 4, a * b * 4, a * b * c * 4}}; }

double rel(double got, double want) { return std::fabs(got - want) / std::max(1.0, std::fabs(want)); }

}  // namespace

int main() {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 1);
  int fails = 0, checks = 0;
  auto report = [&](bool ok, const char *what, int c, double err) {
    ++checks;
    if (!ok) {
      ++fails;
      std::printf("FAIL %s case %d (err %.3g)\n", what, c, err);
    }
  };
  const std::vector<Case> cases = {{128, 2, 4, 4, true, {0}},
                                   {48, 2, 6, 4, true, {0, 2, 0, 0, 2}},
                                   {5, 1, 3, 3, false, {1, 1, 1}},
                                   {200, 1, 2, 2, false, {3, 0}}};
  for (int ci = 0; ci < static_cast<int>(cases.size()); ++ci) {
    const Case &cs = cases[static_cast<size_t>(ci)];
    const int64_t d = cs.d, n_k = cs.n_k, n_v = cs.n_v, K = cs.K, T = static_cast<int64_t>(cs.seq.size()), r = n_v / n_k;
    const int64_t C = 2 * d * n_k + d * n_v, per = (K - 1) * C + 7;
    const int n_seq_max = 4;
    std::vector<float> x(static_cast<size_t>(C * T)), w(static_cast<size_t>(K * C)), base(static_cast<size_t>(2 * n_seq_max * per));
    std::vector<float> ba(static_cast<size_t>(2 * n_v * T)), beta(static_cast<size_t>(n_v * T)), alpha(beta.size()), bias(static_cast<size_t>(n_v)),
        av(bias.size());
    for (auto *v : {&x, &w, &base, &ba, &beta, &alpha, &bias}) for (float &f : *v) f = nd(rng) * 2.0f;
    for (float &f : av) f = -std::exp(nd(rng));
    ba[0] = 30.0f;  // softplus past 20 (qwen3next's first beta... and alpha of head r at token 0)
    ba[static_cast<size_t>(r)] = 25.0f;
    // Table: distinct sequences in order of appearance; the first reads copy 1 and writes 0, the
    // others advance copy 0 in place.
    std::vector<int32_t> rs = {0};
    for (int32_t s : cs.seq) {
      bool seen = false;
      for (int32_t k = 0; k < rs[0]; ++k) seen |= rs[static_cast<size_t>(1 + 3 * k)] == s;
      if (seen) continue;
      rs.insert(rs.end(), {s, rs[0] == 0 ? 1 : 0, 0});
      ++rs[0];
    }
    const std::vector<float> base0 = base;
    std::vector<float> q(static_cast<size_t>(d * n_k * T)), k(q.size()), v(static_cast<size_t>(d * n_v * T)), g(static_cast<size_t>(2 * n_v * T));
    DeltaInArgs a{};
    a.x = x.data();
    a.w = w.data();
    a.x_nb1 = C;
    a.C = C;
    a.T = T;
    a.K = static_cast<int>(K);
    a.seq = cs.seq.data();
    a.rs = rs.data();
    a.base = base.data();
    a.per = per;
    a.n_seq_max = n_seq_max;
    a.d = d;
    a.n_k = n_k;
    a.eps_q = 1e-6f;
    a.eps_k = 1e-5f;
    a.norm_threads = row_threads(d);
    a.q = view3(q.data(), d, n_k, T);
    a.k = view3(k.data(), d, n_k, T);
    a.v = v.data();
    a.v_nb1 = d * n_v;
    const int threads = std::max(static_cast<int>((d + 31) / 32 * 32), row_threads(d));
    a.v_blocks = static_cast<int>((C - 2 * n_k * d + threads - 1) / threads);
    if (cs.next) {  // slices of ba viewed as [2r, n_k, T]: beta = [0, r), alpha = [r, 2r)
      a.beta = GateSrc{reinterpret_cast<const uint8_t *>(ba.data()), 0, r, n_k, 2 * r * 4, 2 * r * n_k * 4};
      a.alpha = GateSrc{reinterpret_cast<const uint8_t *>(ba.data()), r, r, n_k, 2 * r * 4, 2 * r * n_k * 4};
    } else {
      a.beta = GateSrc{reinterpret_cast<const uint8_t *>(beta.data()), 0, n_v, T, n_v * 4, n_v * T * 4};
      a.alpha = GateSrc{reinterpret_cast<const uint8_t *>(alpha.data()), 0, n_v, T, n_v * 4, n_v * T * 4};
    }
    a.bias = bias.data();
    a.a = av.data();
    a.g = g.data();
    a.g_nb1 = 2 * n_v;
    a.n_v = n_v;
    const dim3 grid(static_cast<unsigned>(2 * n_k + a.v_blocks + 1), static_cast<unsigned>(std::min<int64_t>(T, n_seq_max)));
    if (K == 4) launch_pdl(delta_in_kernel<4>, grid, dim3(static_cast<unsigned>(threads)), 0, nullptr, a);
    else launch_pdl(delta_in_kernel<0>, grid, dim3(static_cast<unsigned>(threads)), 0, nullptr, a);

    // Reference: per sequence its tail from its source copy, tokens in order.
    double e_q = 0, e_v = 0, e_g = 0;
    bool tails = true;
    for (int32_t slot = 0; slot < rs[0]; ++slot) {
      const int32_t s = rs[static_cast<size_t>(1 + 3 * slot)], src = rs[static_cast<size_t>(2 + 3 * slot)], dst = rs[static_cast<size_t>(3 + 3 * slot)];
      const float *tail0 = base0.data() + (static_cast<int64_t>(src) * n_seq_max + s) * per;
      const float *tail1 = base.data() + (static_cast<int64_t>(dst) * n_seq_max + s) * per;
      std::vector<double> y(static_cast<size_t>(C));
      std::vector<std::vector<float>> win(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j + 1 < K; ++j) win[static_cast<size_t>(c)].push_back(tail0[j * C + c]);
      for (int64_t t = 0; t < T; ++t) {
        if (cs.seq[static_cast<size_t>(t)] != s) continue;
        for (int64_t c = 0; c < C; ++c) {
          auto &wv = win[static_cast<size_t>(c)];
          wv.push_back(x[static_cast<size_t>(t * C + c)]);
          double sum = 0;
          for (int64_t j = 0; j < K; ++j) sum += static_cast<double>(wv[static_cast<size_t>(j)]) * w[static_cast<size_t>(c * K + j)];
          y[static_cast<size_t>(c)] = sum / (1.0 + std::exp(-sum));
          wv.erase(wv.begin());
        }
        for (int64_t row = 0; row < 2 * n_k; ++row) {
          double ss = 0;
          for (int64_t i = 0; i < d; ++i) ss += y[static_cast<size_t>(row * d + i)] * y[static_cast<size_t>(row * d + i)];
          const double inv = 1.0 / std::max(std::sqrt(ss), row < n_k ? 1e-6 : 1e-5);
          const float *got = (row < n_k ? q.data() : k.data()) + (t * n_k + row % n_k) * d;
          for (int64_t i = 0; i < d; ++i) e_q = std::max(e_q, rel(got[i], y[static_cast<size_t>(row * d + i)] * inv));
        }
        for (int64_t i = 0; i < d * n_v; ++i) e_v = std::max(e_v, rel(v[static_cast<size_t>(t * d * n_v + i)], y[static_cast<size_t>(2 * d * n_k + i)]));
      }
      for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j + 1 < K; ++j) tails &= tail1[j * C + c] == win[static_cast<size_t>(c)][static_cast<size_t>(j)];
    }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < n_v; ++h) {
        const size_t gi = static_cast<size_t>(t * n_k + h / r) * static_cast<size_t>(2 * r) + static_cast<size_t>(h % r);
        const double al = cs.next ? ba[gi + static_cast<size_t>(r)] : alpha[static_cast<size_t>(t * n_v + h)];
        const double be = cs.next ? ba[gi] : beta[static_cast<size_t>(t * n_v + h)];
        const double z = static_cast<double>(static_cast<float>(al + bias[static_cast<size_t>(h)]));
        const double sp = z > 20.0 ? z : std::log1p(std::exp(z));
        e_g = std::max(e_g, rel(g[static_cast<size_t>(t * 2 * n_v + h)], sp * av[static_cast<size_t>(h)]));
        e_g = std::max(e_g, rel(g[static_cast<size_t>(t * 2 * n_v + n_v + h)], 1.0 / (1.0 + std::exp(-be))));
      }
    report(e_q < 2e-6, "q/k rows", ci, e_q);
    report(e_v < 2e-6, "v", ci, e_v);
    report(e_g < 2e-6, "gates", ci, e_g);
    report(tails, "conv tails", ci, 0);

    // gated_norm_kernel: rows of d, 6 rows as [d, 3, 2].
    const int64_t rows = 6;
    std::vector<float> xin(static_cast<size_t>(d * rows)), zin(xin.size()), nw(static_cast<size_t>(d)), out(xin.size());
    for (auto *vv : {&xin, &zin, &nw}) for (float &f : *vv) f = nd(rng);
    GatedNormArgs ga{view3(out.data(), d, 3, 2), view3(xin.data(), d, 3, 2), view3(zin.data(), d, 3, 2), nw.data(), 1e-6f, row_threads(d)};
    launch_pdl(gated_norm_kernel, dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(row_threads(d))), 0, nullptr, ga);
    double e_n = 0;
    for (int64_t row = 0; row < rows; ++row) {
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xin[static_cast<size_t>(row * d + i)]) * xin[static_cast<size_t>(row * d + i)];
      const double sc = 1.0 / std::sqrt(ss / static_cast<double>(d) + 1e-6);
      for (int64_t i = 0; i < d; ++i) {
        const size_t e = static_cast<size_t>(row * d + i);
        const double zz = zin[e];
        e_n = std::max(e_n, rel(out[e], zz / (1.0 + std::exp(-zz)) * xin[e] * sc * nw[static_cast<size_t>(i)]));
      }
    }
    report(e_n < 2e-6, "gated norm", ci, e_n);
  }
  // shared_gate_kernel: (routed + shared * sigmoid(logit)) + res, M = 300 (a partial block), T = 3.
  {
    const int64_t M = 300, T = 3;
    std::vector<float> logit(static_cast<size_t>(T)), sh(static_cast<size_t>(M * T)), ro(sh.size()), re(sh.size()), out(sh.size());
    for (auto *vv : {&logit, &sh, &ro, &re}) for (float &f : *vv) f = nd(rng) * 2.0f;
    SharedGateArgs sa{view3(out.data(), M, T, 1), view3(ro.data(), M, T, 1), view3(re.data(), M, T, 1), view3(sh.data(), M, 1, T),
                      view3(logit.data(), 1, T, 1)};
    launch_pdl(shared_gate_kernel, dim3(static_cast<unsigned>((M + 255) / 256), static_cast<unsigned>(T)), dim3(256), 0, nullptr, sa);
    double e = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < M; ++i) {
        const size_t k = static_cast<size_t>(t * M + i);
        const double sg = 1.0 / (1.0 + std::exp(-static_cast<double>(logit[static_cast<size_t>(t)])));
        e = std::max(e, rel(out[k], static_cast<double>(ro[k]) + sh[k] * sg + re[k]));
      }
    report(e < 2e-6, "shared gate", 0, e);
  }
  std::printf("%d of %d checks failed\n", fails, checks);
  return fails ? 1 : 0;
}
