// Tiled attention for MLA on f16 tensor cores (mma.sync m16n8k16, f32 accumulators), for
// prefill and decode alike: every q head shares the one latent KV head, K rows are 576 wide
// ([latent 512 | rope 64]) and V is the first 512 values of the same row, so one shared tile
// serves both products and every K row is read once per block for all the heads.
//
// A block of 8 warps owns 64 (token, head) rows and walks the cells in tiles of 64:
//  * q (rounded to f16, as the reference does for an F16 cache) stays in shared memory for
//    the whole block (too wide for registers: 36 k-steps);
//  * S = q K^T: warp (rg, half) computes rows 16 rg.., cells 32 half.. of the tile, so S is
//    computed once (no per-V-slice recomputation, which would repeat the 576-wide dots);
//  * the two halves of a row meet through shared memory: each warp publishes its row maxima,
//    both warps of a row group then apply the same running max, and P (f16) goes to shared;
//  * O += P V: warp (rg, half) owns rows 16 rg.., output dims 256 half.. (128 f32
//    accumulators per thread), reading P and the V part of the K tile with ldmatrix.
// Tiles no row can see are skipped before any load; splits of the cells (grid z) write
// partials merged by mla_combine_kernel (decode: one row tile, up to 16 splits of whole tiles,
// at least GpuTuning::mla_split_cells cells each; splits without cells exit at once, and at a
// depth of one split that block writes the output and the combine has nothing to do).
// Launched with launch_pdl: nothing is read before pdl_wait().
//
// Resources: dynamic shared memory 158,720 B (q 74,752 + K 74,752 + P 9,216) + 2 KB static:
// one block (8 warps) per SM on sm_87 (163 KB per block) and sm_90 (227 KB); registers are
// capped at 255 by __launch_bounds__(256, 1).
#include "backends/cuda/ops/attention_mla.cuh"

#include <algorithm>

#include "backends/cuda/ops/arch_guard.cuh"
#include "backends/cuda/ops/mma_common.cuh"
#include "backends/cuda/ops/pdl.cuh"

namespace moe {

namespace {

using mma_tile::cp_async_16;
using mma_tile::cp_async_commit_wait_all;
using mma_tile::ldmatrix_x4;
using mma_tile::ldmatrix_x4_trans;

constexpr int kDk = 576;        // K row: latent 512 + rope 64
constexpr int kDv = 512;        // V: the latent
constexpr int kRows = 64;       // (token, head) rows per block: 4 row groups of 16
constexpr int kCells = 64;      // cells per tile: 2 halves of 32 in the S phase
constexpr int kThreads = 256;   // 8 warps: 4 row groups x 2 halves
constexpr int kLdk = kDk + 8;   // halves per s_q / s_k row: 1,168 B, so the 8 rows of an ldmatrix phase hit distinct banks
constexpr int kLdp = kCells + 8;
constexpr int kKs = kDk / 16;             // k-steps of q K^T
constexpr int kNbWarp = kCells / 2 / 8;   // 8-cell score blocks per warp
constexpr int kNdWarp = kDv / 2 / 8;      // 8-dim output blocks per warp
constexpr int kChunks = kDk / 8;          // 16-byte chunks per K row
constexpr int kQVecs = kRows * kDk / 4;   // float4 of the q tile
constexpr int kQBatch = 12;               // float4 loads in flight per thread
constexpr size_t kSmemQ = static_cast<size_t>(kRows) * kLdk * 2;
constexpr size_t kSmemK = static_cast<size_t>(kCells) * kLdk * 2;
constexpr size_t kSmemBytes = kSmemQ + kSmemK + static_cast<size_t>(kRows) * kLdp * 2;
constexpr int64_t kMaxSplit = 16;
constexpr int64_t kPlannedSms = 132;  // the work buffer is sized for an H200; fewer splits fit any device
static_assert(kKs % 2 == 0 && kNdWarp % 2 == 0, "ldmatrix.x4 serves two k-steps / two output blocks");
static_assert(kCells * kChunks % kThreads == 0, "K tile copy must divide evenly");
static_assert(kQVecs % (kQBatch * kThreads) == 0, "q tile load must divide evenly");

// Cells per split: the cells dealt evenly to the n_split blocks in whole tiles, but at least
// min_cells (GpuTuning::mla_split_cells, a multiple of the tile), so a short cache (decode at
// small depth) runs in fewer blocks; with one the block writes the output itself and the
// combine launch returns at once. The cache length is read on the device (the grid is fixed
// when a graph is captured).
__device__ __forceinline__ int mla_split_cells(int n_kv, int n_split, int min_cells) {
  const int per = (n_kv + n_split - 1) / n_split;
  return max((per + kCells - 1) / kCells * kCells, min_cells);
}
// The splits that hold cells (>= 1).
__device__ __forceinline__ int mla_used_splits(int n_kv, int n_split, int min_cells) {
  const int chunk = mla_split_cells(n_kv, n_split, min_cells);
  return max(1, (n_kv + chunk - 1) / chunk);
}

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const uint32_t b[2] = {b0, b1};
  mma_tile::mma16816<false>(c, a, b);
}

__global__ void __launch_bounds__(kThreads, 1) attn_mla_kernel(TView q, TView out, AttnArgs a, DevUbatch ub, int T, int n_split,
                                                               float *part, int min_cells) {
#if MOE_CUDA_TENSOR_CORE_CODE
  extern __shared__ __align__(16) uint8_t mla_smem[];
  uint16_t(*s_q)[kLdk] = reinterpret_cast<uint16_t(*)[kLdk]>(mla_smem);  // f16 bits
  uint16_t(*s_k)[kLdk] = reinterpret_cast<uint16_t(*)[kLdk]>(mla_smem + kSmemQ);
  uint16_t(*s_p)[kLdp] = reinterpret_cast<uint16_t(*)[kLdp]>(mla_smem + kSmemQ + kSmemK);
  __shared__ int s_cpos[kCells];
  __shared__ unsigned long long s_cseq[kCells];
  __shared__ int s_rpos[kRows];
  __shared__ unsigned long long s_rbit[kRows];
  __shared__ float s_red[2][kRows];  // per half: row maxima of the tile, at the end the row sums

  pdl_wait();  // everything below reads activations / the cache
  pdl_trigger();
  const int n_kv = *ub.n_kv, used = mla_used_splits(n_kv, n_split, min_cells);
  if (static_cast<int>(blockIdx.z) >= used) return;  // (block-uniform) no cells: the combine reads splits < used only
  if (used == 1) part = nullptr;                       // the one split writes the output

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int rg = warp & 3, half = warp >> 2;
  const int group = a.group, hk = blockIdx.y, z = blockIdx.z;
  const int n_head = gridDim.y * group;
  const int rows = T * group;
  // Row r of the tile is (token (r0 + r) / group, head hk * group + (r0 + r) % group). The
  // last row tiles go first: in a causal chunk they see the most cells.
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  auto q_row = [&](int gr) {
    return reinterpret_cast<const float *>(static_cast<const uint8_t *>(q.data) + (hk * group + gr % group) * q.nb[1] +
                                           (gr / group) * q.nb[2]);
  };

  if (tid < kRows) {
    const int gr = r0 + tid;
    const bool ok = gr < rows;
    s_rpos[tid] = ok ? ub.pos[gr / group] : -1;
    s_rbit[tid] = ok ? 1ull << ub.seq[gr / group] : 0ull;  // 0: sees nothing
  }
  // q tile: 36 float4 per thread, loaded in batches of kQBatch before any is stored, so
  // the L2 latency is paid 3 times rather than 36 (the launcher checks 16-byte alignment).
  for (int e0 = 0; e0 < kQVecs; e0 += kQBatch * kThreads) {
    float4 x[kQBatch];
#pragma unroll
    for (int b = 0; b < kQBatch; ++b) {
      const int e = e0 + b * kThreads + tid, r = e / (kDk / 4), gr = r0 + r;
      x[b] = gr < rows ? reinterpret_cast<const float4 *>(q_row(gr))[e % (kDk / 4)] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int b = 0; b < kQBatch; ++b) {
      const int e = e0 + b * kThreads + tid, r = e / (kDk / 4), d = 4 * (e % (kDk / 4));
      *reinterpret_cast<uint2 *>(&s_q[r][d]) = make_uint2(mma_tile::pack2<false>(x[b].x, x[b].y), mma_tile::pack2<false>(x[b].z, x[b].w));
    }
  }
  // This thread's fragment rows: 16 rg + g (i = 0) and + 8 (i = 1).
  int rpos[2];
  unsigned long long rbit[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int gr = r0 + 16 * rg + g + 8 * i;
    const bool ok = gr < rows;
    rpos[i] = ok ? ub.pos[gr / group] : -1;
    rbit[i] = ok ? 1ull << ub.seq[gr / group] : 0ull;
  }

  float o[kNdWarp][4];
#pragma unroll
  for (int nd = 0; nd < kNdWarp; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nd][e] = 0.0f;
  float M[2] = {-INFINITY, -INFINITY};  // running row max, the same in both halves' warps
  float S[2] = {0.0f, 0.0f};            // this thread's share of the row sums (its cells)

  // Warps whose 16 rows are all past the end (short chunks, decode) skip their mma work; they
  // still take part in every barrier and write zero probabilities.
  const bool live = r0 + 16 * rg < rows;
  const int cw = 32 * half;   // this warp's first cell of a tile (S phase)
  const int dw = 256 * half;  // this warp's first output dim (P V phase)
  const uint8_t *kbase = a.kbase + hk * a.khb;
  const int chunk = mla_split_cells(n_kv, n_split, min_cells);
  const int c_begin = min(n_kv, z * chunk), c_end = min(n_kv, c_begin + chunk);
  // Cell state of the next tile, fetched one tile ahead (threads tid < kCells: cell c0 + tid)
  // so its latency overlaps the current tile.
  int next_pos = -1;
  unsigned long long next_seq = 0ull;
  if (tid < kCells && c_begin + tid < c_end) {
    next_pos = ub.cell_pos[c_begin + tid];
    next_seq = ub.cell_seq[c_begin + tid];
  }
  for (int c0 = c_begin; c0 < c_end; c0 += kCells) {
    __syncthreads();  // the previous tile's readers are done (first pass: publishes s_q, s_rpos, s_rbit)
    if (tid < kCells) {
      s_cpos[tid] = next_pos;
      s_cseq[tid] = next_seq;
      const int c = c0 + kCells + tid;
      next_pos = c < c_end ? ub.cell_pos[c] : -1;
      next_seq = c < c_end ? ub.cell_seq[c] : 0ull;
    }
    __syncthreads();
    bool any = false;
    for (int e = tid; e < kRows * kCells && !any; e += kThreads) {
      const int r = e / kCells, j = e % kCells;
      any = attn_visible(s_cpos[j], s_cseq[j], s_rbit[r], s_rpos[r], a.window);
    }
    if (!__syncthreads_or(any)) continue;  // uniform: no row sees this tile

    // K tile (zeros for free cells and cells past this split, so nothing uninitialised
    // meets a zero probability).
    for (int e = tid; e < kCells * kChunks; e += kThreads) {
      const int j = e / kChunks, ch = e % kChunks;
      if (s_cpos[j] >= 0) cp_async_16(&s_k[j][ch * 8], kbase + static_cast<size_t>(c0 + j) * a.krb + ch * 16);
      else *reinterpret_cast<uint4 *>(&s_k[j][ch * 8]) = make_uint4(0, 0, 0, 0);
    }
    cp_async_commit_wait_all();
    __syncthreads();

    // S = q K^T for rows 16 rg.., cells cw... A from s_q: matrices (rows 0-7 | 8-15) x
    // (k 0-7 | 8-15); B from s_k: matrix m = cells nb*8.., dims 16 ks + 8 m.. -> B of k-steps
    // ks (m = 0, 1) and ks + 1 (m = 2, 3).
    float s[kNbWarp][4];
#pragma unroll
    for (int nb = 0; nb < kNbWarp; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nb][e] = 0.0f;
    if (live) {
#pragma unroll 2
      for (int ks = 0; ks < kKs; ks += 2) {
        uint32_t qa0[4], qa1[4];
        ldmatrix_x4(qa0, &s_q[16 * rg + (lane & 15)][16 * ks + 8 * (lane >> 4)]);
        ldmatrix_x4(qa1, &s_q[16 * rg + (lane & 15)][16 * ks + 16 + 8 * (lane >> 4)]);
#pragma unroll
        for (int nb = 0; nb < kNbWarp; ++nb) {
          uint32_t b[4];
          ldmatrix_x4(b, &s_k[cw + nb * 8 + (lane & 7)][16 * ks + 8 * (lane >> 3)]);
          mma(s[nb], qa0, b[0], b[1]);
          mma(s[nb], qa1, b[2], b[3]);
        }
      }
    }

    // Scale and mask (f32); C fragment e of block nb is row 16 rg + g + 8 (e / 2), cell
    // cw + nb*8 + 2 tq + e % 2. The 4 lanes of a quad hold the same two rows.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < kNbWarp; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1, j = cw + nb * 8 + 2 * tq + (e & 1);
        const float v = attn_visible(s_cpos[j], s_cseq[j], rbit[i], rpos[i], a.window) ? s[nb][e] * a.scale : -INFINITY;
        s[nb][e] = v;
        mx[i] = fmaxf(mx[i], v);
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      if (tq == 0) s_red[half][16 * rg + g + 8 * i] = mx[i];
    }
    __syncthreads();  // both halves' maxima
    float corr[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = 16 * rg + g + 8 * i;
      const float newM = fmaxf(M[i], fmaxf(s_red[0][r], s_red[1][r]));
      corr[i] = newM == -INFINITY ? 1.0f : expf(M[i] - newM);  // 0 when M was -inf
      M[i] = newM;
      S[i] *= corr[i];
    }
#pragma unroll
    for (int nb = 0; nb < kNbWarp; ++nb)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float p0 = s[nb][2 * i] == -INFINITY ? 0.0f : expf(s[nb][2 * i] - M[i]);
        const float p1 = s[nb][2 * i + 1] == -INFINITY ? 0.0f : expf(s[nb][2 * i + 1] - M[i]);
        S[i] += p0 + p1;
        *reinterpret_cast<uint32_t *>(&s_p[16 * rg + g + 8 * i][cw + nb * 8 + 2 * tq]) = mma_tile::pack2<false>(p0, p1);
      }
#pragma unroll
    for (int nd = 0; nd < kNdWarp; ++nd) {
      o[nd][0] *= corr[0];
      o[nd][1] *= corr[0];
      o[nd][2] *= corr[1];
      o[nd][3] *= corr[1];
    }
    __syncthreads();  // P complete (both halves)

    // O += P V for rows 16 rg.., dims dw... A from s_p like q above; B from the K tile's
    // first 512 dims, transposed: matrix m = cells 16 kc + 8 (m & 1).., dims dw + 8 (nd + m / 2)..
    // -> B of output blocks nd (m = 0, 1) and nd + 1 (m = 2, 3).
    if (live) {
#pragma unroll
      for (int kc = 0; kc < kCells / 16; ++kc) {
        uint32_t pa[4];
        ldmatrix_x4(pa, &s_p[16 * rg + (lane & 15)][16 * kc + 8 * (lane >> 4)]);
#pragma unroll
        for (int nd = 0; nd < kNdWarp; nd += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, &s_k[16 * kc + (lane & 7) + 8 * ((lane >> 3) & 1)][dw + nd * 8 + 8 * (lane >> 4)]);
          mma(o[nd], pa, b[0], b[1]);
          mma(o[nd + 1], pa, b[2], b[3]);
        }
      }
    }
  }

  // Row sums: the quad, then the two halves (every reader of the tile maxima in s_red has
  // passed the P barrier of the last tile, or no tile ran).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    S[i] += __shfl_xor_sync(0xffffffffu, S[i], 1);
    S[i] += __shfl_xor_sync(0xffffffffu, S[i], 2);
    if (tq == 0) s_red[half][16 * rg + g + 8 * i] = S[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = 16 * rg + g + 8 * i, gr = r0 + r;
    if (gr >= rows) continue;
    const float sum = s_red[0][r] + s_red[1][r];
    const int t = gr / group, h = hk * group + gr % group;
    float f;
    float *dst = attn_row_dst(out, part, a.sinks, t, h, z, n_head, n_split, kDv, M[i], sum, tq == 0 && half == 0, f);
#pragma unroll
    for (int nd = 0; nd < kNdWarp; ++nd) {
      const int d = dw + nd * 8 + 2 * tq;
      dst[d] = o[nd][2 * i] * f;
      dst[d + 1] = o[nd][2 * i + 1] * f;
    }
  }
#else
  __trap();  // sm_75 code: never launched (cuda_paths.h)
#endif
}

// The partials of (head blockIdx.x, token blockIdx.y) of the splits that held cells; none
// to merge where one split wrote the output.
__global__ void mla_combine_kernel(TView out, AttnArgs a, const float *part, int n_split, const int *n_kv, int min_cells) {
  pdl_wait();
  pdl_trigger();
  const int used = mla_used_splits(*n_kv, n_split, min_cells);
  if (used == 1) return;
  attn_combine_row(out, a, part, n_split, blockIdx.x, blockIdx.y, gridDim.x, used);
}

bool mla_shape(int64_t hd_k, int64_t hd_v) { return hd_k == kDk && hd_v == kDv; }

int64_t mla_row_tiles(int64_t T, int64_t n_head, int64_t n_head_kv) { return (T * (n_head / n_head_kv) + kRows - 1) / kRows; }

// Cell splits: about one block per SM in all (one block fills an SM's shared memory).
int64_t mla_splits(int64_t T, int64_t n_head, int64_t n_head_kv, int64_t n_sm) {
  const int64_t blocks = mla_row_tiles(T, n_head, n_head_kv) * n_head_kv;
  return std::min(kMaxSplit, std::max<int64_t>(1, n_sm / std::max<int64_t>(1, blocks)));
}

size_t mla_work(int64_t T, int64_t n_head, int64_t n_split) {
  return n_split > 1 ? static_cast<size_t>(T * n_head * n_split * (kDv + 2)) * 4 : 0;
}

// The kernel's shared memory is above the default 48 KB: the device must allow it per block
// (sm_80 / sm_87 / sm_90 do; sm_86 / sm_89 / sm_120 do not), and the kernel must opt in; its
// code exists from sm_80 on (arch_guard.cuh; the caller checks CudaPaths::tensor_cores).
// smem_optin: the backend's (LaunchStream::smem_optin), an emulated device's where it emulates one.
bool mla_smem_available(int smem_optin) {
  if (static_cast<size_t>(smem_optin) < kSmemBytes + 4096) return false;  // + the static arrays
  MOE_CUDA_CHECK(cudaFuncSetAttribute(attn_mla_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes)));
  return true;
}

}  // namespace

size_t attn_mla_work_size(int64_t T, int64_t n_head, int64_t n_head_kv, int64_t hd_k, int64_t hd_v) {
  if (!mla_shape(hd_k, hd_v) || n_head_kv <= 0 || n_head % n_head_kv) return 0;
  return mla_work(T, n_head, mla_splits(T, n_head, n_head_kv, kPlannedSms));
}

bool attn_mla_launch(const LaunchStream &stream, const TView &q, const TView &out, const AttnArgs &a, const DevUbatch &ub, int T,
                      int n_head_kv, bool v_from_k, float *work, size_t work_size, int n_sm, int split_cells) {
  // 16-byte cp.async of F16 K rows and float4 loads of q: every base and stride must allow them.
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.kbase) | a.krb | a.khb | reinterpret_cast<uintptr_t>(q.data) |
                         static_cast<uintptr_t>(q.nb[1]) | static_cast<uintptr_t>(q.nb[2]);
  const int64_t n_head = static_cast<int64_t>(a.group) * n_head_kv;
  if (!v_from_k || !mla_shape(a.hd_k, a.hd_v) || q.nb[0] != 4 || a.kt != static_cast<int>(DType::F16) || bits % 16 != 0 || a.vbase != a.kbase ||
      a.vhb != a.khb || a.vrb != a.krb || n_head_kv <= 0 || !mla_smem_available(stream.smem_optin))
    return false;
  int64_t n_split = mla_splits(T, n_head, n_head_kv, std::max(1, n_sm));
  while (n_split > 1 && (!work || mla_work(T, n_head, n_split) > work_size)) --n_split;
  float *part = n_split > 1 ? work : nullptr;
  const dim3 grid(static_cast<unsigned>(mla_row_tiles(T, n_head, n_head_kv)), static_cast<unsigned>(n_head_kv),
                  static_cast<unsigned>(n_split));
  const int min_cells = (std::max(split_cells, 1) + kCells - 1) / kCells * kCells;
  launch_pdl(attn_mla_kernel, grid, dim3(kThreads), kSmemBytes, stream, q, out, a, ub, T, static_cast<int>(n_split), part, min_cells);
  if (n_split > 1) {
    const dim3 heads(static_cast<unsigned>(n_head), static_cast<unsigned>(T));
    launch_pdl(mla_combine_kernel, heads, dim3(128), 0, stream, out, a, static_cast<const float *>(part), static_cast<int>(n_split),
               static_cast<const int *>(ub.n_kv), min_cells);
  }
  return true;
}

}  // namespace moe
