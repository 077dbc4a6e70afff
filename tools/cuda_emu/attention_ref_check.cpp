// Checks the reference-order F32 attention kernel (attention_ref_order.cu), run through emu.h,
// bit for bit against the CPU's attend_f32_reference_order (cpu_ref_order.h, cut out of
// src/backends/cpu/ops/attention.cpp by run_attention_ref.sh) on random cache states: free
// cells filled with NaN, two sequences, sliding window, cells past n_kv, head sizes with a
// dot tail, GQA, one token (64-lane KQV) and several (16-lane). Args: SEED CASES.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backends/cuda/ops/attention.cuh"
#include "cpu_ref_order.h"

using namespace moe;

namespace moe {
void emu_ref_order_launch(TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *scratch, int n_cells);
size_t emu_ref_row_floats(int n_cells);
}  // namespace moe

struct Cfg { int hd, group, nkvh, T, n_kv, n_cells, window; };

// Returns the number of output values that differ from the CPU's in any bit.
static int run(const Cfg &c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::uniform_real_distribution<float> ud(0, 1);
  const int n_head = c.group * c.nkvh, hd = c.hd;
  const int maxpos = c.n_kv / 2 + c.T + 4;
  const int cells = std::max(c.n_cells, 1);
  std::vector<int32_t> cpos(cells, -1), pos(c.T), seq(c.T);
  std::vector<unsigned long long> cseq(cells, 0);
  for (int i = 0; i < c.n_kv; ++i) {
    if (ud(rng) < 0.15f) continue;  // free
    cpos[i] = static_cast<int>(ud(rng) * maxpos);
    const float r = ud(rng);
    cseq[i] = r < 0.45f ? 1ull : r < 0.9f ? 2ull : 3ull;
  }
  for (int i = c.n_kv; i < cells; ++i) { cpos[i] = 0; cseq[i] = 3ull; }  // past n_kv: must not be read as visible
  for (int t = 0; t < c.T; ++t) { seq[t] = ud(rng) < 0.5f ? 0 : 1; pos[t] = static_cast<int>(ud(rng) * maxpos); }
  const size_t khb = static_cast<size_t>(hd) * 4, krb = khb * c.nkvh;
  std::vector<float> K(krb / 4 * cells), V(K.size()), Q(static_cast<size_t>(c.T) * n_head * hd);
  for (int cell = 0; cell < cells; ++cell)
    for (size_t i = 0; i < krb / 4; ++i) {
      const bool nan = cell >= c.n_kv || cpos[cell] < 0;
      K[cell * krb / 4 + i] = nan ? NAN : nd(rng);
      V[cell * krb / 4 + i] = nan ? NAN : nd(rng);
    }
  for (auto &x : Q) x = nd(rng) * 0.5f;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int32_t n_kv = c.n_kv;
  AttnArgs a{reinterpret_cast<const uint8_t *>(K.data()), reinterpret_cast<const uint8_t *>(V.data()), krb, krb, khb, khb, hd, hd,
             c.group, static_cast<int>(DType::F32), scale, c.window, nullptr};
  DevUbatch ub{nullptr, pos.data(), seq.data(), cpos.data(), cseq.data(), &n_kv};
  std::vector<float> out(Q.size(), -7.0f), scratch(static_cast<size_t>(c.T) * n_head * emu_ref_row_floats(cells), 12345.0f);
  TView tq{Q.data(), {hd, n_head, c.T, 1}, {4, hd * 4, int64_t(hd) * n_head * 4, int64_t(hd) * n_head * c.T * 4}};
  TView to{out.data(), {hd, n_head, c.T, 1}, {4, hd * 4, int64_t(hd) * n_head * 4, int64_t(hd) * n_head * c.T * 4}};
  emu_ref_order_launch(tq, to, a, ub, scratch.data(), cells);
  int bad = 0;
  std::vector<float> p(cells), ref(hd);
  for (int t = 0; t < c.T; ++t)
    for (int h = 0; h < n_head; ++h) {
      const int hk = h / c.group;
      const uint64_t bit = 1ull << seq[t];
      auto hidden = [&](int32_t cc) {
        return cpos[cc] < 0 || !(cseq[cc] & bit) || cpos[cc] > pos[t] || (c.window > 0 && pos[t] - cpos[cc] >= c.window);
      };
      const uint8_t *kb = reinterpret_cast<const uint8_t *>(K.data()) + hk * khb, *vb = reinterpret_cast<const uint8_t *>(V.data()) + hk * khb;
      attend_f32_reference_order(kb, krb, vb, krb, Q.data() + (static_cast<size_t>(t) * n_head + h) * hd, hd, hd, n_kv, scale, c.T >= 2,
                                 hidden, p.data(), ref.data());
      const float *o = out.data() + (static_cast<size_t>(t) * n_head + h) * hd;
      for (int d = 0; d < hd; ++d)
        if (std::memcmp(&o[d], &ref[d], 4) != 0 && !(std::isnan(o[d]) && std::isnan(ref[d]))) {  // (a token that sees no cell: NaN, its sign bit differs)
          if (bad < 3) std::printf("  t %d h %d d %d: gpu %.9g cpu %.9g\n", t, h, d, o[d], ref[d]);
          ++bad;
        }
    }
  return bad;
}

int main(int argc, char **argv) {
  const uint32_t seed = argc > 1 ? static_cast<uint32_t>(std::atoi(argv[1])) : 1;
  const int cases = argc > 2 ? std::atoi(argv[2]) : 40;
  std::mt19937 rng(seed);
  const int hds[] = {64, 80, 128, 200, 32, 256};
  const int nkvs[] = {0, 1, 15, 16, 17, 63, 64, 65, 100, 130, 257, 600};
  int failed = 0;
  for (int i = 0; i < cases; ++i) {
    Cfg c;
    c.hd = hds[i % 6];
    c.group = 1 << (rng() % 3);
    c.nkvh = 1 + static_cast<int>(rng() % 2);
    c.T = i % 3 == 0 ? 1 : 1 + static_cast<int>(rng() % 5);
    c.n_kv = nkvs[rng() % 12];
    c.n_cells = c.n_kv + static_cast<int>(rng() % 20);
    c.window = rng() % 3 == 0 ? 1 + static_cast<int>(rng() % 40) : 0;
    const int bad = run(c, seed * 1000 + i);
    std::printf("case %2d hd %3d group %d kv heads %d T %d n_kv %3d cells %3d window %2d: %s\n", i, c.hd, c.group, c.nkvh, c.T, c.n_kv,
                c.n_cells, c.window, bad ? "MISMATCH" : "bit-exact");
    failed += bad != 0;
  }
  std::printf("%d of %d cases differ\n", failed, cases);
  return failed ? 1 : 0;
}
