// Host emulation of the CUDA subset the attention kernels use (see README.md): one OS thread
// per CUDA thread, blocks one after another, block / warp barriers, shuffles, mma.m16n8k16
// and ldmatrix by the PTX fragment layouts. Force-included before the kernel sources.
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
#include <algorithm>
#include <chrono>
#include <cstdlib>
using std::min; using std::max;
inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
// Explicitly rounded float operations (the host build has no fma contraction: -std=c++20, no -mfma).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes (b:a) (no sign-replicate mode).
inline unsigned __byte_perm(unsigned a, unsigned b, unsigned s) {
  const uint64_t x = (static_cast<uint64_t>(b) << 32) | a;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((x >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}

#undef __global__
#undef __device__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

inline thread_local uint3 threadIdx, blockIdx;
inline dim3 gridDim, blockDim;
inline std::atomic<int> g_or_cur{0};
inline int g_or_result = 0;
struct OrCompletion { void operator()() noexcept { g_or_result = g_or_cur.exchange(0); } };
inline std::unique_ptr<std::barrier<OrCompletion>> g_block_bar;
struct EmuWarp {
  std::unique_ptr<std::barrier<>> bar;
  float f[32];
  uint32_t a[32][4], b[32][2];
  const void *p[32];
};
inline EmuWarp g_warps[32];

inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline int __syncthreads_or(int p) {
  if (p) g_or_cur.fetch_or(1);
  g_block_bar->arrive_and_wait();
  return g_or_result;
}
inline int __syncthreads_and(int p) { return !__syncthreads_or(!p); }
inline float __shfl_xor_sync(unsigned, float v, int m) {
  const int lane = threadIdx.x & 31;
  EmuWarp &W = g_warps[threadIdx.x >> 5];
  W.f[lane] = v;
  W.bar->arrive_and_wait();
  const float r = W.f[lane ^ m];
  W.bar->arrive_and_wait();
  return r;
}
inline float emu_h(uint32_t reg, int hi) {
  const uint16_t bits = static_cast<uint16_t>(hi ? reg >> 16 : reg & 0xffff);
  __half h;
  std::memcpy(&h, &bits, 2);
  return __half2float(h);
}
// The same for a bf16 half (its bits are the upper half of a float's).
inline float emu_bf(uint32_t reg, int hi) { return __uint_as_float((hi ? reg >> 16 : reg & 0xffff) << 16); }
// D = A B + C, 16x16 f16 (BF: bf16) A (row), 16x8 B (col), f32 C/D, PTX fragment layouts.
template <bool BF = false> inline void emu_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const int lane = threadIdx.x & 31;
  EmuWarp &W = g_warps[threadIdx.x >> 5];
  for (int i = 0; i < 4; ++i) W.a[lane][i] = a[i];
  W.b[lane][0] = b0;
  W.b[lane][1] = b1;
  W.bar->arrive_and_wait();
  auto A = [&](int row, int k) {
    const int l = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return BF ? emu_bf(W.a[l][reg], k & 1) : emu_h(W.a[l][reg], k & 1);
  };
  auto B = [&](int k, int col) {
    const int l = col * 4 + (k % 8) / 2, reg = k >= 8 ? 1 : 0;
    return BF ? emu_bf(W.b[l][reg], k & 1) : emu_h(W.b[l][reg], k & 1);
  };
  float d[4];
  for (int i = 0; i < 4; ++i) {
    const int row = (lane >> 2) + (i >= 2 ? 8 : 0), col = 2 * (lane & 3) + (i & 1);
    double s = 0;
    for (int k = 0; k < 16; ++k) s += double(A(row, k)) * B(k, col);
    d[i] = c[i] + static_cast<float>(s);
  }
  W.bar->arrive_and_wait();
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}

// ldmatrix.m8n8.x4(.trans).b16: lane 8m + r gives the address of row r of matrix m.
inline void emu_ldsm(uint32_t (&r)[4], const void *row, bool trans) {
  const int lane = threadIdx.x & 31;
  EmuWarp &W = g_warps[threadIdx.x >> 5];
  W.p[lane] = row;
  W.bar->arrive_and_wait();
  for (int m = 0; m < 4; ++m) {
    auto at = [&](int rr, int cc) { return static_cast<const uint16_t *>(W.p[m * 8 + rr])[cc]; };
    uint32_t lo, hi;
    if (!trans) { lo = at(lane / 4, 2 * (lane % 4)); hi = at(lane / 4, 2 * (lane % 4) + 1); }
    else { lo = at(2 * (lane % 4), lane / 4); hi = at(2 * (lane % 4) + 1, lane / 4); }
    r[m] = lo | (hi << 16);
  }
  W.bar->arrive_and_wait();
}

inline unsigned __ballot_sync(unsigned, int pred) {
  const int lane = threadIdx.x & 31;
  EmuWarp &W = g_warps[threadIdx.x >> 5];
  W.f[lane] = pred ? 1.0f : 0.0f;
  W.bar->arrive_and_wait();
  unsigned m = 0;
  for (int l = 0; l < 32; ++l)
    if (W.f[l] != 0.0f) m |= 1u << l;
  W.bar->arrive_and_wait();
  return m;
}
// Shuffles of other 4- or 8-byte types (double and int sums, top-k ids) through a per-warp
// buffer: lane src's value (src < 32).
template <class V> V emu_shfl_from(V v, int src) {
  static_assert(sizeof(V) <= 8, "shuffle of a wider type");
  static uint64_t buf[32][32];  // [warp][lane]
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  EmuWarp &W = g_warps[w];
  std::memcpy(&buf[w][lane], &v, sizeof(V));
  W.bar->arrive_and_wait();
  V r;
  std::memcpy(&r, &buf[w][src & 31], sizeof(V));
  W.bar->arrive_and_wait();
  return r;
}
template <class V> V emu_shfl_xor(V v, int m) { return emu_shfl_from(v, (threadIdx.x & 31) ^ m); }
inline double __shfl_xor_sync(unsigned, double v, int m) { return emu_shfl_xor(v, m); }
inline double __shfl_sync(unsigned, double v, int src) { return emu_shfl_from(v, src); }
inline int __shfl_xor_sync(unsigned, int v, int m) { return emu_shfl_xor(v, m); }
inline unsigned long long __shfl_xor_sync(unsigned, unsigned long long v, int m) { return emu_shfl_xor(v, m); }
inline unsigned long long __shfl_sync(unsigned, unsigned long long v, int src) { return emu_shfl_from(v, src); }
inline int __shfl_up_sync(unsigned, int v, int d) {
  const int lane = threadIdx.x & 31;
  return emu_shfl_from(v, lane >= d ? lane - d : lane);
}
inline void __syncwarp() { g_warps[threadIdx.x >> 5].bar->arrive_and_wait(); }
inline float __ldg(const float *p) { return *p; }
inline float4 __ldg(const float4 *p) { return *p; }
inline int __ffs(unsigned x) { return x ? __builtin_ctz(x) + 1 : 0; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicOr(unsigned *p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
inline float __ldcg(const float *p) { return *p; }
inline float2 __ldcg(const float2 *p) { return *p; }
inline int __ldcg(const int *p) { return *p; }

// Programmatic dependent launch (ops/pdl.cuh): blocks run in order here, so the waits are no-ops.
inline void pdl_wait() {}
inline void pdl_trigger() {}
template <class K, class... Args> void emu_launch(dim3 grid, int threads, K kernel, Args... args);
template <class K, class... Args> void launch_pdl(K kernel, dim3 grid, dim3 block, size_t, cudaStream_t, Args... args) {
  emu_launch(grid, static_cast<int>(block.x), kernel, args...);
}

template <class K, class... Args> void emu_launch(dim3 grid, int threads, K kernel, Args... args) {
  gridDim = grid;
  blockDim = dim3(static_cast<unsigned>(threads));
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        g_block_bar = std::make_unique<std::barrier<OrCompletion>>(threads, OrCompletion{});
        for (int w = 0; w < threads / 32; ++w) g_warps[w].bar = std::make_unique<std::barrier<>>(32);
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
          ts.emplace_back([=] {
            threadIdx = make_uint3(static_cast<unsigned>(t), 0, 0);
            blockIdx = make_uint3(x, y, z);
            kernel(args...);
          });
        for (auto &t : ts) t.join();
      }
}

// D = A B + C with int8 A (16 x K, row-major) and B (K x 8, column-major), s32 C / D, K = 32
// (a: 4 registers, b: 2) or 16 (a: 2, b: 1). Register r of lane l holds 4 consecutive k:
// A row l / 4 (+ 8 for odd r), k 4 (l % 4) (+ 16 for r >= 2); B column l / 4, the same k.
// EMU_LAG_WARP=w makes warp w of every block lag (a sleep before each of its ldmatrix and
// int8 mma), so the other warps run ahead up to the next barrier: shared tiles rewritten
// too early show.
inline int emu_lag_warp() {
  static const int w = [] {
    const char *e = std::getenv("EMU_LAG_WARP");
    return e ? std::atoi(e) : -1;
  }();
  return w;
}
inline void emu_lag() {
  if (static_cast<int>(threadIdx.x >> 5) == emu_lag_warp()) std::this_thread::sleep_for(std::chrono::milliseconds(3));
}

inline void emu_mma_s8(int (&c)[4], const uint32_t *a, const uint32_t *b, int K) {
  const int lane = threadIdx.x & 31;
  EmuWarp &W = g_warps[threadIdx.x >> 5];
  emu_lag();
  const int na = K / 8, nb = K / 16;
  for (int i = 0; i < na; ++i) W.a[lane][i] = a[i];
  for (int i = 0; i < nb; ++i) W.b[lane][i] = b[i];
  W.bar->arrive_and_wait();
  auto byte = [](uint32_t reg, int k) { return static_cast<int>(static_cast<int8_t>(reg >> (8 * (k % 4)))); };
  auto A = [&](int row, int k) { return byte(W.a[(row % 8) * 4 + (k % 16) / 4][(row >= 8 ? 1 : 0) + (k >= 16 ? 2 : 0)], k); };
  auto B = [&](int k, int col) { return byte(W.b[col * 4 + (k % 16) / 4][k >= 16 ? 1 : 0], k); };
  int d[4];
  for (int i = 0; i < 4; ++i) {
    const int row = (lane >> 2) + (i >= 2 ? 8 : 0), col = 2 * (lane & 3) + (i & 1);
    int64_t s = c[i];
    for (int k = 0; k < K; ++k) s += A(row, k) * B(k, col);
    if (s != static_cast<int>(s)) std::abort();  // the kernel's int32 bounds were wrong
    d[i] = static_cast<int>(s);
  }
  W.bar->arrive_and_wait();
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}

// cp.async as the PTX ISA describes it for one thread: a copy lands only when a
// cp.async.wait_group lets its group complete (here: then, in issue order), so a read of the
// destination before the wait, or by another thread before a barrier that follows the
// wait, sees stale bytes. Both addresses must be aligned to the copy's size (16 or 4). A
// thread that ends with copies pending aborts.
struct EmuCpAsync {
  struct Copy {
    void *dst;
    const void *src;
    int group, size;
  };
  std::vector<Copy> pending;
  int committed = 0;
  ~EmuCpAsync() {
    if (!pending.empty()) std::abort();
  }
};
inline thread_local EmuCpAsync t_cp_async;
inline void emu_cp_async(void *dst, const void *src, int size = 16) {
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & static_cast<uintptr_t>(size - 1)) std::abort();
  t_cp_async.pending.push_back({dst, src, t_cp_async.committed, size});
}
inline void emu_cp_commit() { ++t_cp_async.committed; }
inline void emu_cp_wait(int n) {
  auto &q = t_cp_async.pending;
  size_t kept = 0;
  for (const auto &c : q) {
    if (c.group < t_cp_async.committed - n)
      std::memcpy(c.dst, c.src, static_cast<size_t>(c.size));
    else
      q[kept++] = c;
  }
  q.resize(kept);
}
