// Rotary position embedding with GGML's semantics (NeoX and normal/GPT-J pairing, YaRN).
#include <cmath>

#include "backends/cpu/ops/cpu_ops.h"
#include "backends/cpu/ops/rope_math.h"

namespace moe {

void cpu_rope(const CpuKernelArgs &a) {
  const Node &x = a.src(0), &pos = a.src(1);
  const RopeParams &p = a.n.rope;
  const int64_t hd = a.n.ne[0], n_head = a.n.ne[1], n_tok = a.n.ne[2];
  const int32_t *positions = static_cast<const int32_t *>(pos.data);
  float corr[2];
  rope_yarn_corr_dims(p.n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow, corr);
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot));
  float cache[kMaxRopeDims];  // cos/sin pairs for one position (n_rot checked by Graph::rope)
  // Split over tokens x heads.
  int64_t r0, r1;
  split_rows(n_tok * n_head, a.ith, a.nth, r0, r1);
  int64_t cached_tok = -1;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t t = r / n_head, h = r % n_head;
    if (t != cached_tok) {
      rope_cache_init(static_cast<float>(positions[t]), p, corr, theta_scale, p.n_rot, cache);
      cached_tok = t;
    }
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + h * x.nb[1] + t * x.nb[2]);
    float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(a.n.data) + h * a.n.nb[1] + t * a.n.nb[2]);
    rope_apply_row(src, dst, cache, p.n_rot, p.neox);
    for (int64_t i = p.n_rot; i < hd; ++i) dst[i] = src[i];
  }
}

}  // namespace moe
