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
inline int __shfl_xor_sync(unsigned, int v, int m) { return emu_exchange(v, (threadIdx.x & 31) ^ m); }
inline float __shfl_sync(unsigned, float v, int src) {
  int b;
  std::memcpy(&b, &v, 4);
  b = emu_exchange(b, src & 31);
  float r;
  std::memcpy(&r, &b, 4);
  return r;
}
inline unsigned __ballot_sync(unsigned, int pred) {
  const int w = threadIdx.x >> 5;
  g_emu_int[w][threadIdx.x & 31] = pred != 0;
  g_warps[w].bar->arrive_and_wait();
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r |= static_cast<unsigned>(g_emu_int[w][l]) << l;
  g_warps[w].bar->arrive_and_wait();
  return r;
}
inline void __syncwarp(unsigned = 0xffffffffu) { g_warps[threadIdx.x >> 5].bar->arrive_and_wait(); }
inline int __ffs(unsigned x) { return __builtin_ffs(static_cast<int>(x)); }
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += static_cast<int8_t>(a >> (8 * i)) * static_cast<int8_t>(b >> (8 * i));
  return c;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned sh) {
  return static_cast<unsigned>(((static_cast<uint64_t>(hi) << 32) | lo) >> (sh & 31));
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}
template <class T> inline T __ldg(const T *p) { return *p; }
inline int __float2int_rn(float f) { return static_cast<int>(std::nearbyint(f)); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }

// pdl.cuh: a programmatic dependent launch is an ordinary (sequential) launch here.
namespace moe {
inline void pdl_wait() {}
inline void pdl_trigger() {}
template <class K, class... Args> void launch_pdl(K kernel, dim3 grid, dim3 block, size_t, cudaStream_t, Args... args) {
  emu_launch(grid, static_cast<int>(block.x), kernel, args...);
}
}  // namespace moe
