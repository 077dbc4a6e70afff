// Tensor-core GEMM for MatMul / MatMulId with many columns (prefill). The pre-rounded f32
// activations are first copied to f16 (bf16 for BF16 weights) rows padded with zeros to a
// multiple of 64. Then a block of 8 warps computes a 128 (weight rows) x 64 (columns)
// output tile: per 64-wide K step it decodes the weight tile into shared memory as f16
// (RawF16<T> where it exists, else dequant32<T> rounded), loads the activation tile beside
// it, and runs mma.sync m16n8k16 with f32 accumulators (each warp 32 x 32).
// F16 / BF16 weights are copied as they are and meet activations already rounded to that
// type (bf16 mma for BF16), so their products are exact; quantized weights and their
// Q8-rounded activations are rounded to f16 (~5e-4 relative per term).
// MatMulId: a block's columns are one routing tile (one expert, <= 64 entries), gathered
// through entries[].x and scattered through entries[].y; all experts in one launch.
#include <algorithm>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops/matmul_mma.h"
#include "backends/cuda/ops/dequant_f16.cuh"
#include "backends/cuda/ops/quant.cuh"

namespace moe {

namespace {

constexpr int kBM = 128;       // weight rows per block
constexpr int kBN = kMmaCols;  // columns per block
constexpr int kBK = 64;        // K per step: two 32-wide sub-blocks per weight row
constexpr int kThreads = 256;  // 8 warps: 4 along the rows x 2 along the columns
// Shared-memory row stride in 16-bit elements. The 16 extra bytes put the 8 rows an
// ldmatrix phase reads (and the rows a quarter-warp stores) on distinct bank quads.
constexpr int kLd = kBK + 8;

static_assert(kThreads == 2 * kBM, "weight loader: one thread per (row, 32-wide half of the K step)");
static_assert(kThreads * 16 == kBN * kBK, "activation loader: 16 elements per thread");

int64_t padded_k(int64_t K) { return (K + kBK - 1) / kBK * kBK; }

// Two values as one 32-bit operand register, the lower k index in the low half (one
// cvt.rn.{f16,bf16}x2.f32).
template <bool BF> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (BF) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&u, &v, 4);
  }
  return u;
}

// Thread -> (row tid / 2, elements k0 + 32 * (tid % 2) .. +31) of the weight tile. Rows past
// M and elements past K are zero (K of a quantized type is a multiple of 32, so its
// sub-blocks are either whole or absent). This is the decode-at-load path of the types
// without RawF16.
template <DType T>
__device__ __forceinline__ void fetch_weights(uint32_t *p, const uint8_t *W, int64_t row_bytes, int row0, int M, int K, int k0,
                                              bool vec_ok) {
  const int row = row0 + (threadIdx.x >> 1);
  const int kb = k0 + (threadIdx.x & 1) * 32;
  if (row >= M || kb >= K) {
#pragma unroll
    for (int i = 0; i < 16; ++i) p[i] = 0;
    return;
  }
  const uint8_t *wrow = W + static_cast<int64_t>(row) * row_bytes;
  if constexpr (is_plain(T)) {
    static_assert(T != DType::F32, "F32 weights stay on the exact f32 kernel");
    const uint16_t *src = reinterpret_cast<const uint16_t *>(wrow) + kb;
    if (vec_ok && kb + 32 <= K) {
      const uint4 *s4 = reinterpret_cast<const uint4 *>(src);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 v = __ldg(s4 + q);
        p[4 * q] = v.x; p[4 * q + 1] = v.y; p[4 * q + 2] = v.z; p[4 * q + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const uint32_t lo = kb + 2 * i < K ? src[2 * i] : 0u, hi = kb + 2 * i + 1 < K ? src[2 * i + 1] : 0u;
        p[i] = lo | (hi << 16);
      }
    }
  } else {
    float w[32];
    dequant32<T>(wrow, kb / 32, w);
#pragma unroll
    for (int i = 0; i < 16; ++i) p[i] = pack2<false>(w[2 * i], w[2 * i + 1]);
  }
}

// This thread's share of the weight tile of one K step: load() issues the reads, decode()
// writes the 16 f16 pairs. Types with RawF16 keep raw bytes in between (the GEMM runs its
// mma there); the others decode at load time.
template <DType T, bool kRaw = has_raw_f16<T>> struct WeightFetch {
  uint32_t p[16];
  __device__ __forceinline__ void load(const uint8_t *W, int64_t row_bytes, int row0, int M, int K, int k0, bool vec_ok) {
    fetch_weights<T>(p, W, row_bytes, row0, M, K, k0, vec_ok);
  }
  __device__ __forceinline__ void decode(uint32_t *out) const {
#pragma unroll
    for (int i = 0; i < 16; ++i) out[i] = p[i];
  }
};
template <DType T> struct WeightFetch<T, true> {
  RawF16<T> raw;
  bool valid;  // row < M and the sub-block inside K
  __device__ __forceinline__ void load(const uint8_t *W, int64_t row_bytes, int row0, int M, int K, int k0, bool) {
    const int row = row0 + (threadIdx.x >> 1);
    const int kb = k0 + (threadIdx.x & 1) * 32;
    valid = row < M && kb < K;
    if (valid) raw.load(W + static_cast<int64_t>(row) * row_bytes, kb / 32);
  }
  __device__ __forceinline__ void decode(uint32_t *out) const {
    if (valid) {
      raw.decode(out);
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) out[i] = 0;
    }
  }
};

// x16[r][k] = x[r][k] as f16 / bf16 (exact: x was rounded to that type, or to Q8 levels
// that the GEMM rounds to f16 anyway), zeros for K <= k < Kp. One thread per 8 elements.
template <bool BF> __global__ void act_to_16bit_kernel(const float *x, int64_t rows, int K, int Kp, uint4 *x16) {
  const int64_t n8 = rows * (Kp / 8);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n8; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / (Kp / 8);
    const int k = static_cast<int>(i % (Kp / 8)) * 8;
    const float *src = x + r * K;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = k + e < K ? src[k + e] : 0.0f;
    x16[i] = make_uint4(pack2<BF>(v[0], v[1]), pack2<BF>(v[2], v[3]), pack2<BF>(v[4], v[5]), pack2<BF>(v[6], v[7]));
  }
}

// Thread -> (column tid / 4, elements k0 + 16 * (tid % 4) .. +15) of the activation tile,
// from the padded 16-bit copy (always in bounds: k0 + 64 <= Kp). xrow < 0 (a column past
// the tile's count) is zero.
__device__ __forceinline__ void fetch_acts(uint32_t *p, const uint16_t *X16, int xrow, int Kp, int k0) {
  if (xrow < 0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) p[i] = 0;
    return;
  }
  const uint4 *src = reinterpret_cast<const uint4 *>(X16 + static_cast<int64_t>(xrow) * Kp + k0 + (threadIdx.x & 3) * 16);
  const uint4 a = __ldg(src), b = __ldg(src + 1);
  p[0] = a.x; p[1] = a.y; p[2] = a.z; p[3] = a.w;
  p[4] = b.x; p[5] = b.y; p[6] = b.z; p[7] = b.w;
}

// Asks L2 for the weight bytes this thread will decode at K step k (row bytes are
// proportional to K in every layout, so k * row_bytes / K lies in the block holding element
// k): each step would otherwise wait once for DRAM. Nothing past the row is touched.
__device__ __forceinline__ void prefetch_weights_l2(const uint8_t *W, int64_t row_bytes, int row0, int M, int K, int k) {
  const int row = row0 + (threadIdx.x >> 1);
  const int64_t off = static_cast<int64_t>(k + (threadIdx.x & 1) * 32) * row_bytes / K;
  if (row < M && off < row_bytes) asm volatile("prefetch.L2 [%0];\n" : : "l"(W + static_cast<int64_t>(row) * row_bytes + off));
}

// This thread's 32 weights (16 pairs) and 16 activations (8 pairs) into the tiles.
__device__ __forceinline__ void store_stage(const uint32_t *w, const uint32_t *x, uint16_t (*sA)[kLd], uint16_t (*sB)[kLd]) {
  uint4 *a = reinterpret_cast<uint4 *>(&sA[threadIdx.x >> 1][(threadIdx.x & 1) * 32]);
#pragma unroll
  for (int q = 0; q < 4; ++q) a[q] = make_uint4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
  uint4 *b = reinterpret_cast<uint4 *>(&sB[threadIdx.x >> 2][(threadIdx.x & 3) * 16]);
  b[0] = make_uint4(x[0], x[1], x[2], x[3]);
  b[1] = make_uint4(x[4], x[5], x[6], x[7]);
}

// Four 8x8 16-bit matrices; lane l gives the row address of matrix l / 8, row l % 8, and
// receives in r[j] the elements (row l / 4, columns 2 (l % 4), +1) of matrix j. The memory
// clobber keeps it between the barriers around the shared-memory stores.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t *p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// d += a (16x16, row-major) * b (16x8, column-major); f32 accumulators.
template <bool BF> __device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (BF) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// grid: (ceil(M / 128), column tiles). See launch_mma_matmul for the column tiles.
template <DType T>
__global__ void __launch_bounds__(kThreads, 2) mma_matmul_kernel(const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                                                                  const uint16_t *X16, int Kp, float *Y, int ncols, const int4 *tiles,
                                                                  const int2 *entries) {
  constexpr bool BF = T == DType::BF16;
  // sA[row][k]: weights (mma A, row-major). sB[col][k]: activations (mma B, column-major).
  __shared__ __align__(16) uint16_t sA[kBM][kLd];
  __shared__ __align__(16) uint16_t sB[kBN][kLd];
  __shared__ int s_xrow[kBN], s_yrow[kBN];

  int expert = 0, first = blockIdx.y * kBN, cnt;
  if (tiles) {
    const int4 tl = tiles[blockIdx.y];
    expert = tl.x;
    first = tl.y;
    cnt = tl.z;
  } else {
    cnt = min(kBN, ncols - first);
  }
  if (cnt <= 0) return;  // whole block: before any barrier
  const int tid = threadIdx.x;
  if (tid < kBN) {
    int2 e = make_int2(-1, -1);
    if (tid < cnt) e = entries ? entries[first + tid] : make_int2(first + tid, first + tid);
    s_xrow[tid] = e.x;
    s_yrow[tid] = e.y;
  }
  __syncthreads();

  const int row0 = blockIdx.x * kBM;
  const uint8_t *We = W + expert * expert_bytes;
  const bool w_vec = ((reinterpret_cast<uintptr_t>(W) | static_cast<uintptr_t>(row_bytes) | static_cast<uintptr_t>(expert_bytes)) & 15) == 0;
  const int xrow = s_xrow[tid >> 2];

  const int warp = tid >> 5, lane = tid & 31;
  const int wm = (warp & 3) * 32, wn = (warp >> 2) * 32;  // this warp's 32 x 32 sub-tile
  const int n_live = cnt - wn;                            // its real columns (if > 0)
  const bool live = n_live > 0 && row0 + wm < M;          // warp-uniform: skip padding-only sub-tiles

  float acc[2][4][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][ni][c] = 0.0f;

  // Register-staged pipeline: the next step's loads are issued before this step's mma and
  // decoded after it, so the mma runs while they are in flight (the last step's fetch
  // re-reads the last step, unused).
  WeightFetch<T> wf;
  uint32_t w[16], x[8];
  wf.load(We, row_bytes, row0, M, K, 0, w_vec);
  wf.decode(w);
  fetch_acts(x, X16, xrow, Kp, 0);
  for (int k0 = 0; k0 < K; k0 += kBK) {
    store_stage(w, x, sA, sB);
    __syncthreads();
    const int kn = k0 + kBK < K ? k0 + kBK : k0;
    wf.load(We, row_bytes, row0, M, K, kn, w_vec);
    fetch_acts(x, X16, xrow, Kp, kn);
    prefetch_weights_l2(We, row_bytes, row0, M, K, k0 + 3 * kBK);
    if (live) {
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {
        uint32_t a[2][4], b[4][2];
        // A 16x16 at (wm + 16 mi, kk): matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) = a0..a3.
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) ldmatrix_x4(a[mi], &sA[wm + mi * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
        // B for two 8-column groups: matrices (cols 0-7, k 0-7), (cols 0-7, k 8-15),
        // (cols 8-15, k 0-7), (cols 8-15, k 8-15) = b0, b1 of group 2np, then of 2np + 1.
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t r[4];
          ldmatrix_x4(r, &sB[wn + np * 16 + (lane >> 4) * 8 + (lane & 7)][kk + ((lane >> 3) & 1) * 8]);
          b[2 * np][0] = r[0];
          b[2 * np][1] = r[1];
          b[2 * np + 1][0] = r[2];
          b[2 * np + 1][1] = r[3];
        }
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          if (ni * 8 >= n_live) continue;  // warp-uniform; padding columns only
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) mma16816<BF>(acc[mi][ni], a[mi], b[ni]);
        }
      }
    }
    wf.decode(w);
    __syncthreads();
  }

  if (!live) return;
  // Accumulator c of (mi, ni): row g + 8 (c / 2), column 2 t + (c % 2) of the 16x8 tile.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int m = row0 + wm + mi * 16 + g + 8 * (c >> 1);
        const int n = wn + ni * 8 + 2 * t + (c & 1);
        if (m < M && n < cnt) Y[static_cast<int64_t>(s_yrow[n]) * M + m] = acc[mi][ni][c];
      }
}

}  // namespace

bool cuda_mma_type_supported(DType t) {
  switch (t) {
    case DType::F16: case DType::BF16: case DType::Q4_0: case DType::Q8_0: case DType::MXFP4:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: return true;
    default: return false;
  }
}

size_t mma_matmul_scratch_bytes(int64_t K, int64_t rows) { return static_cast<size_t>(rows * padded_k(K)) * 2; }

void launch_mma_matmul(DType t, cudaStream_t s, const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                       const float *X, int64_t x_rows, void *scratch, float *Y, int ncols, const int4 *tiles, const int2 *entries,
                       int n_col_tiles) {
  if (n_col_tiles <= 0 || M <= 0 || x_rows <= 0) return;
  const int Kp = static_cast<int>(padded_k(K));
  uint16_t *X16 = static_cast<uint16_t *>(scratch);
  const int64_t n8 = x_rows * (Kp / 8);
  const unsigned conv_blocks = static_cast<unsigned>(std::min<int64_t>((n8 + 255) / 256, 8192));
  if (t == DType::BF16) act_to_16bit_kernel<true><<<conv_blocks, 256, 0, s>>>(X, x_rows, K, Kp, reinterpret_cast<uint4 *>(X16));
  else act_to_16bit_kernel<false><<<conv_blocks, 256, 0, s>>>(X, x_rows, K, Kp, reinterpret_cast<uint4 *>(X16));
  MOE_CUDA_LAUNCH_CHECK("act_to_16bit_kernel");
  const dim3 grid(static_cast<unsigned>((M + kBM - 1) / kBM), static_cast<unsigned>(n_col_tiles));
#define MOE_MMA_CASE(TY) \
  case TY: mma_matmul_kernel<TY><<<grid, kThreads, 0, s>>>(W, row_bytes, expert_bytes, K, M, X16, Kp, Y, ncols, tiles, entries); break;
  switch (t) {
    MOE_MMA_CASE(DType::F16)
    MOE_MMA_CASE(DType::BF16)
    MOE_MMA_CASE(DType::Q4_0)
    MOE_MMA_CASE(DType::Q8_0)
    MOE_MMA_CASE(DType::MXFP4)
    MOE_MMA_CASE(DType::Q2_K)
    MOE_MMA_CASE(DType::Q3_K)
    MOE_MMA_CASE(DType::Q4_K)
    MOE_MMA_CASE(DType::Q5_K)
    MOE_MMA_CASE(DType::Q6_K)
    default: fail(Status::Internal, "CUDA tensor-core matmul: type %s not dispatched", dtype_name(t));
  }
#undef MOE_MMA_CASE
  MOE_CUDA_LAUNCH_CHECK("mma_matmul_kernel");
}

}  // namespace moe
