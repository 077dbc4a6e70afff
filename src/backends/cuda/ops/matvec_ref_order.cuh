// Mat-vec rows of Q4_K, Q5_K, Q6_K and Q8_0 in the CPU's reference float order
// (src/backends/cpu/kernels/ref_order_dot_impl.h, the path ref_order_path picks at one
// token), bit for bit: the K-quant conformance networks are chaotic, a one-ulp difference
// in an activation flips a Q8_K rounding downstream (docs/perf/cuda.md).
//
// The reference keeps 8 float lanes per row: lane k folds, block after block, the exact
// integer sum of bytes 4k..4k+3 of every 32-element group of the block (times the group's
// scale) as acc_k = fma(d, float(sum), acc_k); then a fixed reduce tree. A "piece" (block
// i, lane k) is one such integer: 8 dp4a (K-quants; one for Q8_0), computed with the
// block's float factors by warp lane 8 * (i % 4) + k, four blocks per pass; the fold then
// walks the pass's blocks in order, every lane receiving piece and factors by shuffle, so
// lanes l, l + 8, l + 16, l + 24 hold the same accumulator (the float work is one fma per
// piece, 4 times over; the integer work is not repeated). Used by the decode mat-vec
// (matvec.cu, activations in shared memory) and the small-batch kernel (matmul_ref_order.cu).
#pragma once
#include "backends/cuda/ops/matvec_units.cuh"

namespace moe {

template <DType T> constexpr bool ref_order_type = T == DType::Q4_K || T == DType::Q5_K || T == DType::Q6_K || T == DType::Q8_0;
constexpr bool ref_order_dtype(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q8_0; }
// (F32 one-token rows: ref_dot_f32_row in ref_math.cuh.)
// Elements per fold block (one float step per lane per block): a Q8_0 block, a K-quant super-block.
template <DType T> constexpr int ref_fold_elems = T == DType::Q8_0 ? 32 : 256;
// Q4_K of a row count that is a multiple of 8 runs the reference's repacked gemv: one
// integer per super-block (and one for the mins), each folded into its own accumulator.
__host__ __device__ constexpr bool ref_q4k_repacked(int64_t rows) { return rows % 8 == 0; }

// One little-endian word at any byte address (shared or global memory; the aligned words read
// all hold a byte of the span, so no read leaves its allocation): one aligned load when the
// address allows, a warp-uniform branch for Q4_K / Q5_K, whose blocks keep the row's alignment.
__device__ __forceinline__ uint32_t ld_word(const uint8_t *p) {
  if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) return *reinterpret_cast<const uint32_t *>(p);
  uint32_t w[1];
  ld_words<1>(p, w);
  return w[0];
}
__device__ __forceinline__ int ld_x4(const int8_t *x) { return *reinterpret_cast<const int *>(x); }

// Rounded activations (Q8_0 / Q8_K values: int8 q, a scale per block, sums per 16) in one
// of two layouts: the mat-vec's shared memory (XSmemAct) or act_round_kernel's global
// output with q_int8 (XGlobalAct: (scale, sum) per 16). fold(e): the block from element e
// (4-byte aligned int8 values, sum16(j): the sum of its 16-group j); scale(e): its scale.
template <class S> struct XFold {
  const int8_t *q;
  const S *s;
  __device__ __forceinline__ int sum16(int j) const {
    if constexpr (sizeof(S) == 4) return s[j];
    else return static_cast<int>(s[j].y);  // an integer stored as float: exact
  }
};
struct XSmemAct {
  const int8_t *q;
  const float *d;  // per 32
  const int *s;    // per 16
  __device__ __forceinline__ XFold<int> fold(int e) const { return XFold<int>{q + e, s + e / 16}; }
  __device__ __forceinline__ float scale(int e) const { return d[e / 32]; }
};
struct XGlobalAct {
  const int8_t *q;
  const float2 *s;  // per 16: (scale, sum)
  __device__ __forceinline__ XFold<float2> fold(int e) const { return XFold<float2>{q + e, s + e / 16}; }
  __device__ __forceinline__ float scale(int e) const { return s[e / 16].x; }
};

// Q4_K / Q5_K 6-bit scales and mins of the 8 sub-blocks, byte g % 4 of word g / 4.
__device__ __forceinline__ void scales_mins_k4(const uint8_t *q, uint32_t (&sc)[2], uint32_t (&mn)[2]) {
  const uint32_t a = ld_word(q), b = ld_word(q + 4), c = ld_word(q + 8);
  sc[0] = a & 0x3F3F3F3Fu;
  mn[0] = b & 0x3F3F3F3Fu;
  sc[1] = (c & 0x0F0F0F0Fu) | (((a >> 6) & 0x03030303u) << 4);
  mn[1] = ((c >> 4) & 0x0F0F0F0Fu) | (((b >> 6) & 0x03030303u) << 4);
}
__device__ __forceinline__ int byte_of(const uint32_t (&w)[2], int g) { return ((g < 4 ? w[0] : w[1]) >> (8 * (g & 3))) & 0xFF; }

// The reference's min term of sub-blocks 2kk and 2kk + 1 (Q4_K / Q5_K).
template <class XF> __device__ __forceinline__ int min_pair_k4(const uint32_t (&mn)[2], const XF &x, int kk) {
  return byte_of(mn, 2 * kk) * (x.sum16(4 * kk) + x.sum16(4 * kk + 1)) + byte_of(mn, 2 * kk + 1) * (x.sum16(4 * kk + 2) + x.sum16(4 * kk + 3));
}

// Q4_K piece k split by sub-block pair j (quant bytes 32j..: low nibbles are group 2j, high
// nibbles group 2j + 1): p[j] = its share of the reference's integer for pair j.
template <class XF> __device__ __forceinline__ void q4k_pair_parts(const uint8_t *b, const uint32_t (&sc)[2], const XF &x, int k, int (&p)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t w = ld_word(b + 16 + 32 * j + 4 * k);
    p[j] = byte_of(sc, 2 * j) * __dp4a(static_cast<int>(w & 0x0F0F0F0Fu), ld_x4(x.q + 64 * j + 4 * k), 0) +
           byte_of(sc, 2 * j + 1) * __dp4a(static_cast<int>((w >> 4) & 0x0F0F0F0Fu), ld_x4(x.q + 64 * j + 32 + 4 * k), 0);
  }
}

// Piece k of fold block b: q = the integer of float lane k; m = the block's min term for
// lane k % 4 (Q4_K, Q5_K; else 0).
template <DType T, class XF> __device__ __forceinline__ void ref_piece(const uint8_t *b, const XF &x, int k, int &q, int &m) {
  m = 0;
  if constexpr (T == DType::Q4_K) {
    uint32_t sc[2], mn[2];
    scales_mins_k4(b + 4, sc, mn);
    int p[4];
    q4k_pair_parts(b, sc, x, k, p);
    q = (p[0] + p[1]) + (p[2] + p[3]);
    m = min_pair_k4(mn, x, k & 3);
  } else if constexpr (T == DType::Q5_K) {
    uint32_t sc[2], mn[2];
    scales_mins_k4(b + 4, sc, mn);
    const uint32_t h = ld_word(b + 16 + 4 * k);  // fifth bits: bit g of byte e % 32 for group g
    int s = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t w = ld_word(b + 48 + 32 * j + 4 * k);
      const uint32_t lo = (w & 0x0F0F0F0Fu) | (((h >> (2 * j)) & 0x01010101u) << 4);
      const uint32_t hi = ((w >> 4) & 0x0F0F0F0Fu) | (((h >> (2 * j + 1)) & 0x01010101u) << 4);
      s += byte_of(sc, 2 * j) * __dp4a(static_cast<int>(lo), ld_x4(x.q + 64 * j + 4 * k), 0);
      s += byte_of(sc, 2 * j + 1) * __dp4a(static_cast<int>(hi), ld_x4(x.q + 64 * j + 32 + 4 * k), 0);
    }
    q = s;
    m = min_pair_k4(mn, x, k & 3);
  } else if constexpr (T == DType::Q6_K) {
    // Unsigned 6-bit values, an int8 scale per 16 (lanes k < 4 cover the first 16 bytes of a
    // group); the -32 offset enters lane k as the reference puts it there: 32 * the scaled
    // sums of 16-groups 2k and 2k + 1.
    const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192);
    int s = 0;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t l0 = ld_word(b + 64 * j + 4 * k), l1 = ld_word(b + 64 * j + 32 + 4 * k), h = ld_word(b + 128 + 32 * j + 4 * k);
#pragma unroll
      for (int t = 0; t < 4; ++t) {  // group g = 4j + t: low nibbles of l0, l1, then their high nibbles
        const int g = 4 * j + t;
        const uint32_t v = (((t & 1 ? l1 : l0) >> (4 * (t >> 1))) & 0x0F0F0F0Fu) | (((h >> (2 * t)) & 0x03030303u) << 4);
        s += sc[2 * g + (k >> 2)] * __dp4a(static_cast<int>(v), ld_x4(x.q + 32 * g + 4 * k), 0);
      }
    }
    q = s - 32 * (x.sum16(2 * k) * sc[2 * k] + x.sum16(2 * k + 1) * sc[2 * k + 1]);
  } else {
    static_assert(T == DType::Q8_0, "a reference-order type");
    q = __dp4a(static_cast<int>(ld_word(b + 2 + 4 * k)), ld_x4(x.q + 4 * k), 0);
  }
}

// Sum over the lanes l ^ 1, l ^ 2, ... (width 4 or 8) of an integer (exact in any order).
template <int W> __device__ __forceinline__ int lanes_sum(int v) {
#pragma unroll
  for (int o = 1; o < W; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The float factors of fold block b (activation scale ys): d for the quants, dm for the mins
// (Q4_K / Q5_K; the reference negates it on its vec_dot paths: -(ys * dmin) is the same
// float as its (-ys) * dmin). Products are commutative in IEEE arithmetic, so each order
// the reference writes gives these bits.
template <DType T> __device__ __forceinline__ void ref_factors(const uint8_t *b, float ys, float &d, float &dm) {
  dm = 0.0f;
  if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    d = ys * h2f(b);
    dm = ys * h2f(b + 2);
  } else if constexpr (T == DType::Q6_K) {
    d = ys * h2f(b + 208);
  } else {
    d = ys * h2f(b);
  }
}

// One fold step (the block's integers q, m and factors d, dm) into the reference's lane k
// and min accumulators. Every step is an explicit fmaf (no contraction choices); fma(a, b, c)
// and fma(b, a, c) are the same float.
template <DType T> __device__ __forceinline__ void ref_step(int q, int m, float d, float dm, bool repack, float &acc, float &accm) {
  acc = fmaf(d, static_cast<float>(q), acc);
  if constexpr (T == DType::Q4_K) accm = fmaf(repack ? dm : -dm, static_cast<float>(m), accm);  // gemv: acc - accm at the end
  else if constexpr (T == DType::Q5_K) accm = fmaf(-dm, static_cast<float>(m), accm);
}

// Folds one chunk of a row (ne elements from block bytes cb; activations from element x0
// of xa) into the row's accumulators. Every lane of the warp must call it (shuffles); ne,
// repack: warp-uniform.
template <DType T, int CH, class XA>
__device__ __forceinline__ void ref_chunk(const uint8_t *cb, int ne, int x0, const XA &xa, bool repack, float &acc, float &accm) {
  constexpr int FB = ref_fold_elems<T>, BS = BlockInfo<T>::bytes, NFB = CH / FB, NPL = NFB * 8 / 32;
  static_assert(NFB % 4 == 0, "a warp pass covers 4 fold blocks");
  const int lane = threadIdx.x & 31, k = lane & 7, nfb = ne / FB;
  constexpr bool mins = T == DType::Q4_K || T == DType::Q5_K;
  // Passes of 4 blocks: lane 8 * ii + k computes piece (4r + ii, k) and the block's factors,
  // then every lane folds the 4 blocks in order (scalars only: no register arrays).
#pragma unroll
  for (int r = 0; r < NPL; ++r) {
    if (4 * r >= nfb) break;
    const int i = (lane >> 3) + 4 * r;
    int pq = 0, pm = 0;
    float pd = 0.0f, pdm = 0.0f;
    if (i < nfb) {
      ref_piece<T>(cb + i * BS, xa.fold(x0 + i * FB), k, pq, pm);
      ref_factors<T>(cb + i * BS, xa.scale(x0 + i * FB), pd, pdm);
    }
    if constexpr (T == DType::Q4_K) {
      if (repack) {  // one integer per block: the sum of the 8 lanes, and of the 4 min terms
        pq = lanes_sum<8>(pq);
        pm = lanes_sum<4>(pm);
      }
    } else if constexpr (T == DType::Q5_K) {
      pm = lanes_sum<4>(pm);  // one min sum per block
    }
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) {
      if (4 * r + ii >= nfb) break;
      const int src = 8 * ii + k;  // the lane that computed piece (4r + ii, k)
      const int q = __shfl_sync(0xffffffffu, pq, src);
      const float d = __shfl_sync(0xffffffffu, pd, src);
      const int m = mins ? __shfl_sync(0xffffffffu, pm, src) : 0;
      const float dm = mins ? __shfl_sync(0xffffffffu, pdm, src) : 0.0f;
      ref_step<T>(q, m, d, dm, repack, acc, accm);
    }
  }
}

// Q4_K in the reference's repacked gemm order (dense products, columns in its full groups
// of 4): per super-block one step per sub-block pair j, acc = fma(float(sb_q[j]), d, acc),
// likewise the mins; finished like the gemv order (acc - accm). Folds nfb <= 4 blocks from
// cb (activations from element x0 of xa); every lane of the warp must call it.
template <class XA>
__device__ __forceinline__ void ref_q4k_gemm_pass(const uint8_t *cb, int nfb, int x0, const XA &xa, float &acc, float &accm) {
  const int lane = threadIdx.x & 31, k = lane & 7, i = lane >> 3;
  int p[4] = {0, 0, 0, 0}, m = 0;
  if (i < nfb) {
    const uint8_t *b = cb + i * BlockInfo<DType::Q4_K>::bytes;
    const auto x = xa.fold(x0 + i * 256);
    uint32_t sc[2], mn[2];
    scales_mins_k4(b + 4, sc, mn);
    q4k_pair_parts(b, sc, x, k, p);
    m = min_pair_k4(mn, x, k & 3);  // sb_m[k % 4]
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) p[j] = lanes_sum<8>(p[j]);  // sb_q[j] of block i, in every lane of its 8
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    if (ii >= nfb) break;
    const uint8_t *b = cb + ii * BlockInfo<DType::Q4_K>::bytes;
    float d, dm;
    ref_factors<DType::Q4_K>(b, xa.scale(x0 + ii * 256), d, dm);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int q = __shfl_sync(0xffffffffu, p[j], ii * 8), mj = __shfl_sync(0xffffffffu, m, ii * 8 + j);
      acc = fmaf(static_cast<float>(q), d, acc);
      accm = fmaf(static_cast<float>(mj), dm, accm);
    }
  }
}

// The row's dot product from its accumulators: the reference's 8-lane tree
// ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)), then its min term. Every lane must call it.
template <DType T> __device__ __forceinline__ float ref_finish(float acc, float accm, bool repack) {
  if constexpr (T == DType::Q4_K) {
    if (repack) return acc - accm;
  }
  float s = acc + __shfl_xor_sync(0xffffffffu, acc, 4);
  s = s + __shfl_xor_sync(0xffffffffu, s, 2);
  s = s + __shfl_xor_sync(0xffffffffu, s, 1);
  if constexpr (T == DType::Q4_K) {  // (m0 + m2) + (m1 + m3), lane kk holding m_kk
    float m = accm + __shfl_xor_sync(0xffffffffu, accm, 2);
    m = m + __shfl_xor_sync(0xffffffffu, m, 1);
    return s + m;
  } else if constexpr (T == DType::Q5_K) {
    return s + accm;
  } else {
    return s;
  }
}

}  // namespace moe
