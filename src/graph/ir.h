// Graph IR: a model forward pass as a DAG of typed tensor ops, built once per batch-size
// bucket by an architecture's graph builder (src/model/arch/*.cpp), then compiled
// (src/graph/compiler.h): device placement, memory planning, scheduling.
//
//   Graph g;
//   int x   = g.input("tokens", DType::I32, {n_tokens});
//   int emb = g.get_rows(g.weight(tok_embd), x);          // [n_embd, n_tokens]
//   int h   = g.rms_norm(emb, eps);  h = g.mul(h, g.weight(norm_w));
//   g.mark_output(g.matmul(g.weight(out_w), h), "logits");
//
// Shapes follow GGML's convention: ne[0] is the contiguous (row) dimension; a matrix
// weight of GGUF shape {K, M} maps K inputs to M outputs. Every builder call infers and
// checks its output shape, so a malformed model fails at graph build, not in a kernel.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quant/dtype.h"

namespace moe {

struct GgufTensorInfo;
struct KvLayerRef;

enum class Op : uint8_t {
  Leaf,        // weight, input or external buffer (no computation)
  View,        // reshape/offset view of src0 (no computation)
  GetRows,     // src0 table [ne0, rows] (any type), src1 ids I32 [n] -> F32 [ne0, n]
  MatMul,      // src0 weight [K, M] (any type), src1 F32 [K, N...] -> F32 [M, N...]
  MatMulId,    // src0 experts [K, M, E], src1 F32 [K, 1 or n_used, T], src2 ids I32 [n_used, T] -> F32 [M, n_used, T]
  RmsNorm,     // over ne0; f[0] = eps
  Mul,         // src0 * src1, src1 broadcast over dims where its extent is 1
  Add,         // src0 + src1, same broadcast
  Scale,       // src0 * f[0] + f[1]
  Rope,        // src0 F32 [head_dim, n_head, T], src1 positions I32 [T]; see RopeParams
  Softmax,     // over ne0
  Sigmoid,
  TopK,        // src0 F32 [E, T] -> I32 [k, T], descending, ties -> lower index; i[0] = k
  GatherCols,  // src0 F32 [E, T], src1 I32 [k, T] -> F32 [k, T]: out[j,t] = src0[src1[j,t], t]
  NormSum,     // rows divided by their sum (expert weight renormalisation)
  SwiGLU,      // silu(src0) * src1
  MoeCombine,  // src0 F32 [M, k, T] * src1 weights F32 [k, T], summed over k -> [M, T]
  KvStore,     // write src0 F32 [row, T] into the KV cache tensor named by kv (K or V) at the
               // batch's cells; output is a zero-size token for ordering
  Attention,   // src0 q F32 [hd_k, n_head, T], src1 = KvStore token of K, src2 = of V ->
               // F32 [hd_v, n_head, T]; f[0] = scale; causal + per-sequence mask from cells.
               // Optional (AttentionOptions): i[2] bit 0 = V is the first hd_v values of the K
               // row (MLA latent; src2 unused), i[3] = sliding window, src3 = per-head sinks F32 [n_head]
  Copy,        // contiguous F32 copy of src0 (materialises a view)
  Slice,       // src0 F32 [n0, n1, n2] -> contiguous [ip[1], n1, n2] from element ip[0] of each row
  Concat,      // src0 F32 [a, n1, n2], src1 F32 [b, n1, n2] -> [a + b, n1, n2] (rows joined)
  MatMulHeads, // src0 weight [K, M, H], src1 F32 [K, H, T] -> F32 [M, H, T]: one matrix per head
  GroupedTopK, // src0 F32 [E, T] -> I32 [k, T]: i[0] = k, i[1] = groups, i[2] = groups kept; see ir.cpp
  AddId,       // src0 F32 [M, k, T] + src1 [M, E] columns picked by src2 ids I32 [k, T]
  SwiGLUOai,   // gpt-oss clamped SwiGLU: min(g, lim) * sigmoid(alpha * min(g, lim)) * (clamp(u, -lim, lim) + 1)
  Transfer,    // copy of src0 (contiguous bytes, any type) from another device's memory into this
               // node's device (Node::device); inserted by the compiler at device boundaries only
  // Recurrent (gated DeltaNet) layers; kv_layer names the layer whose per-sequence state
  // (KvCache::recurrent_src/dst) the op reads and advances, token by token in batch order.
  SsmConv,     // src0 F32 [C, T], src1 weight F32 [K, C] -> silu(causal depthwise conv over the
               // sequence's last K-1 inputs and this one) [C, T]; state: conv tail (K-1) x C
  L2Norm,      // x / max(||x||, f[0]) over ne0
  Softplus,    // log(1 + exp(x)), x for x > 20
  DeltaNet,    // gated delta rule: src0 q [d, n_k, T], src1 k [d, n_k, T] (both L2-normalised),
               // src2 v [d, n_v, T], src3 [2 n_v, T] = (log decay g, beta) -> [d, n_v, T];
               // f[0] = output scale; i[0] = value head -> key head: 0 h / (n_v / n_k), 1 h % n_k;
               // i[1] = 1: chunked form (same recurrence, chunks of tokens per sequence);
               // state: n_v matrices d x d after the layer's conv tail
  Count
};
const char *op_name(Op op);

enum class LeafKind : uint8_t { None, Weight, Input, Output };

// RoPE parameters (GGML semantics, including YaRN).
struct RopeParams {
  int n_rot = 0;          // rotated dims per head (<= head_dim)
  bool neox = true;       // NeoX: pairs (i, i + n_rot/2); normal/GPT-J: pairs (2i, 2i+1)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;   // 1 / scaling factor
  float ext_factor = 0.0f;   // YaRN ramp mix (0 = off)
  float attn_factor = 1.0f;  // magnitude scale of cos/sin
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int n_ctx_orig = 0;
};

constexpr int kMaxSrc = 4;

struct AttentionOptions {
  bool v_from_k = false;   // MLA: V = first head_dim_v values of the (single-head) K row
  int32_t window = 0;      // sliding window: cell visible iff query_pos - cell_pos < window (0 = off)
  int sinks = -1;          // node id of F32 [n_head] sink logits, or -1
};
constexpr int kMaxRopeDims = 1024;

struct Node {
  Op op = Op::Leaf;
  DType type = DType::F32;
  int64_t ne[4] = {1, 1, 1, 1};
  size_t nb[4] = {0, 0, 0, 0};  // byte strides (set by finalize_strides; views may differ)
  int src[kMaxSrc] = {-1, -1, -1, -1};
  int32_t ip[4] = {0, 0, 0, 0};
  float fp[4] = {0, 0, 0, 0};
  RopeParams rope;
  std::string name;
  LeafKind leaf = LeafKind::None;
  const GgufTensorInfo *weight = nullptr;  // Leaf/Weight
  int kv_layer = -1;                       // KvStore/Attention: which layer's cache
  int kv_which = 0;                        // KvStore: 0 = K, 1 = V
  // Attention: the KV cache's element type, set by the graph builder (which knows the
  // context's cache), so a backend plans only the scratch that cache type uses; unset
  // (hand-built graphs): scratch for every cache type.
  std::optional<DType> kv_type;
  size_t view_offset = 0;                  // View: byte offset into src0
  int segment = 0;                         // scheduling segment (e.g. layer); abort is polled between segments

  // Filled by the compiler.
  int device = 0;
  int storage = -1;                        // node whose memory this node uses (self, or a view/in-place root)
  size_t offset = 0;                       // byte offset in its device's activation arena
  size_t work_offset = 0, work_size = 0;   // per-node scratch in the arena (e.g. quantized activations)
  void *data = nullptr;                    // resolved address (host or device) after binding
  void *work = nullptr;                    // resolved scratch address (work_size bytes)
  // A graph output that no node reads (the LM head's logits): nothing rounds it further, so a
  // backend may compute it in its own float order instead of the CPU's (CUDA: cuda_own_order_product).
  bool final_output = false;
  // A product the graph builder split off to run on its layer's GPU while its weight stays
  // in page-locked host memory, read there in place over the bus (no Transfer of the
  // weight); see Graph::moe_direct_slots. Placed on CompileOptions::direct_device.
  bool direct_read = false;

  int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  size_t nbytes() const;
  bool is_contiguous() const;
};

class Graph {
public:
  // Leaves
  int weight(const GgufTensorInfo *t);
  int input(const std::string &name, DType type, std::vector<int64_t> ne);

  // Ops (each infers/validates shapes and returns the new node id)
  int get_rows(int table, int ids);
  int matmul(int w, int x);
  int matmul_id(int w, int x, int ids);
  int rms_norm(int x, float eps);
  int mul(int a, int b);
  int add(int a, int b);
  int scale(int a, float s, float bias = 0.0f);
  int rope(int x, int pos, const RopeParams &p);
  int softmax(int x);
  int sigmoid(int x);
  int top_k(int x, int k);
  int gather_cols(int x, int ids);
  int norm_sum(int x);
  int swiglu(int gate, int up);
  int moe_combine(int experts, int weights);
  int kv_store(int x, int layer, int which);
  int attention(int q, int k_token, int v_token, int64_t head_dim_v, float scale);
  int view(int x, std::vector<int64_t> ne, size_t byte_offset = 0);  // contiguous reinterpretation
  int copy(int x);
  // Attention with MLA latent-as-V, sliding window and sinks (see Op::Attention).
  int attention_ext(int q, int k_token, int v_token, int64_t head_dim_v, float scale, const AttentionOptions &o);
  int slice(int x, int64_t start, int64_t len);
  int concat(int a, int b);
  int matmul_heads(int w, int x);
  int grouped_top_k(int x, int k, int n_groups, int n_groups_used);
  int add_id(int x, int bias, int ids);
  int swiglu_oai(int gate, int up, float alpha, float limit);
  // Gated DeltaNet pieces (see Op::SsmConv / DeltaNet); layer = the state's layer.
  int ssm_conv(int x, int w, int layer);
  int l2_norm(int x, float eps);
  int softplus(int x);
  int delta_net(int q, int k, int v, int g_beta, int layer, int head_map, float scale, bool chunked = false);

  void mark_output(int id, const std::string &name);
  // The compiler's rewrite (placement inserts Transfer nodes): the new node list and outputs.
  void replace_nodes(std::vector<Node> nodes, std::vector<int> outputs) { nodes_ = std::move(nodes); outputs_ = std::move(outputs); }
  void set_segment(int s) { segment_ = s; }
  void name(int id, const std::string &n) { nodes_[static_cast<size_t>(id)].name = n; }

  const std::vector<Node> &nodes() const { return nodes_; }
  std::vector<Node> &nodes() { return nodes_; }
  const Node &node(int id) const { return nodes_[static_cast<size_t>(id)]; }
  Node &node(int id) { return nodes_[static_cast<size_t>(id)]; }
  const std::vector<int> &outputs() const { return outputs_; }
  int find_input(const std::string &name) const;
  int find_output(const std::string &name) const;

  // GPU products and F32-cache attention of small batches (2..128 tokens) sum in the CPU
  // backend's float order, bit for bit, instead of the tensor cores' order. On by default
  // for graphs built by hand (op tests compare backends bit for bit); a Context sets it from
  // ContextParams::cpu_float_order (default off: prompts of 16..128 tokens ~10x faster).
  bool cpu_float_order = true;

  // Decode with a layer's experts in host memory: that many of each token's routed experts
  // are computed by the layer's GPU, reading the host copy in place, while the CPU computes
  // the rest (the two read memory through different paths, so their bandwidths add).
  // Indexed by layer; empty or 0 = no split. Set by the Context before the build.
  std::vector<int> moe_direct_slots_by_layer;
  int moe_direct_slots() const {  // for the layer being built (segment_ = layer + 1)
    const size_t l = static_cast<size_t>(segment_ - 1);
    return segment_ >= 1 && l < moe_direct_slots_by_layer.size() ? moe_direct_slots_by_layer[l] : 0;
  }

private:
  int push(Node n);
  std::vector<Node> nodes_;
  std::vector<int> outputs_;
  int segment_ = 0;
};

}  // namespace moe
