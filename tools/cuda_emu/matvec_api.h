// Entry points of the emulated mat-vec versions (gen_matvec.py) for matvec_check.cpp.
#pragma once
#include <cstdint>
#include <cstring>

#include "quant/dtype.h"

namespace moe_emu_api {
using moe::DType;
struct EmuMv {  // matvec.cu's MvArgs fields (copied by name: gen_matvec.py's to_args)
  const uint8_t *w, *w2;
  int64_t rb, eb, rb2, eb2;
  int K, M;
  const uint8_t *x;
  int64_t x_nb1;
  int X;
  const int32_t *ids;
  int E, n_used;
  const float *cw;
  const float *add;
  float *y;
  int mode;
};
struct EmuSeg {
  const uint8_t *w;
  int64_t rb;
  float *y;
  int M;
  DType type;
  int mode;
  const float *add;  // a row added to the product (the q / k / v biases) or null
};
// gpt-oss's expert biases and SwiGLU-OAI (matvec.cu's MvBias).
struct EmuBias {
  const float *b, *b2;
  int64_t s, s2;
  float alpha, limit;
};
uint8_t *emu_dyn_smem();
}  // namespace moe_emu_api

namespace moe {
#define MOE_EMU_API(tag)                                                                                            \
  namespace emu_##tag {                                                                                             \
  void launch_mv(DType t, bool down, unsigned gx, unsigned gy, int groups, int n_sm, const moe_emu_api::EmuMv &m); \
  bool launch_grp(const moe_emu_api::EmuMv &base, const moe_emu_api::EmuSeg *segs, int n, int n_sm);              \
  bool launch_own(DType t, unsigned gx, unsigned gy, const moe_emu_api::EmuMv &m);                                 \
  bool launch_unfused(DType t, int n_sm, const moe_emu_api::EmuMv &m);                                             \
  bool launch_bias(DType t, bool down, int n_sm, const moe_emu_api::EmuMv &m, const moe_emu_api::EmuBias &bias);    \
  }
MOE_EMU_API(old)
MOE_EMU_API(new)
}  // namespace moe
