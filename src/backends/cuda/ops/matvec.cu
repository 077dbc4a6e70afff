// Decode mat-vec: one activation column against a weight matrix (MatMul / MatMulId with one
// token), and the fused one-token groups MatMul + Add, gate/up MatMulId + SwiGLU and down
// MatMulId + MoeCombine (+ Add). Memory-bound: a token reads every weight byte once.
//
// A (logical) block of 8 warps owns a few weight rows; a thread block of row pairs holds one
// or two of them (two share the activation rounding: block_groups); the expert products
// (gate/up, down) run 8-warp blocks, three per multiprocessor (matvec_expert_kernel; down
// with two warps per row: down_split). Each warp owns J "jobs" (weight
// rows: a row pair, a gate row and its up row, or one output row of J experts) and walks K in chunks
// of CH elements: for every job it first issues all its coalesced 16-byte loads of two
// chunks' GGUF blocks into registers (aligned down and up to 16 bytes: up to 15 bytes past a
// row's end are read, which weight tensors have as padding, see weight_upload.cpp), then, one job
// at a time, stores them to the warp's shared staging buffer and lets each lane decode
// 32-weight sub-blocks from there with integer dot products against int8 activations.
// The activations are rounded once per thread block into shared memory (int8 + scale per 32,
// exactly the Q8_0 / Q8_K values act_round_kernel produces), while the first chunk's
// weight loads are in flight. Plain weights (F32/F16/BF16) read the activation from global
// memory (rounded elementwise on the fly) and need no staging; nor do Q4_K rows in the
// repacked order from aligned tensors (q4k_direct_dots: each lane loads its own 16-byte
// pieces of the 16-byte aligned blocks). The reference-order types (Q4_K, Q5_K, Q6_K,
// Q8_0) fold in the CPU's float order (matvec_ref_order.cuh).
//
// Launched with programmatic dependent launch (pdl.cuh): a block whose weight rows do not
// depend on expert ids issues its first weight loads (quantized) or an L2 prefetch of its
// rows (plain) before it waits for the previous kernel, so the launch and the first DRAM
// round trip overlap that kernel's tail. Blocks of expert products wait first (the ids are
// an earlier kernel's output).
#include <algorithm>

#include "backends/cuda/cuda_fusion.h"
#include "backends/cuda/ops/act_round_warp.cuh"
#include "backends/cuda/ops/ew_value.cuh"
#include "backends/cuda/ops/kernel_error.cuh"
#include "backends/cuda/ops/matvec.h"
#include "backends/cuda/ops/matvec_common.cuh"
#include "backends/cuda/ops/matmul_ref_order.h"
#include "backends/cuda/ops/matvec_ref_order.cuh"
#include "backends/cuda/ops/matvec_units.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/quant_extra.h"
#include "backends/cuda/ops/ref_math.cuh"

namespace moe {

namespace {

// A logical block is 8 warps; a launch puts one or two of them in a thread block (two share
// one activation rounding: see block_groups). Row indices below count logical blocks.
constexpr int kMvWarps = 8;
constexpr int kMvThreads = kMvWarps * 32;
constexpr int kMvMaxGroups = 2;
constexpr int kMvMaxThreads = kMvMaxGroups * kMvThreads;
constexpr int kMvSmemMax = 48 * 1024;  // no opt-in to larger dynamic shared memory
constexpr int kRowsPlain = kMvWarps * 2;  // a row pair per warp
constexpr int kRowsOne = kMvWarps;        // gate/up and down: one output row per warp

// Kernel shapes: J jobs per warp, chunks of CH elements.
constexpr int kJPair = 2, kChPair = 2048;  // MatMul, MatMulId, + Add, gate/up
constexpr int kJDown = 4, kChDown = 1024;  // down + combine: 4 experts at a time
constexpr int kMvExpertBlocks = 3;  // 8-warp blocks per SM of the expert products (matvec_expert_kernel)

// kModeSplit: F16 / BF16 with few rows: a block takes one row pair and its 8 warps split K,
// so the rows are spread over more multiprocessors. (F32 rows fold in the reference's
// order over the whole K, ref_dot_f32_row: never split.)
// kModeHalves: quantized MatMuls with few rows (an o-proj, 2048 rows of K 4096): a warp's
// two jobs are the two K halves of one row, twice the warps of kModeRows for the same rows.
// kModeDownSettled: kModeDown whose expert ids were written at least two launches earlier
// (FusedGroup::ids_settled): the blocks read them through L2 and issue their first weight
// loads before pdl_wait, overlapping the gate/up kernel's tail.
enum MvMode : int { kModeRows, kModeGateUp, kModeDown, kModeSplit, kModeHalves, kModeDownSettled };

struct MvArgs {
  const uint8_t *w, *w2;   // weights; w2: up of gate/up
  int64_t rb, eb, rb2, eb2;  // row and expert strides (bytes)
  int K, M;
  const uint8_t *x;        // activations, slot s at x + s * x_nb1
  int64_t x_nb1;
  int X;                   // activation slots: 1 (shared) or one per expert slot
  int mode;                // (here, not last: it fills X's padding, see the size check below)
  const int32_t *ids;      // expert ids [n_used] or null (plain MatMul)
  int E, n_used;
  const float *cw;         // combine weights [n_used] (down)
  const float *add;        // residual row [M] or null
  float *y;
  unsigned *err;           // DevUbatch::err: expert ids outside [0, E) are reported
};
// Above 128 bytes of kernel parameters nvcc stops loading MvArgs into registers at entry and
// reads it through the parameter's address everywhere (ld.param [reg + offset]: 20 -> 51 in the
// row-pair kernel's PTX at 136 bytes); that coincided with the o-proj going 6.8 -> 8.5 us on
// the H200 (docs/perf/cuda.md, 2026-11-30 evening).
static_assert(sizeof(MvArgs) <= 128, "MvArgs: keep the kernel parameters within 128 bytes");

constexpr DType act_type(DType t) {
  return t == DType::Q4_0 || t == DType::Q8_0 || t == DType::MXFP4 ? DType::Q8_0 : DType::Q8_K;
}

template <DType T> constexpr int qk() { return BlockInfo<T>::qk; }

// Types whose one-token rows fold in the CPU's float order (matvec_ref_order.cuh; F32:
// ref_dot_f32_row). Their device code takes Cpu = false for final outputs (the LM head,
// cuda_own_order_product): CUDA's own order, instantiated only in matvec_rows8_kernel.
template <DType T> constexpr bool cpu_order_type = ref_order_type<T> || T == DType::F32;
constexpr bool cpu_order_dtype(DType t) { return ref_order_dtype(t) || t == DType::F32; }

// Chunks of a job whose loads are issued together: two for row pairs (a 4096-long row in
// one round trip), one for the down kernel's four experts and for Q6_K (registers for
// matvec_rows8_kernel). The expert kernel keeps one for every type (its register cap).
template <DType T> constexpr int chunks_in_flight(int J) { return T == DType::Q6_K || J > 2 ? 1 : 2; }

// 16-byte loads per lane for one job's chunk: the chunk's blocks plus <= 30 bytes of cover.
template <DType T, int CH> constexpr int loads_per_lane() { return (CH / qk<T>() * BlockInfo<T>::bytes + 30 + 511) / 512; }
template <DType T, int CH> constexpr int stage_bytes() {
  if constexpr (is_plain(T)) return 0;  // plain weights are not staged
  else return loads_per_lane<T, CH>() * 512 + 16;
}

// Rounded Q8_K activations keep a 32-byte gap after every 256 values in shared memory
// (xq_at): the reference-order pieces of a pass (lane 8g + k reading bytes 32g' + 4k of
// block g's values) then hit 32 distinct banks; without the gap the 4 blocks' reads share 8
// banks (4-way conflicts). Q8_K slots hold multiples of 256 values.
__host__ __device__ constexpr int xq_at(DType V, int e) { return V == DType::Q8_K ? e + (e >> 8) * kXqGap : e; }

// Shared memory: [warp staging buffers][int8 x: slots * K, gaps][scale per 32: float][sum per 16: int].
struct MvSmem {
  int xq, xd, xs, total;
};
__host__ __device__ inline MvSmem mv_smem(int stage, int K, int slots, int warps, DType V) {
  MvSmem s;
  s.xq = warps * stage;
  s.xd = s.xq + xq_at(V, slots * K);
  s.xs = s.xd + slots * (K / 32) * 4;
  s.total = s.xs + slots * (K / 16) * 4;
  return s;
}

// Waits for the previous kernel (all reads of activations / ids and all writes come after)
// and lets the next one start its prologue.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

__device__ __forceinline__ uint8_t *dyn_smem() {
  extern __shared__ __align__(16) uint8_t smem[];
  return smem;
}

// Rounds activation slots [first, first + n) into shared memory, the same values as
// act_round_kernel: a warp takes 256 elements (one Q8_K block, eight Q8_0 blocks), a lane 8.
// Every thread of the block must call it (it ends with no barrier; the caller syncs).
template <DType V> __device__ void round_slots(const MvArgs &a, int first, int n, int8_t *xq, float *xd, int *xs) {
  const int K = a.K, ng = (K + 255) / 256;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int t = warp; t < n * ng; t += nw) {
    const int s = t / ng, i0 = (t % ng) * 256 + lane * 8;
    const float *src = reinterpret_cast<const float *>(a.x + (first + s) * a.x_nb1);
    const bool in = i0 < K;  // K % 32 == 0: a lane's 8 values are all in or all out
    float v[8];
    load8_floats(src, i0, in, v);
    int q[8];
    float scale;
    if constexpr (V == DType::Q8_0) {
      float amax = 0.0f;
#pragma unroll
      for (int l = 0; l < 8; ++l) amax = fmaxf(amax, fabsf(v[l]));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      scale = __half2float(__float2half_rn(d));
#pragma unroll
      for (int l = 0; l < 8; ++l) q[l] = static_cast<int>(roundf(v[l] * id));
    } else {
      scale = q8k_round_warp(v, q);
    }
    const int half = half_block_sum(q);
    if (in) {
      reinterpret_cast<uint2 *>(xq + xq_at(V, s * K + i0))[0] = pack_int8x8(q);
      if ((lane & 3) == 0) xd[s * (K / 32) + i0 / 32] = scale;
      if ((lane & 1) == 0) xs[s * (K / 16) + i0 / 16] = half;
    }
  }
}

// Shared-memory views of the rounded activations.
struct XSmem {
  int8_t *q;
  float *d;
  int *s;
};

// Q4_K rows in the repacked gemv order (ref_q4k_repacked) from 16-byte aligned tensors
// without staging: each lane loads its block's 16-byte header and its 16 quant bytes
// (q4k_repack_sums_regs' layout: blocks are 144 = 9 x 16 bytes, so aligned rows keep every
// block aligned) for one chunk of every job, all before the first use. Jobs of one
// activation (row pairs, gate/up) share its reads, pass by pass; chain (job 1 continues job
// 0, as in quant_dots) folds job after job. Arguments as quant_dots'. LateHeads (the
// 80-register kernels): the 16-byte headers are loaded after the rounding instead of with the
// quant bytes (16 fewer registers live across it; the quant loads have brought most of
// their sectors to L1).
template <int J, int CH, bool LateHeads = false>
__device__ void q4k_direct_dots(const MvArgs &a, int K, const uint8_t *const (&wr)[J], const bool (&ok)[J], const int (&xe)[J], bool round_first,
                                bool wait_late, int x_first, int x_n, const XSmem &xm, float (&acc)[J], bool chain) {
  static_assert(CH % 1024 == 0, "whole passes of 4 blocks");
  constexpr int NP = CH / 1024, BS = BlockInfo<DType::Q4_K>::bytes;  // passes per chunk
  const int lane = threadIdx.x & 31, g = lane >> 3, t = lane & 7, nblk = K / 256;
  const XSmemAct<true> xa{xm.q, xm.d, xm.s};
  bool one_x = !chain;  // warp-uniform
#pragma unroll
  for (int k = 1; k < J; ++k) one_x = one_x && xe[k] == xe[0];
  for (int c0 = 0; c0 < K; c0 += CH) {
    const int b0 = c0 / 256;
    uint4 hd[J][NP], qw[J][NP];
    // The block of (job k, pass p) this lane reads (unconditional: a missing block re-reads the row's last one).
    auto blk = [&](int k, int p) { return wr[k] + static_cast<int64_t>(min(b0 + 4 * p + g, nblk - 1)) * BS; };
#pragma unroll
    for (int k = 0; k < J; ++k)
#pragma unroll
      for (int p = 0; p < NP; ++p) {
        if constexpr (!LateHeads) hd[k][p] = __ldg(reinterpret_cast<const uint4 *>(blk(k, p)));
        qw[k][p] = __ldg(reinterpret_cast<const uint4 *>(blk(k, p) + 16 + 16 * t));
      }
    if (round_first && c0 == 0) {
      if (wait_late) pdl_enter();
      round_slots<DType::Q8_K>(a, x_first, x_n, xm.q, xm.d, xm.s);
      __syncthreads();
    }
    if constexpr (LateHeads) {
#pragma unroll
      for (int k = 0; k < J; ++k)
#pragma unroll
        for (int p = 0; p < NP; ++p) hd[k][p] = __ldg(reinterpret_cast<const uint4 *>(blk(k, p)));
    }
    // Step (job k, pass p); x / ys: the activations of the job's block.
    auto step = [&](int k, int p, const Q4kX &x, float ys) {
      const int i0 = b0 + 4 * p;
      const uint32_t h4[4] = {hd[k][p].x, hd[k][p].y, hd[k][p].z, hd[k][p].w}, w4[4] = {qw[k][p].x, qw[k][p].y, qw[k][p].z, qw[k][p].w};
      float d;
      const int v = q4k_repack_sums_regs(h4, w4, x, ys, t, i0 + g < nblk, d);
      const bool cont = chain && k == 1;
      const float f = ring_fold(cont ? acc[0] : acc[k], v, d, min(4, nblk - i0));
      if (cont) acc[0] = f;
      else acc[k] = f;
    };
    auto x_of = [&](int k, int p, Q4kX &x, float &ys) {
      const int i = min(b0 + 4 * p + g, nblk - 1), e = xe[k] + i * 256;  // the block's first element in the slot array
      x = q4k_repack_x(xa.fold(e), t);
      ys = xa.scale(e);
    };
    if (one_x) {
#pragma unroll
      for (int p = 0; p < NP; ++p) {
        if (b0 + 4 * p >= nblk) break;
        Q4kX x;
        float ys;
        x_of(0, p, x, ys);
#pragma unroll
        for (int k = 0; k < J; ++k)
          if (ok[k]) step(k, p, x, ys);  // warp-uniform
      }
    } else {
#pragma unroll
      for (int k = 0; k < J; ++k) {
        if (!ok[k]) continue;  // warp-uniform
#pragma unroll
        for (int p = 0; p < NP; ++p) {
          if (b0 + 4 * p >= nblk) break;
          Q4kX x;
          float ys;
          x_of(k, p, x, ys);
          step(k, p, x, ys);
        }
      }
    }
  }
}

// Whether q4k_direct_dots may read a.w (and a.w2) blocks as 16-byte words: launch-uniform.
__host__ __device__ __forceinline__ bool rows_aligned16(const MvArgs &a) {
  uintptr_t o = reinterpret_cast<uintptr_t>(a.w) | static_cast<uintptr_t>(a.rb) | static_cast<uintptr_t>(a.eb);
  if (a.w2) o |= reinterpret_cast<uintptr_t>(a.w2) | static_cast<uintptr_t>(a.rb2) | static_cast<uintptr_t>(a.eb2);
  return (o & 15) == 0;
}

// Q4_K rows take q4k_direct_dots when they are in the repacked order and 16-byte aligned
// (launch-uniform). Kernels compile either path or both (Q4kPath, quant_dots): the expert
// kernel's register cap holds each path alone without spills, not both in one kernel.
__host__ __device__ __forceinline__ bool q4k_direct(const MvArgs &a) { return ref_q4k_repacked(a.M) && rows_aligned16(a); }
enum Q4kPath : int { kQ4kEither, kQ4kDirect, kQ4kStaged };
template <DType T> constexpr int q4k_staged_or_either() { return T == DType::Q4_K ? kQ4kStaged : kQ4kEither; }

// Lane partial sums of J weight rows (quantized types) against their activation slots.
// jobs' rows: wr[k] (ok[k] false: skipped, acc[k] stays 0), each walked for K elements (a
// multiple of the block size, <= a.K); xe[k]: the element index of its first activation in
// the shared-memory slot array (slot * a.K + offset in the slot).
// round_first: this call rounds the activations (slots [x_first, x_first + x_n)) after the
// first chunk's loads are issued; then every thread of the block must make the call.
// wait_late (with round_first and K > 0): the block has not waited for the previous kernel
// yet and does so right after issuing the first loads (pdl_enter).
// Reference-order types (matvec_ref_order.cuh) keep the reference's float lanes in acc and
// the min accumulators in accm (lane partial sums otherwise; accm unused); chain: job 1 is
// the K half that follows job 0's (kModeHalves with a half of at most one chunk, so job 0's
// whole half is folded first) and continues job 0's accumulators. Cpu: the reference's float
// order (false: CUDA's own, for final outputs); C: chunks in flight (1: registers for the
// 3-blocks-per-SM kernels; the chunks are folded in the same order: the same sums); P: Q4kPath
// (kQ4kStaged: never q4k_direct_dots).
template <DType T, int J, int CH, bool Cpu = cpu_order_type<T>, int C = chunks_in_flight<T>(J), int P = kQ4kEither>
__device__ void quant_dots(const MvArgs &a, int K, const uint8_t *const (&wr)[J], const bool (&ok)[J], const int (&xe)[J],
                           bool round_first, bool wait_late, int x_first, int x_n, uint8_t *stage, const XSmem &xm,
                           float (&acc)[J], float (&accm)[J], bool chain) {
  constexpr int QK = qk<T>(), BS = BlockInfo<T>::bytes, NL = loads_per_lane<T, CH>();
  const int lane = threadIdx.x & 31;
  if constexpr (T == DType::Q4_K && Cpu && P == kQ4kEither) {  // (kQ4kDirect: row_dots calls q4k_direct_dots itself)
    if (q4k_direct(a)) {
      q4k_direct_dots<J, CH, C == 1>(a, K, wr, ok, xe, round_first, wait_late, x_first, x_n, xm, acc, chain);
      return;
    }
  }
  for (int c0 = 0; c0 < K; c0 += C * CH) {
    uint4 buf[C][J][NL];
    int head[C][J];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int cs = c0 + c * CH;
      if (cs >= K) break;  // block-uniform
      const int nbytes = min(CH, K - cs) / QK * BS;
#pragma unroll
      for (int k = 0; k < J; ++k) {
        const uint8_t *p = wr[k] + static_cast<int64_t>(cs / QK) * BS;
        const uint4 *p16 = reinterpret_cast<const uint4 *>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15));
        head[c][k] = static_cast<int>(reinterpret_cast<uintptr_t>(p) & 15);
        const int np = (head[c][k] + nbytes + 15) >> 4;
        // Unconditional loads (so all of them issue at once): lanes past the cover re-read
        // its last piece; skipped jobs read a valid row that is never used.
#pragma unroll
        for (int t = 0; t < NL; ++t) buf[c][k][t] = __ldg(p16 + min(lane + 32 * t, np - 1));
      }
    }
    if (round_first && c0 == 0) {
      if (wait_late) pdl_enter();
      round_slots<act_type(T)>(a, x_first, x_n, xm.q, xm.d, xm.s);
      __syncthreads();
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int cs = c0 + c * CH;
      if (cs >= K) break;
      const int ne = min(CH, K - cs);
#pragma unroll
      for (int k = 0; k < J; ++k) {
        __syncwarp();
#pragma unroll
        for (int t = 0; t < NL; ++t) reinterpret_cast<uint4 *>(stage)[lane + 32 * t] = buf[c][k][t];
        __syncwarp();
        if (!ok[k]) continue;
        const uint8_t *cb = stage + head[c][k];
        const int x0 = xe[k] + cs;
        if constexpr (ref_order_type<T> && Cpu) {
          const bool cont = chain && k == 1;
          float f = cont ? acc[0] : acc[k], fm = cont ? accm[0] : accm[k];
          ref_chunk<T, CH>(cb, ne, x0, XSmemAct<act_type(T) == DType::Q8_K>{xm.q, xm.d, xm.s}, T == DType::Q4_K && ref_q4k_repacked(a.M), f, fm);
          if (cont) {
            acc[0] = f;
            accm[0] = fm;
          } else {
            acc[k] = f;
            accm[k] = fm;
          }
        } else {
          constexpr int UPB = QK / 32;
          for (int u = lane; u < ne / 32; u += 32) {
            const int e = x0 + 32 * u;  // element index in the slot array
            const XSub xsub{xm.q + xq_at(act_type(T), e), xm.d[e / 32], xm.s[e / 16], xm.s[e / 16 + 1]};
            acc[k] += unit_dot<T>(cb + (u / UPB) * BS, u % UPB, xsub);
          }
        }
      }
    }
  }
}

// Lane partial sums of J plain-type rows against f32 activation rows xr[k].
template <DType T, int J>
__device__ void plain_dots(int K, const uint8_t *const (&wr)[J], const bool (&ok)[J], const float *const (&xr)[J], float (&acc)[J]) {
  const int lane = threadIdx.x & 31;
  bool vec = K % 8 == 0;  // warp-uniform
#pragma unroll
  for (int k = 0; k < J; ++k)
    vec = vec && (reinterpret_cast<uintptr_t>(wr[k]) & 15) == 0 && (reinterpret_cast<uintptr_t>(xr[k]) & 15) == 0;
  if (!vec) {
    for (int i = lane; i < K; i += 32)
#pragma unroll
      for (int k = 0; k < J; ++k)
        if (ok[k]) acc[k] += plain_at<T>(wr[k], i) * round_plain<T>(__ldg(xr[k] + i));
    return;
  }
  constexpr int U = J <= 2 ? 4 : 2;  // 8-weight pieces per lane per job in flight (<= 8 per lane)
  // Loads are unconditional (indices clamped into the row; rows of skipped jobs point at a
  // valid row), so all of them issue before the first use; the sums are guarded instead.
  for (int base = 0; base < K; base += 256 * U) {
    float w[J][U][8], x[J][U][8];
#pragma unroll
    for (int k = 0; k < J; ++k)
#pragma unroll
      for (int u = 0; u < U; ++u) load8<T>(wr[k], min(base + 256 * u + 8 * lane, K - 8), w[k][u]);
#pragma unroll
    for (int k = 0; k < J; ++k)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const float4 *p = reinterpret_cast<const float4 *>(xr[k] + min(base + 256 * u + 8 * lane, K - 8));
        const float4 a = __ldg(p), b = __ldg(p + 1);
        x[k][u][0] = a.x; x[k][u][1] = a.y; x[k][u][2] = a.z; x[k][u][3] = a.w;
        x[k][u][4] = b.x; x[k][u][5] = b.y; x[k][u][6] = b.z; x[k][u][7] = b.w;
      }
#pragma unroll
    for (int k = 0; k < J; ++k)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (!ok[k] || base + 256 * u + 8 * lane >= K) continue;
#pragma unroll
        for (int l = 0; l < 8; ++l) acc[k] += w[k][u][l] * round_plain<T>(x[k][u][l]);
      }
  }
}

template <DType T> constexpr int plain_bytes() { return T == DType::F32 ? 4 : 2; }

// kModeSplit: this warp's share [kb, kb + kn) of K, a multiple of 8 (keeps 16-byte alignment).
__device__ __forceinline__ void split_share(int K, int &kb, int &kn) {
  const int kw = ((K + 7) / 8 + 7) / 8 * 8;
  kb = min(K, static_cast<int>(threadIdx.x >> 5) * kw);
  kn = min(K - kb, kw);
}

// kModeSplit: the warps' partial sums of the block's J rows, added in warp order (every
// thread gets them; all threads must call it).
template <DType T, int J>
__device__ void split_dots(const MvArgs &a, const uint8_t *const (&wr)[J], const bool (&ok)[J], int xs0, float (&v)[J]) {
  __shared__ float part[kMvWarps][J];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int kb, kn;
  split_share(a.K, kb, kn);
  constexpr int elem = plain_bytes<T>();
  const float *x = reinterpret_cast<const float *>(a.x + xs0 * a.x_nb1) + kb;
  const uint8_t *w[J];
  const float *xr[J];
  float acc[J];
#pragma unroll
  for (int k = 0; k < J; ++k) {
    w[k] = wr[k] + static_cast<int64_t>(kb) * elem;
    xr[k] = x;
    acc[k] = 0.0f;
  }
  plain_dots<T, J>(kn, w, ok, xr, acc);
#pragma unroll
  for (int k = 0; k < J; ++k) {
    const float s = warp_sum(acc[k]);
    if (lane == 0) part[warp][k] = s;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < J; ++k) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kMvWarps; ++i) s += part[i][k];
    v[k] = s;
  }
}

// kh > 0 (quantized only): job 1 is the second half of job 0's row (kModeHalves): both walk
// kh elements, job 1 from activation kh on (its row pointer already points there).
template <DType T, int J, int CH, bool Cpu = cpu_order_type<T>, int C = chunks_in_flight<T>(J), int P = kQ4kEither>
__device__ __forceinline__ void row_dots(const MvArgs &a, const uint8_t *const (&wr)[J], const bool (&ok)[J], const int (&xslot)[J],
                                         bool round_first, bool wait_late, int x_first, int x_n, uint8_t *stage, const XSmem &xm,
                                         float (&acc)[J], float (&accm)[J], int kh = 0) {
#pragma unroll
  for (int k = 0; k < J; ++k) acc[k] = accm[k] = 0.0f;
  if constexpr (is_plain(T)) {
    const float *xr[J];
#pragma unroll
    for (int k = 0; k < J; ++k) xr[k] = reinterpret_cast<const float *>(a.x + xslot[k] * a.x_nb1);
    if constexpr (T == DType::F32 && Cpu) {  // the whole dot in the reference's order (finish_rows takes it as is)
#pragma unroll
      for (int k = 0; k < J; ++k) acc[k] = ref_dot_f32_row(reinterpret_cast<const float *>(wr[k]), xr[k], a.K);
    } else {
      plain_dots<T, J>(a.K, wr, ok, xr, acc);
    }
  } else {
    int xe[J];
#pragma unroll
    for (int k = 0; k < J; ++k) xe[k] = (xslot[k] - x_first) * a.K + (kh > 0 && k == 1 ? kh : 0);
    const int kn = kh > 0 ? kh : a.K;
    if constexpr (T == DType::Q4_K && Cpu && P == kQ4kDirect) q4k_direct_dots<J, CH>(a, kn, wr, ok, xe, round_first, wait_late, x_first, x_n, xm, acc, kh > 0);
    else quant_dots<T, J, CH, Cpu, C, P>(a, kn, wr, ok, xe, round_first, wait_late, x_first, x_n, stage, xm, acc, accm, kh > 0);
  }
}

// The unfused kModeHalves order for each of J jobs (quantized types outside the reference
// order, where a row's two K halves fold apart): a job's lane sums over its first half and over
// its second half of kh = a.K / 2 elements, added lane by lane (rows_block's acc[0] += acc[1]);
// finish_rows then sums the lanes. The same unit_dot sums per lane as the unfused launch, so the
// bias kernels match an unfused MatMulId that rows_mode sends to kModeHalves bit for bit.
// Arguments as row_dots'.
template <DType T, int J, int CH, int C, int P>
__device__ __forceinline__ void halves_dots(const MvArgs &a, const uint8_t *const (&wr)[J], const bool (&ok)[J], const int (&xslot)[J],
                                            bool round_first, bool wait_late, int x_first, int x_n, uint8_t *stage, const XSmem &xm,
                                            float (&acc)[J]) {
  static_assert(!is_plain(T) && !ref_order_type<T>, "reference-order halves continue one fold: row_dots");
  const int kh = a.K / 2;
  const int64_t hb = static_cast<int64_t>(kh / qk<T>()) * BlockInfo<T>::bytes;
  const uint8_t *wr2[J];
  int xe[J], xe2[J];
  float acc2[J], accm[J], accm2[J];
#pragma unroll
  for (int k = 0; k < J; ++k) {
    xe[k] = (xslot[k] - x_first) * a.K;
    xe2[k] = xe[k] + kh;
    wr2[k] = ok[k] ? wr[k] + hb : wr[k];
    acc[k] = acc2[k] = accm[k] = accm2[k] = 0.0f;
  }
  quant_dots<T, J, CH, false, C, P>(a, kh, wr, ok, xe, round_first, wait_late, x_first, x_n, stage, xm, acc, accm, false);
  quant_dots<T, J, CH, false, C, P>(a, kh, wr2, ok, xe2, false, false, x_first, x_n, stage, xm, acc2, accm2, false);
#pragma unroll
  for (int k = 0; k < J; ++k) acc[k] += acc2[k];
}

// The J jobs' dot products from their accumulators (row_dots); every lane gets them and
// must make the call (shuffles).
template <DType T, int J, bool Cpu = cpu_order_type<T>>
__device__ __forceinline__ void finish_rows(const MvArgs &a, const float (&acc)[J], const float (&accm)[J], float (&v)[J]) {
#pragma unroll
  for (int k = 0; k < J; ++k) {
    if constexpr (ref_order_type<T> && Cpu) v[k] = ref_finish<T>(acc[k], accm[k], T == DType::Q4_K && ref_q4k_repacked(a.M));
    else if constexpr (T == DType::F32 && Cpu) v[k] = acc[k];  // ref_dot_f32_row: already the row's dot in every lane
    else v[k] = warp_sum(acc[k]);
  }
}

// gpt-oss's expert biases (AddId after each expert MatMulId) and SwiGLU-OAI, for the
// bias kernels only (matvec_expert_bias_kernel, matvec_down_bias_kernel): a second kernel
// parameter, because MvArgs is at its 128-byte limit and its fields that gate/up
// leaves unused (cw, add) are too few for two biases plus alpha and limit; the other expert
// kernels are instantiated without it (Bias = false) and keep their code.
// Each product gets bias[e][row] added after its dot, then gate/up takes SwiGLU-OAI and down
// the combine: the unfused AddId, SwiGLU-OAI and MoeCombine kernels' float operations in
// their order.
struct MvBias {
  const float *b;       // gate's (gate/up) or down's bias rows: row e (expert) at b + e * s
  const float *b2;      // up's bias rows (gate/up; null for down)
  int64_t s, s2;        // expert strides of b and b2 (floats)
  float alpha, limit;   // SwiGLU-OAI's (gate/up)
  bool halves;          // host only: launch the Halves kernels (unfused_halves); false: one pass over K
};

// Warps per output row of the down kernel: two where the expert slots take more than one
// pass of J (each warp then folds every other pass: twice the warps, half the serial chain
// per warp), else one. Rows per 8-warp block: kMvWarps / down_split.
__host__ __device__ constexpr int down_split(int n_used, int J) { return n_used > J ? 2 : 1; }

// kModeDown: a row's expert slots in passes of J, the passes dealt to the row's S =
// down_split warps in turn (pass q to warp part q % S); each warp writes its products to
// shared memory (prod: a row of n_used floats per row of the block, after the rounding's
// layout) and, after a barrier, the row's first warp combines them in slot order j = 0, 1, ...
// (the products and their order are those of one warp doing every pass: bit-identical).
// OneWarp: one warp per row whatever the slots (the 16-warp matvec_down_kernel).
// Bias: each expert's product gets its bias row's value added first (MvBias; bias set).
// Halves (with Bias): each product folds K in halves (halves_dots), as its unfused MatMulId.
template <DType T, int J, int CH, int P, bool OneWarp = false, bool Bias = false, bool Halves = false>
__device__ __forceinline__ void down_block(const MvArgs &a, const MvBias *bias = nullptr) {
  // Settled ids (kModeDownSettled, quantized, K > 0 and n_used > 0: the host checks) are read
  // before the wait, through L2 (__ldcg: this SM's L1 may hold an older layer's ids), and the
  // first pass waits after issuing its weight loads (row_dots' wait_late); otherwise wait first.
  const bool settled = !is_plain(T) && a.mode == kModeDownSettled;
  if (!settled) pdl_enter();
  auto id_at = [&](int j) { return settled ? __ldcg(a.ids + j) : a.ids[j]; };
  uint8_t *smem = dyn_smem();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int stage_sz = stage_bytes<T, CH>();
  const int x_n = a.X;
  const MvSmem L = mv_smem(stage_sz, a.K, x_n, blockDim.x >> 5, act_type(T));
  const XSmem xm{reinterpret_cast<int8_t *>(smem + L.xq), reinterpret_cast<float *>(smem + L.xd), reinterpret_cast<int *>(smem + L.xs)};
  uint8_t *stage = smem + warp * stage_sz;
  const int S = OneWarp ? 1 : down_split(a.n_used, J), R = static_cast<int>(blockDim.x >> 5) / S;  // warps per row, rows per block
  const int r = warp % R, part = warp / R;
  const int row = blockIdx.x * R + r;
  float *prod = reinterpret_cast<float *>(smem + (is_plain(T) ? 0 : L.total)) + r * a.n_used;  // plain types: no rounding layout
  const uint8_t *wr[J];
  bool ok[J];
  int xslot[J];
  float acc[J], accm[J], v[J];
  float bv[J];  // Bias: the jobs' bias values, loaded with the pass's first weights
  // The experts of this warp's later passes: their rows into L2 while the first pass loads
  // and computes (the passes' register loads are issued one after another).
  if (row < a.M)
    for (int j0 = (part + S) * J; j0 < a.n_used; j0 += S * J)
      for (int j = j0; j < min(j0 + J, a.n_used); ++j) {
        const int e = id_at(j);
        if (e >= 0 && e < a.E) prefetch_l2(a.w + e * a.eb + static_cast<int64_t>(row) * a.rb, a.rb);
      }
  // Every warp has a first pass (part * J < n_used: down_split), which rounds the activations
  // with the whole block.
  for (int j0 = part * J; j0 < a.n_used; j0 += S * J) {
#pragma unroll
    for (int k = 0; k < J; ++k) {
      const int j = j0 + k;
      const int e = j < a.n_used ? id_at(j) : -1;
      ok[k] = row < a.M && e >= 0 && e < a.E;  // out-of-range experts contribute nothing
      wr[k] = ok[k] ? a.w + e * a.eb + static_cast<int64_t>(row) * a.rb : a.w;
      xslot[k] = a.X == 1 || j >= a.n_used ? 0 : j;
      if constexpr (Bias) bv[k] = ok[k] ? __ldg(bias->b + e * bias->s + row) : 0.0f;
    }
    const bool first = j0 == part * J;
    if constexpr (Halves) halves_dots<T, J, CH, chunks_in_flight<T>(J), P>(a, wr, ok, xslot, first, settled && first, 0, x_n, stage, xm, acc);
    else row_dots<T, J, CH, cpu_order_type<T>, chunks_in_flight<T>(J), P>(a, wr, ok, xslot, first, settled && first, 0, x_n, stage, xm, acc, accm);
    if (blockIdx.x == 0 && threadIdx.x == 0)  // (after the wait: no global write before it)
      for (int j = j0; j < min(j0 + J, a.n_used); ++j)
        if (const int e = a.ids[j]; e < 0 || e >= a.E) report_bad_index(a.err, kKernelErrExpertId, e, a.E);
    finish_rows<T, J>(a, acc, accm, v);
    if (lane == 0) {
#pragma unroll
      for (int k = 0; k < J; ++k)
        if (ok[k]) {
          if constexpr (Bias) prod[j0 + k] = __fadd_rn(v[k], bv[k]);  // (rounded: never an fma with the dot's last product)
          else prod[j0 + k] = v[k];
        }
    }
  }
  __syncthreads();
  if (part == 0 && lane == 0 && row < a.M) {
    // The MoeCombine op's order: the first slot's product, then each next one added (a
    // rounded product, then a rounded sum: no fma); out-of-range experts are skipped.
    float out = 0.0f;
    for (int j = 0; j < a.n_used; ++j) {
      const int e = a.ids[j];
      if (e >= 0 && e < a.E) out = j == 0 ? __fmul_rn(prod[j], a.cw[0]) : __fadd_rn(out, __fmul_rn(prod[j], a.cw[j]));
    }
    a.y[row] = a.add ? out + a.add[row] : out;
  }
}

// kModeRows / kModeGateUp / kModeSplit for thread block bx of the row range (blockIdx.y:
// expert slot); stage_sz: the block's staging bytes per warp (>= stage_bytes<T, kChPair>()).
// kModeSplit runs one logical block per thread block.
// Cpu, C, P: the reference's order, chunks in flight and Q4_K path (quant_dots).
// Bias (kModeGateUp only): gate and up get their bias values added, then SwiGLU-OAI (MvBias);
// Halves (with Bias): both dots fold K in halves (halves_dots), as their unfused MatMulIds.
template <DType T, bool Cpu = cpu_order_type<T>, int C = chunks_in_flight<T>(kJPair), int P = kQ4kEither, bool Bias = false,
          bool Halves = false>
__device__ __forceinline__ void rows_block(const MvArgs &a, unsigned bx, int stage_sz, const MvBias *bias = nullptr) {
  constexpr int J = kJPair, CH = kChPair;
  uint8_t *smem = dyn_smem();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  const MvSmem L = mv_smem(stage_sz, a.K, 1, nw, act_type(T));
  const XSmem xm{reinterpret_cast<int8_t *>(smem + L.xq), reinterpret_cast<float *>(smem + L.xd), reinterpret_cast<int *>(smem + L.xs)};
  uint8_t *stage = smem + warp * stage_sz;
  const uint8_t *wr[J];
  bool ok[J];
  int xslot[J];
  float acc[J], accm[J];
  const int j = blockIdx.y;
  const int xs0 = a.X == 1 ? 0 : j;
  int e = 0;
  bool e_ok = true;
  // Without expert ids the rows are known before the wait: quantized rows wait after their
  // first loads (quant_dots; needs K > 0 to reach it), plain rows after an L2 prefetch.
  const bool wait_late = a.ids == nullptr && !is_plain(T) && a.K > 0;
  if (a.ids) {
    pdl_enter();
    e = a.ids[j];
    e_ok = e >= 0 && e < a.E;
    if (!e_ok && blockIdx.x == 0 && threadIdx.x == 0) report_bad_index(a.err, kKernelErrExpertId, e, a.E);
  }
  const bool gu = a.mode == kModeGateUp, split = a.mode == kModeSplit, halves = a.mode == kModeHalves;
  const bool one_row = gu || halves;  // a warp computes one output row
  const int lb = static_cast<int>(bx) * (nw / kMvWarps) + warp / kMvWarps, wl = warp % kMvWarps;  // logical block, its warp
  const int row0 = one_row ? lb * kRowsOne + wl : split ? lb * J : lb * kRowsPlain + 2 * wl;
  int kh = 0;  // kModeHalves: the first half's length (the host checks K % (2 * block size) == 0)
  int64_t half_bytes = 0;
  if constexpr (!is_plain(T)) {
    if (halves) {
      kh = a.K / 2;
      half_bytes = static_cast<int64_t>(kh / qk<T>()) * BlockInfo<T>::bytes;
    }
  }
#pragma unroll
  for (int k = 0; k < J; ++k) {
    const int row = one_row ? row0 : row0 + k;
    ok[k] = e_ok && row < a.M;
    const uint8_t *base = gu && k == 1 ? a.w2 + e * a.eb2 + static_cast<int64_t>(row) * a.rb2
                                       : a.w + e * a.eb + static_cast<int64_t>(row) * a.rb + (k == 1 ? half_bytes : 0);
    wr[k] = ok[k] ? base : a.w;
    xslot[k] = xs0;
  }
  if constexpr (is_plain(T)) {
    if (!a.ids) {
      int kb = 0, kn = a.K;
      if (split) split_share(a.K, kb, kn);
#pragma unroll
      for (int k = 0; k < J; ++k)
        if (ok[k]) prefetch_l2(wr[k] + static_cast<int64_t>(kb) * plain_bytes<T>(), static_cast<int64_t>(kn) * plain_bytes<T>());
      pdl_enter();
    }
  } else if (!a.ids && !wait_late) {
    pdl_enter();  // K == 0: nothing to load first
  }
  float bg = 0.0f, bu = 0.0f;  // Bias: gate's and up's bias values, loaded before the dots
  if constexpr (Bias) {
    if (e_ok && row0 < a.M) {
      bg = __ldg(bias->b + e * bias->s + row0);
      bu = __ldg(bias->b2 + e * bias->s2 + row0);
    }
  }
  float v[J];
  bool writer = lane == 0;
  if constexpr (is_plain(T)) {
    if (split) {
      split_dots<T, J>(a, wr, ok, xs0, v);
      writer = threadIdx.x == 0;
    }
  }
  if (!split) {
    if constexpr (Halves) {
      halves_dots<T, J, CH, C, P>(a, wr, ok, xslot, true, wait_late, xs0, 1, stage, xm, acc);
    } else {
      row_dots<T, J, CH, Cpu, C, P>(a, wr, ok, xslot, true, wait_late, xs0, 1, stage, xm, acc, accm, kh);
      if (halves && !(ref_order_type<T> && Cpu)) acc[0] += acc[1];  // (reference order: job 1 continued job 0's accumulators)
    }
    finish_rows<T, J, Cpu>(a, acc, accm, v);
  }
  if (writer) {
    float *yj = a.y + static_cast<int64_t>(j) * a.M;
    if (gu) {
      if constexpr (Bias) {  // (the sums rounded: never an fma with the dot's last product)
        if (row0 < a.M) yj[row0] = e_ok ? swiglu_oai_value(__fadd_rn(v[0], bg), __fadd_rn(v[1], bu), bias->alpha, bias->limit) : 0.0f;
      } else {
        if (row0 < a.M) yj[row0] = e_ok ? ref_swiglu(v[0], v[1], row0, a.M) : 0.0f;  // the CPU's SwiGLU bits
      }
    } else if (halves) {
      if (row0 < a.M) yj[row0] = !e_ok ? 0.0f : a.add ? v[0] + a.add[row0] : v[0];
    } else {
#pragma unroll
      for (int k = 0; k < J; ++k) {
        const int row = row0 + k;
        if (row < a.M) yj[row] = !e_ok ? 0.0f : a.add ? v[k] + a.add[row] : v[k];
      }
    }
  }
}

template <DType T, int J, int CH> __global__ void __launch_bounds__(kMvMaxThreads) matvec_kernel(MvArgs a) {
  static_assert(J == kJPair, "row pairs (the expert products take matvec_expert_kernel)");
  rows_block<T>(a, blockIdx.x, stage_bytes<T, CH>());
}

// The same in 8-warp blocks, three per multiprocessor (<= 80 registers: one chunk in flight),
// for grids of 2..3 logical blocks per SM (group_lean): matvec_kernel's 16-warp blocks take 126
// registers, one block per SM, so such a grid runs in 1.4..1.5 waves (gpt-oss's o-proj: 360
// logical blocks on 132 SMs). Same bits as matvec_kernel (chunks in flight change loads only).
template <DType T> __global__ void __launch_bounds__(kMvThreads, 3) matvec_lean_kernel(MvArgs a) {
  rows_block<T, cpu_order_type<T>, 1>(a, blockIdx.x, stage_bytes<T, kChPair>());
}

// The expert products (gate/up + SwiGLU: J = kJPair, down + combine: J = kJDown) in 8-warp
// thread blocks with a register cap that lets kMvExpertBlocks of them share a
// multiprocessor (65536 / (256 x 3) -> 80 registers): 24 resident warps instead of the 16 of
// one 16-warp block at 128 registers. These launches are latency bound (each warp's loads,
// then its serial fold), so more resident warps is more overlap. Grids of a Qwen3-30B-A3B
// layer: gate/up 96 x 8 blocks, down 512 blocks (two warps per row: down_split; the 16-warp
// matvec_down_kernel takes Qwen3's). P: the
// Q4_K path (Q4kPath; the host picks it).
template <DType T, int J, int CH, int P>
__global__ void __launch_bounds__(kMvThreads, kMvExpertBlocks) matvec_expert_kernel(MvArgs a) {
  if constexpr (J == kJDown) down_block<T, J, CH, P>(a);
  else rows_block<T, cpu_order_type<T>, 1, P>(a, blockIdx.x, stage_bytes<T, CH>());  // one chunk in flight: see chunks_in_flight
}

// The expert kernels with gpt-oss's biases (MvBias): the same blocks and device code as
// matvec_expert_kernel / matvec_down_kernel plus the bias adds and SwiGLU-OAI, instantiated
// only for the weight types of bias_type.
// H: Halves (K folded in halves like the unfused kModeHalves launch; see unfused_halves).
template <DType T, int J, int CH, int P, bool H>
__global__ void __launch_bounds__(kMvThreads, kMvExpertBlocks) matvec_expert_bias_kernel(MvArgs a, const __grid_constant__ MvBias bias) {
  if constexpr (J == kJDown) down_block<T, J, CH, P, false, true, H>(a, &bias);
  else rows_block<T, cpu_order_type<T>, 1, P, true, H>(a, blockIdx.x, stage_bytes<T, CH>(), &bias);
}
template <DType T, int J, int CH, int P, bool H>
__global__ void __launch_bounds__(kMvMaxThreads) matvec_down_bias_kernel(MvArgs a, const __grid_constant__ MvBias bias) {
  down_block<T, J, CH, P, true, true, H>(a, &bias);
}

// Down + combine in 16-warp blocks at up to 128 registers, one warp per row: the geometry
// of ff270d2 (2026-11-30), which the H200 ran faster for Qwen3-30B-A3B's 8 slots (ncu, 8-layer model: Q6_K
// 14.3 us, Q4_K 11.6) than the 8-warp expert kernel with two warps per row (17.1 / 15.9).
template <DType T, int J, int CH, int P>
__global__ void __launch_bounds__(kMvMaxThreads) matvec_down_kernel(MvArgs a) {
  down_block<T, J, CH, P, true>(a);
}

// Q6_K rows in 8-warp thread blocks (the LM head: thousands of blocks): at most 85
// registers, so three blocks share a multiprocessor (24 warps, was 16 at 128 registers) and
// one block's loads overlap another's arithmetic. The same device code as matvec_kernel.
// Cpu = false: a final output of a CPU-order type in CUDA's own order (launch_own_order).
template <DType T, bool Cpu = cpu_order_type<T>>
__global__ void __launch_bounds__(kMvThreads, 3) matvec_rows8_kernel(MvArgs a) {
  rows_block<T, Cpu, 1>(a, blockIdx.x, stage_bytes<T, kChPair>());
}

int stage_size(DType t, bool down) {
  switch (t) {
#define MOE_MV_STAGE(TY) \
  case TY: return down ? stage_bytes<TY, kChDown>() : stage_bytes<TY, kChPair>();
    MOE_MV_STAGE(DType::Q4_0)
    MOE_MV_STAGE(DType::Q8_0)
    MOE_MV_STAGE(DType::MXFP4)
    MOE_MV_STAGE(DType::Q2_K)
    MOE_MV_STAGE(DType::Q3_K)
    MOE_MV_STAGE(DType::Q4_K)
    MOE_MV_STAGE(DType::Q5_K)
    MOE_MV_STAGE(DType::Q6_K)
#undef MOE_MV_STAGE
    default: return 0;  // plain types
  }
}

bool type_ok(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q4_0: case DType::Q8_0: case DType::MXFP4:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: return true;
    default: return false;
  }
}

// Dynamic shared memory of a launch with `groups` logical blocks per thread block, or -1
// when it does not fit.
int smem_bytes(DType t, int K, int x_n, bool down, int groups = 1) {
  if (is_plain(t)) return 0;
  if (static_cast<int64_t>(K) * x_n > kMvSmemMax) return -1;
  const int64_t total = mv_smem(stage_size(t, down), K, x_n, groups * kMvWarps, act_type(t)).total;
  return total <= kMvSmemMax ? static_cast<int>(total) : -1;
}

// Logical blocks per thread block. Every thread block rounds the activation, about a third
// of a quantized mat-vec's instructions; two logical blocks in one 16-warp block (at most
// 128 registers a thread, so one such block per multiprocessor holds as many warps as two
// 8-warp blocks) halve that where the grid still has about a block per multiprocessor and
// the staging fits. Grids of many waves (the LM head) keep 8-warp blocks: two per
// multiprocessor drift apart, one loading while the other computes, which a single 16-warp
// block cannot do. Plain types round elementwise from global memory: nothing to share.
struct MvShape {
  int groups, smem;
  bool lean = false;  // groups == 1 in matvec_lean_kernel (launch)
};
MvShape block_groups(DType t, int64_t logical_blocks, int n_sm, int smem1, int smem2) {
  const int64_t sm = n_sm;
  if (!is_plain(t) && smem2 >= 0 && logical_blocks * 16 >= sm * 30 && logical_blocks <= sm * 6) return {2, smem2};
  return {1, smem1};
}

unsigned blocks(int64_t rows, int per_block) { return static_cast<unsigned>((rows + per_block - 1) / per_block); }

// kModeRows or, for quantized matrices whose row pairs give fewer than ~2 logical blocks per
// SM and whose K is an even number of blocks, kModeHalves (twice the warps on the same rows).
// A MatVecs segment decides as its own launch would (bit-identical results).
// Reference-order types fold the halves one after the other: only where each half is one chunk
// (own: a final output, CUDA's own order: any halves).
int rows_mode(DType t, int K, int64_t M, int n_used, int n_sm, bool own = false) {
  const bool few = static_cast<int64_t>(blocks(M, kRowsPlain)) * n_used * 16 < static_cast<int64_t>(n_sm) * 30;
  const bool halves_ok = K % (2 * type_traits(t).block_size) == 0 && (own || !ref_order_dtype(t) || K <= 2 * kChPair);
  return !is_plain(t) && few && halves_ok ? kModeHalves : kModeRows;
}
int rows_per_block(int mode) { return mode == kModeHalves ? kRowsOne : kRowsPlain; }

// Whether the unfused MatMulId of a bias group's product (cuda_matvec -> launch_rows at this
// device's n_sm) folds K in halves that the bias kernels' one pass would not reproduce: the
// types outside the reference order (reference-order halves continue one fold: the same bits).
// The bias launchers then take the Halves kernels (MvBias::halves). gpt-oss-20b's experts
// (K 2880, 2880 rows, 4 slots) take row pairs on the H200: its decode runs the one-pass kernels.
bool unfused_halves(DType t, const MvArgs &a, int n_sm) {
  return a.K > 0 && !ref_order_dtype(t) && rows_mode(t, a.K, a.M, a.n_used, n_sm) == kModeHalves;
}

// A final output of a CPU-order type in CUDA's own order: 8-warp thread blocks (one logical
// block each; grid.x counts them). Returns false for the other types (their one order).
bool launch_own_order(DType t, dim3 grid, int smem, const LaunchStream &s, const MvArgs &a) {
  const dim3 block(kMvThreads);
  switch (t) {
#define MOE_MV_OWN_CASE(TY) \
  case TY: launch_pdl(matvec_rows8_kernel<TY, false>, grid, block, static_cast<size_t>(smem), s, a); return true;
    MOE_MV_OWN_CASE(DType::F32)
    MOE_MV_OWN_CASE(DType::Q8_0)
    MOE_MV_OWN_CASE(DType::Q4_K)
    MOE_MV_OWN_CASE(DType::Q5_K)
    MOE_MV_OWN_CASE(DType::Q6_K)
#undef MOE_MV_OWN_CASE
    default: return false;
  }
}


// The weight types of the mat-vec kernels (X: a macro taking one DType).
#define MOE_MV_TYPES(X)                                                                                     \
  X(DType::F32) X(DType::F16) X(DType::BF16) X(DType::Q4_0) X(DType::Q8_0) X(DType::MXFP4) X(DType::Q2_K) \
  X(DType::Q3_K) X(DType::Q4_K) X(DType::Q5_K) X(DType::Q6_K)

// The weight types of the bias kernels (matvec_expert_bias_kernel): gpt-oss's experts, MXFP4 as
// released, Q8_0 / Q4_0 as requantized. The others run the groups' members unfused.
#define MOE_MV_BIAS_TYPES(X) X(DType::MXFP4) X(DType::Q8_0) X(DType::Q4_0)
bool bias_type(DType t) {
#define MOE_MV_BIAS_IS(TY) t == TY ||
  return MOE_MV_BIAS_TYPES(MOE_MV_BIAS_IS) false;
#undef MOE_MV_BIAS_IS
}

// Row pairs / K halves / split K (not the expert products: launch_expert); grid.x counts
// logical blocks.
void launch(DType t, dim3 grid, MvShape sh, const LaunchStream &s, const MvArgs &a) {
  const dim3 block(kMvThreads * sh.groups);
  grid.x = blocks(grid.x, sh.groups);
  const int smem = sh.smem;
  if (sh.lean) {
    switch (t) {
#define MOE_MV_LEAN_CASE(TY) \
  case TY: launch_pdl(matvec_lean_kernel<TY>, grid, block, static_cast<size_t>(smem), s, a); return;
      MOE_MV_LEAN_CASE(DType::Q4_0)
      MOE_MV_LEAN_CASE(DType::Q8_0)
      MOE_MV_LEAN_CASE(DType::MXFP4)
      MOE_MV_LEAN_CASE(DType::Q2_K)
      MOE_MV_LEAN_CASE(DType::Q3_K)
      MOE_MV_LEAN_CASE(DType::Q4_K)
      MOE_MV_LEAN_CASE(DType::Q5_K)
#undef MOE_MV_LEAN_CASE
      default: break;  // (Q6_K's one-group launch is matvec_rows8_kernel, already three 8-warp blocks per SM)
    }
  }
  if (t == DType::Q6_K && sh.groups == 1) {
    launch_pdl(matvec_rows8_kernel<DType::Q6_K>, grid, block, static_cast<size_t>(smem), s, a);
    return;
  }
#define MOE_MV_CASE(TY) \
  case TY: launch_pdl(matvec_kernel<TY, kJPair, kChPair>, grid, block, static_cast<size_t>(smem), s, a); break;
  switch (t) {
    MOE_MV_TYPES(MOE_MV_CASE)
    default: fail(Status::Internal, "CUDA mat-vec: type %s not dispatched", dtype_name(t));
  }
#undef MOE_MV_CASE
}

// wide: down in matvec_down_kernel's 16-warp blocks.
template <DType T, int P>
void launch_expert_as(bool down, bool wide, dim3 grid, size_t smem, const LaunchStream &s, const MvArgs &a) {
  if (down && wide) launch_pdl(matvec_down_kernel<T, kJDown, kChDown, P>, grid, dim3(kMvMaxThreads), smem, s, a);
  else if (down) launch_pdl(matvec_expert_kernel<T, kJDown, kChDown, P>, grid, dim3(kMvThreads), smem, s, a);
  else launch_pdl(matvec_expert_kernel<T, kJPair, kChPair, P>, grid, dim3(kMvThreads), smem, s, a);
}

// The same with gpt-oss's biases (the bias kernels; instantiated for bias_type's types only,
// H: Halves, only for the types outside the reference order).
template <DType T, bool H>
void launch_expert_bias_in(bool down, bool wide, dim3 grid, size_t smem, const LaunchStream &s, const MvArgs &a, const MvBias &bias) {
  if (down && wide) launch_pdl(matvec_down_bias_kernel<T, kJDown, kChDown, kQ4kEither, H>, grid, dim3(kMvMaxThreads), smem, s, a, bias);
  else if (down) launch_pdl(matvec_expert_bias_kernel<T, kJDown, kChDown, kQ4kEither, H>, grid, dim3(kMvThreads), smem, s, a, bias);
  else launch_pdl(matvec_expert_bias_kernel<T, kJPair, kChPair, kQ4kEither, H>, grid, dim3(kMvThreads), smem, s, a, bias);
}
template <DType T>
void launch_expert_bias_as(bool down, bool wide, dim3 grid, size_t smem, const LaunchStream &s, const MvArgs &a, const MvBias &bias) {
  if constexpr (!ref_order_type<T>) {
    if (bias.halves) return launch_expert_bias_in<T, true>(down, wide, grid, smem, s, a, bias);
  }
  launch_expert_bias_in<T, false>(down, wide, grid, smem, s, a, bias);
}

// Gate/up + SwiGLU (a.mode kModeGateUp; grid: blocks of kRowsOne rows x expert slots) or
// down + combine (kModeDown; blocks of kMvWarps / down_split rows) in 8-warp blocks of
// matvec_expert_kernel. Returns false, launching nothing, where the shared memory does not
// fit (the caller runs the members unfused).
// bias: gpt-oss's expert biases (+ SwiGLU-OAI for gate/up): the bias kernels, for the types
// of bias_type (false, launching nothing, for the others).
bool launch_expert(DType t, bool down, const LaunchStream &s, const MvArgs &a, const MvBias *bias = nullptr) {
  if (bias && !bias_type(t)) return false;
  int64_t smem = -1;
  dim3 grid;
  bool wide = false;
  if (down) {
    // 16 rows per 16-warp block where their staging fits, else the 8-warp expert kernel.
    const int base16 = smem_bytes(t, a.K, a.X, true, kMvMaxGroups);
    wide = base16 >= 0 && base16 + static_cast<int64_t>(kMvMaxGroups * kMvWarps) * a.n_used * 4 <= kMvSmemMax;
    const int rows = wide ? kMvMaxGroups * kMvWarps : kMvWarps / down_split(a.n_used, kJDown);
    const int base = wide ? base16 : smem_bytes(t, a.K, a.X, true);
    if (base >= 0) smem = base + static_cast<int64_t>(rows) * a.n_used * 4;  // + the products (down_block)
    grid = dim3(blocks(a.M, rows));
  } else {
    smem = smem_bytes(t, a.K, 1, false);
    grid = dim3(blocks(a.M, kRowsOne), static_cast<unsigned>(a.n_used));
  }
  if (smem < 0 || smem > kMvSmemMax) return false;
  if (grid.x == 0 || grid.y == 0) return true;
  const size_t sm = static_cast<size_t>(smem);
  if (bias) {
#define MOE_MV_BIAS_CASE(TY) \
  case TY: launch_expert_bias_as<TY>(down, wide, grid, sm, s, a, *bias); break;
    switch (t) {
      MOE_MV_BIAS_TYPES(MOE_MV_BIAS_CASE)
      default: break;  // (bias_type)
    }
#undef MOE_MV_BIAS_CASE
    return true;
  }
  if (t == DType::Q4_K && q4k_direct(a)) {
    launch_expert_as<DType::Q4_K, kQ4kDirect>(down, wide, grid, sm, s, a);
    return true;
  }
#define MOE_MV_EXPERT_CASE(TY) \
  case TY: launch_expert_as<TY, q4k_staged_or_either<TY>()>(down, wide, grid, sm, s, a); break;
  switch (t) {
    MOE_MV_TYPES(MOE_MV_EXPERT_CASE)
    default: fail(Status::Internal, "CUDA mat-vec: type %s not dispatched", dtype_name(t));
  }
#undef MOE_MV_EXPERT_CASE
  return true;
}

// MatVecs group: one-token MatMuls of one activation, each a range of blocks of the
// row-pair kernel (the same device code as their own launches: bit-identical results).
// Types may mix within one activation rounding V (Q8_0: Q4_0, Q8_0, MXFP4; Q8_K: the
// K-quants): one kernel per V keeps the registers of the largest case within two blocks
// per multiprocessor (all eight types in one kernel spilled).
struct MvSeg {
  const uint8_t *w;
  int64_t rb;
  float *y;
  const float *add;  // a row added to the product (gpt-oss's q / k / v biases) or null
  int M;
  DType type;
  int mode;  // kModeRows / kModeHalves (rows_mode)
};
struct MvGroupArgs {
  MvArgs a;                           // fields the segments share (activation, K)
  MvSeg seg[kMaxFusedMatVecs];
  unsigned block0[kMaxFusedMatVecs];  // first block of each segment, non-decreasing
  int n, stage;                       // segments; staging bytes per warp (the largest type's)
};

// A block belongs to the last segment whose first block is <= blockIdx.x (so empty segments
// are skipped); the choice is block-uniform, the type switch does not diverge.
// Lean: 8-warp blocks, three per multiprocessor (<= 80 registers: one chunk in flight per
// job), for grids of 2..3 logical blocks per SM (group_lean).
template <DType V, bool Lean>
__global__ void __launch_bounds__(Lean ? kMvThreads : kMvMaxThreads, Lean ? 3 : 1) matvec_group_kernel(MvGroupArgs g) {
  MvArgs a = g.a;
  DType t = g.seg[0].type;
  unsigned b0 = 0;
#pragma unroll
  for (int s = 0; s < kMaxFusedMatVecs; ++s)
    if (s < g.n && blockIdx.x >= g.block0[s]) {
      a.w = g.seg[s].w;
      a.rb = g.seg[s].rb;
      a.y = g.seg[s].y;
      a.add = g.seg[s].add;
      a.M = g.seg[s].M;
      a.mode = g.seg[s].mode;
      t = g.seg[s].type;
      b0 = g.block0[s];
    }
  switch (t) {
#define MOE_MV_GROUP_CASE(TY)                                                     \
  case TY:                                                                        \
    if constexpr (act_type(TY) == V) rows_block<TY, cpu_order_type<TY>, Lean ? 1 : chunks_in_flight<TY>(kJPair)>(a, blockIdx.x - b0, g.stage); \
    else pdl_enter();                                                             \
    break;
    MOE_MV_GROUP_CASE(DType::Q4_0)
    MOE_MV_GROUP_CASE(DType::Q8_0)
    MOE_MV_GROUP_CASE(DType::MXFP4)
    MOE_MV_GROUP_CASE(DType::Q2_K)
    MOE_MV_GROUP_CASE(DType::Q3_K)
    MOE_MV_GROUP_CASE(DType::Q4_K)
    MOE_MV_GROUP_CASE(DType::Q5_K)
    MOE_MV_GROUP_CASE(DType::Q6_K)
#undef MOE_MV_GROUP_CASE
    default: pdl_enter(); break;  // types of another class are never launched here; keeps the PDL contract
  }
}

// Whether a group of `logical` logical blocks takes the lean kernel: more than two logical
// blocks per SM (16-warp blocks of 128 registers, one per SM, would leave a partial second
// wave: Qwen3-30B-A3B's q/k/v are 384 logical blocks = 1.45 waves of 132) and at most three
// (the lean kernel's 3 x 8 warps per SM: one wave). Only with GpuTuning::lean_groups.
bool group_lean(int64_t logical, int n_sm, bool lean_groups) {
  return lean_groups && logical > 2 * static_cast<int64_t>(n_sm) && logical <= 3 * static_cast<int64_t>(n_sm);
}

// Launches a MatVecs group: segs[0..n) of one activation rounding, base: the shared fields
// (activation, K). Returns false, launching nothing, where a segment's staging does not fit.
bool launch_group(const MvArgs &base, const MvSeg *segs, int n, int n_sm, bool lean_groups, const LaunchStream &stream) {
  MvGroupArgs g{};
  g.a = base;
  g.n = n;
  int smem1 = 0, smem2 = 0;  // the largest type's (-1 for two groups: one does not fit)
  int64_t logical = 0;
  for (int s = 0; s < n; ++s) {
    const int b1 = smem_bytes(segs[s].type, base.K, 1, false), b2 = smem_bytes(segs[s].type, base.K, 1, false, 2);
    if (b1 < 0) return false;
    smem1 = std::max(smem1, b1);
    smem2 = b2 < 0 || smem2 < 0 ? -1 : std::max(smem2, b2);
    g.stage = std::max(g.stage, stage_size(segs[s].type, false));
    logical += blocks(segs[s].M, rows_per_block(segs[s].mode));
  }
  // A thread block never spans two segments (its logical blocks share one type's rounding).
  const bool lean = group_lean(logical, n_sm, lean_groups);
  const MvShape sh = lean ? MvShape{1, smem1} : block_groups(segs[0].type, logical, n_sm, smem1, smem2);
  unsigned total = 0;
  for (int s = 0; s < n; ++s) {
    g.seg[s] = segs[s];
    g.block0[s] = total;
    total += blocks(blocks(segs[s].M, rows_per_block(segs[s].mode)), sh.groups);
  }
  if (total == 0) return true;
  const dim3 block(kMvThreads * sh.groups);
  const size_t smem = static_cast<size_t>(sh.smem);
  const bool q8_0 = act_type(segs[0].type) == DType::Q8_0;
  // (one kernel per class of activation rounding and shape)
  using Kernel = void (*)(MvGroupArgs);
  const Kernel kernels[2][2] = {{matvec_group_kernel<DType::Q8_K, false>, matvec_group_kernel<DType::Q8_K, true>},
                                {matvec_group_kernel<DType::Q8_0, false>, matvec_group_kernel<DType::Q8_0, true>}};
  launch_pdl(kernels[q8_0][lean], dim3(total), block, smem, stream, g);
  return true;
}

// MatMul / MatMulId (+ Add): row pairs per warp, or, where row pairs per warp would leave
// multiprocessors idle, per block with K split over the warps (plain types) or one row per
// warp in two K halves (quantized types whose K is an even number of blocks).
// own: a final output (cuda_own_order_product), CUDA's own order for every type.
// lean_rows: GpuTuning::lean_rows (quantized types, grids of 2..3 logical blocks per SM).
void launch_rows(const LaunchStream &stream, int n_sm, DType t, int smem, MvArgs &a, bool own = false, bool lean_rows = false) {
  const unsigned lx = blocks(a.M, kRowsPlain);
  own = own && cpu_order_dtype(t);  // (the other types have one order)
  // (F32 rows in the reference's order fold over the whole K: never split.)
  if (is_plain(t) && (t != DType::F32 || own) && static_cast<int64_t>(lx) * a.n_used < n_sm) {
    a.mode = kModeSplit;
    const dim3 grid(blocks(a.M, kJPair), static_cast<unsigned>(a.n_used));
    if (!own || !launch_own_order(t, grid, smem, stream, a)) launch(t, grid, MvShape{1, smem}, stream, a);
    return;
  }
  a.mode = rows_mode(t, a.K, a.M, a.n_used, n_sm, own);
  const unsigned rows_lx = blocks(a.M, rows_per_block(a.mode));
  if (own && launch_own_order(t, dim3(rows_lx, static_cast<unsigned>(a.n_used)), smem, stream, a)) return;
  const int64_t logical = static_cast<int64_t>(rows_lx) * a.n_used;
  const MvShape sh = !is_plain(t) && group_lean(logical, n_sm, lean_rows) ? MvShape{1, smem, true}
                                                                         : block_groups(t, logical, n_sm, smem, smem_bytes(t, a.K, 1, false, 2));
  launch(t, dim3(rows_lx, static_cast<unsigned>(a.n_used)), sh, stream, a);
}

// Fields common to every mode, from a MatMul / MatMulId node with one token.
MvArgs args_of(const Graph &g, const Node &mm, float *y) {
  const Node &w = g.node(mm.src[0]), &x = g.node(mm.src[1]);
  MvArgs a{};
  a.w = static_cast<const uint8_t *>(w.data);
  a.rb = static_cast<int64_t>(w.nb[1]);
  a.K = static_cast<int>(w.ne[0]);
  a.M = static_cast<int>(w.ne[1]);
  a.x = static_cast<const uint8_t *>(x.data);
  a.x_nb1 = static_cast<int64_t>(x.nb[1]);
  a.X = 1;
  a.E = 1;
  a.n_used = 1;
  if (mm.op == Op::MatMulId) {
    const Node &ids = g.node(mm.src[2]);
    a.eb = static_cast<int64_t>(w.nb[2]);
    a.E = static_cast<int>(w.ne[2]);
    a.X = static_cast<int>(x.ne[1]);
    a.ids = static_cast<const int32_t *>(ids.data);
    a.n_used = static_cast<int>(ids.ne[0]);
  }
  a.y = y;
  a.mode = kModeRows;
  return a;
}

// A weight tensor (or a view of one): padded to 256 bytes, so the 16-byte cover of its last
// row stays inside the allocation.
bool weight_backed(const Graph &g, const Node &n) {
  const Node *p = &n;
  while (p->op == Op::View) p = &g.node(p->src[0]);
  return p->op == Op::Leaf && p->leaf == LeafKind::Weight;
}

// One token, a supported type, a weight matrix, contiguous f32 activation rows.
bool one_token_ok(const Graph &g, const Node &mm) {
  if (mm.op != Op::MatMul && mm.op != Op::MatMulId) return false;
  // F16 weights here sum in half precision like the reference (matmul_f16_halfsum.cu).
  if (cuda_f16_halfsum_applies(g, mm)) return false;
  const Node &w = g.node(mm.src[0]), &x = g.node(mm.src[1]);
  if (!type_ok(w.type) || x.type != DType::F32 || x.nb[0] != 4 || w.ne[0] > (1 << 30) || w.ne[1] > (1 << 30)) return false;
  if (!is_plain(w.type) && !weight_backed(g, w)) return false;
  if (mm.op == Op::MatMul) return x.ne[1] * x.ne[2] * x.ne[3] == 1;
  const Node &ids = g.node(mm.src[2]);
  return ids.ne[1] == 1 && ids.ne[2] == 1 && x.ne[2] == 1 && (x.ne[1] == 1 || x.ne[1] == ids.ne[0]) && ids.ne[0] <= 65535;
}

// Unfused fallback of a group: its members in their original order.
void run_members(const CudaOpCtx &c, std::initializer_list<const Node *> members) {
  for (const Node *m : members)
    if (m) cuda_run_node(c.with_node(*m));
}

const float *f32_data(const Node &n) { return static_cast<const float *>(n.data); }
int node_id(const Graph &g, const Node &n) { return static_cast<int>(&n - &g.node(0)); }

// The bias rows of AddId node `add_id` over the expert product mm (its src0, the same ids):
// rows and their expert stride in floats; false where the bias kernels cannot read them
// (not F32 rows of mm's M values, or not one per expert of mm's weights: the kernels check
// ids against those).
bool bias_rows(const Graph &g, const Node &add_id, const Node &mm, const float *&rows, int64_t &stride) {
  if (add_id.op != Op::AddId || &g.node(add_id.src[0]) != &mm || add_id.src[2] != mm.src[2] || mm.op != Op::MatMulId) return false;
  const Node &b = g.node(add_id.src[1]), &w = g.node(mm.src[0]);
  if (b.type != DType::F32 || b.nb[0] != 4 || b.nb[1] % 4 != 0 || b.ne[0] != mm.ne[0] || b.ne[1] != w.ne[2]) return false;
  rows = f32_data(b);
  stride = static_cast<int64_t>(b.nb[1] / 4);
  return true;
}

// Down + combine [+ residual], with gpt-oss's bias (AddId between down and the combine) or
// without (bias null).
void down_combine(const CudaOpCtx &c, const Node &down, const Node *bias, const Node &combine, const Node *add, bool ids_settled) {
  const Node &cw = c.g.node(combine.src[1]);
  const Node *other = nullptr;
  if (add) other = &c.g.node(add->src[0]) == &combine ? &c.g.node(add->src[1]) : &c.g.node(add->src[0]);
  MvBias mb{};
  const bool ok = down.op == Op::MatMulId && one_token_ok(c.g, down) && cw.type == DType::F32 && cw.nb[0] == 4 &&
                  (!other || (other->type == DType::F32 && other->ne[0] == down.ne[0])) && (!bias || bias_rows(c.g, *bias, down, mb.b, mb.s));
  if (ok) {
    MvArgs a = args_of(c.g, down, static_cast<float *>(add ? add->data : combine.data));
    a.err = c.ub.err;
    a.cw = f32_data(cw);
    a.add = other ? f32_data(*other) : nullptr;
    const DType wt = c.g.node(down.src[0]).type;
    a.mode = ids_settled && !is_plain(wt) && a.K > 0 && a.n_used > 0 ? kModeDownSettled : kModeDown;
    mb.halves = bias && unfused_halves(wt, a, c.n_sm);
    if (launch_expert(wt, true, c.stream, a, bias ? &mb : nullptr)) return;
  }
  run_members(c, {&down, bias, &combine, add});
}


}  // namespace

bool cuda_weight_backed(const Graph &g, const Node &n) { return weight_backed(g, n); }
bool cuda_matvec_bias_type(DType t) { return bias_type(t); }

bool cuda_matvec(const CudaOpCtx &c) {
  if (!one_token_ok(c.g, c.n)) return false;
  MvArgs a = args_of(c.g, c.n, static_cast<float *>(c.n.data));
  a.err = c.ub.err;
  const DType t = c.src(0).type;
  const int smem = smem_bytes(t, a.K, 1, false);
  if (smem < 0) return false;
  if (a.M == 0 || a.n_used == 0) return true;
  launch_rows(c.stream, c.n_sm, t, smem, a, cuda_own_order_product(c.n, c.tuning), c.tuning.lean_rows);
  return true;
}

int cuda_matvec_group_key(DType t) {
  if (cuda_extra_type(t)) return cuda_extra_matvec_group_key(t);  // (quant_extra.h)
  if (!type_ok(t) || is_plain(t)) return 0;
  return act_type(t) == DType::Q8_0 ? 1 : 2;
}

void cuda_fused_matvecs(const CudaOpCtx &c, const std::vector<int> &members) {
  const Node &first = c.g.node(members.front());
  const int64_t K = c.g.node(first.src[0]).ne[0];
  if (first.ne[1] * first.ne[2] * first.ne[3] > 1) {  // a few columns: one rounding, else the members in order
    if (!cuda_mcol_matvecs(c, members))
      for (int id : members) cuda_run_node(c.with_node(c.g.node(id)));
    return;
  }
  if (cuda_extra_fused_matvecs(c, members)) return;
  const DType V = act_type(c.g.node(first.src[0]).type);
  bool ok = true;
  int n = 0;
  MvSeg segs[kMaxFusedMatVecs];
  for (size_t k = 0; ok && k < members.size(); ++k) {
    const Node &mm = c.g.node(members[k]);
    if (mm.op == Op::Add && n > 0) {  // Add(product, row) right after its MatMul: the row joins that segment
      const Node &prev = c.g.node(members[k - 1]);
      const bool first_src = &c.g.node(mm.src[0]) == &prev;
      const Node &row = c.g.node(first_src ? mm.src[1] : mm.src[0]);
      ok = prev.op == Op::MatMul && (first_src || &c.g.node(mm.src[1]) == &prev) && row.type == DType::F32 && row.ne[0] == prev.ne[0] &&
           segs[n - 1].add == nullptr;
      if (ok) {
        segs[n - 1].add = f32_data(row);
        segs[n - 1].y = static_cast<float *>(mm.data);
      }
      continue;
    }
    const Node &w = c.g.node(mm.src[0]);
    ok = n < kMaxFusedMatVecs && mm.op == Op::MatMul && mm.src[1] == first.src[1] && w.ne[0] == K && cuda_matvec_group_key(w.type) != 0 &&
         act_type(w.type) == V && one_token_ok(c.g, mm);
    if (ok) segs[n++] = MvSeg{static_cast<const uint8_t *>(w.data), static_cast<int64_t>(w.nb[1]), static_cast<float *>(mm.data), nullptr,
                              static_cast<int>(w.ne[1]), w.type, rows_mode(w.type, static_cast<int>(K), w.ne[1], 1, c.n_sm)};
  }
  if (ok && launch_group(args_of(c.g, first, nullptr), segs, n, c.n_sm, c.tuning.lean_groups, c.stream)) return;
  for (int id : members) cuda_run_node(c.with_node(c.g.node(id)));
}

void cuda_fused_matmul_add(const CudaOpCtx &c, const Node &mm, const Node &add) {
  if (mm.ne[1] * mm.ne[2] * mm.ne[3] > 1) {  // a few columns: one few-column launch, else the members in order
    if (!cuda_mcol_matmul_add(c, mm, add)) run_members(c, {&mm, &add});
    return;
  }
  if (cuda_extra_fused_matmul_add(c, mm, add)) return;  // (quant_extra.h)
  const Node &w = c.g.node(mm.src[0]);
  const Node &other = &c.g.node(add.src[0]) == &mm ? c.g.node(add.src[1]) : c.g.node(add.src[0]);
  const int smem = smem_bytes(w.type, static_cast<int>(w.ne[0]), 1, false);
  if (mm.op != Op::MatMul || !one_token_ok(c.g, mm) || smem < 0 || other.type != DType::F32 || other.ne[0] != mm.ne[0]) {
    run_members(c, {&mm, &add});
    return;
  }
  MvArgs a = args_of(c.g, mm, static_cast<float *>(add.data));
  a.add = f32_data(other);
  if (a.M > 0) launch_rows(c.stream, c.n_sm, w.type, smem, a, false, c.tuning.lean_rows);
}

void cuda_fused_gate_up_swiglu(const CudaOpCtx &c, const Node &up, const Node &gate, const Node &swiglu) {
  if (cuda_extra_fused_gate_up(c, gate, up, swiglu)) return;
  if (cuda_mcol_swiglu(c, gate, up, swiglu)) return;  // 2+ tokens on the few-column tensor-core kernel
  const Node &wg = c.g.node(gate.src[0]), &wu = c.g.node(up.src[0]);
  const bool same = gate.op == up.op && wg.type == wu.type && wg.ne[0] == wu.ne[0] && wg.ne[1] == wu.ne[1] && wg.ne[2] == wu.ne[2] &&
                    gate.src[1] == up.src[1] && (gate.op == Op::MatMul || gate.src[2] == up.src[2]);
  if (same && one_token_ok(c.g, gate) && one_token_ok(c.g, up)) {
    MvArgs a = args_of(c.g, gate, static_cast<float *>(swiglu.data));
    a.err = c.ub.err;
    a.w2 = static_cast<const uint8_t *>(wu.data);
    a.rb2 = static_cast<int64_t>(wu.nb[1]);
    a.eb2 = gate.op == Op::MatMulId ? static_cast<int64_t>(wu.nb[2]) : 0;
    a.mode = kModeGateUp;
    if (launch_expert(wg.type, false, c.stream, a)) return;
  }
  // In graph order (qwen3moe builds up before gate): a member's work scratch may lie under a
  // later member's output (the planner frees it after its own node). Run gate first and up's
  // activation rounding overwrites gate's product: the tiny q4_1 model's plan puts up's
  // scratch [1728, 2240) over gate's output [1728, 1984), the likely cause of the garbage
  // (expert ids of -1 downstream) a Q4_1 model met on the H200 in these groups.
  if (node_id(c.g, up) < node_id(c.g, gate)) return run_members(c, {&up, &gate, &swiglu});
  run_members(c, {&gate, &up, &swiglu});
}

void cuda_fused_down_combine(const CudaOpCtx &c, const Node &down, const Node &combine, const Node *add, bool ids_settled) {
  if (cuda_extra_fused_down(c, down, combine, add)) return;  // (its ids: always after its wait)
  down_combine(c, down, nullptr, combine, add, ids_settled);
}

void cuda_fused_down_bias_combine(const CudaOpCtx &c, const Node &down, const Node &bias, const Node &combine, const Node *add, bool ids_settled) {
  down_combine(c, down, &bias, combine, add, ids_settled);
}

void cuda_fused_gate_up_oai(const CudaOpCtx &c, const Node &gate_bias, const Node &up_bias, const Node &swiglu_oai) {
  const Node &gate = c.g.node(gate_bias.src[0]), &up = c.g.node(up_bias.src[0]);
  const Node &wg = c.g.node(gate.src[0]), &wu = c.g.node(up.src[0]);
  MvBias mb{};
  mb.alpha = swiglu_oai.fp[0];
  mb.limit = swiglu_oai.fp[1];
  const bool ok = gate.op == Op::MatMulId && up.op == Op::MatMulId && wg.type == wu.type && wg.ne[0] == wu.ne[0] && wg.ne[1] == wu.ne[1] &&
                  wg.ne[2] == wu.ne[2] && gate.src[1] == up.src[1] && gate.src[2] == up.src[2] && one_token_ok(c.g, gate) &&
                  one_token_ok(c.g, up) && bias_rows(c.g, gate_bias, gate, mb.b, mb.s) && bias_rows(c.g, up_bias, up, mb.b2, mb.s2);
  if (ok) {
    MvArgs a = args_of(c.g, gate, static_cast<float *>(swiglu_oai.data));
    a.err = c.ub.err;
    a.w2 = static_cast<const uint8_t *>(wu.data);
    a.rb2 = static_cast<int64_t>(wu.nb[1]);
    a.eb2 = static_cast<int64_t>(wu.nb[2]);
    a.mode = kModeGateUp;
    mb.halves = unfused_halves(wg.type, a, c.n_sm);  // (up's MatMulId has gate's shape)
    if (launch_expert(wg.type, false, c.stream, a, &mb)) return;
  }
  // In graph order (see cuda_fused_gate_up_swiglu: a member's scratch may lie under a later member's output).
  if (node_id(c.g, up) < node_id(c.g, gate)) return run_members(c, {&up, &up_bias, &gate, &gate_bias, &swiglu_oai});
  run_members(c, {&gate, &gate_bias, &up, &up_bias, &swiglu_oai});
}

}  // namespace moe
