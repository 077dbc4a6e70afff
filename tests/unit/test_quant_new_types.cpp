// Q4_1, Q5_0, Q5_1 and the i-quants: dequantization (and, where we reproduce the reference
// quantizer, quantization) against numbers the reference engine produced
// (tests/data/quant_reference/, README.md there says how), and the CPU dot kernels on every
// ISA this machine runs against a float64 reference and against the scalar kernels.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/kernels/vec_dot.h"
#include "backends/cpu/kernels/vec_dot_impl.h"
#include "core/fp16.h"
#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "quant/dtype.h"
#include "support/reference_qwen3moe.h"
#include "support/tiny_model.h"

using namespace moe;

namespace {

struct NewType {
  DType type;
  int blocks;               // generated blocks in the reference file
  std::vector<int> halves;  // byte offsets of the f16 scale fields, made finite
  bool ref_quantizer;       // our quantizer reproduces the reference's bytes
};

const NewType kNewTypes[] = {
    {DType::Q4_1, 16, {0, 2}, true}, {DType::Q5_0, 16, {0}, true},   {DType::Q5_1, 16, {0, 2}, true},
    {DType::IQ4_NL, 16, {0}, true},  {DType::IQ4_XS, 4, {0}, true},  {DType::IQ3_S, 4, {0}, false},
    {DType::IQ3_XXS, 4, {0}, false}, {DType::IQ2_XXS, 4, {0}, false}, {DType::IQ2_XS, 4, {0}, false},
    {DType::IQ2_S, 4, {0}, false},   {DType::IQ1_S, 4, {0}, false},  {DType::IQ1_M, 4, {}, false},
};

// splitmix64: the generator the reference numbers were made with.
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Random sign and mantissa, exponent field 9..16: |h| in [2^-6, 4).
  uint16_t finite_half() {
    const uint16_t h = static_cast<uint16_t>(next() & 0x83FF);
    return static_cast<uint16_t>(h | ((9 + next() % 8) << 10));
  }
};

// nblocks blocks of random bytes (every code, index and sign bit) with finite f16 scales.
std::vector<uint8_t> random_blocks(const NewType &t, int nblocks, uint64_t seed) {
  const size_t bytes = type_traits(t.type).type_size;
  std::vector<uint8_t> data(bytes * static_cast<size_t>(nblocks));
  SplitMix rng{seed};
  for (int b = 0; b < nblocks; ++b) {
    uint8_t *p = data.data() + b * bytes;
    for (size_t k = 0; k < bytes; ++k) p[k] = static_cast<uint8_t>(rng.next() & 0xFF);
    for (int off : t.halves) {
      const uint16_t h = rng.finite_half();
      std::memcpy(p + off, &h, 2);
    }
    if (t.type == DType::IQ1_M) {  // its f16 scale: top nibbles of the four scale words
      const uint16_t h = rng.finite_half();
      uint16_t sc[4];
      std::memcpy(sc, p + 48, 8);
      for (int k = 0; k < 4; ++k) sc[k] = static_cast<uint16_t>((sc[k] & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12));
      std::memcpy(p + 48, sc, 8);
    }
  }
  return data;
}

// The blocks the reference numbers were made from.
std::vector<uint8_t> generated_blocks(const NewType &t) {
  return random_blocks(t, t.blocks, 0x5eed0000ULL + static_cast<uint32_t>(t.type));
}

// Quantizer input: values in [-1, 1), every 7th 32-group zero, another 1/64 scaled.
std::vector<float> generated_values(DType t, int n) {
  SplitMix rng{0xF10A7000ULL + static_cast<uint32_t>(t)};
  std::vector<float> x(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    float v = static_cast<float>(static_cast<int32_t>(rng.next() >> 32)) * (1.0f / 2147483648.0f);
    if ((i / 32) % 7 == 3) v = 0.0f;
    if ((i / 32) % 7 == 5) v *= 1.0f / 64;
    x[static_cast<size_t>(i)] = v;
  }
  return x;
}

struct Reference {
  std::vector<uint32_t> dequant;  // float bits
  std::vector<uint8_t> quantized;
};

Reference read_reference(DType t) {
  const std::string path = std::string(MOEINFER_SOURCE_DIR) + "/tests/data/quant_reference/" + dtype_name(t) + ".txt";
  std::ifstream in(path);
  REQUIRE(in.good());
  Reference r;
  std::string line, key;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream head(line);
    size_t count = 0;
    head >> key >> count;
    for (size_t i = 0; i < count; ++i) {
      unsigned long v = 0;
      in >> std::hex >> v >> std::dec;
      if (key == "dequant") r.dequant.push_back(static_cast<uint32_t>(v));
      else r.quantized.push_back(static_cast<uint8_t>(v));
    }
    std::getline(in, line);  // rest of the last data line
  }
  return r;
}

std::vector<CpuIsa> available_isas() {
  std::vector<CpuIsa> v{CpuIsa::Scalar};
  const CpuIsa best = detect_cpu_isa();
  if (best == CpuIsa::Avx512) v.push_back(CpuIsa::Avx2);
  if (best != CpuIsa::Scalar) v.push_back(best);
  return v;
}

struct IsaGuard {
  CpuIsa saved = active_cpu_isa();
  ~IsaGuard() { set_cpu_isa(saved); }
};

// The Q8_1 activation carries s = f16(d * sum(qs)); the weight's min multiplies s, not the
// exact sum, so the float64 reference over dequantized values differs by m * (s - d*sum).
double q8_1_sum_rounding(DType wt, const uint8_t *w, const uint8_t *xq, int n) {
  if (wt != DType::Q4_1 && wt != DType::Q5_1) return 0;
  const size_t wbytes = type_traits(wt).type_size;
  double err = 0;
  for (int b = 0; b < n / 32; ++b) {
    uint16_t m;
    std::memcpy(&m, w + b * wbytes + 2, 2);
    BlockQ8_1 a;
    std::memcpy(&a, xq + b * sizeof(BlockQ8_1), sizeof a);
    double sum = 0;
    for (int8_t q : a.qs) sum += q;
    err += std::fabs(static_cast<double>(fp16_to_fp32(m)) *
                     (static_cast<double>(fp16_to_fp32(a.s)) - static_cast<double>(fp16_to_fp32(a.d)) * sum));
  }
  return err;
}

// Dot of weight bytes w (n values) with activations x on every ISA against float64.
void check_dot(DType wt, const std::vector<uint8_t> &w, const std::vector<float> &x, int n) {
  const DType at = type_traits(wt).vec_dot_type;
  std::vector<uint8_t> xq(row_size(at, n));
  quantize_row(at, x.data(), xq.data(), n);
  std::vector<float> wd(static_cast<size_t>(n)), xd(static_cast<size_t>(n));
  dequantize_row(wt, w.data(), wd.data(), n);
  dequantize_row(at, xq.data(), xd.data(), n);
  double ref = 0, abs_sum = 0;
  for (int i = 0; i < n; ++i) {
    ref += static_cast<double>(wd[i]) * xd[i];
    abs_sum += std::fabs(static_cast<double>(wd[i]) * xd[i]);
  }
  const double tol = 1e-6 + 4e-7 * std::sqrt(n) * abs_sum + 1e-7 * abs_sum +
                     q8_1_sum_rounding(wt, w.data(), xq.data(), n) * 1.01;
  for (CpuIsa isa : available_isas()) {
    set_cpu_isa(isa);
    const CpuTypeKernels &k = cpu_type_kernels(wt);
    REQUIRE(k.vec_dot != nullptr);
    std::vector<uint8_t> xq2(xq.size(), 0xCD);
    k.from_float(x.data(), xq2.data(), n);
    CHECK(std::memcmp(xq2.data(), xq.data(), xq.size()) == 0);
    float s = -12345.0f;
    k.vec_dot(n, &s, w.data(), xq.data());
    INFO(cpu_isa_name(isa) << " " << dtype_name(wt) << " n=" << n << " ref=" << ref << " got=" << s);
    CHECK(std::fabs(s - ref) <= tol);
  }
}

}  // namespace

TEST_CASE("new weight types: table entries follow the GGUF ids and block layouts", "[quant][newtypes]") {
  struct Row { DType t; uint32_t id; int64_t block; size_t bytes; DType act; };
  for (const Row &r : {Row{DType::Q4_1, 3, 32, 20, DType::Q8_1}, Row{DType::Q5_0, 6, 32, 22, DType::Q8_0},
                       Row{DType::Q5_1, 7, 32, 24, DType::Q8_1}, Row{DType::IQ4_NL, 20, 32, 18, DType::Q8_0},
                       Row{DType::IQ4_XS, 23, 256, 136, DType::Q8_K}, Row{DType::IQ2_XXS, 16, 256, 66, DType::Q8_K},
                       Row{DType::IQ2_XS, 17, 256, 74, DType::Q8_K}, Row{DType::IQ3_XXS, 18, 256, 98, DType::Q8_K},
                       Row{DType::IQ1_S, 19, 256, 50, DType::Q8_K}, Row{DType::IQ3_S, 21, 256, 110, DType::Q8_K},
                       Row{DType::IQ2_S, 22, 256, 82, DType::Q8_K}, Row{DType::IQ1_M, 29, 256, 56, DType::Q8_K}}) {
    const TypeTraits &tr = type_traits(r.t);
    INFO(tr.name);
    CHECK(static_cast<uint32_t>(r.t) == r.id);
    CHECK(tr.block_size == r.block);
    CHECK(tr.type_size == r.bytes);
    CHECK(tr.supported);
    CHECK(tr.vec_dot_type == r.act);
    DType back = DType::F32;
    REQUIRE(dtype_from_name(tr.name, &back));
    CHECK(back == r.t);
  }
}

TEST_CASE("new weight types: dequantization is bit-identical to the reference engine", "[quant][newtypes]") {
  for (const NewType &t : kNewTypes) {
    INFO(dtype_name(t.type));
    const Reference ref = read_reference(t.type);
    const int n = t.blocks * static_cast<int>(type_traits(t.type).block_size);
    REQUIRE(ref.dequant.size() == static_cast<size_t>(n));
    const std::vector<uint8_t> blocks = generated_blocks(t);
    std::vector<float> y(static_cast<size_t>(n));
    dequantize_row(t.type, blocks.data(), y.data(), n);
    int mismatches = 0;
    for (int i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &y[static_cast<size_t>(i)], 4);
      if (bits != ref.dequant[static_cast<size_t>(i)]) ++mismatches;
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("new weight types: quantization writes the reference engine's bytes", "[quant][newtypes]") {
  const int n = 2048;
  for (const NewType &t : kNewTypes) {
    if (!t.ref_quantizer) continue;
    INFO(dtype_name(t.type));
    const Reference ref = read_reference(t.type);
    REQUIRE(ref.quantized.size() == row_size(t.type, n));
    const std::vector<float> x = generated_values(t.type, n);
    std::vector<uint8_t> q(row_size(t.type, n), 0xCD);
    quantize_row(t.type, x.data(), q.data(), n);
    CHECK(std::memcmp(q.data(), ref.quantized.data(), q.size()) == 0);
  }
}

TEST_CASE("new weight types: dot products match a float64 reference on every ISA", "[quant][newtypes][cpu]") {
  IsaGuard guard;
  std::mt19937 rng(2024);
  std::normal_distribution<float> nd(0, 1);
  for (const NewType &t : kNewTypes) {
    // Generated blocks: every code and both signs of every scale field.
    const std::vector<uint8_t> blocks = generated_blocks(t);
    const int nb = t.blocks * static_cast<int>(type_traits(t.type).block_size);
    std::vector<float> x(static_cast<size_t>(nb));
    for (auto &v : x) v = nd(rng);
    check_dot(t.type, blocks, x, nb);
    // Quantized rows of several lengths, biased (mins matter) and with outliers.
    for (int nblk : {1, 3, 8}) {
      const int n = nblk * 256;
      std::vector<float> w(static_cast<size_t>(n)), a(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        w[static_cast<size_t>(i)] = nd(rng) + (nblk == 3 ? 0.4f : 0.0f);
        a[static_cast<size_t>(i)] = (i % 97 == 0 ? 30.0f : 1.0f) * nd(rng);
      }
      std::vector<uint8_t> q(row_size(t.type, n));
      quantize_row(t.type, w.data(), q.data(), n);
      check_dot(t.type, q, a, n);
    }
  }
}

namespace {

// One ISA's kernel table for the new types, read from its own file (not through dispatch).
struct IsaTable {
  CpuIsa isa;
  VecDotFn (*kernel)(DType);
  const char *needs;
};

bool cpu_runs(CpuIsa isa) {
  const CpuIsa best = detect_cpu_isa();
  switch (isa) {
    case CpuIsa::Avx2: return best == CpuIsa::Avx2 || best == CpuIsa::Avx512;
    case CpuIsa::Avx512: return best == CpuIsa::Avx512;
    case CpuIsa::Neon: return best == CpuIsa::Neon;
    default: return true;
  }
}

}  // namespace

TEST_CASE("new weight types: each ISA's kernels, called directly, agree with scalar on random blocks", "[quant][newtypes][cpu][isa]") {
  IsaGuard guard;
  const IsaTable tables[] = {{CpuIsa::Avx2, vec_dot_extra_kernel_avx2, "an x86-64 build and AVX2/FMA/F16C/BMI2"},
                             {CpuIsa::Avx512, vec_dot_extra_kernel_avx512, "an x86-64 build and AVX-512 F/BW/VL/DQ + VNNI"},
                             {CpuIsa::Neon, vec_dot_extra_kernel_neon, "an AArch64 build"}};
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0, 1);
  for (const IsaTable &table : tables) {
    const char *isa = cpu_isa_name(table.isa);
    if (!cpu_runs(table.isa)) {
      WARN(isa << " dot kernels for the new types not run: they need " << table.needs);
      continue;
    }
    set_cpu_isa(table.isa);
    REQUIRE(active_cpu_isa() == table.isa);
    for (const NewType &t : kNewTypes) {
      const VecDotFn got_fn = table.kernel(t.type), want_fn = vec_dot_extra_kernel_scalar(t.type);
      INFO(isa << " " << dtype_name(t.type));
      REQUIRE(got_fn != nullptr);
      CHECK(cpu_type_kernels(t.type).vec_dot == got_fn);  // and dispatch hands out this kernel
      const int bs = static_cast<int>(type_traits(t.type).block_size);
      const DType at = type_traits(t.type).vec_dot_type;
      // The 1-3 bit i-quants share iq_dot's float steps over exact integer sums: same bits.
      const bool exact = bs == QK_K && t.type != DType::IQ4_XS;
      for (int nblk : {1, 2, 3, 5, 8, 33}) {
        const int n = nblk * bs;
        const std::vector<uint8_t> w = random_blocks(t, nblk, 0xB10C0000ULL + 131 * static_cast<uint64_t>(t.type) + nblk);
        std::vector<float> x(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = (i % 61 == 0 ? 20.0f : 1.0f) * nd(rng);
        std::vector<uint8_t> xq(row_size(at, n));
        quantize_row(at, x.data(), xq.data(), n);
        float want = -1.0f, got = -2.0f;
        want_fn(n, &want, w.data(), xq.data());
        got_fn(n, &got, w.data(), xq.data());
        // Otherwise both are float sums of the same exact block integers in different orders.
        std::vector<float> wd(static_cast<size_t>(n)), xd(static_cast<size_t>(n));
        dequantize_row(t.type, w.data(), wd.data(), n);
        dequantize_row(at, xq.data(), xd.data(), n);
        double abs_sum = 0;
        for (int i = 0; i < n; ++i) abs_sum += std::fabs(static_cast<double>(wd[static_cast<size_t>(i)]) * xd[static_cast<size_t>(i)]);
        const double tol = 2 * (1e-6 + 4e-7 * std::sqrt(n) * abs_sum + 1e-7 * abs_sum);
        INFO("n=" << n << " scalar=" << want << " got=" << got << " tol=" << tol);
        if (exact) CHECK(std::memcmp(&got, &want, 4) == 0);
        else CHECK(std::fabs(static_cast<double>(got) - want) <= tol);
      }
    }
  }
}

TEST_CASE("new weight types: all-zero weights give exactly zero on every ISA", "[quant][newtypes][cpu]") {
  IsaGuard guard;
  const int n = 512;
  std::vector<float> zero(n, 0.0f), x(n);
  for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = std::sin(0.1f * i);
  for (const NewType &t : kNewTypes) {
    std::vector<uint8_t> w(row_size(t.type, n)), xq(row_size(type_traits(t.type).vec_dot_type, n));
    quantize_row(t.type, zero.data(), w.data(), n);
    quantize_row(type_traits(t.type).vec_dot_type, x.data(), xq.data(), n);
    for (CpuIsa isa : available_isas()) {
      set_cpu_isa(isa);
      float s = 1.0f;
      cpu_type_kernels(t.type).vec_dot(n, &s, w.data(), xq.data());
      INFO(cpu_isa_name(isa) << " " << dtype_name(t.type));
      CHECK(s == 0.0f);
    }
  }
}

TEST_CASE("new weight types: the simple i-quant quantizer writes blocks that decode close to the input", "[quant][newtypes]") {
  // Relative RMS error bounds for Gaussian data with this quantizer (no importance matrix):
  // about 1.5x what it reaches, far below the 1.0 of an all-zero or garbled block.
  struct Bound { DType t; double max_rel_rms; };
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0, 1);
  const int n = 1024;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto &v : x) v = nd(rng);
  for (int i = 256; i < 512; ++i) x[static_cast<size_t>(i)] = 0;  // one all-zero super-block
  for (const Bound &b : {Bound{DType::IQ3_S, 0.21}, Bound{DType::IQ3_XXS, 0.3}, Bound{DType::IQ2_S, 0.39},
                         Bound{DType::IQ2_XS, 0.46}, Bound{DType::IQ2_XXS, 0.54}, Bound{DType::IQ1_M, 0.75},
                         Bound{DType::IQ1_S, 0.97}}) {
    INFO(dtype_name(b.t));
    std::vector<uint8_t> q(row_size(b.t, n));
    quantize_row(b.t, x.data(), q.data(), n);
    std::vector<float> y(static_cast<size_t>(n));
    dequantize_row(b.t, q.data(), y.data(), n);
    double err = 0, ref = 0;
    for (int i = 0; i < n; ++i) {
      err += (static_cast<double>(x[static_cast<size_t>(i)]) - y[static_cast<size_t>(i)]) *
             (static_cast<double>(x[static_cast<size_t>(i)]) - y[static_cast<size_t>(i)]);
      ref += static_cast<double>(x[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
    }
    CHECK(std::sqrt(err / ref) < b.max_rel_rms);
    for (int i = 256; i < 512; ++i) CHECK(y[static_cast<size_t>(i)] == 0.0f);
  }
}

namespace {

// Loads the model at path, runs a short prompt on the CPU and compares the last logits with
// the float64 forward over the same dequantized weights (unquantized activations: the only
// difference is the Q8 activation rounding the kernels apply).
void check_model_on_cpu(const std::string &path, DType type) {
  const std::vector<int32_t> ids = {5, 77, 300, 12, 9};
  auto f = GgufFile::open(path);
  bool saw_type = false;  // the mix's own type is really in the file, not only fallbacks
  for (const auto &t : f->tensors()) saw_type |= t.type == type;
  CHECK(saw_type);
  auto model = Model::load(path, {});
  ContextParams cp;
  cp.n_ctx = 16;
  cp.device = "cpu";
  cp.n_threads = 2;
  auto ctx = Context::create(*model, cp);
  std::vector<BatchToken> batch;
  for (size_t i = 0; i < ids.size(); ++i) batch.push_back({ids[i], static_cast<int32_t>(i), 0, i + 1 == ids.size()});
  ctx->decode(batch.data(), batch.size());
  const auto want = moe_ref::qwen3moe_last_logits(*f, ids);
  const float *got = ctx->logits(-1);
  double diff2 = 0, ref2 = 0;
  for (int32_t v = 0; v < model->n_vocab(); ++v) {
    const double w = want[static_cast<size_t>(v)];
    diff2 += (got[v] - w) * (got[v] - w);
    ref2 += w * w;
  }
  CHECK(std::sqrt(diff2 / ref2) < 0.05);
}

}  // namespace

TEST_CASE("new weight types: a tiny model in each 32-value mix runs on the CPU close to the float64 forward", "[quant][newtypes][engine]") {
  for (const char *mix : {"q4_1", "q5_0", "q5_1", "iq4_nl"}) {
    INFO(mix);
    DType type = DType::F32;
    REQUIRE(dtype_from_name(mix, &type));
    check_model_on_cpu(moe_test::tiny_model(mix), type);
  }
}

// Tiny's rows (64 values) do not fit the 256-value types; "small" (256) does, but writing it
// with the exhaustive i-quant search and the float64 forward take minutes.
TEST_CASE("new weight types: a small model in 256-value mixes runs on the CPU close to the float64 forward", "[quant][newtypes][engine][slow]") {
  for (const char *mix : {"iq4_xs", "iq3_s", "iq2_xxs", "iq1_m"}) {
    INFO(mix);
    DType type = DType::F32;
    REQUIRE(dtype_from_name(mix, &type));
    const std::string path = moe_test::temp_name(std::string("small-") + mix + ".gguf");
    SynthSpec spec;
    spec.preset = "small";
    spec.type_mix = mix;
    spec.seed = 5;
    write_synthetic_model(spec, path);
    moe_test::remove_at_exit(path);
    check_model_on_cpu(path, type);
  }
}
