#include "graph/ir.h"

#include "core/status.h"
#include "gguf/gguf_reader.h"

namespace moe {

const char *op_name(Op op) {
  static const char *names[] = {"leaf", "view", "get_rows", "matmul", "matmul_id", "rms_norm", "mul",
                                "add", "scale", "rope", "softmax", "sigmoid", "top_k", "gather_cols",
                                "norm_sum", "swiglu", "moe_combine", "kv_store", "attention", "copy",
                                "slice", "concat", "matmul_heads", "grouped_top_k", "add_id", "swiglu_oai", "transfer",
                                "ssm_conv", "l2_norm", "softplus", "delta_net"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(Op::Count), "op names");
  return names[static_cast<size_t>(op)];
}

static void set_contiguous_strides(Node &n) {
  const TypeTraits &tr = type_traits(n.type);
  n.nb[0] = tr.type_size;
  n.nb[1] = row_size(n.type, n.ne[0]);
  n.nb[2] = n.nb[1] * static_cast<size_t>(n.ne[1]);
  n.nb[3] = n.nb[2] * static_cast<size_t>(n.ne[2]);
}

size_t Node::nbytes() const { return nb[3] * static_cast<size_t>(ne[3]); }

bool Node::is_contiguous() const {
  const TypeTraits &tr = type_traits(type);
  return nb[0] == tr.type_size && nb[1] == row_size(type, ne[0]) &&
         nb[2] == nb[1] * static_cast<size_t>(ne[1]) && nb[3] == nb[2] * static_cast<size_t>(ne[2]);
}

int Graph::push(Node n) {
  if (n.op != Op::View) set_contiguous_strides(n);
  n.segment = segment_;
  nodes_.push_back(std::move(n));
  return static_cast<int>(nodes_.size()) - 1;
}

static std::string shape_str(const Node &n) {
  return strfmt("[%lld,%lld,%lld,%lld]", (long long)n.ne[0], (long long)n.ne[1], (long long)n.ne[2], (long long)n.ne[3]);
}

[[noreturn]] static void shape_fail(const char *op, const Node &a, const Node &b, const char *why) {
  fail(Status::InvalidModel, "%s: %s (%s %s vs %s %s)", op, why, a.name.c_str(), shape_str(a).c_str(),
       b.name.c_str(), shape_str(b).c_str());
}

int Graph::weight(const GgufTensorInfo *t) {
  Node n;
  n.leaf = LeafKind::Weight;
  n.type = t->type;
  for (int d = 0; d < 4; ++d) n.ne[d] = t->ne[d];
  n.weight = t;
  n.name = t->name;
  return push(std::move(n));
}

int Graph::input(const std::string &name, DType type, std::vector<int64_t> ne) {
  Node n;
  n.leaf = LeafKind::Input;
  n.type = type;
  for (size_t d = 0; d < ne.size() && d < 4; ++d) n.ne[d] = ne[d];
  n.name = name;
  return push(std::move(n));
}

int Graph::get_rows(int table, int ids) {
  const Node &t = node(table), &i = node(ids);
  if (i.type != DType::I32) fail(Status::Internal, "get_rows: ids must be i32");
  if (t.type != DType::F32 && !type_traits(t.type).supported) fail(Status::Unsupported, "get_rows: %s has unsupported type %s", t.name.c_str(), dtype_name(t.type));
  Node n;
  n.op = Op::GetRows;
  n.ne[0] = t.ne[0];
  n.ne[1] = i.ne[0];
  n.src[0] = table;
  n.src[1] = ids;
  return push(std::move(n));
}

int Graph::matmul(int w, int x) {
  const Node &a = node(w), &b = node(x);
  if (a.ne[0] != b.ne[0]) shape_fail("matmul", a, b, "inner dimensions differ");
  if (b.type != DType::F32) fail(Status::Internal, "matmul: activation %s must be f32", b.name.c_str());
  if (a.ne[2] != 1 || a.ne[3] != 1) shape_fail("matmul", a, b, "weight must be 2-D");
  Node n;
  n.op = Op::MatMul;
  n.ne[0] = a.ne[1];
  n.ne[1] = b.ne[1];
  n.ne[2] = b.ne[2];
  n.ne[3] = b.ne[3];
  n.src[0] = w;
  n.src[1] = x;
  return push(std::move(n));
}

int Graph::matmul_id(int w, int x, int ids) {
  const Node &a = node(w), &b = node(x), &c = node(ids);
  if (a.ne[0] != b.ne[0]) shape_fail("matmul_id", a, b, "inner dimensions differ");
  if (c.type != DType::I32) fail(Status::Internal, "matmul_id: ids must be i32");
  if (b.ne[2] != c.ne[1]) shape_fail("matmul_id", b, c, "token counts differ");
  if (b.ne[1] != 1 && b.ne[1] != c.ne[0]) shape_fail("matmul_id", b, c, "input must have 1 or n_used rows per token");
  Node n;
  n.op = Op::MatMulId;
  n.ne[0] = a.ne[1];
  n.ne[1] = c.ne[0];
  n.ne[2] = c.ne[1];
  n.src[0] = w;
  n.src[1] = x;
  n.src[2] = ids;
  n.ip[0] = static_cast<int32_t>(a.ne[2]);  // number of experts, for bounds checks
  return push(std::move(n));
}

static Node unary(Op op, const Node &a, int src) {
  Node n;
  n.op = op;
  for (int d = 0; d < 4; ++d) n.ne[d] = a.ne[d];
  n.src[0] = src;
  return n;
}

int Graph::rms_norm(int x, float eps) {
  Node n = unary(Op::RmsNorm, node(x), x);
  n.fp[0] = eps;
  return push(std::move(n));
}

static void check_broadcast(const char *op, const Node &a, const Node &b) {
  if (b.type != DType::F32 || a.type != DType::F32) {
    if (!(b.leaf == LeafKind::Weight && b.type == DType::F32)) shape_fail(op, a, b, "operands must be f32");
  }
  if (a.ne[0] != b.ne[0]) shape_fail(op, a, b, "row lengths differ");
  for (int d = 1; d < 4; ++d)
    if (b.ne[d] != a.ne[d] && b.ne[d] != 1) shape_fail(op, a, b, "cannot broadcast");
}

int Graph::mul(int a, int b) {
  check_broadcast("mul", node(a), node(b));
  Node n = unary(Op::Mul, node(a), a);
  n.src[1] = b;
  return push(std::move(n));
}

int Graph::add(int a, int b) {
  check_broadcast("add", node(a), node(b));
  Node n = unary(Op::Add, node(a), a);
  n.src[1] = b;
  return push(std::move(n));
}

int Graph::scale(int a, float s, float bias) {
  Node n = unary(Op::Scale, node(a), a);
  n.fp[0] = s;
  n.fp[1] = bias;
  return push(std::move(n));
}

int Graph::rope(int x, int pos, const RopeParams &p) {
  const Node &a = node(x), &b = node(pos);
  if (b.type != DType::I32 || b.ne[0] != a.ne[2]) shape_fail("rope", a, b, "positions must be i32 [n_tokens]");
  if (p.n_rot <= 0 || p.n_rot > a.ne[0] || p.n_rot % 2 || p.n_rot > kMaxRopeDims) fail(Status::InvalidModel, "rope: n_rot %d invalid for head dim %lld", p.n_rot, (long long)a.ne[0]);
  Node n = unary(Op::Rope, a, x);
  n.src[1] = pos;
  n.rope = p;
  return push(std::move(n));
}

int Graph::softmax(int x) { return push(unary(Op::Softmax, node(x), x)); }
int Graph::sigmoid(int x) { return push(unary(Op::Sigmoid, node(x), x)); }

int Graph::top_k(int x, int k) {
  const Node &a = node(x);
  if (k <= 0 || k > a.ne[0]) fail(Status::InvalidModel, "top_k: k=%d but only %lld candidates", k, (long long)a.ne[0]);
  Node n = unary(Op::TopK, a, x);
  n.type = DType::I32;
  n.ne[0] = k;
  n.ip[0] = k;
  return push(std::move(n));
}

int Graph::gather_cols(int x, int ids) {
  const Node &a = node(x), &b = node(ids);
  if (b.type != DType::I32 || b.ne[1] != a.ne[1]) shape_fail("gather_cols", a, b, "ids must be i32 [k, T]");
  Node n = unary(Op::GatherCols, a, x);
  n.ne[0] = b.ne[0];
  n.src[1] = ids;
  return push(std::move(n));
}

int Graph::norm_sum(int x) { return push(unary(Op::NormSum, node(x), x)); }

int Graph::swiglu(int gate, int up) {
  const Node &a = node(gate), &b = node(up);
  for (int d = 0; d < 4; ++d)
    if (a.ne[d] != b.ne[d]) shape_fail("swiglu", a, b, "shapes differ");
  Node n = unary(Op::SwiGLU, a, gate);
  n.src[1] = up;
  return push(std::move(n));
}

int Graph::moe_combine(int experts, int weights) {
  const Node &a = node(experts), &b = node(weights);
  if (a.ne[1] != b.ne[0] || a.ne[2] != b.ne[1]) shape_fail("moe_combine", a, b, "expert outputs and weights disagree");
  Node n;
  n.op = Op::MoeCombine;
  n.ne[0] = a.ne[0];
  n.ne[1] = a.ne[2];
  n.src[0] = experts;
  n.src[1] = weights;
  return push(std::move(n));
}

int Graph::kv_store(int x, int layer, int which) {
  Node n;
  n.op = Op::KvStore;
  n.ne[0] = 0;  // produces no data: an ordering token
  n.src[0] = x;
  n.kv_layer = layer;
  n.kv_which = which;
  n.ip[0] = static_cast<int32_t>(node(x).ne[0] * node(x).ne[1]);  // values per token row
  return push(std::move(n));
}

int Graph::attention(int q, int k_token, int v_token, int64_t head_dim_v, float scale) {
  const Node &a = node(q);
  Node n;
  n.op = Op::Attention;
  n.ne[0] = head_dim_v;
  n.ne[1] = a.ne[1];
  n.ne[2] = a.ne[2];
  n.src[0] = q;
  n.src[1] = k_token;
  n.src[2] = v_token;
  n.kv_layer = node(k_token).kv_layer;
  n.fp[0] = scale;
  return push(std::move(n));
}

int Graph::view(int x, std::vector<int64_t> ne, size_t byte_offset) {
  const Node &a = node(x);
  if (!a.is_contiguous()) fail(Status::Internal, "view of non-contiguous %s", a.name.c_str());
  Node n;
  n.op = Op::View;
  n.type = a.type;
  for (size_t d = 0; d < 4; ++d) n.ne[d] = d < ne.size() ? ne[d] : 1;
  set_contiguous_strides(n);
  if (byte_offset + n.nbytes() > a.nbytes()) fail(Status::Internal, "view of %s out of range", a.name.c_str());
  n.src[0] = x;
  n.view_offset = byte_offset;
  n.leaf = a.leaf == LeafKind::Weight ? LeafKind::Weight : LeafKind::None;
  n.weight = a.weight;
  return push(std::move(n));
}

int Graph::copy(int x) { return push(unary(Op::Copy, node(x), x)); }

int Graph::attention_ext(int q, int k_token, int v_token, int64_t head_dim_v, float scale, const AttentionOptions &o) {
  const Node &a = node(q);
  if (o.v_from_k && head_dim_v > a.ne[0]) shape_fail("attention", a, a, "latent V longer than the K row");
  if (o.window < 0) fail(Status::InvalidModel, "attention: negative sliding window %d", o.window);
  if (o.sinks >= 0) {
    const Node &s = node(o.sinks);
    if (s.type != DType::F32 || s.ne[0] != a.ne[1] || s.nelements() != a.ne[1]) shape_fail("attention", a, s, "sinks must be f32 [n_head]");
  }
  int id = attention(q, k_token, o.v_from_k ? k_token : v_token, head_dim_v, scale);
  Node &n = node(id);
  n.ip[2] = o.v_from_k ? 1 : 0;
  n.ip[3] = o.window;
  n.src[3] = o.sinks;
  return id;
}

int Graph::slice(int x, int64_t start, int64_t len) {
  const Node &a = node(x);
  if (a.type != DType::F32 || start < 0 || len <= 0 || start + len > a.ne[0]) shape_fail("slice", a, a, "range outside the row");
  Node n = unary(Op::Slice, a, x);
  n.ne[0] = len;
  n.ip[0] = static_cast<int32_t>(start);
  n.ip[1] = static_cast<int32_t>(len);
  return push(std::move(n));
}

int Graph::concat(int a, int b) {
  const Node &x = node(a), &y = node(b);
  if (x.type != DType::F32 || y.type != DType::F32) shape_fail("concat", x, y, "operands must be f32");
  for (int d = 1; d < 4; ++d)
    if (x.ne[d] != y.ne[d]) shape_fail("concat", x, y, "outer dimensions differ");
  Node n = unary(Op::Concat, x, a);
  n.ne[0] = x.ne[0] + y.ne[0];
  n.src[1] = b;
  return push(std::move(n));
}

int Graph::matmul_heads(int w, int x) {
  const Node &a = node(w), &b = node(x);
  if (a.ne[0] != b.ne[0]) shape_fail("matmul_heads", a, b, "inner dimensions differ");
  if (a.ne[2] != b.ne[1] || a.ne[3] != 1) shape_fail("matmul_heads", a, b, "one matrix per head expected");
  if (b.type != DType::F32) fail(Status::Internal, "matmul_heads: activation %s must be f32", b.name.c_str());
  Node n;
  n.op = Op::MatMulHeads;
  n.ne[0] = a.ne[1];
  n.ne[1] = b.ne[1];
  n.ne[2] = b.ne[2];
  n.src[0] = w;
  n.src[1] = x;
  return push(std::move(n));
}

// Groups of E / n_groups consecutive experts are ranked by the sum of their two best
// scores; the best n_groups_used groups are kept, then the k best experts of the kept
// groups are chosen. Ties go to the lower index at both stages, so no -inf masking (whose
// meaning would depend on a backend's handling of infinities) is involved.
int Graph::grouped_top_k(int x, int k, int n_groups, int n_groups_used) {
  const Node &a = node(x);
  if (n_groups <= 0 || a.ne[0] % n_groups)
    fail(Status::InvalidModel, "grouped_top_k: %lld experts do not split into %d groups", (long long)a.ne[0], n_groups);
  if (n_groups_used <= 0 || n_groups_used > n_groups)
    fail(Status::InvalidModel, "grouped_top_k: %d groups used of %d", n_groups_used, n_groups);
  if (k <= 0 || k > a.ne[0] / n_groups * n_groups_used)
    fail(Status::InvalidModel, "grouped_top_k: k=%d but the %d kept groups hold only %lld experts", k, n_groups_used,
         (long long)(a.ne[0] / n_groups * n_groups_used));
  Node n = unary(Op::GroupedTopK, a, x);
  n.type = DType::I32;
  n.ne[0] = k;
  n.ip[0] = k;
  n.ip[1] = n_groups;
  n.ip[2] = n_groups_used;
  return push(std::move(n));
}

int Graph::add_id(int x, int bias, int ids) {
  const Node &a = node(x), &b = node(bias), &c = node(ids);
  if (b.type != DType::F32 || b.ne[0] != a.ne[0] || b.ne[2] != 1) shape_fail("add_id", a, b, "bias must be f32 [M, E]");
  if (c.type != DType::I32 || c.ne[0] != a.ne[1] || c.ne[1] != a.ne[2]) shape_fail("add_id", a, c, "ids must be i32 [k, T]");
  Node n = unary(Op::AddId, a, x);
  n.src[1] = bias;
  n.src[2] = ids;
  return push(std::move(n));
}

int Graph::swiglu_oai(int gate, int up, float alpha, float limit) {
  const Node &a = node(gate), &b = node(up);
  for (int d = 0; d < 4; ++d)
    if (a.ne[d] != b.ne[d]) shape_fail("swiglu_oai", a, b, "shapes differ");
  Node n = unary(Op::SwiGLUOai, a, gate);
  n.src[1] = up;
  n.fp[0] = alpha;
  n.fp[1] = limit;
  return push(std::move(n));
}

int Graph::ssm_conv(int x, int w, int layer) {
  const Node &a = node(x), &b = node(w);
  if (a.type != DType::F32 || a.ne[2] != 1 || a.ne[3] != 1) shape_fail("ssm_conv", a, b, "input must be f32 [channels, tokens]");
  if (b.type != DType::F32 || b.ne[1] != a.ne[0] || b.ne[0] < 1 || b.ne[0] > 64 || b.ne[2] != 1)
    shape_fail("ssm_conv", a, b, "kernel must be f32 [width 1..64, channels]");
  Node n = unary(Op::SsmConv, a, x);
  n.src[1] = w;
  n.kv_layer = layer;
  n.ip[0] = static_cast<int32_t>(b.ne[0]);
  return push(std::move(n));
}

int Graph::l2_norm(int x, float eps) {
  Node n = unary(Op::L2Norm, node(x), x);
  n.fp[0] = eps;
  return push(std::move(n));
}

int Graph::softplus(int x) { return push(unary(Op::Softplus, node(x), x)); }

int Graph::delta_net(int q, int k, int v, int g_beta, int layer, int head_map, float scale, bool chunked) {
  const Node &a = node(q), &b = node(k), &c = node(v), &gb = node(g_beta);
  for (int d = 0; d < 4; ++d)
    if (a.ne[d] != b.ne[d]) shape_fail("delta_net", a, b, "q and k shapes differ");
  if (c.ne[0] != a.ne[0] || c.ne[2] != a.ne[2] || a.ne[3] != 1 || c.ne[1] % a.ne[1]) shape_fail("delta_net", a, c, "v must be [d, a multiple of the key heads, T]");
  if (gb.ne[0] != 2 * c.ne[1] || gb.ne[1] != c.ne[2] || gb.ne[2] != 1) shape_fail("delta_net", c, gb, "gates must be [2 x value heads, T]");
  for (const Node *t : {&a, &b, &c, &gb})
    if (t->type != DType::F32 || !t->is_contiguous()) shape_fail("delta_net", *t, *t, "operands must be contiguous f32");
  Node n = unary(Op::DeltaNet, c, v);
  n.src[0] = q;
  n.src[1] = k;
  n.src[2] = v;
  n.src[3] = g_beta;
  n.kv_layer = layer;
  n.ip[0] = head_map;
  n.ip[1] = chunked ? 1 : 0;
  n.fp[0] = scale;
  return push(std::move(n));
}

void Graph::mark_output(int id, const std::string &name) {
  nodes_[static_cast<size_t>(id)].name = name;
  outputs_.push_back(id);
}

int Graph::find_input(const std::string &name) const {
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].leaf == LeafKind::Input && nodes_[i].name == name) return static_cast<int>(i);
  return -1;
}

int Graph::find_output(const std::string &name) const {
  for (int id : outputs_)
    if (nodes_[static_cast<size_t>(id)].name == name) return id;
  return -1;
}

}  // namespace moe
