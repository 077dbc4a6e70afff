// Test data of the emulation checks (matvec_check.cpp, mmv_ref_check.cpp): padded device-like
// buffers, random activations, quantized or random-byte weights, and the CPU's
// reference-order products they are checked against.
#pragma once
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/kernels/ref_order_dot.h"
#include "core/fp16.h"
#include "quant/dtype.h"

namespace emu_check {
using namespace moe;

struct Buf {
  uint8_t *p = nullptr;
  size_t n = 0;
  explicit Buf(size_t bytes) : n(bytes) {
    p = static_cast<uint8_t *>(std::aligned_alloc(256, (bytes + 511) / 256 * 256));
    std::memset(p, 0xFF, (bytes + 511) / 256 * 256);
  }
  ~Buf() { std::free(p); }
  Buf(const Buf &) = delete;
  Buf &operator=(const Buf &) = delete;
};

inline std::mt19937 rng(7);
inline std::vector<float> randn(size_t n, float s = 1.0f) {
  std::normal_distribution<float> d(0.0f, s);
  std::vector<float> v(n);
  for (auto &x : v) x = d(rng);
  return v;
}

// rows x K weights of type t (each row quantized on its own), 256-byte padded.
inline Buf *weights(DType t, int64_t K, int64_t rows) {
  const size_t rb = row_size(t, K);
  Buf *b = new Buf(rb * rows);
  const auto f = randn(static_cast<size_t>(K * rows), 0.5f);
  for (int64_t r = 0; r < rows; ++r) quantize_row(t, f.data() + r * K, b->p + r * rb, K);
  return b;
}

// rows x K random block bytes (every scale and min code), with random f16 block scales of
// moderate size (either sign) so that the products stay finite.
inline Buf *random_blocks(DType t, int64_t K, int64_t rows) {
  const size_t rb = row_size(t, K), bb = row_size(t, type_traits(t).block_size);
  Buf *b = new Buf(rb * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  for (size_t i = 0; i < rb * rows; ++i) b->p[i] = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> mag(0.5f, 2.0f);
  auto put = [&](uint8_t *p, float scale) {
    const uint16_t h = fp32_to_fp16((byte(rng) & 1 ? -scale : scale) * mag(rng));
    std::memcpy(p, &h, 2);
  };
  for (size_t o = 0; o < rb * rows; o += bb) {
    if (t == DType::Q8_0) put(b->p + o, 1e-2f);
    if (t == DType::Q4_K || t == DType::Q5_K) {
      put(b->p + o, 1e-3f);
      put(b->p + o + 2, 1e-3f);
    }
    if (t == DType::Q6_K) put(b->p + o + 208, 1e-3f);
  }
  return b;
}

// The CPU's outputs: M reference-order rows against x on the given path (the activation
// converted as the CPU does: Q8_0 for Q8_0, Q8_K for the K-quants, none for F32).
inline std::vector<float> cpu_rows_on(DType t, const uint8_t *w, size_t rb, int64_t M, int64_t K, const float *x, RefPath path) {
  const DType act = t == DType::F32 ? DType::F32 : t == DType::Q8_0 ? DType::Q8_0 : DType::Q8_K;
  std::vector<uint8_t> xq(row_size(act, K));
  quantize_row(act, x, xq.data(), K);
  std::vector<float> y(static_cast<size_t>(M));
  ref_order_dot_rows(t, static_cast<int>(K), static_cast<int>(M), y.data(), w, rb, xq.data(), path);
  return y;
}
// ... on the path the CPU takes at one token (moe: an expert product).
inline std::vector<float> cpu_rows(DType t, const uint8_t *w, size_t rb, int64_t M, int64_t K, const float *x, bool moe) {
  return cpu_rows_on(t, w, rb, M, K, x, ref_order_path(t, K, M, 1, 0, moe));
}

// One activation row rounded as act_round_kernel writes it for the int8 paths: K int8
// integers, and per 16 elements (block scale, integer sum) as two floats.
inline void round_int8(DType t, const float *x, int64_t K, int8_t *q, float *s) {
  const DType act = t == DType::Q8_0 ? DType::Q8_0 : DType::Q8_K;
  std::vector<uint8_t> b(row_size(act, K));
  quantize_row(act, x, b.data(), K);
  for (int64_t i = 0; i < K; i += 16) {
    float d;
    const int8_t *v;
    if (act == DType::Q8_0) {
      const auto &blk = reinterpret_cast<const BlockQ8_0 *>(b.data())[i / 32];
      d = fp16_to_fp32(blk.d);
      v = blk.qs + i % 32;
    } else {
      const auto &blk = reinterpret_cast<const BlockQ8_K *>(b.data())[i / 256];
      d = blk.d;
      v = blk.qs + i % 256;
    }
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += q[i + l] = v[l];
    s[2 * (i / 16)] = d;
    s[2 * (i / 16) + 1] = static_cast<float>(sum);
  }
}

}  // namespace emu_check
