// Checks the DeltaNet kernel with its fused output norm (delta_net.cu: delta_net_kernel<M, true>,
// FusedKind::DeltaNorm) run through emu.h: the DeltaNet outputs and the written states must be
// the unfused kernel's bits, the normed output the bits of gated_norm_kernel over the unfused
// outputs, every (head, token) counter back at zero, and everything within float64 references
// of the delta rule and of silu(z) * rms_norm(o) * w. Cases: head sizes 128 / 48 / 16 / 200,
// one token; two sequences of one token; five tokens of two interleaved sequences (the norm of a
// head row per token, a sequence advancing in place); both head maps; z through a strided view.
// Included at the end of the generated dnnorm_emu.cpp (gen_dnnorm.py). Exit status 1 on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

using namespace moe;

struct Case {
  int64_t d, n_k, n_v;
  int head_map;
  std::vector<int32_t> seq;  // per token
};

double rel(double got, double want) { return std::fabs(got - want) / std::max(1.0, std::fabs(want)); }

template <bool Norm> void run_delta(const DeltaArgs &a) {
  const dim3 grid(static_cast<unsigned>(a.n_v * (a.d / kDeltaWarps)), static_cast<unsigned>(a.rs[0]));
  if (a.d <= 32) launch_pdl(delta_net_kernel<1, Norm>, grid, dim3(32 * kDeltaWarps), 0, nullptr, a);
  else if (a.d <= 64) launch_pdl(delta_net_kernel<2, Norm>, grid, dim3(32 * kDeltaWarps), 0, nullptr, a);
  else if (a.d <= 128) launch_pdl(delta_net_kernel<4, Norm>, grid, dim3(32 * kDeltaWarps), 0, nullptr, a);
  else launch_pdl(delta_net_kernel<8, Norm>, grid, dim3(32 * kDeltaWarps), 0, nullptr, a);
}

}  // namespace

int main() {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0, 1);
  std::uniform_real_distribution<float> ud(0, 1);
  int fails = 0, checks = 0;
  auto report = [&](bool ok, const char *what, int c, double err) {
    ++checks;
    if (!ok) {
      ++fails;
      std::printf("FAIL %s case %d (err %.3g)\n", what, c, err);
    }
  };
  const std::vector<Case> cases = {{128, 2, 4, 0, {0}}, {48, 2, 6, 1, {0, 2}}, {16, 1, 3, 0, {0, 2, 0, 0, 2}}, {200, 1, 2, 1, {3}}};
  for (int ci = 0; ci < static_cast<int>(cases.size()); ++ci) {
    const Case &cs = cases[static_cast<size_t>(ci)];
    const int64_t d = cs.d, n_k = cs.n_k, n_v = cs.n_v, T = static_cast<int64_t>(cs.seq.size());
    const int64_t conv = 11, per = conv + n_v * d * d;
    const int n_seq_max = 4;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d)), eps = 1e-6f;
    std::vector<float> q(static_cast<size_t>(d * n_k * T)), k(q.size()), v(static_cast<size_t>(d * n_v * T)), gb(static_cast<size_t>(2 * n_v * T));
    std::vector<float> base(static_cast<size_t>(2 * n_seq_max * per)), nw(static_cast<size_t>(d));
    const int64_t z_rs = d + 3;  // z rows with a gap: a strided view as the graph's View of the gate product can be
    std::vector<float> z(static_cast<size_t>(z_rs * n_v * T), NAN);
    // q, k: unit rows (the L2Norms before the kernel); gates: log decay in [-2, 0), beta in (0, 1).
    for (auto *x : {&q, &k})
      for (int64_t r = 0; r < n_k * T; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < d; ++i) ss += std::pow((*x)[static_cast<size_t>(r * d + i)] = nd(rng), 2);
        for (int64_t i = 0; i < d; ++i) (*x)[static_cast<size_t>(r * d + i)] /= static_cast<float>(std::sqrt(ss));
      }
    for (float &f : v) f = nd(rng);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < n_v; ++h) {
        gb[static_cast<size_t>(t * 2 * n_v + h)] = -2.0f * ud(rng);
        gb[static_cast<size_t>(t * 2 * n_v + n_v + h)] = ud(rng);
      }
    for (float &f : base) f = 0.3f * nd(rng);
    for (float &f : nw) f = 1.0f + 0.2f * nd(rng);
    for (int64_t r = 0; r < n_v * T; ++r)
      for (int64_t i = 0; i < d; ++i) z[static_cast<size_t>(r * z_rs + i)] = 2.0f * nd(rng);
    // Table: distinct sequences in order of appearance; the first reads copy 1 and writes 0, the
    // others advance copy 0 in place.
    std::vector<int32_t> rs = {0};
    for (int32_t s : cs.seq) {
      bool seen = false;
      for (int32_t j = 0; j < rs[0]; ++j) seen |= rs[static_cast<size_t>(1 + 3 * j)] == s;
      if (seen) continue;
      rs.insert(rs.end(), {s, rs[0] == 0 ? 1 : 0, 0});
      ++rs[0];
    }
    const std::vector<float> base0 = base;
    auto args = [&](float *o, float *st) {
      DeltaArgs a{};
      a.o = o;
      a.q = q.data();
      a.k = k.data();
      a.v = v.data();
      a.gb = gb.data();
      a.d = d;
      a.n_k = n_k;
      a.n_v = n_v;
      a.T = T;
      a.conv = conv;
      a.head_map = cs.head_map;
      a.scale = scale;
      a.seq = cs.seq.data();
      a.rs = rs.data();
      a.base = st;
      a.per = per;
      a.n_seq_max = n_seq_max;
      return a;
    };
    auto view3 = [](float *p, int64_t a, int64_t b, int64_t c, int64_t rs) {
      return TView{p, {a, b, c, 1}, {4, rs * 4, rs * b * 4, rs * b * c * 4}};
    };
    // Unfused: the kernel, then gated_norm_kernel over its outputs (a block of row_threads(d) per row).
    std::vector<float> o1(v.size(), NAN), y1(v.size(), NAN), st1 = base0;
    run_delta<false>(args(o1.data(), st1.data()));
    GatedNormArgs ga{view3(y1.data(), d, n_v, T, d), view3(o1.data(), d, n_v, T, d), view3(z.data(), d, n_v, T, z_rs), nw.data(), eps, row_threads(d)};
    launch_pdl(gated_norm_kernel, dim3(static_cast<unsigned>(n_v * T)), dim3(static_cast<unsigned>(row_threads(d))), 0, nullptr, ga);
    // Fused, twice (the counters must be back at zero for the replay).
    std::vector<unsigned> sync(static_cast<size_t>(n_v * T + 1), 0u);
    bool bits = true, zero = true;
    std::vector<float> o2, y2, st2;
    for (int rep = 0; rep < 2; ++rep) {
      o2.assign(v.size(), NAN);
      y2.assign(v.size(), NAN);
      st2 = base0;
      DeltaArgs a = args(o2.data(), st2.data());
      a.norm_w = nw.data();
      a.y = view3(y2.data(), d, n_v, T, d);
      a.z = view3(z.data(), d, n_v, T, z_rs);
      a.eps = eps;
      a.sync = sync.data();
      run_delta<true>(a);
      bits = bits && std::memcmp(o1.data(), o2.data(), o1.size() * 4) == 0 && std::memcmp(y1.data(), y2.data(), y1.size() * 4) == 0 &&
             std::memcmp(st1.data(), st2.data(), st1.size() * 4) == 0;
      for (unsigned c : sync) zero = zero && c == 0;
    }
    report(bits, "fused == unfused bits (o, y, states)", ci, 0);
    report(zero, "counters back at zero", ci, 0);
    // float64: the recurrence per sequence over its tokens, then the gated norm per head row.
    std::vector<double> S(base0.begin(), base0.end());
    double e_o = 0, e_y = 0, e_s = 0;
    for (int32_t sl = 0; sl < rs[0]; ++sl) {
      const int32_t sq = rs[static_cast<size_t>(1 + 3 * sl)], src = rs[static_cast<size_t>(2 + 3 * sl)], dst = rs[static_cast<size_t>(3 + 3 * sl)];
      std::vector<double> st(static_cast<size_t>(n_v * d * d));
      const size_t off_src = static_cast<size_t>((src * n_seq_max + sq) * per + conv), off_dst = static_cast<size_t>((dst * n_seq_max + sq) * per + conv);
      for (size_t e = 0; e < st.size(); ++e) st[e] = base0[off_src + e];
      for (int64_t t = 0; t < T; ++t) {
        if (cs.seq[static_cast<size_t>(t)] != sq) continue;
        for (int64_t h = 0; h < n_v; ++h) {
          const int64_t kh = cs.head_map == 0 ? h / (n_v / n_k) : h % n_k;
          const float *qt = q.data() + (t * n_k + kh) * d, *kt = k.data() + (t * n_k + kh) * d;
          const double decay = std::exp(static_cast<double>(gb[static_cast<size_t>(t * 2 * n_v + h)])), beta = gb[static_cast<size_t>(t * 2 * n_v + n_v + h)];
          std::vector<double> o(static_cast<size_t>(d));
          for (int64_t j = 0; j < d; ++j) {
            double *row = st.data() + (h * d + j) * d, sk = 0, sqv = 0;
            for (int64_t i = 0; i < d; ++i) sk += (row[i] *= decay) * kt[i];
            const double delta = beta * (v[static_cast<size_t>((t * n_v + h) * d + j)] - sk);
            for (int64_t i = 0; i < d; ++i) sqv += (row[i] += kt[i] * delta) * qt[i];
            o[static_cast<size_t>(j)] = sqv * scale;
          }
          double ss = 0;
          for (double x : o) ss += x * x;
          const double sc = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
          for (int64_t i = 0; i < d; ++i) {
            const size_t e = static_cast<size_t>((t * n_v + h) * d + i);
            const double zz = z[static_cast<size_t>((t * n_v + h) * z_rs + i)];
            e_o = std::max(e_o, rel(o2[e], o[static_cast<size_t>(i)]));
            e_y = std::max(e_y, rel(y2[e], zz / (1.0 + std::exp(-zz)) * o[static_cast<size_t>(i)] * sc * nw[static_cast<size_t>(i)]));
          }
        }
      }
      for (size_t e = 0; e < st.size(); ++e) e_s = std::max(e_s, rel(st2[off_dst + e], st[e]));
    }
    report(e_o < 1e-5, "outputs vs float64", ci, e_o);
    report(e_y < 1e-4, "normed outputs vs float64", ci, e_y);
    report(e_s < 1e-5, "states vs float64", ci, e_s);
    std::printf("case %d: d %lld, %lld tokens: outputs %.2g, normed %.2g, states %.2g vs float64\n", ci, static_cast<long long>(d),
                static_cast<long long>(T), e_o, e_y, e_s);
  }
  std::printf("%d of %d checks failed\n", fails, checks);
  return fails ? 1 : 0;
}
