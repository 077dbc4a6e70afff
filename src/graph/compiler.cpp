#include "graph/compiler.h"

#include "backends/backend.h"
#include "core/status.h"

namespace moe {

static void place(CompiledPlan &p, const CompileOptions &o) {
  Graph &g = p.graph;
  for (int i = 0; i < static_cast<int>(g.nodes().size()); ++i) {
    Node &n = g.node(i);
    int chosen = -1;
    for (size_t d = 0; d < o.devices.size(); ++d) {
      if (o.devices[d]->supports(g, i)) { chosen = static_cast<int>(d); break; }
      if (!o.allow_fallback) break;
    }
    if (chosen < 0)
      fail(Status::Unsupported, "no device supports %s node '%s' (type %s)", op_name(n.op), n.name.c_str(),
           n.src[0] >= 0 ? dtype_name(g.node(n.src[0]).type) : dtype_name(n.type));
    // Views and in-place ops must live with their source.
    if (n.op == Op::View) chosen = g.node(n.src[0]).device;
    n.device = chosen;
  }
}

// Node::final_output: outputs no node reads (before planning: work sizes may depend on it).
static void mark_final_outputs(Graph &g) {
  std::vector<bool> read(g.nodes().size(), false);
  for (const Node &n : g.nodes())
    for (int s : n.src)
      if (s >= 0) read[static_cast<size_t>(s)] = true;
  for (Node &n : g.nodes()) n.final_output = false;
  for (int o : g.outputs()) g.node(o).final_output = !read[static_cast<size_t>(o)];
}

static void schedule(CompiledPlan &p) {
  const auto &nodes = p.graph.nodes();
  int begin = 0;
  for (int i = 1; i <= static_cast<int>(nodes.size()); ++i) {
    if (i == static_cast<int>(nodes.size()) || nodes[static_cast<size_t>(i)].device != nodes[static_cast<size_t>(begin)].device ||
        nodes[static_cast<size_t>(i)].segment != nodes[static_cast<size_t>(begin)].segment) {
      p.segments.push_back({nodes[static_cast<size_t>(begin)].device, begin, i, nodes[static_cast<size_t>(begin)].segment});
      begin = i;
    }
  }
}

std::unique_ptr<CompiledPlan> compile_graph(Graph g, const CompileOptions &o) {
  if (o.devices.empty()) fail(Status::Internal, "compile_graph: no devices");
  auto p = std::make_unique<CompiledPlan>();
  p->graph = std::move(g);
  place(*p, o);
  mark_final_outputs(p->graph);
  PlanStats st = plan_memory(p->graph, [&](int id) {
    const Node &n = p->graph.node(id);
    return o.devices[static_cast<size_t>(n.device)]->work_size(p->graph, id, o.n_threads);
  });
  for (int d = 0; d < kMaxDevices; ++d) p->arena_bytes[d] = st.arena_bytes[d];
  p->n_inplace = st.n_inplace;
  schedule(*p);
  p->input_tokens = p->graph.find_input("tokens");
  p->input_pos = p->graph.find_input("pos");
  p->input_out_ids = p->graph.find_input("out_ids");
  p->output_logits = p->graph.find_output("logits");
  return p;
}

void bind_plan(CompiledPlan &plan, void *const *arenas, const std::function<void *(const Node &)> &weight_addr) {
  Graph &g = plan.graph;
  for (auto &n : g.nodes()) {
    if (n.leaf == LeafKind::Weight) {
      n.data = n.op == Op::View ? static_cast<uint8_t *>(weight_addr(g.node(n.src[0]))) + n.view_offset : weight_addr(n);
    } else if (n.storage >= 0) {
      n.data = static_cast<uint8_t *>(arenas[n.device]) + n.offset;
    } else {
      n.data = nullptr;
    }
    n.work = n.work_size ? static_cast<uint8_t *>(arenas[n.device]) + n.work_offset : nullptr;
  }
}

}  // namespace moe
