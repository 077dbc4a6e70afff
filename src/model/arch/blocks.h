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
// What an Attention node learns of the context's cache: its cell count (the scratch bound)
// and element type (which kernels, hence which scratch, can run).
void set_attention_cache(Graph &g, int attention, const GraphBuildParams &p);

// Final RMSNorm (output_norm) and the LM head (output.weight, or token_embd when tied):
// marks the graph output "logits" in its own segment.
void lm_head(Graph &g, const Model::Impl &m, int x);
// The tensors lm_head and the embedding lookup use: token_embd, output_norm, output (untied).
void require_embedding_and_head(const Model::Impl &m);

struct MoeWeights {
  int router;          // [n_embd, n_expert]
  int gate, up, down;  // [n_embd, n_ff, E], [n_embd, n_ff, E], [n_ff, n_embd, E]
};

// Softmax router -> top-k -> optional renormalisation -> SwiGLU experts -> weighted sum.
int moe_ffn_softmax(Graph &g, int x, const MoeWeights &w, int n_used, bool norm_weights);

// Experts for already selected ids [k, T] and weights [k, T].
int moe_experts(Graph &g, int x, const MoeWeights &w, int ids, int weights);

// Dense SwiGLU FFN: down(silu(gate x) * up x) (deepseek2 leading dense blocks, shared experts).
int ffn_swiglu(Graph &g, int x, int gate, int up, int down);

// Router options of DeepSeek-V3-style MoE layers.
struct MoeRouting {
  ExpertGating gating = ExpertGating::Softmax;
  int selection_bias = -1;        // exp_probs_b [n_expert]: added to the scores for selection only
  int n_groups = 0, n_groups_used = 0;  // grouped selection when n_groups > 1
  bool norm_weights = false;      // renormalise the selected weights to sum 1
  float weights_scale = 1.0f;     // then multiply them by this
};
// Router (softmax or sigmoid) -> biased (grouped) top-k -> unbiased weights -> experts.
int moe_ffn_routed(Graph &g, int x, const MoeWeights &w, int n_used, const MoeRouting &r);

// The attn_factor the reference engine hands to RoPE (llama.cpp cparams.yarn_attn_factor):
// YaRN's mscale ratio divided by the factor the RoPE kernel multiplies back in.
// log_mul is mscale_all_dim; deepseek2 uses it as mscale too when it is not 1.
float yarn_rope_attn_factor(const Hparams &h, float log_mul, bool deepseek2);

}  // namespace moe
