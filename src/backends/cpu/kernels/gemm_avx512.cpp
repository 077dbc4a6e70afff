// AVX-512 (BW/VL/DQ) Q4_K x Q8_K tiles in the repacked-Q4_K float order (see gemm.h).
// A tile is 16 (row, column) products: 16 rows x 1 column (decode), 8 x 2, 4 x 4 (gemv
// order) or 1 row x 4 columns x 4 sub-block pairs (gemm order). Per super-block every
// product gets a 16-lane int32 vector (64 values per maddubs/madd, the two sub-blocks of a
// pair in the two 256-bit halves), and one transpose-reduction turns the 16 vectors into
// one vector of 16 exact totals, so the float steps run 16 products wide.
#include "backends/cpu/kernels/gemm.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "quant/dtype.h"
#include "quant/quant_util.h"

namespace moe {

namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

// lane i of the result = sum of the 16 lanes of v[i] (exact int32).
inline __m512i reduce16(const __m512i *v) {
  __m512i x[8], y[4];
  for (int i = 0; i < 8; ++i)  // 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    x[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // 128-bit lane: partial sums of v[4i..4i+3] in order
    y[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(x[2 * i], x[2 * i + 1]), _mm512_unpackhi_epi64(x[2 * i], x[2 * i + 1]));
  const __m512i p = _mm512_add_epi32(_mm512_shuffle_i64x2(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_i64x2(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i q = _mm512_add_epi32(_mm512_shuffle_i64x2(y[2], y[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_i64x2(y[2], y[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_epi32(_mm512_shuffle_i64x2(p, q, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i64x2(p, q, _MM_SHUFFLE(3, 1, 3, 1)));
}

// One Q4_K super-block of one row, unpacked: u[j] = the 64 codes of sub-blocks 2j (low
// 256 bits) and 2j+1 (high), in the order of the Q8_K values 64j..64j+63; s[j] = their
// scales as int16 (16 lanes each half); mn16 = mins duplicated per 16-group (int16).
struct RowBlock {
  __m512i u[4], s[4];
  __m256i mn16;
  float d, dmin;
};

inline void unpack_block(const BlockQ4_K *b, RowBlock &rb) {
  const __m512i shift = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(b->qs + 32 * j)));
    rb.u[j] = _mm512_and_si512(_mm512_srlv_epi64(q, shift), m4);  // high half: >> 4 (bits from the next byte masked)
  }
  alignas(16) uint8_t scm[16];
  unpack_q4k_scales(b->scales, scm, scm + 8);
  const __m128i sm8 = _mm_load_si128(reinterpret_cast<const __m128i *>(scm));
  const __m512i sc16 = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(sm8));  // lanes 0..7 scales
  // s[j]: scale 2j in the low 16 int16 lanes, 2j+1 in the high 16
  alignas(64) static const int16_t idx[4][32] = {
      {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
      {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3},
      {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5},
      {6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}};
  for (int j = 0; j < 4; ++j) rb.s[j] = _mm512_permutexvar_epi16(_mm512_load_si512(idx[j]), sc16);
  const __m128i mn8 = _mm_srli_si128(sm8, 8);
  rb.mn16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
  rb.d = h2f(b->d);
  rb.dmin = h2f(b->dmin);
}

inline __m512i pair_dot(const RowBlock &rb, int j, const int8_t *q8) {
  return _mm512_madd_epi16(_mm512_maddubs_epi16(rb.u[j], _mm512_loadu_si512(q8 + 64 * j)), rb.s[j]);
}

// Mins term of one product: sum_g mn[g/2] * bsums[g], as 8 int32 lanes in a 512 vector.
inline __m512i mins_dot(const RowBlock &rb, const BlockQ8_K *y) {
  return _mm512_zextsi256_si512(_mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(y->bsums)), rb.mn16));
}

// Gemv order, R rows x C columns (R * C == 16), lane r * C + c.
template <int R, int C>
void tile_gemv(int nb, const uint8_t *const *rows, const BlockQ8_K *const *cols, float *res) {
  static_assert(R * C == 16, "16 products per tile");
  __m512 acc = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
  alignas(64) float dl[16], dml[16], yl[16];
  RowBlock rb;
  for (int i = 0; i < nb; ++i) {
    __m512i v[16], vm[16];
    for (int r = 0; r < R; ++r) {
      unpack_block(reinterpret_cast<const BlockQ4_K *>(rows[r]) + i, rb);
      for (int c = 0; c < C; ++c) {
        const BlockQ8_K *y = cols[c] + i;
        const __m512i a = _mm512_add_epi32(pair_dot(rb, 0, y->qs), pair_dot(rb, 1, y->qs));
        const __m512i b = _mm512_add_epi32(pair_dot(rb, 2, y->qs), pair_dot(rb, 3, y->qs));
        v[r * C + c] = _mm512_add_epi32(a, b);
        vm[r * C + c] = mins_dot(rb, y);
        dl[r * C + c] = rb.d;
        dml[r * C + c] = rb.dmin;
        yl[r * C + c] = y->d;
      }
    }
    const __m512 yd = _mm512_load_ps(yl);
    // the reference: d = fp16(x.d) * y.d; acc = fma(float(sum), d, acc)
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(reduce16(v)), _mm512_mul_ps(_mm512_load_ps(dl), yd), acc);
    accm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(reduce16(vm)), _mm512_mul_ps(_mm512_load_ps(dml), yd), accm);
  }
  _mm512_store_ps(res, _mm512_sub_ps(acc, accm));
}

// Gemm order: one row x 4 columns; lane j * 4 + c holds sub-block pair j of column c.
void tile_gemm(int nb, const uint8_t *row, const BlockQ8_K *const *cols, float *res) {
  __m128 acc = _mm_setzero_ps(), accm = _mm_setzero_ps();
  // (c0 j0, c0 j1, c1 j0, c1 j1 | c0 j2, c0 j3, c1 j2, c1 j3 | same for c2, c3) -> j * 4 + c
  const __m512i mperm = _mm512_set_epi32(15, 13, 7, 5, 14, 12, 6, 4, 11, 9, 3, 1, 10, 8, 2, 0);
  RowBlock rb;
  for (int i = 0; i < nb; ++i) {
    unpack_block(reinterpret_cast<const BlockQ4_K *>(row) + i, rb);
    __m512i v[16];
    __m256i m[4];
    alignas(16) float yl[4];
    for (int c = 0; c < 4; ++c) {
      const BlockQ8_K *y = cols[c] + i;
      for (int j = 0; j < 4; ++j) v[j * 4 + c] = pair_dot(rb, j, y->qs);
      m[c] = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(y->bsums)), rb.mn16);
      yl[c] = y->d;
    }
    const __m512i tot = reduce16(v);
    const __m512i mm = _mm512_permutexvar_epi32(
        mperm, _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_hadd_epi32(m[0], m[1])), _mm256_hadd_epi32(m[2], m[3]), 1));
    const __m512 totf = _mm512_cvtepi32_ps(tot), mmf = _mm512_cvtepi32_ps(mm);
    const __m128 yd = _mm_load_ps(yl);
    const __m128 d = _mm_mul_ps(_mm_set1_ps(rb.d), yd), dm = _mm_mul_ps(_mm_set1_ps(rb.dmin), yd);
    acc = _mm_fmadd_ps(_mm512_castps512_ps128(totf), d, acc);
    accm = _mm_fmadd_ps(_mm512_castps512_ps128(mmf), dm, accm);
    acc = _mm_fmadd_ps(_mm512_extractf32x4_ps(totf, 1), d, acc);
    accm = _mm_fmadd_ps(_mm512_extractf32x4_ps(mmf, 1), dm, accm);
    acc = _mm_fmadd_ps(_mm512_extractf32x4_ps(totf, 2), d, acc);
    accm = _mm_fmadd_ps(_mm512_extractf32x4_ps(mmf, 2), dm, accm);
    acc = _mm_fmadd_ps(_mm512_extractf32x4_ps(totf, 3), d, acc);
    accm = _mm_fmadd_ps(_mm512_extractf32x4_ps(mmf, 3), dm, accm);
  }
  _mm_store_ps(res, _mm_sub_ps(acc, accm));
}

template <int R, int C>
void run_gemv(int nb, int r0, int nrows, int c0, int ncols, float *const *out, const uint8_t *w, size_t ws,
              const void *const *x) {
  const uint8_t *rows[R];
  const BlockQ8_K *cols[C];
  // Short tiles repeat their last row/column (valid memory); those results are dropped.
  for (int r = 0; r < R; ++r) rows[r] = w + (r0 + (r < nrows ? r : nrows - 1)) * ws;
  for (int c = 0; c < C; ++c) cols[c] = static_cast<const BlockQ8_K *>(x[c0 + (c < ncols ? c : ncols - 1)]);
  alignas(64) float res[16];
  tile_gemv<R, C>(nb, rows, cols, res);
  for (int r = 0; r < R && r < nrows; ++r)
    for (int c = 0; c < C && c < ncols; ++c) out[c0 + c][r0 + r] = res[r * C + c];
}

}  // namespace

void cpu_gemm_q4_K_avx512(int n, int nrows, int ncols, float *const *out, const void *w, size_t w_stride,
                          const void *const *x, Q4kOrder order) {
  const int nb = n / QK_K;
  const uint8_t *wb = static_cast<const uint8_t *>(w);
  int c0 = 0;
  if (order == Q4kOrder::Gemm) {
    alignas(16) float res[4];
    for (; c0 + 4 <= ncols; c0 += 4) {
      const BlockQ8_K *cols[4];
      for (int c = 0; c < 4; ++c) cols[c] = static_cast<const BlockQ8_K *>(x[c0 + c]);
      for (int r = 0; r < nrows; ++r) {
        tile_gemm(nb, wb + r * w_stride, cols, res);
        for (int c = 0; c < 4; ++c) out[c0 + c][r] = res[c];
      }
    }
  }
  for (; c0 < ncols; c0 += 4) {
    const int nc = ncols - c0 < 4 ? ncols - c0 : 4;
    for (int r0 = 0; r0 < nrows;) {
      const int left = nrows - r0;
      if (nc == 1) { run_gemv<16, 1>(nb, r0, left < 16 ? left : 16, c0, 1, out, wb, w_stride, x); r0 += 16; }
      else if (nc == 2) { run_gemv<8, 2>(nb, r0, left < 8 ? left : 8, c0, 2, out, wb, w_stride, x); r0 += 8; }
      else { run_gemv<4, 4>(nb, r0, left < 4 ? left : 4, c0, nc, out, wb, w_stride, x); r0 += 4; }
    }
  }
}

bool cpu_gemm_q4_K_avx512_built() { return true; }

}  // namespace moe

#else

namespace moe {
void cpu_gemm_q4_K_avx512(int, int, int, float *const *, const void *, size_t, const void *const *, Q4kOrder) {}
bool cpu_gemm_q4_K_avx512_built() { return false; }
}  // namespace moe

#endif
