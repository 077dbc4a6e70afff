// Checks the prefill row-chain kernel of fused.cu (row_chains_warp_kernel: a block per token,
// a warp per row) against the decode one (row_chains_kernel: a block per row), both run
// through emu.h on the same chains: every output row and every KV cache byte must be
// identical (the GPU tests tie the block kernel to the unfused ops and the CPU). Also the
// RmsNorm -> Mul rows against a float64 reference, to catch a harness that checks nothing.
// Included at the end of the generated rowchains_emu.cpp (gen_rowchains.py). Exit status 1
// on any failure.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace moe {
// The executor's host RoPE tables (rope.cu) are not part of this build: none.
const float *cuda_rope_table(const DevUbatch &, const RopeParams &, int64_t) { return nullptr; }
}  // namespace moe

namespace {

using namespace moe;

struct ChainSpec {
  int64_t n, heads;  // rows [n, heads, T]
  bool rms, mul, out, in_place;
  int n_rot;         // 0: no Rope
  bool neox, yarn;
  bool kv;           // KvStore at the end
};

struct Case {
  const char *name;
  int64_t T;
  DType kv_type;
  std::vector<ChainSpec> chains;
};

size_t kv_row_bytes(DType t, int64_t n) {
  return t == DType::F32 ? static_cast<size_t>(n) * 4 : t == DType::F16 ? static_cast<size_t>(n) * 2 : static_cast<size_t>(n / 32) * 34;
}

TView view3(float *p, int64_t n, int64_t h, int64_t T) {
  return TView{p, {n, h, T, 1}, {4, n * 4, n * h * 4, n * h * T * 4}};
}

struct Buffers {
  std::vector<std::vector<float>> in, out;
  std::vector<std::vector<uint8_t>> kv;
};

// Runs one kernel on fresh copies of the inputs; returns the outputs and caches.
Buffers run(const Case &c, const std::vector<std::vector<float>> &inputs, const std::vector<std::vector<float>> &weights,
            const std::vector<int32_t> &pos, const std::vector<int32_t> &cells, bool warp_kernel) {
  Buffers b;
  b.in = inputs;
  const int64_t T = c.T;
  ChainsArgs a{};
  a.n = static_cast<int>(c.chains.size());
  a.cells = cells.data();
  a.n_cells = static_cast<int>(T + 3);  // the cells main() picks lie in [0, T + 3)
  int64_t total = 0, widest = 1;
  b.out.resize(c.chains.size());
  b.kv.resize(c.chains.size());
  for (size_t k = 0; k < c.chains.size(); ++k) {
    const ChainSpec &s = c.chains[k];
    ChainDesc &d = a.ch[k];
    d.in = view3(b.in[k].data(), s.n, s.heads, T);
    d.rows = s.heads * T;
    d.rms = s.rms ? 1 : 0;
    d.rms_threads = row_threads(s.n);
    d.eps = 1e-6f;
    d.w = s.mul ? weights[k].data() : nullptr;
    if (s.n_rot) {
      RopeParams rp;
      rp.n_rot = s.n_rot;
      rp.neox = s.neox;
      rp.freq_base = 1e6f;
      if (s.yarn) { rp.freq_scale = 0.25f; rp.ext_factor = 1.0f; rp.n_ctx_orig = 4096; }
      d.ra = make_rope_args(rp, DevUbatch{}, T);  // no host table: the angles are computed in the kernel
      d.pos = pos.data();
      d.pos_early = k % 2 == 0;
    }
    if (s.kv) {
      b.kv[k].assign(kv_row_bytes(c.kv_type, s.n * s.heads) * static_cast<size_t>(T + 3), 0xAB);
      d.kv = b.kv[k].data();
      d.kv_rb = kv_row_bytes(c.kv_type, s.n * s.heads);
      d.kv_type = static_cast<int>(c.kv_type);
    }
    if (s.out) {
      if (s.in_place) {
        d.out = d.in;
      } else {
        b.out[k].assign(static_cast<size_t>(s.n * s.heads * T), NAN);
        d.out = view3(b.out[k].data(), s.n, s.heads, T);
      }
    } else {
      d.out.data = nullptr;
    }
    total += d.rows;
    widest = std::max(widest, s.n);
  }
  if (warp_kernel) {
    if (warp_kernel_groups(a, widest) != T) {
      std::printf("%s: the warp kernel does not take this case\n", c.name);
      std::exit(1);
    }
    launch_pdl(row_chains_warp_kernel, dim3(static_cast<unsigned>(T)), dim3(kRcThreads), 0, nullptr, a);
  } else {
    launch_pdl(row_chains_kernel, dim3(static_cast<unsigned>(total)), dim3(static_cast<unsigned>(row_threads(widest))), 0, nullptr, a);
  }
  for (size_t k = 0; k < c.chains.size(); ++k)
    if (c.chains[k].out && c.chains[k].in_place) b.out[k] = b.in[k];
  return b;
}

// RmsNorm -> Mul of one row in float64 (no Rope chains).
double rms_mul_err(const float *x, const float *w, const float *y, int64_t n) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const double sc = 1.0 / std::sqrt(ss / double(n) + 1e-6);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double ref = x[i] * sc * (w ? w[i] : 1.0);
    worst = std::max(worst, std::fabs(ref - y[i]) / (std::fabs(ref) + 1e-3));
  }
  return worst;
}

}  // namespace

int main() {
  const ChainSpec res{300, 1, true, true, true, false, 0, false, false, false};
  auto qk = [](int64_t n, int64_t h, int n_rot, bool neox, bool yarn, bool out, bool kv, bool in_place = false) {
    return ChainSpec{n, h, true, true, out, in_place, n_rot, neox, yarn, kv};
  };
  auto store = [](int64_t n, int64_t h) { return ChainSpec{n, h, false, false, false, false, 0, false, false, true}; };
  auto rope_only = [](int64_t n, int64_t h, int n_rot, bool neox) { return ChainSpec{n, h, false, false, true, false, n_rot, neox, false, true}; };
  const std::vector<Case> cases = {
      {"qwen3moe layer, F32 cache", 9, DType::F32, {res, qk(64, 5, 64, true, false, true, false), qk(64, 2, 64, true, false, false, true), store(64, 2)}},
      {"qwen3moe layer, F16 cache", 8, DType::F16, {qk(128, 3, 128, true, false, true, false), qk(128, 1, 128, true, false, false, true), store(128, 1)}},
      {"Q8_0 cache, partial normal rope, yarn, in place", 11, DType::Q8_0,
       {qk(96, 7, 32, false, true, true, false, true), qk(96, 1, 64, false, true, true, true), store(96, 1)}},
      {"head dim 256, odd heads", 8, DType::F16, {qk(256, 3, 256, true, false, true, true), store(256, 3)}},
      {"rows of 40 (two virtual warps, a partial one)", 10, DType::F32, {qk(40, 3, 24, false, true, true, false), qk(40, 3, 40, true, false, true, true)}},
      {"rows of 300 and 512, norm only", 8, DType::F32, {store(64, 1), ChainSpec{300, 3, true, true, true, false, 0, false, false, false},
                                                      ChainSpec{512, 2, true, false, true, false, 0, false, false, false}}},
      {"rope and store without a norm (gpt-oss)", 12, DType::F16, {rope_only(64, 6, 64, true), ChainSpec{64, 2, false, false, false, false, 64, true, false, true}, store(64, 2)}},
  };
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 1);
  int fails = 0;
  for (const Case &c : cases) {
    std::vector<std::vector<float>> inputs, weights;
    for (const ChainSpec &s : c.chains) {
      std::vector<float> x(static_cast<size_t>(s.n * s.heads * c.T)), w(static_cast<size_t>(s.n));
      for (float &v : x) v = nd(rng) * 3.0f;
      for (float &v : w) v = nd(rng);
      inputs.push_back(x);
      weights.push_back(w);
    }
    std::vector<int32_t> pos(static_cast<size_t>(c.T)), cells(static_cast<size_t>(c.T));
    for (int64_t t = 0; t < c.T; ++t) {
      pos[static_cast<size_t>(t)] = static_cast<int32_t>(3 + 97 * t);
      cells[static_cast<size_t>(t)] = static_cast<int32_t>((t * 5 + 2) % (c.T + 3));
    }
    const Buffers blk = run(c, inputs, weights, pos, cells, false);
    const Buffers wrp = run(c, inputs, weights, pos, cells, true);
    bool ok = true;
    for (size_t k = 0; k < c.chains.size(); ++k) {
      const ChainSpec &s = c.chains[k];
      if (s.out && std::memcmp(blk.out[k].data(), wrp.out[k].data(), blk.out[k].size() * 4) != 0) {
        std::printf("  chain %zu: outputs differ\n", k);
        ok = false;
      }
      if (s.kv && blk.kv[k] != wrp.kv[k]) {
        std::printf("  chain %zu: KV cache bytes differ\n", k);
        ok = false;
      }
      if (s.out && s.rms && !s.n_rot) {
        double worst = 0;
        for (int64_t r = 0; r < s.heads * c.T; ++r)
          worst = std::max(worst, rms_mul_err(inputs[k].data() + r * s.n, s.mul ? weights[k].data() : nullptr, wrp.out[k].data() + r * s.n, s.n));
        if (worst > 1e-5) {
          std::printf("  chain %zu: RmsNorm -> Mul off the float64 reference by %g\n", k, worst);
          ok = false;
        }
      }
    }
    std::printf("%-50s T=%-3lld %s\n", c.name, static_cast<long long>(c.T), ok ? "ok" : "FAIL");
    fails += ok ? 0 : 1;
  }
  std::printf("%d of %zu cases failed\n", fails, cases.size());
  return fails ? 1 : 0;
}
