// The warp intrinsics the mat-vec kernels use beyond emu.h (force-included after it).
#pragma once
#include <cuda_bf16.h>

inline int g_emu_int[32][32];

inline int emu_exchange(int v, int src) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  g_emu_int[w][lane] = v;
  g_warps[w].bar->arrive_and_wait();
  const int r = g_emu_int[w][src];
  g_warps[w].bar->arrive_and_wait();
  return r;
}
inline float __shfl_sync(unsigned, float v, int src) {
  int b;
  std::memcpy(&b, &v, 4);
  b = emu_exchange(b, src & 31);
  float r;
  std::memcpy(&r, &b, 4);
  return r;
}
inline int __shfl_sync(unsigned, int v, int src) { return emu_exchange(v, src & 31); }
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += static_cast<int8_t>(a >> (8 * i)) * static_cast<int8_t>(b >> (8 * i));
  return c;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned sh) {
  return static_cast<unsigned>(((static_cast<uint64_t>(hi) << 32) | lo) >> (sh & 31));
}
template <class T> inline T __ldg(const T *p) { return *p; }
inline int __float2int_rn(float f) { return static_cast<int>(std::nearbyint(f)); }

// pdl.cuh (pdl_wait, pdl_trigger, launch_pdl): emu.h has them.
