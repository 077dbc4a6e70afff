// Checks the attention kernels (prefill: tiled f16 mma / f32 fma + combine; decode: the
// grouped kernel with its last-block merge), run through emu.h, against a float64 reference
// on random cache states (see README.md). Args: SEED CASES; exit status 1 on any failure.
#include "backends/cuda/ops/attention.cuh"
#include "backends/cuda/ops/attention_decode.cuh"
#include <cstdarg>
#include "backends/cuda/ops/attention_mla.cuh"
#include <cstdio>
#include <cstdlib>
#include <random>
using namespace moe;

namespace moe {
[[noreturn]] void fail(Status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::abort();
}
}  // namespace moe

static float f16r(float x) { return __half2float(__float2half_rn(x)); }
static uint16_t f16bits(float x) { __half h = __float2half_rn(x); uint16_t b; std::memcpy(&b, &h, 2); return b; }

// mla: K rows of hd = 576, V = their first 512 values (one KV head, F16), attention_mla.cu.
// tc: the tensor-core decode kernel (attention_decode_tc.cu), ranges of >= min_chunk cells.
// span: the grouped decode kernel on a cache in position order (one sequence, cell i at
// position base + i, `holes` free cells in the last 200), so the kernel bounds each token's
// cells by its window (DevUbatch::cell_pos_base); refill: the last token sits in a former hole
// (order broken), two_seq: two sequences interleaved (no order): both fall back to n_kv.
struct Cfg { int kt, hd, group, nkvh, T, n_kv, window; bool sinks; int n_split; bool mma, decode, split_dec, mla, causal = false, tc = false; int min_chunk = 64, max_ranges = 32;
             bool span = false, refill = false, two_seq = false; int base = 0, holes = 0; };

// DevUbatch::cell_pos_base as the executor computes it: B when every used cell c holds c + B.
static int32_t cell_pos_base(const std::vector<int32_t> &cpos, int n_kv) {
  int64_t base = kNoCellPosBase;
  for (int c = 0; c < n_kv; ++c) {
    if (cpos[c] < 0) continue;
    if (base == kNoCellPosBase) base = int64_t(cpos[c]) - c;
    else if (int64_t(cpos[c]) - c != base) return kNoCellPosBase;
  }
  return static_cast<int32_t>(base);
}

namespace moe {  // comb_emu.cpp (generated from attention.cu)
void emu_split_launch(TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *part, int T, int n_head, int merge);
int emu_split_count();
}  // namespace moe

static double run(const Cfg &c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::uniform_real_distribution<float> ud(0, 1);
  const int n_head = c.group * c.nkvh, hd = c.hd, hdv = c.mla ? 512 : hd;
  const int maxpos = c.n_kv / 2 + c.T + 4;
  std::vector<int32_t> cpos(std::max(c.n_kv, 1)), pos(c.T), seq(c.T);
  std::vector<unsigned long long> cseq(std::max(c.n_kv, 1));
  for (int i = 0; i < c.n_kv; ++i) {
    if (ud(rng) < 0.15f) { cpos[i] = -1; cseq[i] = 0; continue; }
    cpos[i] = static_cast<int>(ud(rng) * maxpos);
    const float r = ud(rng);
    cseq[i] = r < 0.45f ? 1ull : r < 0.9f ? 2ull : 3ull;
  }
  for (int t = 0; t < c.T; ++t) { seq[t] = ud(rng) < 0.5f ? 0 : 1; pos[t] = static_cast<int>(ud(rng) * maxpos); }
  if (c.causal) {  // one sequence, cell i at position i, the batch the last T positions: whole tiles every row sees
    for (int i = 0; i < c.n_kv; ++i) { cpos[i] = i; cseq[i] = 1ull; }
    for (int t = 0; t < c.T; ++t) { seq[t] = 0; pos[t] = c.n_kv - c.T + t; }
  }
  if (c.span) {  // the tokens hold the last T cells (positions base + n_kv - T ...)
    for (int i = 0; i < c.n_kv; ++i) {
      cpos[i] = c.two_seq ? c.base + i / 2 : c.base + i;
      cseq[i] = c.two_seq ? 1ull << (i % 2) : 1ull;
    }
    for (int t = 0; t < c.T; ++t) {
      const int cell = c.n_kv - c.T + t;
      seq[t] = c.two_seq ? cell % 2 : 0;
      pos[t] = cpos[cell];
    }
    const int older = c.n_kv - c.T;  // cells before the batch's
    for (int h = 0; h < c.holes && older > 0; ++h) {
      const int cell = older - 1 - static_cast<int>(rng() % std::min(200, older));
      cpos[cell] = -1;
      cseq[cell] = 0;
    }
    if (c.refill && older > 0) {  // the last token moves into an older cell
      const int cell = static_cast<int>(rng() % older);
      cpos[cell] = pos[c.T - 1];
      cseq[cell] = cseq[c.n_kv - 1];
      cpos[c.n_kv - 1] = -1;
      cseq[c.n_kv - 1] = 0;
    }
  }
  const size_t khb = c.kt == (int)DType::F32 ? hd * 4 : c.kt == (int)DType::F16 ? hd * 2 : hd / 32 * 34;
  const size_t krb = khb * c.nkvh;
  std::vector<uint8_t> K(krb * std::max(c.n_kv, 1)), V(K.size());
  std::vector<float> Kd(static_cast<size_t>(std::max(c.n_kv, 1)) * c.nkvh * hd), Vd(Kd.size());  // dequantized
  for (int pass = 0; pass < 2; ++pass) {
    auto &B = pass ? V : K;
    auto &D = pass ? Vd : Kd;
    for (int cell = 0; cell < c.n_kv; ++cell)
      for (int h = 0; h < c.nkvh; ++h) {
        uint8_t *row = B.data() + cell * krb + h * khb;
        float *drow = D.data() + (static_cast<size_t>(cell) * c.nkvh + h) * hd;
        const bool freec = cpos[cell] < 0;
        if (c.kt == (int)DType::F32) {
          for (int d = 0; d < hd; ++d) { float v = freec ? NAN : nd(rng); std::memcpy(row + 4 * d, &v, 4); drow[d] = v; }
        } else if (c.kt == (int)DType::F16) {
          for (int d = 0; d < hd; ++d) { uint16_t b = freec ? 0x7e00 : f16bits(nd(rng)); std::memcpy(row + 2 * d, &b, 2); __half hh; std::memcpy(&hh, &b, 2); drow[d] = __half2float(hh); }
        } else {
          for (int b = 0; b < hd / 32; ++b) {
            uint8_t *blk = row + b * 34;
            const float dsc = 0.01f + 0.03f * ud(rng);
            uint16_t db = freec ? 0x7e00 : f16bits(dsc);
            std::memcpy(blk, &db, 2);
            __half hh; std::memcpy(&hh, &db, 2);
            for (int l = 0; l < 32; ++l) {
              int8_t qv = static_cast<int8_t>(static_cast<int>(ud(rng) * 254) - 127);
              blk[2 + l] = static_cast<uint8_t>(qv);
              drow[b * 32 + l] = qv * __half2float(hh);
            }
          }
        }
      }
  }
  std::vector<float> q(static_cast<size_t>(c.T) * n_head * hd), sinks(n_head);
  std::vector<float> out(static_cast<size_t>(c.T) * n_head * hdv, -7.0f), ref(out.size());
  for (auto &x : q) x = nd(rng);
  for (int h = 0; h < n_head; ++h) sinks[h] = h % 5 == 3 ? 20.0f : ud(rng) * 5 - 2;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // reference
  for (int t = 0; t < c.T; ++t)
    for (int h = 0; h < n_head; ++h) {
      const int hk = h / c.group;
      std::vector<float> qr(hd);
      const float *qrow = q.data() + (static_cast<size_t>(t) * n_head + h) * hd;
      for (int b = 0; b < hd / 32; ++b) {
        float amax = 0;
        for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(qrow[b * 32 + l]));
        const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        for (int l = 0; l < 32; ++l) {
          const float v = qrow[b * 32 + l];
          qr[b * 32 + l] = c.kt == (int)DType::F32 ? v : c.kt == (int)DType::F16 ? f16r(v) : std::round(v * id) * f16r(dd);
        }
      }
      std::vector<double> s;
      std::vector<int> cs;
      for (int cell = 0; cell < c.n_kv; ++cell) {
        const int cp = cpos[cell];
        const bool vis = cp >= 0 && (cseq[cell] & (1ull << seq[t])) && cp <= pos[t] && (c.window <= 0 || pos[t] - cp < c.window);
        if (!vis) continue;
        double acc = 0;
        const float *kr = Kd.data() + (static_cast<size_t>(cell) * c.nkvh + hk) * hd;
        for (int d = 0; d < hd; ++d) acc += double(qr[d]) * kr[d];
        s.push_back(acc * scale);
        cs.push_back(cell);
      }
      double m = -INFINITY;
      for (double x : s) m = std::max(m, x);
      if (c.sinks) m = std::max(m, double(sinks[h]));
      double den = c.sinks ? std::exp(sinks[h] - m) : 0.0;
      for (double x : s) den += std::exp(x - m);
      float *o = ref.data() + (static_cast<size_t>(t) * n_head + h) * hdv;
      const auto &Vr = c.mla ? Kd : Vd;  // MLA: V is the leading part of the K row
      for (int d = 0; d < hdv; ++d) {
        double v = 0;
        for (size_t i = 0; i < s.size(); ++i) v += std::exp(s[i] - m) * Vr[(static_cast<size_t>(cs[i]) * c.nkvh + hk) * hd + d];
        o[d] = den > 0 ? static_cast<float>(v / den) : 0.0f;
      }
    }
  // emulated kernels
  AttnArgs a{K.data(), c.mla ? K.data() : V.data(), krb, krb, khb, khb, hd, hdv, c.group, c.kt, scale, c.window, c.sinks ? sinks.data() : nullptr};
  int32_t n_kv = c.n_kv;
  DevUbatch ub{nullptr, pos.data(), seq.data(), cpos.data(), cseq.data(), &n_kv};
  int32_t pos_base = cell_pos_base(cpos, c.n_kv);
  if (c.span) ub.cell_pos_base = &pos_base;
  if (c.span && (c.refill || c.two_seq) == (pos_base != kNoCellPosBase)) return 1e30;  // the case is not what it says
  TView tq{q.data(), {hd, n_head, c.T, 1}, {4, hd * 4, (int64_t)n_head * hd * 4, (int64_t)c.T * n_head * hd * 4}};
  TView to{out.data(), {hdv, n_head, c.T, 1}, {4, hdv * 4, (int64_t)n_head * hdv * 4, (int64_t)c.T * n_head * hdv * 4}};
  if (c.mla) {  // n_sm chosen so that the launcher picks c.n_split splits
    std::vector<float> part(static_cast<size_t>(c.T) * n_head * c.n_split * (hdv + 2), NAN);
    const int blocks = (c.T * c.group + 63) / 64;
    const int split_cells = 64 << (c.n_kv % 3);  // GpuTuning::mla_split_cells 64 / 128 / 256
    if (!attn_mla_launch(LaunchStream{}, tq, to, a, ub, c.T, 1, true, part.data(), part.size() * 4, blocks * c.n_split, split_cells)) return 1e30;
  } else if (c.split_dec) {  // the generic decode split kernel, merged by its last blocks (n_split = 1) or by a combine launch
    std::vector<unsigned> sync(kCudaSyncSlots, 0);
    ub.sync = sync.data();
    std::vector<float> part(static_cast<size_t>(c.T) * n_head * emu_split_count() * (hd + 2), NAN);
    for (int rep = 0; rep < 2; ++rep) {
      emu_split_launch(tq, to, a, ub, part.data(), c.T, n_head, c.n_split == 1 ? 1 : 0);
      for (unsigned v : sync)
        if (v != 0) return 1e30;
    }
  } else if (c.decode) {  // twice: the last-block counters must be back at zero after each launch
    std::vector<unsigned> sync(kCudaSyncSlots, 0);
    ub.sync = c.n_split == 1 ? sync.data() : nullptr;  // no counters: partials, then attn_combine_kernel
    std::vector<float> part(attn_decode_work_size(c.T, n_head, hd) / 4, NAN);
    for (int rep = 0; rep < 2; ++rep) {
      GpuTuning tuning;
      tuning.decode_min_chunk = c.min_chunk;
      tuning.decode_max_ranges = c.max_ranges;
      if (c.tc) attn_decode_tc_launch(LaunchStream{}, tq, to, a, ub, part.data(), tuning);
      else attn_decode_launch(LaunchStream{}, tq, to, a, ub, part.data(), tuning);
      for (unsigned v : sync)
        if (v != 0) return 1e30;
    }
  } else {
    std::vector<float> part(static_cast<size_t>(c.T) * n_head * c.n_split * (hd + 2), NAN);
    AttnTiledLaunch l{tq, to, a, ub, c.T, c.nkvh, c.n_split, part.data(), nullptr};
    if (c.mma) attn_tiled_mma_launch(l);
    else attn_tiled_fma_launch(l);
    if (c.n_split > 1) attn_combine_launch(to, a, part.data(), c.T, n_head, c.n_split, LaunchStream{});
  }
  double worst = 0;
  for (size_t r = 0; r < out.size(); r += hdv) {
    double num = 0, den = 0;
    for (int d = 0; d < hdv; ++d) {
      if (!std::isfinite(out[r + d])) return 1e30;
      num += (double(out[r + d]) - ref[r + d]) * (double(out[r + d]) - ref[r + d]);
      den += double(ref[r + d]) * ref[r + d];
    }
    const double e = den > 1e-30 ? std::sqrt(num / den) : std::sqrt(num);
    worst = std::max(worst, e);
  }
  return worst;
}

int main(int argc, char **argv) {
  std::mt19937 rng(argc > 1 ? atoi(argv[1]) : 1);
  const int n = argc > 2 ? atoi(argv[2]) : 20;
  const bool mla_only = argc > 3 && std::strcmp(argv[3], "mla") == 0;
  const bool dec_only = argc > 3 && std::strcmp(argv[3], "dec") == 0;
  const bool mma_only = argc > 3 && std::strcmp(argv[3], "mma") == 0;  // the tiled tensor-core kernel, half the cases causal
  const bool tc_only = argc > 3 && std::strcmp(argv[3], "tcdec") == 0;  // the tensor-core decode kernel (F16 cache)
  const bool span_only = argc > 3 && std::strcmp(argv[3], "span") == 0;  // the grouped decode kernel bounded by the span
  int fails = 0;
  const int kts[] = {(int)DType::F32, (int)DType::F16, (int)DType::Q8_0};
  for (int i = 0; i < n; ++i) {
    Cfg c;
    c.mla = !dec_only && (mla_only || i % 5 == 4);
    c.mma = c.mla || i % 4 == 0;
    c.decode = dec_only || (!c.mla && i % 4 == 2);
    c.split_dec = !c.mla && !dec_only && i % 4 == 3;
    if (dec_only) c.mma = false;
    if (mma_only) c.mla = c.decode = c.split_dec = false, c.mma = true;
    c.kt = c.mma ? (int)DType::F16 : kts[rng() % 3];
    c.hd = c.mla ? 576 : rng() % 2 ? 64 : 128;
    if (c.mma && !c.mla && rng() % 3 == 0) c.hd = 256;  // Qwen3-Next / Qwen3.5: output dims over two blocks
    const int gs[] = {1, 4, 8}, mla_gs[] = {1, 3, 20};
    c.group = c.mla ? mla_gs[rng() % 3] : gs[rng() % 3];
    c.nkvh = c.mla ? 1 : 1 + rng() % 2;
    const int Ts[] = {8, 9, 33, 70};
    c.T = Ts[rng() % 4];
    const int nks[] = {0, 1, 37, 64, 130, 201};
    c.n_kv = nks[rng() % 6];
    if (c.mla && rng() % 3 == 0) c.T = 1 + rng() % 4;  // decode
    if (c.mla && c.group == 20) c.T = std::min(c.T, 9);  // 256 emulated threads per block: keep it short
    c.window = rng() % 3 == 0 ? 17 : 0;
    c.sinks = rng() % 3 == 0;
    const int sp[] = {1, 1, 3, 16};
    c.n_split = sp[rng() % 4];
    if (c.decode) {  // the grouped decode kernel: its head sizes, groups over 8 heads, deep caches
      // n_kv around the range boundaries of ranges >= 16 / 32 (default) / 64 cells, at most 32
      // (default) or 64: one range up to the minimum, minimum-sized ranges up to the most, then
      // longer ones (8257 in 64: 130 cells, 33 per warp, a second mask window).
      const int hds[] = {64, 128, 256}, dgs[] = {1, 4, 8, 12}, chunks[] = {16, 32, 64},
                dnks[] = {0, 1, 31, 32, 33, 37, 63, 64, 65, 128, 129, 130, 201, 513, 530, 1025, 2049, 2500, 4097, 4100, 8257};
      c.hd = hds[rng() % 3];
      c.group = dgs[rng() % 4];
      c.T = 1 + static_cast<int>(rng() % 4);
      c.n_kv = dnks[rng() % 21];
      c.n_split = rng() % 4 == 0 ? 2 : 1;  // 2: merged by a combine launch
      c.min_chunk = chunks[rng() % 3];
      c.max_ranges = rng() % 2 ? 64 : 32;
    }
    if (c.split_dec) {  // any head size; n_split 1: merged in the launch, 2: by attn_combine_kernel
      c.hd = 32 * (1 + static_cast<int>(rng() % 5));
      c.T = 1 + static_cast<int>(rng() % 4);
      c.n_split = 1 + static_cast<int>(rng() % 2);
    }
    if (c.mma && !c.mla && i % (mma_only ? 2 : 8) == 0) {  // a causal prompt after a cached prefix (the prefill case)
      c.causal = true;
      c.n_kv = std::max(c.n_kv, 130) + c.T;
      c.window = (i / 2) % 2 ? 70 : 0;  // 70: whole tiles outside the window, tiles inside it
    }
    if (tc_only) {  // every row tile shape (groups over 16 rows, tokens across tiles), ranges down to 16 cells
      const int dgs[] = {1, 4, 8, 12, 16}, dnks[] = {0, 1, 37, 63, 64, 65, 130, 513, 2500, 4097};
      c.mla = c.mma = c.split_dec = false;
      c.decode = c.tc = true;
      c.kt = (int)DType::F16;
      c.hd = rng() % 2 ? 128 : 256;
      c.group = dgs[rng() % 5];
      c.T = 1 + static_cast<int>(rng() % 4);
      c.n_kv = dnks[rng() % 10];
      c.n_split = rng() % 4 == 0 ? 2 : 1;  // 2: merged by a combine launch
      c.min_chunk = rng() % 3 == 0 ? 16 : 64;
      c.causal = i % 4 == 1;  // one sequence, every cell seen (no hidden cells: whole tiles of data)
    }
    if (span_only) {  // gpt-oss's shape (head dim 64, 8 heads per KV head, window 128, sinks) at the test depths
      const int dnks[] = {1, 127, 128, 129, 600, 4097};
      c = Cfg{};
      c.span = c.decode = true;
      c.kt = kts[rng() % 3];
      c.hd = i % 7 == 6 ? 128 : 64;
      c.group = 8;
      c.nkvh = 1 + static_cast<int>(rng() % 2);
      c.T = 1 + (i / 6) % 2;
      c.n_kv = std::max(dnks[i % 6], c.T);
      c.window = i % 5 == 4 ? 5000 : 128;  // 5000: wider than the context
      c.sinks = true;
      c.n_split = rng() % 4 == 0 ? 2 : 1;  // 2: merged by a combine launch
      c.min_chunk = rng() % 3 == 0 ? 16 : 64;
      c.base = rng() % 2 ? 1000 : 0;
      c.holes = static_cast<int>(rng() % 4);
      const int kind = static_cast<int>(rng() % 4);  // 0, 1: in order; 2: refilled hole; 3: two sequences
      c.refill = kind == 2 && c.n_kv > c.T;
      c.two_seq = kind == 3 && c.n_kv > 2;
    }
    const double e = run(c, rng());
    const double tol = c.mma || c.tc ? 3e-3 : c.decode || c.split_dec ? 2e-5 : 1e-5;
    const bool ok = e < tol;
    fails += !ok;
    std::printf("%s %s%s kt=%d hd=%d group=%d nkvh=%d T=%d n_kv=%d window=%d sinks=%d split=%d chunk=%d worst_row_err=%.3g", ok ? "ok  " : "FAIL",
                c.mla ? "mla" : c.mma ? "mma" : c.tc ? "tcdec" : c.span ? "span" : c.decode ? "dec" : c.split_dec ? "spl" : "fma", c.causal ? " causal" : "", c.kt, c.hd, c.group, c.nkvh, c.T, c.n_kv, c.window, c.sinks, c.n_split, c.min_chunk, e);
    if (c.decode && !c.span) std::printf(" ranges<=%d", c.max_ranges);
    if (c.span) std::printf(" base=%d holes=%d%s%s", c.base, c.holes, c.refill ? " refilled" : "", c.two_seq ? " two-seq" : "");
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("%d failures\n", fails);
  return fails != 0;
}
