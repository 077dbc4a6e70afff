// Building blocks shared by the architecture graph builders.
#pragma once
#include "graph/ir.h"
#include "model/arch/arch.h"
#include "model/hparams.h"

namespace moe {

struct BlockInputs {
  int tokens, pos, out_ids;
};
BlockInputs make_block_inputs(Graph &g, const GraphBuildParams &p);

// RoPE parameters from hparams (YaRN / linear scaling included), GGML semantics.
RopeParams rope_params_from(const Hparams &h, int n_rot, bool neox);

// Store k/v ([hd, n_head_kv, T]) into the layer's cache, then causal GQA attention of q
// ([hd_k, n_head, T]) over the cache. Returns [hd_v, n_head, T].
int attention_block(Graph &g, int q, int k, int v, int layer, int64_t head_dim_v, float scale, const GraphBuildParams &p);

struct MoeWeights {
  int router;          // [n_embd, n_expert]
  int gate, up, down;  // [n_embd, n_ff, E], [n_embd, n_ff, E], [n_ff, n_embd, E]
};

// Softmax router -> top-k -> optional renormalisation -> SwiGLU experts -> weighted sum.
int moe_ffn_softmax(Graph &g, int x, const MoeWeights &w, int n_used, bool norm_weights);

// Experts for already selected ids [k, T] and weights [k, T].
int moe_experts(Graph &g, int x, const MoeWeights &w, int ids, int weights);

}  // namespace moe
