// Mat-vec rows of Q4_K, Q5_K, Q6_K and Q8_0 in the CPU's reference float order
// (src/backends/cpu/kernels/ref_order_dot_impl.h, the path ref_order_path picks at one
// token), bit for bit: the K-quant conformance networks are chaotic, a one-ulp difference
// in an activation flips a Q8_K rounding downstream (docs/perf/cuda.md).
//
// The reference keeps 8 float lanes per row: lane k folds, block after block, the exact
// integer sum of bytes 4k..4k+3 of every 32-element group of the block (times the group's
// scale) as acc_k = fma(d, float(sum), acc_k); then a fixed reduce tree. A "piece" (block
// i, lane k) is one such integer: 8 dp4a (K-quants; one for Q8_0), computed with the
// block's float factors by warp lane 8 * (i % 4) + k, four blocks per pass; the fold
// (ring_fold) then carries lane k's accumulator through lanes k, 8 + k, 16 + k, 24 + k, one
// step per block in the lane that computed its piece (one shuffle per block for all 8
// lanes). The integer work may be split any way (exact); only the float steps are fixed.
// Q4_K of a row count that is a multiple of 8 (the reference's repacked gemv) has one
// integer per block and one for its mins, summed over the block's 8 lanes (q4k_repack_sums).
// Used by the decode mat-vec (matvec.cu, activations in shared memory) and the small-batch
// kernel (matmul_ref_order.cu).
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

// The words of one 2-byte aligned block at b (Q6_K), its alignment taken once: each
// word is then two loads at fixed offsets from two bases and a funnel shift, no branch (hi is
// lo where b is 4-byte aligned: no read leaves the span). Pointer arithmetic only (an integer
// round trip loses the address space): a block in shared memory is read with 32-bit LDS, not
// generic loads on 64-bit addresses.
struct Words2 {
  const uint32_t *lo, *hi;
  uint32_t sh;
  __device__ __forceinline__ explicit Words2(const uint8_t *b) {
    const unsigned mis = static_cast<unsigned>(reinterpret_cast<uintptr_t>(b)) & 2u;
    lo = reinterpret_cast<const uint32_t *>(b - mis);
    hi = lo + (mis >> 1);
    sh = mis * 8;
  }
  // The word at byte o (a multiple of 4) of the block.
  __device__ __forceinline__ uint32_t at(int o) const { return __funnelshift_r(lo[o >> 2], hi[o >> 2], sh); }
};
// One word at a 2-byte aligned address, the aligned word after it read only where the
// address is 2 mod 4 (then it still holds a byte of the span: no read past it). (Q8_0's one
// word a piece: as Words2, it measured 64 more SASS instructions in the down kernel.)
__device__ __forceinline__ uint32_t ld_word2(const uint8_t *p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t *b = reinterpret_cast<const uint32_t *>(a & ~uintptr_t(3));
  const uint32_t sh = static_cast<uint32_t>(a & 2) * 8;
  return __funnelshift_r(b[0], sh ? b[1] : b[0], sh);
}
// An f16 at a 2-byte aligned address.
__device__ __forceinline__ float h2f_at2(const uint8_t *p) {
  __half h;
  *reinterpret_cast<uint16_t *>(&h) = *reinterpret_cast<const uint16_t *>(p);
  return __half2float(h);
}
// Signed byte i (0..3, any value) of w.
__device__ __forceinline__ int sbyte(uint32_t w, int i) { return static_cast<int>(w << (24 - 8 * i)) >> 24; }

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
  // sum16(j), sum16(j + 1) for even j (one 8-byte read in shared memory).
  __device__ __forceinline__ int2 sum16x2(int j) const {
    if constexpr (sizeof(S) == 4) return *reinterpret_cast<const int2 *>(s + j);
    else return make_int2(static_cast<int>(s[j].y), static_cast<int>(s[j + 1].y));
  }
};
// Gap: Q8_K values in the mat-vec's shared memory keep kXqGap bytes after every 256 (matvec.cu: xq_at).
constexpr int kXqGap = 32;
template <bool Gap> struct XSmemAct {
  const int8_t *q;
  const float *d;  // per 32
  const int *s;    // per 16
  __device__ __forceinline__ XFold<int> fold(int e) const { return XFold<int>{q + (Gap ? e + (e >> 8) * kXqGap : e), s + e / 16}; }
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
    // group: even scale bytes, k >= 4 the odd ones); the -32 offset enters lane k as the
    // reference puts it there: 32 * the scaled sums of 16-groups 2k and 2k + 1.
    const Words2 bw(b);
    const uint32_t sc[4] = {bw.at(192), bw.at(196), bw.at(200), bw.at(204)};
    int s = 0;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t l0 = bw.at(64 * j + 4 * k), l1 = bw.at(64 * j + 32 + 4 * k), h = bw.at(128 + 32 * j + 4 * k);
#pragma unroll
      for (int t = 0; t < 4; ++t) {  // group g = 4j + t: low nibbles of l0, l1, then their high nibbles
        const int g = 4 * j + t;
        const uint32_t v = (((t & 1 ? l1 : l0) >> (4 * (t >> 1))) & 0x0F0F0F0Fu) | (((h >> (2 * t)) & 0x03030303u) << 4);
        s += sbyte(sc[g >> 1], 2 * (g & 1) + (k >> 2)) * __dp4a(static_cast<int>(v), ld_x4(x.q + 32 * g + 4 * k), 0);
      }
    }
    const uint32_t sk = k & 4 ? (k & 2 ? sc[3] : sc[2]) : (k & 2 ? sc[1] : sc[0]);  // bytes 2k, 2k + 1 of the scales
    const int2 xs = x.sum16x2(2 * k);
    q = s - 32 * (xs.x * sbyte(sk, 2 * (k & 1)) + xs.y * sbyte(sk, 2 * (k & 1) + 1));
  } else {
    static_assert(T == DType::Q8_0, "a reference-order type");
    q = __dp4a(static_cast<int>(ld_word2(b + 2 + 4 * k)), ld_x4(x.q + 4 * k), 0);
  }
}

// Sum over the lanes l ^ 1, l ^ 2, ... (width 4 or 8) of an integer (exact in any order).
template <int W> __device__ __forceinline__ int lanes_sum(int v) {
#pragma unroll
  for (int o = 1; o < W; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// An f16 value from the low 16 bits of w.
__device__ __forceinline__ float h2f_bits(uint32_t w) {
  __half h;
  *reinterpret_cast<uint16_t *>(&h) = static_cast<uint16_t>(w & 0xFFFFu);
  return __half2float(h);
}

// Q4_K repacked gemv integers of one super-block (the 8 lanes of a group, lane t): hd = its
// first 16 bytes (d, dmin, 12 scale bytes), w = its quant bytes 16t .. 16t + 15 (pair j =
// t / 2, half h = t % 2: low nibbles are elements 64j + 16h .. of group 2j, high nibbles the
// same 16 of group 2j + 1), x its activations (q4k_repack_x); the mins come from
// dp4a with the min replicated in 4 bytes (= min times the sum of the 16 activations).
// Returns the block's quant integer in even lanes and its min integer in odd lanes (exact
// sums over the 8 lanes, any order), and the matching factor in d (ys * d, ys * dmin).
// ok: this lane's block exists; every lane must call it (shuffles).
// The activations of lane t: xa its first 16-byte read, xb the second. First read: low
// nibbles for pairs 0 / 1, high for 2 / 3, so the 8 lanes of a group (one shared-memory
// phase) read 8 distinct 16-byte bank ranges.
struct Q4kX {
  int4 a, b;
};
template <class XF> __device__ __forceinline__ Q4kX q4k_repack_x(const XF &x, int t) {
  const int j = t >> 1, h = t & 1, n1 = j >> 1;
  return Q4kX{*reinterpret_cast<const int4 *>(x.q + 64 * j + 32 * n1 + 16 * h), *reinterpret_cast<const int4 *>(x.q + 64 * j + 32 * (1 - n1) + 16 * h)};
}
__device__ __forceinline__ int q4k_repack_sums_regs(const uint32_t (&hd)[4], const uint32_t (&w)[4], const Q4kX &x, float ys, int t, bool ok,
                                                    float &d) {
  int q = 0, m = 0;
  d = 0.0f;
  if (ok) {
    const int j = t >> 1, n1 = j >> 1;
    const uint32_t scw = j < 2 ? hd[1] & 0x3F3F3F3Fu : (hd[3] & 0x0F0F0F0Fu) | (((hd[1] >> 6) & 0x03030303u) << 4);
    const uint32_t mnw = j < 2 ? hd[2] & 0x3F3F3F3Fu : ((hd[3] >> 4) & 0x0F0F0F0Fu) | (((hd[2] >> 6) & 0x03030303u) << 4);
    const int sa = 8 * ((2 * j + n1) & 3), sb = 8 * ((2 * j + 1 - n1) & 3);
    const int sca = static_cast<int>((scw >> sa) & 0xFFu), scb = static_cast<int>((scw >> sb) & 0xFFu);
    const int ra = static_cast<int>(((mnw >> sa) & 0xFFu) * 0x01010101u), rb = static_cast<int>(((mnw >> sb) & 0xFFu) * 0x01010101u);
    const int xav[4] = {x.a.x, x.a.y, x.a.z, x.a.w}, xbv[4] = {x.b.x, x.b.y, x.b.z, x.b.w};
    const int na = 4 * n1, nb = 4 - na;
    int da = 0, db = 0;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      da = __dp4a(static_cast<int>((w[u] >> na) & 0x0F0F0F0Fu), xav[u], da);
      db = __dp4a(static_cast<int>((w[u] >> nb) & 0x0F0F0F0Fu), xbv[u], db);
      m = __dp4a(ra, xav[u], m);
      m = __dp4a(rb, xbv[u], m);
    }
    q = sca * da + scb * db;
    d = ys * h2f_bits(t & 1 ? hd[0] >> 16 : hd[0]);
  }
  // Transposed sum: even lanes keep the quant sums, odd lanes the min sums.
  const bool odd = t & 1;
  int v = (odd ? m : q) + __shfl_xor_sync(0xffffffffu, odd ? q : m, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  return v;
}

// The same from the block's bytes at b (shared or global memory).
template <class XF>
__device__ __forceinline__ int q4k_repack_sums(const uint8_t *b, const XF &x, float ys, int t, bool ok, float &d) {
  uint32_t hd[4] = {0, 0, 0, 0}, w[4] = {0, 0, 0, 0};
  Q4kX xv{};
  if (ok) {
    ld_words_rows16<4>(b, hd);
    ld_words_rows16<4>(b + 16 + 16 * t, w);
    xv = q4k_repack_x(x, t);
  }
  return q4k_repack_sums_regs(hd, w, xv, ys, t, ok, d);
}

// One pass of the fold over nb (1..4, warp-uniform) blocks: lane 8g + t holds chain t's
// integer v and factor d for block g of the pass. Chain t's accumulator starts and ends in
// lane t and visits lane 8s + t at step s (a ring shift by 8 lanes after each step), so each
// block's step runs in the lane that holds its integer: one shuffle per block for up to 8
// chains, and the float steps are exactly the reference's acc = fma(d, float(v), acc) in
// block order. The other lanes' accumulators carry values nobody reads.
__device__ __forceinline__ float ring_fold(float acc, int v, float d, int nb) {
  const int src = (static_cast<int>(threadIdx.x) + 24) & 31;  // lane - 8
  const float f = static_cast<float>(v);
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    if (s < nb) acc = fmaf(d, f, acc);
    acc = __shfl_sync(0xffffffffu, acc, src);
  }
  return acc;
}

// The float factors of fold block b (activation scale ys): d for the quants, dm for the mins
// (Q4_K / Q5_K; the reference negates it on its vec_dot paths: -(ys * dmin) is the same
// float as its (-ys) * dmin). Products are commutative in IEEE arithmetic, so each order
// the reference writes gives these bits.
template <DType T> __device__ __forceinline__ void ref_factors(const uint8_t *b, float ys, float &d, float &dm) {
  dm = 0.0f;
  if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    const uint32_t w = ld_word(b);
    d = ys * h2f_bits(w);
    dm = ys * h2f_bits(w >> 16);
  } else if constexpr (T == DType::Q6_K) {
    d = ys * h2f_at2(b + 208);
  } else {
    d = ys * h2f_at2(b);
  }
}

// Folds one chunk of a row (ne elements from block bytes cb; activations from element x0
// of xa) into the row's accumulators, in passes of 4 fold blocks: lane 8g + k computes piece
// (block 4r + g, lane k) and the block's factors, ring_fold steps the chains. Accumulators
// live in lanes 0..7 (ref_finish): the reference's float lane k in lane k of acc; the min
// lanes (Q4_K vec_dot: lanes 0..3, Q5_K: lane 0) in accm; Q4_K repacked: lane 0 of acc the
// quants, lane 1 the mins (accm unused). Every lane of the warp must call it (shuffles); ne,
// repack: warp-uniform.
template <DType T, int CH, class XA>
__device__ __forceinline__ void ref_chunk(const uint8_t *cb, int ne, int x0, const XA &xa, bool repack, float &acc, float &accm) {
  constexpr int FB = ref_fold_elems<T>, BS = BlockInfo<T>::bytes, NFB = CH / FB, NPL = NFB * 8 / 32;
  static_assert(NFB % 4 == 0, "a warp pass covers 4 fold blocks");
  const int lane = threadIdx.x & 31, k = lane & 7, nfb = ne / FB;
#pragma unroll
  for (int r = 0; r < NPL; ++r) {
    if (4 * r >= nfb) break;
    const int i = (lane >> 3) + 4 * r, nb = min(4, nfb - 4 * r);
    if constexpr (T == DType::Q4_K) {
      if (repack) {
        float d;
        const int v = q4k_repack_sums(cb + i * BS, xa.fold(x0 + i * FB), i < nfb ? xa.scale(x0 + i * FB) : 0.0f, k, i < nfb, d);
        acc = ring_fold(acc, v, d, nb);
        continue;
      }
    }
    int pq = 0, pm = 0;
    float pd = 0.0f, pdm = 0.0f;
    if (i < nfb) {
      ref_piece<T>(cb + i * BS, xa.fold(x0 + i * FB), k, pq, pm);
      ref_factors<T>(cb + i * BS, xa.scale(x0 + i * FB), pd, pdm);
    }
    acc = ring_fold(acc, pq, pd, nb);
    if constexpr (T == DType::Q4_K) {
      accm = ring_fold(accm, pm, -pdm, nb);  // lane kk < 4: the min pair kk
    } else if constexpr (T == DType::Q5_K) {
      accm = ring_fold(accm, lanes_sum<4>(pm), -pdm, nb);  // one min sum per block
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

// The row's dot product from ref_chunk's accumulators (lanes 0..7): the reference's 8-lane
// tree ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)), then its min term; Q4_K repacked:
// quants minus mins. Every lane must call it and gets lane 0's result.
template <DType T> __device__ __forceinline__ float ref_finish(float acc, float accm, bool repack) {
  if constexpr (T == DType::Q4_K) {
    if (repack) return __shfl_sync(0xffffffffu, acc, 0) - __shfl_sync(0xffffffffu, acc, 1);
  }
  float s = acc + __shfl_xor_sync(0xffffffffu, acc, 4);
  s = s + __shfl_xor_sync(0xffffffffu, s, 2);
  s = s + __shfl_xor_sync(0xffffffffu, s, 1);
  if constexpr (T == DType::Q4_K) {  // (m0 + m2) + (m1 + m3), lane kk holding m_kk
    float m = accm + __shfl_xor_sync(0xffffffffu, accm, 2);
    m = m + __shfl_xor_sync(0xffffffffu, m, 1);
    s = s + m;
  } else if constexpr (T == DType::Q5_K) {
    s = s + accm;
  }
  return __shfl_sync(0xffffffffu, s, 0);
}

}  // namespace moe
