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
using std::min; using std::max;
inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
// Byte n of the result: byte (selector nibble n) % 8 of the pair y:x (default mode).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t xy = (static_cast<uint64_t>(y) << 32) | x;
  unsigned r = 0;
  for (int n = 0; n < 4; ++n) r |= static_cast<unsigned>((xy >> (8 * ((s >> (4 * n)) & 7))) & 0xff) << (8 * n);
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
// D = A B + C, 16x16 f16 A (row), 16x8 f16 B (col), f32 C/D, PTX fragment layouts.
inline void emu_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const int lane = threadIdx.x & 31;
  EmuWarp &W = g_warps[threadIdx.x >> 5];
  for (int i = 0; i < 4; ++i) W.a[lane][i] = a[i];
  W.b[lane][0] = b0;
  W.b[lane][1] = b1;
  W.bar->arrive_and_wait();
  auto A = [&](int row, int k) {
    const int l = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return emu_h(W.a[l][reg], k & 1);
  };
  auto B = [&](int k, int col) {
    const int l = col * 4 + (k % 8) / 2, reg = k >= 8 ? 1 : 0;
    return emu_h(W.b[l][reg], k & 1);
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
