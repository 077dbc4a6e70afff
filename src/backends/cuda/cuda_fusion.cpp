// Fusion plan: pattern matching over a compiled graph (see cuda_fusion.h for the rules).
#include "backends/cuda/cuda_fusion.h"

#include <algorithm>

#include "backends/cuda/ops/matmul_heads.h"
#include "backends/cuda/ops/matvec.h"
#include "backends/cuda/ops/quant_extra.h"

namespace moe {

namespace {

// The fused mat-vec launchers (cuda_fused_matmul_add & co., ops/matvec.cu) exist: groups of
// those kinds are planned (0: never, e.g. to measure without them).
#ifndef MOE_CUDA_FUSED_MATVEC
#define MOE_CUDA_FUSED_MATVEC 1
#endif

bool is_compute(const Node &n) { return n.op != Op::Leaf && n.op != Op::View; }
bool f32_rows(const Node &n) { return n.type == DType::F32 && n.nb[0] == 4; }

struct Range {
  int device;
  size_t lo, hi;
};

class Matcher {
public:
  explicit Matcher(const Graph &g, bool delta_norm = true)
      : g_(g), delta_norm_(delta_norm), n_(static_cast<int>(g.nodes().size())), uses_(static_cast<size_t>(n_), 0),
        output_(static_cast<size_t>(n_), false) {
    for (const Node &nd : g.nodes())
      for (int s : nd.src)
        if (s >= 0) uses_[static_cast<size_t>(s)]++;
    for (int o : g.outputs()) output_[static_cast<size_t>(o)] = true;
  }

  FusionPlan run() {
    FusionPlan p;
    p.group_of.assign(static_cast<size_t>(n_), -1);
    for (int i = 0; i < n_; ++i) {
      if (!is_compute(g_.node(i))) continue;
      FusedGroup grp;
      if (!match_at(i, grp) || !safe(grp)) {
        // A norm that cannot join its router (or gated norm) may still form a row chain, a
        // Slice that cannot start a DeltaIn group a sequence.
        grp = FusedGroup{};
        const Op op = nd(i).op;
        const bool seq = op == Op::Slice || op == Op::Concat || op == Op::Sigmoid;
        if (!(op == Op::RmsNorm ? match_row_chains(i, grp) : seq && match_sequence(i, grp)) || !safe(grp)) continue;
      }
      grp.first = grp.members.front();
      grp.last = grp.members.back();
      grp.label = "fused:";
      for (size_t k = 0; k < grp.members.size(); ++k)
        grp.label += std::string(k ? "+" : "") + op_name(g_.node(grp.members[k]).op);
      if (grp.kind == FusedKind::DownCombine && !p.groups.empty()) grp.ids_settled = ids_read_just_before(p.groups.back(), grp);
      for (int k = grp.first; k <= grp.last; ++k) p.group_of[static_cast<size_t>(k)] = static_cast<int>(p.groups.size());
      i = grp.last;
      p.groups.push_back(std::move(grp));
    }
    return p;
  }

  // Every value a DeltaIn group of `device` reads from outside stays intact until its last
  // member ran: the launch reads qkv and the gate operands while other blocks write the q / k /
  // v / gates outputs, which the planner would otherwise put over them (they die inside).
  // The same for a DownCombine group (its combine output would otherwise take the bytes of the
  // expert ids or the activations, dead after the unfused down: safe() then refuses the group,
  // seen in most layers of the tiny hybrids, whose combine is not followed by an Add), and for a
  // DeltaNorm group, its DeltaNet output too (the scratch its last blocks normalise). And for
  // gpt-oss's gate/up group (its SwiGLU-OAI output would otherwise take the activations' bytes,
  // dead after the unfused gate product).
  void keep_live(int device, std::vector<int> &keep_until) const {
    for (int i = 0; i < n_; ++i) {
      FusedGroup grp;
      // (A gate/up group of 2+ tokens may run as one few-column launch: cuda_mcol_swiglu; a
      // MatMul + Add of 2+ columns too: cuda_mcol_matmul_add.)
      const bool moe = nd(i).op == Op::MatMulId && MOE_CUDA_FUSED_MATVEC &&
                       (match_gate_up_oai(i, grp) || match_down(i, grp) || (match_gate_up(i, grp) && nd(i).ne[2] > 1));
      const bool cols = nd(i).op == Op::MatMul && MOE_CUDA_FUSED_MATVEC && nd(i).ne[1] * nd(i).ne[2] * nd(i).ne[3] > 1 &&
                        match_matmul_add(i, grp);
      // (A CombineAdd group's output would otherwise take the bytes of the down's products,
      // dead after the unfused combine, which its threads still read.)
      const bool comb = nd(i).op == Op::MoeCombine && match_combine_add(i, grp);
      const bool heads = nd(i).op == Op::MatMulHeads && match_heads_concat(i, grp);
      const bool glue = nd(i).op == Op::Slice && match_sequence(i, grp) && grp.mla_glue;
      if (nd(i).device != device || !is_compute(nd(i)) || !(moe || cols || comb || heads || glue || match_delta_in(i, grp) || match_delta_norm(i, grp)))
        continue;
      if (grp.kind == FusedKind::DeltaNorm) keep_until[static_cast<size_t>(i)] = std::max(keep_until[static_cast<size_t>(i)], grp.members.back());
      for (int m : grp.members)
        for (int s : nd(m).src)
          if (s >= 0 && std::find(grp.members.begin(), grp.members.end(), s) == grp.members.end())
            keep_until[static_cast<size_t>(s)] = std::max(keep_until[static_cast<size_t>(s)], grp.members.back());
      i = grp.members.back();
    }
  }

private:
  const Node &nd(int i) const { return g_.node(i); }
  // Next node that runs (skipping leaves and views), or -1.
  int next(int i) const {
    for (int k = i + 1; k < n_; ++k)
      if (is_compute(nd(k))) return k;
    return -1;
  }
  // A gate/up group that runs right before `down` and reads its expert ids (FusedGroup::ids_settled).
  bool ids_read_just_before(const FusedGroup &prev, const FusedGroup &down) const {
    if (prev.kind != FusedKind::GateUpSwiGLU || next(prev.last) != down.first) return false;
    const Node &gate = nd(prev.members[0]), &d = nd(down.members[0]);
    return gate.op == Op::MatMulId && d.op == Op::MatMulId && gate.src[2] == d.src[2] && same_place(prev.members[0], down.members[0]);
  }
  // Read only by its one consumer inside the group and not a graph output.
  bool private_to_group(int i) const { return uses_[static_cast<size_t>(i)] == 1 && !output_[static_cast<size_t>(i)]; }
  bool read_outside(int i, int n_inside) const {
    return uses_[static_cast<size_t>(i)] > n_inside || output_[static_cast<size_t>(i)];
  }
  bool same_place(int a, int b) const { return nd(a).device == nd(b).device && nd(a).segment == nd(b).segment; }
  int other_src(const Node &add, int x) const { return add.src[0] == x ? add.src[1] : add.src[0]; }
  bool same_shape(const Node &a, const Node &b) const {
    for (int d = 0; d < 4; ++d)
      if (a.ne[d] != b.ne[d]) return false;
    return true;
  }

  bool match_at(int i, FusedGroup &grp) const {
    // F16 weights keep their own one-token kernel (half-precision sums like the reference).
    if ((nd(i).op == Op::MatMul || nd(i).op == Op::MatMulId) && cuda_f16_halfsum_applies(g_, nd(i))) return false;
    switch (nd(i).op) {
      case Op::MatMulId: return match_gate_up(i, grp) || match_down(i, grp);
      case Op::MatMul:
        return match_gate_up(i, grp) || match_topk_router(i, grp) || match_matvecs_add(i, grp) || match_matmul_add(i, grp) ||
               match_router_mm(i, grp) || match_router_side_mm(i, grp) || match_matvecs(i, grp);
      case Op::Softmax: return match_router(i, grp);
      case Op::MoeCombine: return match_combine_add(i, grp);
      case Op::RmsNorm: return match_norm_router(i, grp) || match_gated_norm(i, grp) || match_row_chains(i, grp);
      case Op::Rope: case Op::KvStore: return match_row_chains(i, grp);
      case Op::Slice: case Op::Concat: case Op::Sigmoid: return match_delta_in(i, grp) || match_shared_gate(i, grp) || match_sequence(i, grp);
      case Op::TopK: return match_sequence(i, grp);
      case Op::Add: case Op::Softplus: case Op::SsmConv: return match_delta_in(i, grp);
      case Op::DeltaNet: return match_delta_norm(i, grp);
      case Op::MatMulHeads: return match_heads_concat(i, grp);
      default: return false;
    }
  }

  // The gate/up, down and MatMul + Add groups: matvec.cu's kernels take the weight types of
  // cuda_matmul_type_supported, quant_extra.cu's (cuda_extra_fused_*) the extra types. (Before
  // those existed, an extra-type model in these groups ran them member by member, gate before
  // up, over up's scratch, and met expert ids of -1 on the H200: docs/perf/cuda.md, 2026-12-03
  // evening.)
  bool fusable_weight(int i) const {
    const DType t = nd(nd(i).src[0]).type;
    return cuda_matmul_type_supported(t) || cuda_extra_type(t);
  }

  // Add(mm, r) or Add(r, mm) right after a MatMul of one column, or of 2..kMaxMatVecsCols
  // (several sequences' attention output: one few-column launch where its product takes that
  // kernel, cuda_mcol_matmul_add; else its members in order).
  bool match_matmul_add(int i, FusedGroup &grp) const {
    if (!MOE_CUDA_FUSED_MATVEC || !fusable_weight(i)) return false;
    const Node &mm = nd(i);
    const int a = next(i);
    if (a < 0 || nd(a).op != Op::Add || !same_place(i, a) || !private_to_group(i)) return false;
    const int64_t cols = mm.ne[1] * mm.ne[2] * mm.ne[3];
    if (mm.op != Op::MatMul || cols < 1 || cols > kMaxMatVecsCols) return false;
    const Node &add = nd(a);
    if ((add.src[0] == i) == (add.src[1] == i)) return false;
    FusedGroup delta;  // a DeltaNet's alpha + dt_bias: its Add starts the DeltaIn group (one launch more saved)
    if (match_delta_in(a, delta)) return false;
    const Node &r = nd(other_src(add, i));
    if (!f32_rows(add) || !f32_rows(r) || !f32_rows(mm) || !same_shape(r, add) || !same_shape(mm, add)) return false;
    grp.kind = FusedKind::MatMulAdd;
    grp.members = {i, a};
    grp.written = {a};
    return true;
  }

  // AddId(mm, bias, ids) right after the expert product mm (a MatMulId of one token, the
  // same ids), read by nothing but its consumer in the group, in a weight type of the bias
  // kernels (gpt-oss's expert biases): the AddId's index, else -1.
  int bias_after(int mm) const {
    const int b = next(mm);
    if (b < 0 || nd(b).op != Op::AddId || nd(mm).op != Op::MatMulId || nd(b).src[0] != mm || nd(b).src[2] != nd(mm).src[2]) return -1;
    const Node &rows = nd(nd(b).src[1]), &w = nd(nd(mm).src[0]);
    if (!same_place(mm, b) || !private_to_group(mm) || !f32_rows(nd(b)) || !f32_rows(rows) || rows.ne[0] != nd(mm).ne[0] ||
        rows.ne[1] != w.ne[2] || !cuda_matvec_bias_type(w.type) || nd(mm).ne[2] != 1)
      return -1;
    return b;
  }

  // gpt-oss: MatMulId(up|gate) -> AddId(bias) -> MatMulId(gate|up) -> AddId(bias) ->
  // SwiGLUOai(gate, up); one token, one activation and one set of ids.
  bool match_gate_up_oai(int i, FusedGroup &grp) const {
    const int bi = bias_after(i), j = bi >= 0 ? next(bi) : -1;
    const int bj = j >= 0 ? bias_after(j) : -1, s = bj >= 0 ? next(bj) : -1;
    if (s < 0 || nd(s).op != Op::SwiGLUOai || !same_place(i, j) || !same_place(i, s)) return false;
    const Node &a = nd(i), &b = nd(j), &sw = nd(s);
    if (a.src[1] != b.src[1] || a.src[2] != b.src[2] || !same_shape(a, b) || nd(a.src[0]).type != nd(b.src[0]).type) return false;
    const bool ab = sw.src[0] == bj && sw.src[1] == bi, ba = sw.src[0] == bi && sw.src[1] == bj;
    if (!(ab || ba) || !private_to_group(bi) || !private_to_group(bj) || !f32_rows(sw)) return false;
    grp.kind = FusedKind::GateUpSwiGLU;
    grp.members = {i, bi, j, bj, s};
    grp.written = {s};
    return true;
  }

  // MatMulId(up|gate, x, ids), MatMulId(gate|up, x, ids), SwiGLU(gate, up) of up to
  // kMaxGateUpTokens tokens; or the same with two MatMul (dense or shared-expert FFN) of one
  // token. Or gpt-oss's (match_gate_up_oai).
  bool match_gate_up(int i, FusedGroup &grp) const {
    if (!MOE_CUDA_FUSED_MATVEC) return false;
    if (nd(i).op == Op::MatMulId && match_gate_up_oai(i, grp)) return true;
    const int j = next(i);
    if (j < 0 || nd(j).op != nd(i).op || !fusable_weight(i) || !fusable_weight(j)) return false;
    const int s = next(j);
    if (s < 0 || nd(s).op != Op::SwiGLU || !same_place(i, j) || !same_place(i, s)) return false;
    const Node &a = nd(i), &b = nd(j), &sw = nd(s);
    const bool moe = a.op == Op::MatMulId;
    if (a.src[1] != b.src[1] || (moe && a.src[2] != b.src[2]) || !same_shape(a, b)) return false;
    if (moe ? a.ne[2] < 1 || a.ne[2] > kMaxGateUpTokens : a.ne[1] * a.ne[2] * a.ne[3] != 1) return false;
    const bool ab = sw.src[0] == j && sw.src[1] == i, ba = sw.src[0] == i && sw.src[1] == j;
    if (!(ab || ba) || !private_to_group(i) || !private_to_group(j) || !f32_rows(sw)) return false;
    grp.kind = FusedKind::GateUpSwiGLU;
    grp.members = {i, j, s};
    grp.written = {s};
    return true;
  }

  // MatMulId(down, act, ids) [, AddId(down, bias, ids): gpt-oss], MoeCombine(down, weights)
  // [, Add(combine, r) / Add(r, combine)]; one token.
  bool match_down(int i, FusedGroup &grp) const {
    if (!MOE_CUDA_FUSED_MATVEC || !fusable_weight(i)) return false;
    const int b = bias_after(i), p = b >= 0 ? b : i;  // the combine's product: the bias sum or the MatMulId
    const int c = next(p);
    if (c < 0 || nd(c).op != Op::MoeCombine || nd(c).src[0] != p || !same_place(i, c) || !private_to_group(p)) return false;
    if (nd(i).ne[2] != 1 || !f32_rows(nd(c))) return false;
    grp.kind = FusedKind::DownCombine;
    grp.members = {i};
    if (b >= 0) grp.members.push_back(b);
    grp.members.push_back(c);
    const int a = next(c);
    if (a >= 0 && nd(a).op == Op::Add && same_place(i, a) && private_to_group(c) && (nd(a).src[0] == c) != (nd(a).src[1] == c)) {
      const Node &r = nd(other_src(nd(a), c));
      if (f32_rows(nd(a)) && f32_rows(r) && same_shape(r, nd(a)) && same_shape(nd(c), nd(a))) grp.members.push_back(a);
    }
    grp.written = {grp.members.back()};
    return true;
  }

  // MoeCombine(down, weights) -> Add(combine, r) / Add(r, combine) where no DownCombine group
  // took the combine (2+ tokens): the combine's launch adds the residual (cuda_fused_combine_add).
  bool match_combine_add(int i, FusedGroup &grp) const {
    const int a = next(i);
    if (a < 0 || nd(a).op != Op::Add || !same_place(i, a) || !private_to_group(i)) return false;
    const Node &add = nd(a);
    if ((add.src[0] == i) == (add.src[1] == i)) return false;
    const Node &r = nd(other_src(add, i));
    if (!f32_rows(add) || !f32_rows(r) || !f32_rows(nd(i)) || !same_shape(r, add) || !same_shape(nd(i), add)) return false;
    grp.kind = FusedKind::CombineAdd;
    grp.members = {i, a};
    grp.written = {a};
    return true;
  }

  // The MatVecs group key of a one-token MatMul with f32 activation and output (0: none); with
  // few_cols also of 2..kMaxMatVecsCols columns (one activation rounding for the group:
  // cuda_mcol_matvecs).
  int matvec_key(int i, bool few_cols = false) const {
    const Node &mm = nd(i);
    const int64_t cols = mm.ne[1] * mm.ne[2] * mm.ne[3];
    if (mm.op != Op::MatMul || cols < 1 || cols > (few_cols ? kMaxMatVecsCols : 1) || !f32_rows(mm) || !f32_rows(nd(mm.src[1]))) return 0;
    return cuda_matvec_group_key(nd(mm.src[0]).type);
  }

  // MatMul x 2..kMaxFusedMatVecs in a row reading the same activation (a layer's q, k, v),
  // weight types of one group key: one launch writes every output. A MatMul that starts a
  // MatMul + Add or gate/up group is left to that group.
  bool match_matvecs(int i, FusedGroup &grp) const {
    const int key = matvec_key(i, true);
    if (!MOE_CUDA_FUSED_MATVEC || key == 0) return false;
    std::vector<int> members = {i};
    for (int j = next(i); j >= 0 && static_cast<int>(members.size()) < kMaxFusedMatVecs; j = next(j)) {
      FusedGroup other;
      if (matvec_key(j, true) != key || nd(j).src[1] != nd(i).src[1] || !same_place(i, j) || match_gate_up(j, other) ||
          match_matmul_add(j, other))
        break;
      members.push_back(j);
    }
    if (members.size() < 2) return false;
    grp.kind = FusedKind::MatVecs;
    grp.members = members;
    grp.written = members;
    return true;
  }

  // (MatMul -> Add(product, row)) x 2..kMaxFusedMatVecs in a row, the MatMuls reading the same
  // activation with weight types of one group key (gpt-oss's q, k, v with their biases): one
  // MatVecs launch adds each row to its product; only the Adds' outputs are written.
  bool match_matvecs_add(int i, FusedGroup &grp) const {
    const int key = matvec_key(i);
    if (!MOE_CUDA_FUSED_MATVEC || key == 0) return false;
    std::vector<int> members;
    for (int j = i; j >= 0 && static_cast<int>(members.size()) < 2 * kMaxFusedMatVecs; j = next(j)) {
      FusedGroup pair;
      if (matvec_key(j) != key || nd(j).src[1] != nd(i).src[1] || !same_place(i, j) || !match_matmul_add(j, pair)) break;
      members.insert(members.end(), pair.members.begin(), pair.members.end());
      j = pair.members.back();
    }
    if (members.size() < 4) return false;
    grp.kind = FusedKind::MatVecs;
    grp.members = members;
    for (size_t k = 1; k < members.size(); k += 2) grp.written.push_back(members[k]);
    return true;
  }

  // Softmax(l) -> TopK(probs) -> GatherCols(probs, ids) [-> NormSum].
  bool match_router(int i, FusedGroup &grp) const {
    const Node &sm = nd(i);
    const int t = next(i);
    if (t < 0 || nd(t).op != Op::TopK || nd(t).src[0] != i || !same_place(i, t)) return false;
    const int gc = next(t);
    if (gc < 0 || nd(gc).op != Op::GatherCols || nd(gc).src[0] != i || nd(gc).src[1] != t || !same_place(i, gc)) return false;
    const int64_t E = sm.ne[0], k = nd(t).ne[0];
    if (!f32_rows(sm) || !f32_rows(nd(sm.src[0])) || E > kCudaMaxExperts || k > 32 || k > E) return false;
    if (sm.ne[2] != 1 || sm.ne[3] != 1 || nd(t).ne[1] != sm.ne[1] || !f32_rows(nd(gc))) return false;
    grp.kind = FusedKind::Router;
    grp.members = {i, t, gc};
    const int ns = next(gc);
    if (ns >= 0 && nd(ns).op == Op::NormSum && nd(ns).src[0] == gc && private_to_group(gc) && same_place(i, ns) && f32_rows(nd(ns)))
      grp.members.push_back(ns);
    if (read_outside(i, 2)) grp.written.push_back(i);
    grp.written.push_back(t);
    if (grp.members.size() == 3) grp.written.push_back(gc);
    else grp.written.push_back(grp.members.back());
    return true;
  }

  // Sigmoid(l) [-> Add(probs, bias [E])] -> TopK(scores) -> GatherCols(probs, ids) [-> NormSum]
  // [-> Scale] (deepseek2's sigmoid gating); only behind the router's mat-vec (match_router_mm):
  // alone it is a Sequence.
  bool match_sigmoid_router(int i, FusedGroup &grp) const {
    const Node &sg = nd(i);
    const int64_t E = sg.ne[0];
    if (!f32_rows(sg) || !f32_rows(nd(sg.src[0])) || E > kCudaMaxExperts || sg.ne[2] != 1 || sg.ne[3] != 1) return false;
    std::vector<int> members = {i};
    int scores = i, add = -1, j = next(i);
    if (j >= 0 && nd(j).op == Op::Add && nd(j).src[0] == i && same_place(i, j)) {
      const Node &b = nd(nd(j).src[1]);
      if (!f32_rows(nd(j)) || b.type != DType::F32 || b.nb[0] != 4 || b.ne[0] != E || b.ne[1] != 1 || b.ne[2] != 1 || b.ne[3] != 1) return false;
      scores = add = j;
      members.push_back(j);
      j = next(j);
    }
    if (j < 0 || nd(j).op != Op::TopK || nd(j).src[0] != scores || !same_place(i, j)) return false;
    const int tk = j, k = static_cast<int>(nd(tk).ne[0]);
    if (k > 32 || k > E || nd(tk).ne[1] != sg.ne[1]) return false;
    const int gc = next(tk);
    if (gc < 0 || nd(gc).op != Op::GatherCols || nd(gc).src[0] != i || nd(gc).src[1] != tk || !same_place(i, gc) || !f32_rows(nd(gc)))
      return false;
    members.insert(members.end(), {tk, gc});
    int last = gc;
    for (Op op : {Op::NormSum, Op::Scale}) {  // each only on the previous one's private output
      const int n = next(last);
      if (n < 0 || nd(n).op != op || nd(n).src[0] != last || !private_to_group(last) || !same_place(i, n) || !f32_rows(nd(n))) continue;
      members.push_back(n);
      last = n;
    }
    grp.kind = FusedKind::Router;
    grp.members = members;
    if (read_outside(i, 2)) grp.written.push_back(i);  // read inside by the Add (or TopK) and the gather
    if (add >= 0 && read_outside(add, 1)) grp.written.push_back(add);
    grp.written.push_back(tk);
    grp.written.push_back(last);
    return true;
  }

  // A one-token MatMul of an F32 weight whose only reader is a router's Softmax (or Sigmoid):
  // the logits are computed in the router's launch (written: its last block reads them back).
  bool match_router_mm(int i, FusedGroup &grp) const {
    const Node &mm = nd(i), &w = nd(mm.src[0]);
    const int s = next(i);
    if (s < 0 || (nd(s).op != Op::Softmax && nd(s).op != Op::Sigmoid) || nd(s).src[0] != i || !same_place(i, s) || !private_to_group(i))
      return false;
    if (w.type != DType::F32 || w.ne[0] % 8 != 0 || w.ne[2] != 1 || w.ne[3] != 1 || mm.ne[1] * mm.ne[2] * mm.ne[3] != 1) return false;
    if (!f32_rows(mm) || !f32_rows(nd(mm.src[1]))) return false;
    if (!(nd(s).op == Op::Softmax ? match_router(s, grp) : match_sigmoid_router(s, grp))) return false;
    grp.members.insert(grp.members.begin(), i);
    grp.written.insert(grp.written.begin(), i);
    return true;
  }

  // A one-token F32 MatMul of at most kMaxRouterSideRows rows right before the router's F32
  // MatMul of the same activation (match_router_mm; qwen3next's shared-expert gate logit): the
  // router launch computes its rows too (written: read after the group).
  bool match_router_side_mm(int i, FusedGroup &grp) const {
    const Node &mm = nd(i), &w = nd(mm.src[0]);
    const int r = next(i);
    if (r < 0 || nd(r).op != Op::MatMul || nd(r).src[1] != mm.src[1] || !same_place(i, r)) return false;
    if (w.type != DType::F32 || w.ne[0] % 8 != 0 || w.ne[0] != nd(nd(r).src[0]).ne[0] || w.ne[1] > kMaxRouterSideRows || w.ne[2] != 1 ||
        w.ne[3] != 1 || mm.ne[1] * mm.ne[2] * mm.ne[3] != 1 || !f32_rows(mm))
      return false;
    if (!match_router_mm(r, grp)) return false;
    grp.members.insert(grp.members.begin(), i);
    grp.written.insert(grp.written.begin(), i);
    return true;
  }

  // gpt-oss's router (cuda_fusion.h: TopKRouter): a one-token F32 MatMul -> Add(logits, bias [E])
  // -> TopK(biased) -> GatherCols(biased, ids) -> Softmax(gathered) [-> Scale], the MatMul read by
  // the Add only (taken before match_matmul_add). The Add's output is always written (the
  // launch's last block reads the logits back), the ids and the last member (Softmax or Scale)
  // too, the gathered logits when read outside.
  bool match_topk_router(int i, FusedGroup &grp) const {
    const Node &mm = nd(i), &w = nd(mm.src[0]);
    if (mm.op != Op::MatMul || w.type != DType::F32 || w.ne[0] % 8 != 0 || w.ne[2] != 1 || w.ne[3] != 1 || mm.ne[1] * mm.ne[2] * mm.ne[3] != 1 ||
        !f32_rows(mm) || !f32_rows(nd(mm.src[1])))
      return false;
    const int64_t E = mm.ne[0];
    const int a = next(i);
    if (E > kCudaMaxExperts || a < 0 || nd(a).op != Op::Add || nd(a).src[0] != i || !same_place(i, a) || !private_to_group(i) || !f32_rows(nd(a)))
      return false;
    const Node &b = nd(nd(a).src[1]);
    if (b.type != DType::F32 || b.nb[0] != 4 || b.ne[0] != E || b.ne[1] != 1 || b.ne[2] != 1 || b.ne[3] != 1 || !same_shape(nd(a), mm)) return false;
    const int tk = next(a);
    if (tk < 0 || nd(tk).op != Op::TopK || nd(tk).src[0] != a || !same_place(i, tk) || nd(tk).ne[0] > 32 || nd(tk).ne[0] > E || nd(tk).ne[1] != 1)
      return false;
    const int gc = next(tk);
    if (gc < 0 || nd(gc).op != Op::GatherCols || nd(gc).src[0] != a || nd(gc).src[1] != tk || !same_place(i, gc) || !f32_rows(nd(gc))) return false;
    const int sm = next(gc);
    if (sm < 0 || nd(sm).op != Op::Softmax || nd(sm).src[0] != gc || !same_place(i, sm) || !f32_rows(nd(sm)) || nd(sm).ne[0] != nd(tk).ne[0])
      return false;
    grp.kind = FusedKind::TopKRouter;
    grp.members = {i, a, tk, gc, sm};
    grp.written = {a, tk};
    if (read_outside(gc, 1)) grp.written.push_back(gc);
    const int s = next(sm);
    if (s >= 0 && nd(s).op == Op::Scale && nd(s).src[0] == sm && private_to_group(sm) && same_place(i, s) && f32_rows(nd(s)) && same_shape(nd(s), nd(sm)))
      grp.members.push_back(s);
    grp.written.push_back(grp.members.back());
    return true;
  }

  // RmsNorm(x) -> Mul(row weight) -> [side MatMul ->] the router's F32 MatMul (match_router_mm, match_topk_router), one token:
  // every block of the router launch normalises the row itself; the Mul output is written
  // when the experts (or others) read it.
  bool match_norm_router(int i, FusedGroup &grp) const {
    const int m = next(i);
    if (m < 0 || nd(m).op != Op::Mul || nd(m).src[0] != i || !same_place(i, m) || !private_to_group(i)) return false;
    if (!row_node_ok(i) || !row_node_ok(m) || nd(i).ne[1] * nd(i).ne[2] * nd(i).ne[3] != 1) return false;
    const int mm = next(m);
    if (mm < 0 || nd(mm).op != Op::MatMul || nd(mm).src[1] != m || !same_place(i, mm) ||
        !(match_router_mm(mm, grp) || match_router_side_mm(mm, grp) || match_topk_router(mm, grp)))
      return false;
    const int readers = grp.kind == FusedKind::Router && nd(grp.members[1]).op == Op::MatMul ? 2 : 1;  // (the side mat-vec reads it too)
    grp.members.insert(grp.members.begin(), {i, m});
    if (read_outside(m, readers)) grp.written.insert(grp.written.begin(), m);
    return true;
  }

  // Can node j extend a chain whose tail is p (p -> j)?
  bool chain_step_ok(int p, int j) const {
    const Op a = nd(p).op, b = nd(j).op;
    return (a == Op::RmsNorm && b == Op::Mul) || (a == Op::Mul && (b == Op::Rope || b == Op::KvStore)) ||
           (a == Op::Rope && b == Op::KvStore);
  }

  // Per-node checks of the fused row-chain kernel (rows of ne0 F32 values).
  bool row_node_ok(int j) const {
    const Node &n = nd(j);
    const Node &x = nd(n.src[0]);
    if (x.type != DType::F32 || x.nb[0] != 4 || x.ne[0] > kMaxFusedRow || x.ne[0] < 1) return false;
    switch (n.op) {
      case Op::RmsNorm: return f32_rows(n);
      case Op::Mul: {
        const Node &w = nd(n.src[1]);
        return f32_rows(n) && w.type == DType::F32 && w.nb[0] == 4 && w.ne[0] == n.ne[0] && w.ne[1] == 1 && w.ne[2] == 1 &&
               w.ne[3] == 1;
      }
      case Op::Rope:
        return f32_rows(n) && n.ne[3] == 1 && n.rope.n_rot <= kMaxRopeDims && n.rope.n_rot <= n.ne[0] && n.rope.n_rot % 2 == 0 &&
               nd(n.src[1]).ne[0] == n.ne[2];
      case Op::KvStore:
        // The row of a token is its heads side by side (what the KvStore kernel reads).
        return x.ne[3] == 1 && n.ip[0] == x.ne[0] * x.ne[1] && x.nb[1] == static_cast<size_t>(x.ne[0]) * 4;
      default: return false;
    }
  }

  bool match_row_chains(int i, FusedGroup &grp) const {
    std::vector<int> tails;  // per chain: its current last node
    std::vector<int> members;
    for (int j = i; j >= 0; j = next(j)) {
      const Node &n = nd(j);
      if (!(n.op == Op::RmsNorm || n.op == Op::Mul || n.op == Op::Rope || n.op == Op::KvStore) || !same_place(i, j) || !row_node_ok(j))
        break;
      // Every source other than the chain predecessor comes from outside the group.
      bool outside = true;
      for (int s = 1; s < kMaxSrc; ++s)
        if (n.src[s] >= 0 && std::find(members.begin(), members.end(), n.src[s]) != members.end()) outside = false;
      if (!outside) break;
      auto tail = std::find(tails.begin(), tails.end(), n.src[0]);
      if (tail != tails.end()) {
        if (!chain_step_ok(*tail, j) || !private_to_group(*tail)) break;
        *tail = j;
      } else {
        if (n.op == Op::Mul || std::find(members.begin(), members.end(), n.src[0]) != members.end()) break;
        if (static_cast<int>(tails.size()) == kMaxFusedChains) break;
        tails.push_back(j);
      }
      members.push_back(j);
    }
    if (members.size() < 2) return false;
    grp.kind = FusedKind::RowChains;
    grp.members = members;
    for (int t : tails)
      if (nd(t).op != Op::KvStore) grp.written.push_back(t);
    return true;
  }

  // A member of a Sequence group (cuda_fusion.h): one of its ops, every operand and the
  // output (a KvStore: its input) at most kMaxSequenceValues values.
  bool sequence_node_ok(int j) const {
    const Node &n = nd(j);
    switch (n.op) {
      case Op::Slice: case Op::Concat: case Op::Rope: case Op::RmsNorm: case Op::Mul: case Op::Add: case Op::Scale:
      case Op::Sigmoid: case Op::TopK: case Op::GatherCols: case Op::NormSum: case Op::KvStore: case Op::Softmax: break;
      default: return false;
    }
    if (n.nelements() > kMaxSequenceValues) return false;
    for (int s : n.src)
      if (s >= 0 && nd(s).nelements() > kMaxSequenceValues) return false;
    // The kernel takes RmsNorm rows, Rope tokens and KvStore tokens one after another.
    if (n.op == Op::KvStore) {  // a token's row: the values of its heads side by side
      const Node &x = nd(n.src[0]);
      return x.type == DType::F32 && x.nb[0] == 4 && x.ne[3] == 1 && n.ip[0] == x.ne[0] * x.ne[1] &&
             x.nb[1] == static_cast<size_t>(x.ne[0]) * 4 && x.ne[2] <= kMaxSequenceRows;
    }
    if (n.op == Op::Rope)
      return f32_rows(n) && n.ne[3] == 1 && n.rope.n_rot <= kMaxRopeDims && n.rope.n_rot <= n.ne[0] && n.ne[2] <= kMaxSequenceRows;
    if (n.op == Op::RmsNorm || n.op == Op::Softmax)
      return f32_rows(n) && f32_rows(nd(n.src[0])) && n.ne[1] * n.ne[2] * n.ne[3] <= kMaxSequenceRows;
    return n.op == Op::TopK || f32_rows(n);
  }

  // Slice / Concat / Sigmoid / TopK and the small ops after it (see cuda_fusion.h), at most
  // kMaxFusedSequence of them.
  bool match_sequence(int i, FusedGroup &grp) const {
    std::vector<int> members;
    for (int j = i; j >= 0 && static_cast<int>(members.size()) < kMaxFusedSequence; j = next(j)) {
      if (!same_place(i, j) || !sequence_node_ok(j)) break;
      members.push_back(j);
    }
    if (members.size() < 2) return false;
    grp.kind = FusedKind::Sequence;
    grp.members = members;
    grp.mla_glue = mla_glue(members);
    // The generic kernel writes every member; the MLA glue kernel only what is read later.
    for (size_t k = 0; k < members.size(); ++k) {
      if (grp.mla_glue && !read_after(members[k], members.back())) continue;
      if (grp.mla_glue) grp.live_mask |= 1u << k;
      if (nd(members[k]).op != Op::KvStore) grp.written.push_back(members[k]);
    }
    return true;
  }

  // Read by a node after `last` (through views) or a graph output.
  bool read_after(int id, int last) const {
    if (output_[static_cast<size_t>(id)]) return true;
    for (int k = id + 1; k < n_; ++k)
      for (int s : nd(k).src)
        if (s == id && (nd(k).op == Op::View ? read_after(k, last) : k > last)) return true;
    return false;
  }
  // deepseek2's MLA glue as its graph builds it (FusedGroup::mla_glue): K row (k_pe slice ->
  // rope; latent slice -> norm -> weight; concat -> store), then q's nope and pe slices, pe rope.
  bool mla_glue(const std::vector<int> &m) const {
    static const Op ops[] = {Op::Slice, Op::Rope, Op::Slice, Op::RmsNorm, Op::Mul, Op::Concat, Op::KvStore, Op::Slice, Op::Slice, Op::Rope};
    if (m.size() != sizeof(ops) / sizeof(ops[0])) return false;
    for (size_t k = 0; k < m.size(); ++k)
      if (nd(m[k]).op != ops[k]) return false;
    auto src = [&](int k, int s) { return through_view(nd(m[static_cast<size_t>(k)]).src[static_cast<size_t>(s)]); };
    const Node &w = nd(nd(m[4]).src[1]);
    return src(1, 0) == m[0] && src(2, 0) == src(0, 0) && src(3, 0) == m[2] && src(4, 0) == m[3] && w.type == DType::F32 &&
           w.is_contiguous() && w.nelements() == nd(m[4]).ne[0] && src(5, 0) == m[4] && src(5, 1) == m[1] && src(6, 0) == m[5] &&
           src(8, 0) == src(7, 0) && src(9, 0) == m[8] && nd(m[1]).ne[1] == 1;
  }

  // MatMulHeads -> Concat(product, b) (cuda_fusion.h: HeadsConcat): the product's only reader is
  // the Concat, every operand F32 rows of the same heads and tokens. The launch writes the
  // Concat's output while it reads x and b, so those stay live until the Concat (keep_live).
  bool match_heads_concat(int i, FusedGroup &grp) const {
    const Node &mh = nd(i);
    const int c = next(i);
    if (c < 0 || nd(c).op != Op::Concat || nd(c).src[0] != i || !same_place(i, c) || !private_to_group(i)) return false;
    const DType wt = nd(mh.src[0]).type;
    if (cuda_extra_type(wt) || !cuda_matmul_type_supported(wt)) return false;
    const Node &cat = nd(c), &x = nd(mh.src[1]), &b = nd(cat.src[1]);
    for (const Node *n : {&mh, &cat, &x, &b})
      if (!f32_rows(*n) || n->ne[3] != 1) return false;
    if (cat.ne[0] != mh.ne[0] + b.ne[0] || cat.ne[1] != mh.ne[1] || b.ne[1] != mh.ne[1] || cat.ne[2] != mh.ne[2] || b.ne[2] != mh.ne[2])
      return false;
    grp.kind = FusedKind::HeadsConcat;
    grp.members = {i, c};
    grp.written = {c};
    return true;
  }

  // RmsNorm(x) -> Mul(w) -> SwiGLU(z, .) (cuda_fusion.h: GatedNorm).
  bool match_gated_norm(int i, FusedGroup &grp) const {
    const int m = next(i);
    if (m < 0 || nd(m).op != Op::Mul || nd(m).src[0] != i || !same_place(i, m) || !private_to_group(i)) return false;
    const int s = next(m);
    if (s < 0 || nd(s).op != Op::SwiGLU || nd(s).src[1] != m || nd(s).src[0] == i || !same_place(i, s) || !private_to_group(m)) return false;
    const Node &x = nd(nd(i).src[0]), &w = nd(nd(m).src[1]), &z = nd(nd(s).src[0]);
    if (!f32_rows(x) || !f32_rows(nd(i)) || !f32_rows(nd(m)) || !f32_rows(nd(s)) || !f32_rows(z)) return false;
    if (!same_shape(x, nd(i)) || !same_shape(nd(i), nd(m)) || !same_shape(nd(m), nd(s)) || !same_shape(z, nd(s))) return false;
    if (w.type != DType::F32 || !w.is_contiguous() || w.nelements() != nd(i).ne[0]) return false;
    grp.kind = FusedKind::GatedNorm;
    grp.members = {i, m, s};
    grp.written = {s};
    return true;
  }

  // DeltaNet -> the GatedNorm of its output (cuda_fusion.h: DeltaNorm).
  bool match_delta_norm(int i, FusedGroup &grp) const {
    FusedGroup gn;
    const int r = next(i);
    if (!delta_norm_ || nd(i).op != Op::DeltaNet || !cuda_delta_norm_fits(g_, nd(i)) || r < 0 || nd(r).src[0] != i || !same_place(i, r) || !match_gated_norm(r, gn))
      return false;
    if (!same_shape(nd(i), nd(r)) || !f32_rows(nd(gn.members[2]))) return false;
    grp.kind = FusedKind::DeltaNorm;
    grp.members = {i, gn.members[0], gn.members[1], gn.members[2]};
    grp.written = {i, gn.members[2]};
    return true;
  }

  // Read by one node only (a View: by one node of its own, and so on) and no graph output.
  bool private_through_views(int id) const {
    if (!private_to_group(id)) return false;
    for (int k = id + 1; k < n_; ++k)
      for (int s : nd(k).src)
        if (s == id) return nd(k).op != Op::View || private_through_views(k);
    return false;
  }

  // Sigmoid -> MoeCombine(one expert) -> Add -> Add (cuda_fusion.h: SharedGate).
  bool match_shared_gate(int i, FusedGroup &grp) const {
    const int c = next(i), a = c >= 0 ? next(c) : -1, y = a >= 0 ? next(a) : -1;
    if (y < 0 || nd(c).op != Op::MoeCombine || nd(a).op != Op::Add || nd(y).op != Op::Add) return false;
    if (!same_place(i, c) || !same_place(i, a) || !same_place(i, y)) return false;
    const Node &cn = nd(c), &sh = nd(cn.src[0]), &s = nd(i);
    if (cn.src[1] != i || sh.ne[1] != 1 || s.ne[0] != 1 || s.ne[1] != cn.ne[1] || s.ne[2] * s.ne[3] != 1 || !f32_rows(s)) return false;
    if ((nd(a).src[0] == c) == (nd(a).src[1] == c) || (nd(y).src[0] == a) == (nd(y).src[1] == a)) return false;
    if (!private_to_group(i) || !private_to_group(c) || !private_to_group(a)) return false;
    const Node &routed = nd(other_src(nd(a), c)), &res = nd(other_src(nd(y), a));
    for (const Node *n : {&cn, &nd(a), &nd(y), &routed, &res})
      if (!f32_rows(*n) || !same_shape(*n, nd(y)) || n->ne[2] * n->ne[3] != 1) return false;
    if (sh.type != DType::F32 || sh.nb[0] != 4 || sh.ne[0] != cn.ne[0] || sh.ne[2] != cn.ne[1] || sh.ne[3] != 1) return false;
    grp.kind = FusedKind::SharedGate;
    grp.members = {i, c, a, y};
    grp.written = {y};
    return true;
  }

  // An F32 vector of n values (dt_bias, ssm_a: broadcast over the tokens).
  bool f32_vector(int id, int64_t n) const {
    const Node &v = nd(id);
    return v.type == DType::F32 && v.is_contiguous() && v.ne[0] == n && v.nelements() == n;
  }
  // Through a View (always a contiguous reinterpretation) to its source.
  int through_view(int id) const { return nd(id).op == Op::View && nd(id).view_offset == 0 ? nd(id).src[0] : id; }

  // The DeltaNet's input chain starting at node i (cuda_fusion.h: DeltaIn).
  bool match_delta_in(int i, FusedGroup &grp) const {
    std::vector<int> run;
    int dn = -1;
    for (int j = i; j >= 0 && static_cast<int>(run.size()) <= kMaxDeltaIn; j = next(j)) {
      if (!same_place(i, j)) return false;
      if (nd(j).op == Op::DeltaNet) { dn = j; break; }
      run.push_back(j);
    }
    if (dn < 0 || !cuda_delta_net_supported(g_, nd(dn))) return false;
    const Node &D = nd(dn);
    const int64_t d = D.ne[0], n_v = D.ne[1], T = D.ne[2];
    if (T > kMaxDeltaInTokens || d > 1024) return false;
    // q, k: L2Norm(View(Slice(conv))); v: View(Slice(conv)).
    const int l2q = D.src[0], l2k = D.src[1], sv = through_view(D.src[2]), cc = D.src[3];
    if (nd(l2q).op != Op::L2Norm || nd(l2k).op != Op::L2Norm || nd(sv).op != Op::Slice || nd(cc).op != Op::Concat) return false;
    const int sq = through_view(nd(l2q).src[0]), sk = through_view(nd(l2k).src[0]);
    if (nd(sq).op != Op::Slice || nd(sk).op != Op::Slice) return false;
    const int conv = nd(sq).src[0];
    const int64_t n_k = nd(l2q).ne[1];
    if (nd(conv).op != Op::SsmConv || nd(sk).src[0] != conv || nd(sv).src[0] != conv || !cuda_delta_net_supported(g_, nd(conv))) return false;
    const Node &cn = nd(conv);
    if (cn.ne[1] != T || cn.ne[0] != 2 * d * n_k + d * n_v || nd(l2q).ne[0] != d || nd(l2k).ne[0] != d || nd(l2k).ne[1] != n_k) return false;
    if (nd(sq).ip[0] != 0 || nd(sk).ip[0] != d * n_k || nd(sv).ip[0] != 2 * d * n_k || nd(sq).ip[1] != d * n_k || nd(sk).ip[1] != d * n_k)
      return false;
    for (int l : {l2q, l2k})
      if (!f32_rows(nd(l)) || nd(l).ne[2] != T || nd(l).ne[3] != 1) return false;
    if (!nd(sv).is_contiguous() || nd(sv).type != DType::F32 || !f32_rows(nd(cn.src[0]))) return false;
    // Gates: Concat(Mul(Softplus(Add(alpha, bias)), a), Sigmoid(beta)), each [n_v, T].
    const int mul = nd(cc).src[0], sig = nd(cc).src[1];
    if (nd(mul).op != Op::Mul || nd(sig).op != Op::Sigmoid || !nd(cc).is_contiguous() || nd(cc).ne[0] != 2 * n_v || nd(cc).ne[1] != T)
      return false;
    const int sp = nd(mul).src[0], add = nd(sp).src[0];
    if (nd(sp).op != Op::Softplus || nd(add).op != Op::Add || !f32_vector(nd(mul).src[1], n_v) || !f32_vector(nd(add).src[1], n_v)) return false;
    for (int e : {mul, sig, sp, add})
      if (nd(e).type != DType::F32 || nd(e).ne[0] != n_v || nd(e).nelements() != n_v * T) return false;
    std::vector<int> want = {conv, sq, l2q, sk, l2k, sv, cc, mul, sp, add, sig};
    for (int operand : {nd(add).src[0], nd(sig).src[0]}) {
      int src = 0;
      int64_t start = 0, len = 0;
      delta_gate_source(g_, operand, src, start, len);
      const Node &s = nd(src);
      if (s.type != DType::F32 || s.nb[0] != 4 || s.ne[3] != 1 || len < 1 || start + len > s.ne[0] || len * s.ne[1] * s.ne[2] != n_v * T)
        return false;
      const int sl = through_view(operand);
      if (sl != src) want.push_back(sl);  // the Slice: a member (if it is in the run)
    }
    // The run is exactly these nodes (a Slice of ba made before the run stays outside).
    std::vector<int> sorted_run = run, sorted_want = want;
    std::sort(sorted_run.begin(), sorted_run.end());
    std::sort(sorted_want.begin(), sorted_want.end());
    sorted_want.erase(std::unique(sorted_want.begin(), sorted_want.end()), sorted_want.end());
    if (sorted_run != sorted_want) return false;
    // Unwritten intermediates have no reader outside the group.
    if (uses_[static_cast<size_t>(conv)] != 3 || output_[static_cast<size_t>(conv)]) return false;
    for (int m : run)
      if (m != conv && m != l2q && m != l2k && m != sv && m != cc && !private_through_views(m)) return false;
    grp.kind = FusedKind::DeltaIn;
    grp.members = run;
    grp.written = {l2q, l2k, sv, cc};
    grp.parts.assign(kDiParts, -1);
    grp.parts[kDiConv] = conv;
    grp.parts[kDiQ] = l2q;
    grp.parts[kDiK] = l2k;
    grp.parts[kDiV] = sv;
    grp.parts[kDiGates] = cc;
    grp.parts[kDiAdd] = add;
    grp.parts[kDiMul] = mul;
    grp.parts[kDiSigmoid] = sig;
    return true;
  }

  // Arena bytes of a node's storage (whole root, conservatively); false for weights/KV tokens.
  bool range_of(int id, Range &r) const {
    const Node &n = nd(id);
    if (n.storage < 0) return false;
    const Node &root = nd(n.storage);
    r = {root.device, root.offset, root.offset + root.nbytes()};
    return true;
  }

  // A group may write its output over one input of the same layout where each output value
  // is computed by the thread that read the same input value first: a row chain over its own
  // input (an in-place RmsNorm; a block stages its row before writing it), a fused Add over
  // its residual (an in-place Add; y[i] = dot + r[i]).
  bool same_rows(int w, int x) const {
    const Node &a = nd(w), &b = nd(x);
    if (a.storage < 0 || a.storage != b.storage || a.offset != b.offset) return false;
    for (int d = 0; d < 4; ++d)
      if (a.ne[d] != b.ne[d] || a.nb[d] != b.nb[d]) return false;
    return true;
  }

  bool safe(const FusedGroup &grp) const {
    // A Sequence kernel runs its members one after the other in their order: every read and
    // write happens as in the unfused schedule, whatever the planner let alias.
    if (grp.kind == FusedKind::Sequence) return true;
    struct Access {
      Range r;
      int node;
    };
    std::vector<Access> wr, rd;
    Range r;
    for (int w : grp.written)
      if (range_of(w, r)) wr.push_back({r, w});
    for (int m : grp.members) {
      const Node &n = nd(m);
      if (n.work_size) wr.push_back({{n.device, n.work_offset, n.work_offset + n.work_size}, -1});
      for (int s : n.src)
        if (s >= 0 && std::find(grp.members.begin(), grp.members.end(), s) == grp.members.end() && range_of(s, r)) rd.push_back({r, s});
    }
    std::vector<std::pair<int, int>> own;  // (written node, input it may overwrite)
    if (grp.kind == FusedKind::RowChains)
      for (const auto &ch : row_chains(g_, grp.members)) own.push_back({ch.back(), nd(ch.front()).src[0]});
    if (grp.kind == FusedKind::SharedGate) {  // y[i] from the operands' element i, by the thread that writes it
      const Node &a = nd(grp.members[2]), &y = nd(grp.members[3]);
      own.push_back({grp.members[3], other_src(a, grp.members[1])});
      own.push_back({grp.members[3], other_src(y, grp.members[2])});
    }
    const size_t n = grp.members.size();
    const Node &last = nd(grp.members[n - 1]);
    if ((grp.kind == FusedKind::MatMulAdd || grp.kind == FusedKind::DownCombine || grp.kind == FusedKind::CombineAdd) && last.op == Op::Add) {
      const int prev = grp.members[n - 2];
      own.push_back({grp.members[n - 1], other_src(last, prev)});
    }
    for (const Access &a : wr)
      for (const Access &b : rd) {
        if (a.r.device != b.r.device || a.r.hi <= b.r.lo || b.r.hi <= a.r.lo) continue;
        const bool exempt = std::find(own.begin(), own.end(), std::make_pair(a.node, b.node)) != own.end() && same_rows(a.node, b.node);
        if (!exempt) return false;
      }
    return true;
  }

  const Graph &g_;
  bool delta_norm_;      // DeltaNorm groups planned (else the norm is a GatedNorm group)
  int n_;
  std::vector<int> uses_;
  std::vector<bool> output_;
};

}  // namespace

bool cuda_fused_matvec_available() { return MOE_CUDA_FUSED_MATVEC != 0; }

FusionPlan plan_fusion(const Graph &g, unsigned flags) { return Matcher(g, (flags & kNoDeltaNorm) == 0).run(); }

void cuda_fusion_keep_live(const Graph &g, int device, std::vector<int> &keep_until) {
  if (keep_until.size() < g.nodes().size()) keep_until.resize(g.nodes().size(), -1);
  Matcher(g).keep_live(device, keep_until);
}

std::vector<std::vector<int>> row_chains(const Graph &g, const std::vector<int> &members) {
  std::vector<std::vector<int>> chains;
  for (int m : members) {
    bool appended = false;
    for (auto &ch : chains)
      if (ch.back() == g.node(m).src[0]) { ch.push_back(m); appended = true; break; }
    if (!appended) chains.push_back({m});
  }
  return chains;
}

void delta_gate_source(const Graph &g, int operand, int &src, int64_t &start, int64_t &len) {
  const Node &o = g.node(operand);
  const int sl = o.op == Op::View && o.view_offset == 0 ? o.src[0] : operand;
  if (g.node(sl).op == Op::Slice) {
    src = g.node(sl).src[0];
    start = g.node(sl).ip[0];
    len = g.node(sl).ip[1];
  } else {
    src = operand;
    start = 0;
    len = o.ne[0];
  }
}

void cuda_run_group(const FusedGroup &grp, const CudaOpCtx &c) {
  switch (grp.kind) {
    case FusedKind::RowChains:
      if (cuda_fused_row_chains_fit(c, grp)) return cuda_fused_row_chains(c, grp);
      break;
    case FusedKind::Router: return cuda_fused_router(c, grp);
    case FusedKind::Sequence:
      if (cuda_fused_sequence_fit(c, grp)) return cuda_fused_sequence(c, grp);
      break;
    case FusedKind::DeltaIn: return cuda_fused_delta_in(c, grp);
    case FusedKind::GatedNorm: return cuda_fused_gated_norm(c, grp);
    case FusedKind::SharedGate: return cuda_fused_shared_gate(c, grp);
    case FusedKind::DeltaNorm: return cuda_fused_delta_norm(c, grp);
    case FusedKind::TopKRouter: return cuda_fused_topk_router(c, grp);
    case FusedKind::CombineAdd:
      if (c.tuning.combine_add) return cuda_fused_combine_add(c, c.g.node(grp.members[0]), c.g.node(grp.members[1]));
      break;
    case FusedKind::HeadsConcat:
      if (cuda_fused_heads_concat(c.with_node(c.g.node(grp.members[0])), c.g.node(grp.members[1]))) return;
      break;
#if MOE_CUDA_FUSED_MATVEC
    case FusedKind::MatMulAdd:
      return cuda_fused_matmul_add(c, c.g.node(grp.members[0]), c.g.node(grp.members[1]));
    case FusedKind::GateUpSwiGLU: {
      const Node &sw = c.g.node(grp.members.back());
      if (sw.op == Op::SwiGLUOai) return cuda_fused_gate_up_oai(c, c.g.node(sw.src[0]), c.g.node(sw.src[1]), sw);
      return cuda_fused_gate_up_swiglu(c, c.g.node(sw.src[1]), c.g.node(sw.src[0]), sw);
    }
    case FusedKind::DownCombine: {
      const size_t n = grp.members.size();  // down, [bias,] combine [, add]
      const Node &down = c.g.node(grp.members[0]), &second = c.g.node(grp.members[1]);
      if (second.op == Op::AddId)
        return cuda_fused_down_bias_combine(c, down, second, c.g.node(grp.members[2]), n > 3 ? &c.g.node(grp.members[3]) : nullptr,
                                            grp.ids_settled);
      return cuda_fused_down_combine(c, down, second, n > 2 ? &c.g.node(grp.members[2]) : nullptr, grp.ids_settled);
    }
    case FusedKind::MatVecs: return cuda_fused_matvecs(c, grp.members);
#endif
    default: break;
  }
  // Unfused: the members in their own order (the group is consecutive, so this is the
  // original schedule).
  for (int m : grp.members) cuda_run_node(c.with_node(c.g.node(m)));
}

}  // namespace moe
