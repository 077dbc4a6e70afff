// Host emulation of what the int8 MMQ kernel (matmul_mmq_i8.cu) needs beyond emu.h:
// mma.m16n8k32 / m16n8k16 .s8 -> .s32 by the PTX fragment layouts, and the device
// intrinsics it calls, with their documented semantics.
#pragma once
#include "emu.h"

#include <chrono>
#include <cstdlib>

template <class T> inline T __ldg(const T *p) { return *p; }
inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<uint32_t>(v >> (sh & 31));
}
inline uint32_t __float_as_uint(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __dp4a(int a, int b, int c) {  // signed bytes
  for (int i = 0; i < 4; ++i) c += static_cast<int8_t>(a >> (8 * i)) * static_cast<int8_t>(b >> (8 * i));
  return c;
}
inline float __fdividef(float a, float b) { return a / b; }
// Byte-wise SIMD of the extra types' decoders (modulo 256 per byte, as the PTX vsub4 / vadd4).
inline unsigned __vsub4(unsigned a, unsigned b) {
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (((a >> (8 * i)) - (b >> (8 * i))) & 0xFFu) << (8 * i);
  return r;
}
inline unsigned __vadd4(unsigned a, unsigned b) {
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (((a >> (8 * i)) + (b >> (8 * i))) & 0xFFu) << (8 * i);
  return r;
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
// Block barriers counted per thread (gen_mmq.py puts emu_counted_syncthreads in the raw
// kernels' place of __syncthreads; every thread of a block runs the same ones, so the counts
// agree at each block's start), so that the lagging warp can stop at a point until every
// other thread has arrived at a barrier it has not (emu_lag_past_barrier): a read by another
// warp of what the lagging warp writes there, without that barrier between, then sees stale
// bytes, however long the emulated work in between takes. A mutated kernel whose other
// threads exit instead would wait forever: 5 s at most.
inline std::atomic<int> g_emu_bars[1024];
inline void emu_counted_syncthreads() {
  ++g_emu_bars[threadIdx.x];
  __syncthreads();
}
inline void emu_lag_past_barrier() {
  const unsigned w = threadIdx.x >> 5;
  if (static_cast<int>(w) != emu_lag_warp()) return;
  const int mine = g_emu_bars[threadIdx.x].load();
  const auto t0 = std::chrono::steady_clock::now();
  for (unsigned t = 0; t < blockDim.x; ++t)
    while ((t >> 5) != w && g_emu_bars[t].load() <= mine && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
      std::this_thread::sleep_for(std::chrono::microseconds(100));
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
