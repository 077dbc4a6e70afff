// The extra weight types (quant_extra_decode.cuh) on the int8 tensor-core GEMM
// (matmul_mmq_i8.cu): each 32-weight sub-block decoded by the types' own decoders into int8
// integers q and scales with, exactly (k a power of two, sc a small integer),
//   weight l = (d k) sc q_l (+ m)
// where the CPU's dequantizer gives (quant/iq_decode.cpp, iq4.cpp, q4_1_q5.cpp):
//   type     q_l (int8)                        sc (per 16: sc0, sc1)  d k            m     acts
//   Q4_1     code 0..15                        1                      d              m     Q8_1
//   Q5_0     code - 16, -16..15                1                      d              -     Q8_0
//   Q5_1     code 0..31                        1                      d              m     Q8_1
//   IQ4_NL   kvalues_iq4nl[code], -127..113    1                      d              -     Q8_0
//   IQ4_XS   kvalues_iq4nl[code]               ls - 32, -32..31       d              -     Q8_K
//   IQ3_XXS  +-grid byte, 4..62                2 s + 1, 1..31         d / 4          -     Q8_K
//   IQ3_S    +-grid byte, 1..15                2 s + 1, 1..31         d              -     Q8_K
//   IQ2_XXS  +-grid byte, 8..43                2 s + 1, 1..31         d / 8          -     Q8_K
//   IQ2_XS   +-grid byte, 8..43                2 s + 1 per 16         d / 8          -     Q8_K
//   IQ2_S    +-grid byte, 8..43                2 s + 1 per 16         d / 8          -     Q8_K
//   IQ1_S    8 g +- 1, g in {-1, 0, 1}         2 s + 1, 1..15         d / 8          -     Q8_K
//   IQ1_M    8 g +- 1 (delta sign per 8)       2 s + 1 per 16         d / 8          -     Q8_K
// (IQ2: d (0.5 + s) 0.25 g = (d / 8) (2 s + 1) g; IQ3_XXS: d (0.5 + s) 0.5 g; IQ1: the CPU's
// grid value + delta 1/8 is q / 8.) Every type stages exactly, none keeps the dp4a kernel
// for being inexact. Products, in int32 as the K-quants' (matmul_mmq_i8.cu):
//   32-blocks: per 32 the K step's fold, acc += S (d c) (+ m c X, X the activations' integer
//     sum: the CPU's m * Q8_1 s; |S| <= 32 * 127 * 127 < 2^24);
//   256-blocks: I = sum sc S over the block (|I| <= 8 * 32 * 32 * 127 * 127 = 132e6 < 2^31,
//     IQ4_XS the largest), then acc += (d k c) I; per-16 scales by two k16 mmas as Q6_K's.
// The K step's bytes (I8Raw, regions of the pipeline's shared-memory copies) per type below.
#pragma once
#include <cstdint>

#include "backends/cuda/ops/quant_extra_decode.cuh"

namespace moe {
namespace mmq {

// Regions of raw bytes a K step's staging may read (IQ2_S and IQ3_S use all of them).
constexpr int kI8Regions = 4;

template <DType T> constexpr bool i8_extra = is_extra_type(T);
// Extra types with an additive min (folded per 32 with the activations' integer sums).
template <DType T> constexpr bool i8_min32 = extra_has_min<T>;
// Extra types with two integer scales per 32 (two k16 mmas per sub-block).
template <DType T> constexpr bool i8_extra_per16 = T == DType::IQ2_XS || T == DType::IQ2_S || T == DType::IQ1_M;

template <DType T> struct I8Raw;

// The step's bytes, regions (offset in the row, length) from the block at blk = (k0 / 256) B
// and s4 = (k0 / 64) % 4; chunks(r): the 16-byte chunks covering the region at the worst
// start the block's alignment allows (blocks of 136 and 56 bytes are 8-byte aligned, the
// others 2-byte: a region of L bytes takes ceil((16 - a + L) / 16) chunks).
//   IQ4_XS  (136): header [0, 8) 1, qs [8 + 32 s4, +32) 3
//   IQ2_XXS (66):  d [0, 2) 1, qs [2 + 16 s4, +16) 2
//   IQ2_XS  (74):  d 1, qs [2 + 16 s4, +16) 2, scales [66 + 2 s4, +2) 1
//   IQ2_S   (82):  d 1, qs [2 + 8 s4, +8) 2, signs [34 + 8 s4, +8) 2, qh .. scales [66 + 2 s4, +10) 2
//   IQ3_XXS (98):  d 1, qs [2 + 16 s4, +16) 2, aux [66 + 8 s4, +8) 2
//   IQ3_S   (110): d 1, qs [2 + 16 s4, +16) 2, qh .. signs [66 + 2 s4, 82 + 8 s4) 3, scale [106 + s4, +1) 1
//   IQ1_S   (50):  d 1, qs [2 + 8 s4, +8) 2, qh [34 + 4 s4, +4) 2
//   IQ1_M   (56):  qs [8 s4, +8) 1, qh [32 + 4 s4, +4) 1, scales [48, 56) 1
//   32-blocks (Q4_1 20, Q5_0 22, Q5_1 24, IQ4_NL 18 bytes): the step's one or two blocks, 4.
struct I8Region {
  int off, len, chunks;
};
template <DType T> __host__ __device__ constexpr I8Region extra_region(int r, int s4) {
  constexpr int B = extra_bytes<T>();
  (void)B;
  if constexpr (T == DType::IQ4_XS) {
    return r == 0 ? I8Region{0, 8, 1} : r == 1 ? I8Region{8 + 32 * s4, 32, 3} : I8Region{0, 0, 0};
  } else if constexpr (T == DType::IQ2_XXS) {
    return r == 0 ? I8Region{0, 2, 1} : r == 1 ? I8Region{2 + 16 * s4, 16, 2} : I8Region{0, 0, 0};
  } else if constexpr (T == DType::IQ2_XS) {
    return r == 0 ? I8Region{0, 2, 1} : r == 1 ? I8Region{2 + 16 * s4, 16, 2} : r == 2 ? I8Region{66 + 2 * s4, 2, 1} : I8Region{0, 0, 0};
  } else if constexpr (T == DType::IQ2_S) {
    return r == 0 ? I8Region{0, 2, 1} : r == 1 ? I8Region{2 + 8 * s4, 8, 2} : r == 2 ? I8Region{34 + 8 * s4, 8, 2} : I8Region{66 + 2 * s4, 10, 2};
  } else if constexpr (T == DType::IQ3_XXS) {
    return r == 0 ? I8Region{0, 2, 1} : r == 1 ? I8Region{2 + 16 * s4, 16, 2} : r == 2 ? I8Region{66 + 8 * s4, 8, 2} : I8Region{0, 0, 0};
  } else if constexpr (T == DType::IQ3_S) {
    return r == 0   ? I8Region{0, 2, 1}
           : r == 1 ? I8Region{2 + 16 * s4, 16, 2}
           : r == 2 ? I8Region{66 + 2 * s4, 16 + 6 * s4, 3}
                    : I8Region{106 + s4, 1, 1};
  } else if constexpr (T == DType::IQ1_S) {
    return r == 0 ? I8Region{0, 2, 1} : r == 1 ? I8Region{2 + 8 * s4, 8, 2} : r == 2 ? I8Region{34 + 4 * s4, 4, 2} : I8Region{0, 0, 0};
  } else if constexpr (T == DType::IQ1_M) {
    return r == 0 ? I8Region{8 * s4, 8, 1} : r == 1 ? I8Region{32 + 4 * s4, 4, 1} : r == 2 ? I8Region{48, 8, 1} : I8Region{0, 0, 0};
  } else {
    return r == 0 ? I8Region{0, 2 * B, 4} : I8Region{0, 0, 0};  // a 32-block type (a K tail: one block, fewer bytes)
  }
}

template <DType T> struct I8RawExtra {
  __host__ __device__ static constexpr int chunks(int r) { return extra_region<T>(r, 0).chunks; }
  __device__ static int2 region(int r, int k0, int K) {
    if constexpr (extra_qk<T> == 32) {
      return make_int2((k0 >> 5) * extra_bytes<T>(), (K - k0 >= 64 ? 2 : 1) * extra_bytes<T>());
    } else {
      const I8Region g = extra_region<T>(r, (k0 >> 6) & 3);
      return make_int2((k0 >> 8) * extra_bytes<T>() + g.off, g.len);
    }
  }
};
#define MOE_I8_RAW_EXTRA(TY) \
  template <> struct I8Raw<TY> : I8RawExtra<TY> {};
MOE_I8_RAW_EXTRA(DType::Q4_1)
MOE_I8_RAW_EXTRA(DType::Q5_0)
MOE_I8_RAW_EXTRA(DType::Q5_1)
MOE_I8_RAW_EXTRA(DType::IQ4_NL)
MOE_I8_RAW_EXTRA(DType::IQ4_XS)
MOE_I8_RAW_EXTRA(DType::IQ3_S)
MOE_I8_RAW_EXTRA(DType::IQ3_XXS)
MOE_I8_RAW_EXTRA(DType::IQ2_S)
MOE_I8_RAW_EXTRA(DType::IQ2_XS)
MOE_I8_RAW_EXTRA(DType::IQ2_XXS)
MOE_I8_RAW_EXTRA(DType::IQ1_S)
MOE_I8_RAW_EXTRA(DType::IQ1_M)
#undef MOE_I8_RAW_EXTRA

// Sub-block h (0, 1) of the K step at k0 from p[r] = region r's first byte (the regions above).
template <DType T> __device__ __forceinline__ void extra_sub_regions(const uint8_t *const (&p)[kI8Regions], int k0, int h, SubBlock &b) {
  const int s4 = (k0 >> 6) & 3, ib = 2 * s4 + h;
  b.m = 0.0f;
  b.ls0 = b.ls1 = 1;
  if constexpr (extra_qk<T> == 32) {
    decode_block32<T>(p[0], h, b);
  } else if constexpr (T == DType::IQ4_XS) {
    iq4xs_sub(p[0], p[1] + 16 * h, ib, b);
  } else if constexpr (T == DType::IQ2_XXS) {
    iq2xxs_sub(p[0], p[1] + 8 * h, b);
  } else if constexpr (T == DType::IQ2_XS) {
    iq2xs_sub(p[0], p[1] + 8 * h, p[2] + h, b);
  } else if constexpr (T == DType::IQ2_S) {
    iq2s_sub(p[0], p[1] + 4 * h, p[2] + 4 * h, p[3] + h, p[3] + 8 + h, b);
  } else if constexpr (T == DType::IQ3_XXS) {
    iq3xxs_sub(p[0], p[1] + 8 * h, p[2] + 4 * h, b);
  } else if constexpr (T == DType::IQ3_S) {
    iq3s_sub(p[0], p[1] + 8 * h, p[2] + h, p[2] + 8 + 6 * s4 + 4 * h, p[3], ib, b);
  } else if constexpr (T == DType::IQ1_S) {
    iq1s_sub(p[0], p[1] + 4 * h, p[2] + 2 * h, b);
  } else {
    static_assert(T == DType::IQ1_M, "an extra type");
    iq1m_sub(p[0] + 4 * h, p[1] + 2 * h, p[2], ib, b);
  }
}

}  // namespace mmq
}  // namespace moe
