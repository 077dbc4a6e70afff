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


