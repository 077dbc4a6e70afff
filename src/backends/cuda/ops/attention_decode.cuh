// Decode attention for a few query tokens with common head sizes (attention_decode.cu):
// one block per KV head reads each K/V row once for all the query heads of its group.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cuda/ops/attention.cuh"
#include "backends/cuda/ops/rope.cuh"

namespace moe {

// True when the grouped decode kernel handles this call (few tokens, head size 64/128/256,
// separate V of the same size); then attn_decode_work_size bytes of scratch are needed.
bool attn_decode_applies(int64_t T, int64_t hd_k, int64_t hd_v, bool v_from_k);
size_t attn_decode_work_size(int64_t T, int64_t n_head, int64_t hd_v);
void attn_decode_launch(cudaStream_t s, TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *work);

// The head chains a one-token decode attention runs itself (FusedKind::ChainsAttention): each
// block prepares its query heads ([RmsNorm -> Mul ->] Rope, the row chains' device code, so the
// same bits), and the block whose cell range holds the token's cell prepares the token's K head
// ([RmsNorm -> Mul ->] [Rope]) and stores it and the V head into the cache before it reads them.
struct AttnHeadChain {
  const float *src;   // the token's raw heads: head h at src + h * rs
  int64_t rs;
  const float *w;     // Mul weight [hd], or null
  int rms;            // RmsNorm first
  int rms_threads;    // the unfused RmsNorm kernel's block size (its sum order)
  float eps;
  int rope;           // Rope last (before a store)
  RopeArgs ra;
  const int32_t *pos;
  int pos_early;      // pos is a graph input: its angle table is built before pdl_wait
};
struct AttnChains {
  AttnHeadChain q, k, v;  // v: src and rs only
  int k_table_of_q;       // k's Rope has q's arguments and positions: one angle table
  uint8_t *kc, *vc;       // the layer's K and V cache
  const int32_t *cells;   // DevUbatch::cells: the token's cell
  int n_cells;
  unsigned *err;
};
// T = 1, a.group <= 8, a.kt F16 or Q8_0 (the caller checks attn_decode_applies too).
void attn_decode_chains_launch(cudaStream_t s, TView out, int n_head, const AttnArgs &a, const DevUbatch &ub, float *work, const AttnChains &ch);

}  // namespace moe
