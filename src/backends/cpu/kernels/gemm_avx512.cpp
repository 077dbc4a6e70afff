// AVX-512 (BW/VL/DQ) Q4_K / Q6_K x Q8_K tiles (see gemm.h). Q4_K: the repacked float order.
// A tile is 16 (row, column) products: 16 rows x 1 column (decode), 8 x 2, 4 x 4 (gemv
// order) or 1 row x 4 columns x 4 sub-block pairs (gemm order). Per super-block every
// product gets a 16-lane int32 vector (64 values per maddubs/madd, the two sub-blocks of a
// pair in the two 256-bit halves), and one transpose-reduction turns the 16 vectors into
// one vector of 16 exact totals, so the float steps run 16 products wide.
#include "backends/cpu/kernels/gemm.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__) && defined(__FMA__) && defined(__F16C__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "quant/dtype.h"

namespace moe {

namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

// Software prefetch of the same block one tile ahead (pf: the next tile's rows, same
// stride; null for the last tile). A single core keeps few misses in flight on its own;
// at batch 1 the weights stream from DRAM and this raises one thread's read rate.
template <size_t kBytes>
inline void prefetch_block(const uint8_t *p) {
  for (size_t o = 0; o < kBytes; o += 64) _mm_prefetch(reinterpret_cast<const char *>(p + o), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char *>(p + kBytes - 1), _MM_HINT_T0);
}

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

// lane i = sum of the 8 int32 lanes of product i, where w[2m + h] holds product 8h + m in
// its low 256 bits and product 8h + 4 + m in its high 256 bits (8-lane products, such as
// the mins terms, two to a vector: half the shuffles of reduce16 on half-empty vectors).
inline __m512i reduce16_halves(const __m512i *w) {
  __m512i y[4];
  for (int k = 0; k < 4; ++k)  // 128-bit lane L: partial sums of product 4L + k
    y[k] = _mm512_add_epi32(_mm512_shuffle_i64x2(w[2 * k], w[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i64x2(w[2 * k], w[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i x0 = _mm512_add_epi32(_mm512_unpacklo_epi32(y[0], y[1]), _mm512_unpackhi_epi32(y[0], y[1]));
  const __m512i x1 = _mm512_add_epi32(_mm512_unpacklo_epi32(y[2], y[3]), _mm512_unpackhi_epi32(y[2], y[3]));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(x0, x1), _mm512_unpackhi_epi64(x0, x1));
}

// One Q4_K super-block of one row, unpacked: u[j] = the 64 codes of sub-blocks 2j (low
// 256 bits) and 2j+1 (high), in the order of the Q8_K values 64j..64j+63; s[j] = their
// scales as int16 (16 lanes each half); mn16 = mins duplicated per 16-group (int16).
struct RowBlock {
  __m512i u[4], s[4];
  __m256i mn16;
  float d, dmin;
};

// The 8 six-bit scales (bytes 0..7) and mins (bytes 8..15) of a Q4_K block, as
// unpack_q4k_scales forms them, computed in registers: staging them through memory cost a
// failed store-to-load forward per block (+7% on the cache-resident 16x1 tile without it).
inline __m128i unpack_scales_mins(const BlockQ4_K *b) {
  // words w0, w1, w2 = scales bytes 0..3, 4..7, 8..11 (the 16-byte load stays inside the block)
  const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b->scales));
  const __m128i a = _mm_shuffle_epi32(w, _MM_SHUFFLE(1, 0, 1, 0));  // w0, w1, w0, w1
  const __m128i c = _mm_shuffle_epi32(w, _MM_SHUFFLE(2, 2, 2, 2));  // w2 x4
  const __m128i lo = _mm_and_si128(a, _mm_set1_epi32(0x3f3f3f3f));   // s_lo, m_lo
  const __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srlv_epi32(c, _mm_set_epi32(4, 0, 4, 0)), _mm_set1_epi32(0x0f0f0f0f)),
                                  _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(a, 6), _mm_set1_epi32(0x03030303)), 4));
  return _mm_unpacklo_epi32(lo, hi);  // s_lo, s_hi, m_lo, m_hi
}

inline void unpack_block(const BlockQ4_K *b, RowBlock &rb) {
  const __m512i shift = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(b->qs + 32 * j)));
    rb.u[j] = _mm512_and_si512(_mm512_srlv_epi64(q, shift), m4);  // high half: >> 4 (bits from the next byte masked)
  }
  const __m128i sm8 = unpack_scales_mins(b);
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

// acc + pair_dot: VNNI dpwssd fuses the scale madd and the add (exact int32, no saturation).
inline __m512i pair_dot_acc(__m512i acc, const RowBlock &rb, int j, const int8_t *q8) {
  return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(rb.u[j], _mm512_loadu_si512(q8 + 64 * j)), rb.s[j]);
}

// Mins term of one product: sum_g mn[g/2] * bsums[g], as 8 int32 lanes.
inline __m256i mins_dot(const RowBlock &rb, const BlockQ8_K *y) {
  return _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(y->bsums)), rb.mn16);
}

// Inlined into its caller: called out of line, the caller built rows[] / cols[] with one
// vector store and the tile read them back as 8-byte loads, a failed store-to-load forward
// per call; with the tiny shapes' one super-block per call that stall was a fifth of the tile.
#define MOE_TILE_INLINE __attribute__((always_inline)) inline

// The per-lane scales of a gemv tile (lane r * C + c) for super-block i, formed in
// registers: filling a 16-float array with scalar stores and loading it as one vector
// failed store-to-load forwarding on every block (three such loads per block, and with the
// tiny shapes' single super-block per call that stall sat on every tile).
// dl / dml: the rows' d / dmin (fp16 -> f32 is exact); yl: the columns' d.
template <int R, int C>
inline void tile_scales(const uint8_t *const *rows, const BlockQ8_K *const *cols, int i, __m512 &dl, __m512 &dml, __m512 &yl) {
  // 32-bit lane r = the (d, dmin) halves of row r's block i (the first 4 bytes of a Q4_K block)
  auto dm = [&](int r) -> int {
    if (r >= R) return 0;
    int v;
    std::memcpy(&v, rows[r] + static_cast<size_t>(i) * sizeof(BlockQ4_K), 4);
    return v;
  };
  const __m512i h = _mm512_set_epi32(dm(15), dm(14), dm(13), dm(12), dm(11), dm(10), dm(9), dm(8), dm(7), dm(6), dm(5),
                                     dm(4), dm(3), dm(2), dm(1), dm(0));
  const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));  // d0, dmin0, .., d7, dmin7
  struct Idx { alignas(64) int32_t d[16], m[16]; };
  static constexpr Idx idx = [] {
    Idx x{};
    for (int l = 0; l < 16; ++l) { x.d[l] = 2 * (l / C); x.m[l] = 2 * (l / C) + 1; }
    return x;
  }();
  if (R > 8) {
    const __m512 hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    dl = _mm512_permutex2var_ps(lo, _mm512_load_si512(idx.d), hi);
    dml = _mm512_permutex2var_ps(lo, _mm512_load_si512(idx.m), hi);
  } else {
    dl = _mm512_permutexvar_ps(_mm512_load_si512(idx.d), lo);
    dml = _mm512_permutexvar_ps(_mm512_load_si512(idx.m), lo);
  }
  if (C == 1) {
    yl = _mm512_set1_ps(cols[0][i].d);
    return;
  }
  auto y = [&](int c) { return c < C ? cols[c][i].d : 0.f; };
  const __m512 yc = _mm512_set_ps(0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, y(7), y(6), y(5), y(4), y(3), y(2), y(1), y(0));
  struct Cidx { alignas(64) int32_t c[16]; };
  static constexpr Cidx cidx = [] {
    Cidx x{};
    for (int l = 0; l < 16; ++l) x.c[l] = l % C;
    return x;
  }();
  yl = _mm512_permutexvar_ps(_mm512_load_si512(cidx.c), yc);
}

// Gemv order, R rows x C columns (R * C == 16), lane r * C + c.
template <int R, int C>
MOE_TILE_INLINE void tile_gemv(int nb, const uint8_t *const *rows, const BlockQ8_K *const *cols, float *res, const uint8_t *pf, size_t ws) {
  static_assert(R * C == 16 && C <= 8, "16 products per tile");
  __m512 acc = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
  RowBlock rb;
  for (int i = 0; i < nb; ++i) {
    __m512i v[16], vm2[8];
    __m256i vm[16];
    for (int r = 0; r < R; ++r) {
      if (pf) prefetch_block<sizeof(BlockQ4_K)>(pf + r * ws + i * sizeof(BlockQ4_K));
      unpack_block(reinterpret_cast<const BlockQ4_K *>(rows[r]) + i, rb);
      for (int c = 0; c < C; ++c) {
        const BlockQ8_K *y = cols[c] + i;
        const __m512i a = pair_dot_acc(pair_dot(rb, 0, y->qs), rb, 1, y->qs);
        v[r * C + c] = pair_dot_acc(pair_dot_acc(a, rb, 2, y->qs), rb, 3, y->qs);
        vm[r * C + c] = mins_dot(rb, y);
      }
    }
    for (int m = 0; m < 4; ++m)
      for (int h = 0; h < 2; ++h)
        vm2[2 * m + h] = _mm512_inserti64x4(_mm512_castsi256_si512(vm[8 * h + m]), vm[8 * h + 4 + m], 1);
    __m512 dl, dml, yd;
    tile_scales<R, C>(rows, cols, i, dl, dml, yd);
    // the reference: d = fp16(x.d) * y.d; acc = fma(float(sum), d, acc)
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(reduce16(v)), _mm512_mul_ps(dl, yd), acc);
    accm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(reduce16_halves(vm2)), _mm512_mul_ps(dml, yd), accm);
  }
  _mm512_store_ps(res, _mm512_sub_ps(acc, accm));
}

// Gemm order: one row x G groups of 4 columns (the row block unpacked once for all);
// in group g, lane j * 4 + c holds sub-block pair j of column 4g + c.
template <int G>
void tile_gemm(int nb, const uint8_t *row, const BlockQ8_K *const *cols, float *res) {
  __m128 acc[G], accm[G];
  for (int g = 0; g < G; ++g) acc[g] = accm[g] = _mm_setzero_ps();
  // (c0 j0, c0 j1, c1 j0, c1 j1 | c0 j2, c0 j3, c1 j2, c1 j3 | same for c2, c3) -> j * 4 + c
  const __m512i mperm = _mm512_set_epi32(15, 13, 7, 5, 14, 12, 6, 4, 11, 9, 3, 1, 10, 8, 2, 0);
  RowBlock rb;
  for (int i = 0; i < nb; ++i) {
    unpack_block(reinterpret_cast<const BlockQ4_K *>(row) + i, rb);
    for (int g = 0; g < G; ++g) {
      __m512i v[16];
      __m256i m[4];
      for (int c = 0; c < 4; ++c) {
        const BlockQ8_K *y = cols[4 * g + c] + i;
        for (int j = 0; j < 4; ++j) v[j * 4 + c] = pair_dot(rb, j, y->qs);
        m[c] = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(y->bsums)), rb.mn16);
      }
      const __m512i tot = reduce16(v);
      const __m512i mm = _mm512_permutexvar_epi32(
          mperm, _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_hadd_epi32(m[0], m[1])), _mm256_hadd_epi32(m[2], m[3]), 1));
      const __m512 totf = _mm512_cvtepi32_ps(tot), mmf = _mm512_cvtepi32_ps(mm);
      // in registers: four scalar stores read back as one vector failed store forwarding
      const __m128 yd = _mm_set_ps(cols[4 * g + 3][i].d, cols[4 * g + 2][i].d, cols[4 * g + 1][i].d, cols[4 * g][i].d);
      const __m128 d = _mm_mul_ps(_mm_set1_ps(rb.d), yd), dm = _mm_mul_ps(_mm_set1_ps(rb.dmin), yd);
      acc[g] = _mm_fmadd_ps(_mm512_castps512_ps128(totf), d, acc[g]);
      accm[g] = _mm_fmadd_ps(_mm512_castps512_ps128(mmf), dm, accm[g]);
      acc[g] = _mm_fmadd_ps(_mm512_extractf32x4_ps(totf, 1), d, acc[g]);
      accm[g] = _mm_fmadd_ps(_mm512_extractf32x4_ps(mmf, 1), dm, accm[g]);
      acc[g] = _mm_fmadd_ps(_mm512_extractf32x4_ps(totf, 2), d, acc[g]);
      accm[g] = _mm_fmadd_ps(_mm512_extractf32x4_ps(mmf, 2), dm, accm[g]);
      acc[g] = _mm_fmadd_ps(_mm512_extractf32x4_ps(totf, 3), d, acc[g]);
      accm[g] = _mm_fmadd_ps(_mm512_extractf32x4_ps(mmf, 3), dm, accm[g]);
    }
  }
  for (int g = 0; g < G; ++g) _mm_store_ps(res + 4 * g, _mm_sub_ps(acc[g], accm[g]));
}

template <int R, int C>
void run_gemv(int nb, int r0, int nrows, int c0, int ncols, float *const *out, const uint8_t *w, size_t ws,
              const void *const *x, int nrows_total) {
  const uint8_t *rows[R];
  const BlockQ8_K *cols[C];
  // Short tiles repeat their last row/column (valid memory); those results are dropped.
  for (int r = 0; r < R; ++r) rows[r] = w + (r0 + (r < nrows ? r : nrows - 1)) * ws;
  for (int c = 0; c < C; ++c) cols[c] = static_cast<const BlockQ8_K *>(x[c0 + (c < ncols ? c : ncols - 1)]);
  alignas(64) float res[16];
  // one column: the weights are the stream (batch 1), prefetch the next tile
  const uint8_t *pf = C == 1 && r0 + 2 * R <= nrows_total ? w + (r0 + R) * ws : nullptr;
  tile_gemv<R, C>(nb, rows, cols, res, pf, ws);
  for (int r = 0; r < R && r < nrows; ++r)
    for (int c = 0; c < C && c < ncols; ++c) out[c0 + c][r0 + r] = res[r * C + c];
}

// ---- Q6_K: the AVX2 vec_dot order (= the reference's): per product 8 float lanes, lane k
// += d * (int32 lane k of the block, i.e. bytes 4k..4k+3 of every 32-value run, scaled,
// minus 32 * scale * bsums for 16-groups 2k, 2k+1), then the 8-lane tree. ----

// One Q6_K super-block of one row: q[h][0] = values 128h..128h+63, q[h][1] = 128h+64..+127
// (unsigned 6-bit codes), s[2h + t] their per-16 scales as int16 lanes, sc16 all 16 scales.
struct Q6Block {
  __m512i q[2][2], s[4];
  __m256i sc16;
  float d;
};

inline void unpack_q6(const BlockQ6_K *b, Q6Block &qb) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
  const __m512i sh_a = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0), sh_b = _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4);
  for (int h = 0; h < 2; ++h) {
    const __m512i l = _mm512_loadu_si512(b->ql + 64 * h);
    const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(b->qh + 32 * h)));
    // 64-bit shifts: the bits that cross into a byte from its neighbour are masked off
    const __m512i ha = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(hb, sh_a), m3), 4);
    const __m512i hc = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(hb, sh_b), m3), 4);
    qb.q[h][0] = _mm512_or_si512(_mm512_and_si512(l, m4), ha);
    qb.q[h][1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), hc);
  }
  qb.sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b->scales)));
  // int16 lane i of a 64-value vector k covers values 2i, 2i+1: scale 4k + i / 8
  alignas(64) static const int16_t idx[4][32] = {
      {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
      {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
      {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
      {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
       14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};
  const __m512i sc = _mm512_zextsi256_si512(qb.sc16);
  for (int k = 0; k < 4; ++k) qb.s[k] = _mm512_permutexvar_epi16(_mm512_load_si512(idx[k]), sc);
  qb.d = h2f(b->d);
}

// The 8 int32 lanes of one product's block, as the AVX2 kernel forms them.
inline __m256i q6_lanes(const Q6Block &qb, const BlockQ8_K *y) {
  __m512i p = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < 2; ++t)
      p = _mm512_dpwssd_epi32(p, _mm512_maddubs_epi16(qb.q[h][t], _mm512_loadu_si512(y->qs + 128 * h + 64 * t)),
                              qb.s[2 * h + t]);
  const __m256i lanes = _mm256_add_epi32(_mm512_castsi512_si256(p), _mm512_extracti64x4_epi64(p, 1));
  const __m256i off = _mm256_slli_epi32(
      _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(y->bsums)), qb.sc16), 5);
  return _mm256_sub_epi32(lanes, off);
}

inline float hsum8(__m256 v) {  // (x_k + x_{k+4}), then (s0 + s2) + (s1 + s3)
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int R, int C>
MOE_TILE_INLINE void tile_q6(int nb, const uint8_t *const *rows, const BlockQ8_K *const *cols, float *res, const uint8_t *pf, size_t ws) {
  __m256 acc[R * C];
  for (auto &a : acc) a = _mm256_setzero_ps();
  Q6Block qb;
  for (int i = 0; i < nb; ++i) {
    for (int r = 0; r < R; ++r) {
      if (pf) prefetch_block<sizeof(BlockQ6_K)>(pf + r * ws + i * sizeof(BlockQ6_K));
      unpack_q6(reinterpret_cast<const BlockQ6_K *>(rows[r]) + i, qb);
      for (int c = 0; c < C; ++c) {
        const BlockQ8_K *y = cols[c] + i;
        acc[r * C + c] = _mm256_fmadd_ps(_mm256_set1_ps(qb.d * y->d), _mm256_cvtepi32_ps(q6_lanes(qb, y)), acc[r * C + c]);
      }
    }
  }
  for (int l = 0; l < R * C; ++l) res[l] = hsum8(acc[l]);
}

template <int R, int C>
void run_q6(int nb, int r0, int nrows, int c0, int ncols, float *const *out, const uint8_t *w, size_t ws,
            const void *const *x, int nrows_total) {
  const uint8_t *rows[R];
  const BlockQ8_K *cols[C];
  for (int r = 0; r < R; ++r) rows[r] = w + (r0 + (r < nrows ? r : nrows - 1)) * ws;
  for (int c = 0; c < C; ++c) cols[c] = static_cast<const BlockQ8_K *>(x[c0 + (c < ncols ? c : ncols - 1)]);
  float res[R * C];
  const uint8_t *pf = C == 1 && r0 + 2 * R <= nrows_total ? w + (r0 + R) * ws : nullptr;
  tile_q6<R, C>(nb, rows, cols, res, pf, ws);
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
    alignas(16) float res[8];
    const BlockQ8_K *cols[8];
    for (; c0 + 8 <= ncols; c0 += 8) {  // two groups of 4 per row unpack
      for (int c = 0; c < 8; ++c) cols[c] = static_cast<const BlockQ8_K *>(x[c0 + c]);
      for (int r = 0; r < nrows; ++r) {
        tile_gemm<2>(nb, wb + r * w_stride, cols, res);
        for (int c = 0; c < 8; ++c) out[c0 + c][r] = res[c];
      }
    }
    for (; c0 + 4 <= ncols; c0 += 4) {
      for (int c = 0; c < 4; ++c) cols[c] = static_cast<const BlockQ8_K *>(x[c0 + c]);
      for (int r = 0; r < nrows; ++r) {
        tile_gemm<1>(nb, wb + r * w_stride, cols, res);
        for (int c = 0; c < 4; ++c) out[c0 + c][r] = res[c];
      }
    }
  }
  // 8 columns per tile where there are 8 (each row block unpacked once per 8 products)
  for (int step; c0 < ncols; c0 += step) {
    step = ncols - c0 >= 8 ? 8 : 4;
    const int nc = ncols - c0 < step ? ncols - c0 : step;
    for (int r0 = 0; r0 < nrows;) {
      const int left = nrows - r0;
      if (nc == 8) { run_gemv<2, 8>(nb, r0, left < 2 ? left : 2, c0, 8, out, wb, w_stride, x, nrows); r0 += 2; }
      else if (nc == 1) { run_gemv<16, 1>(nb, r0, left < 16 ? left : 16, c0, 1, out, wb, w_stride, x, nrows); r0 += 16; }
      else if (nc == 2) { run_gemv<8, 2>(nb, r0, left < 8 ? left : 8, c0, 2, out, wb, w_stride, x, nrows); r0 += 8; }
      else { run_gemv<4, 4>(nb, r0, left < 4 ? left : 4, c0, nc, out, wb, w_stride, x, nrows); r0 += 4; }
    }
  }
}

bool cpu_gemm_q4_K_avx512_built() { return true; }

void cpu_gemm_q6_K_avx512(int n, int nrows, int ncols, float *const *out, const void *w, size_t w_stride,
                          const void *const *x) {
  const int nb = n / QK_K;
  const uint8_t *wb = static_cast<const uint8_t *>(w);
  for (int c0 = 0, step; c0 < ncols; c0 += step) {
    step = ncols - c0 >= 8 ? 8 : 4;
    const int nc = ncols - c0 < step ? ncols - c0 : step;
    for (int r0 = 0; r0 < nrows;) {
      const int left = nrows - r0;
      if (nc == 8) { run_q6<2, 8>(nb, r0, left < 2 ? left : 2, c0, 8, out, wb, w_stride, x, nrows); r0 += 2; }
      else if (nc == 1) { run_q6<4, 1>(nb, r0, left < 4 ? left : 4, c0, 1, out, wb, w_stride, x, nrows); r0 += 4; }
      else if (nc == 2) { run_q6<4, 2>(nb, r0, left < 4 ? left : 4, c0, 2, out, wb, w_stride, x, nrows); r0 += 4; }
      else { run_q6<4, 4>(nb, r0, left < 4 ? left : 4, c0, nc, out, wb, w_stride, x, nrows); r0 += 4; }
    }
  }
}

}  // namespace moe

#else

namespace moe {
void cpu_gemm_q4_K_avx512(int, int, int, float *const *, const void *, size_t, const void *const *, Q4kOrder) {}
bool cpu_gemm_q4_K_avx512_built() { return false; }
void cpu_gemm_q6_K_avx512(int, int, int, float *const *, const void *, size_t, const void *const *) {}
}  // namespace moe

#endif
