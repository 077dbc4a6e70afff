#include "graph/compiler.h"

#include <algorithm>
#include <map>
#include <utility>

#include "backends/backend.h"
#include "core/status.h"

namespace moe {

namespace {

bool on_host(const CompileOptions &o, int d) { return o.devices[static_cast<size_t>(d)]->host_memory(); }
const char *dev_name(const CompileOptions &o, int d) { return o.devices[static_cast<size_t>(d)]->info().name.c_str(); }
bool is_product(Op op) { return op == Op::MatMul || op == Op::MatMulId || op == Op::MatMulHeads; }

// Device of every node: a weight where the placement put it; KvStore / Attention and the
// recurrent ops (SsmConv / DeltaNet) with their layer's cache, whose memory they read and
// write (no fallback: the state is not on another device); any other op with its first weight (so the bytes it streams stay where they
// are), else with its first computed input; graph inputs with their first reader.
void place(Graph &g, const CompileOptions &o) {
  const int n = static_cast<int>(g.nodes().size());
  const int n_dev = static_cast<int>(o.devices.size());
  auto check = [&](int d, const char *what) {
    if (d < 0 || d >= n_dev) fail(Status::Internal, "placement put %s on device %d of %d", what, d, n_dev);
    return d;
  };
  std::vector<bool> placed(static_cast<size_t>(n), false);
  for (int i = 0; i < n; ++i) {
    Node &nd = g.node(i);
    int d = -1;
    if (nd.leaf == LeafKind::Input) continue;  // below, with its first reader
    if (nd.op == Op::View) {
      if (!placed[static_cast<size_t>(nd.src[0])]) continue;  // a view of an input: below
      d = g.node(nd.src[0]).device;
    } else if (nd.leaf == LeafKind::Weight) {
      d = o.weight_device ? check(o.weight_device(nd.weight), nd.name.c_str()) : o.default_device;
    } else if (nd.op == Op::KvStore || nd.op == Op::Attention) {
      d = o.kv_device ? check(o.kv_device(nd.kv_layer), "a KV cache layer") : o.default_device;
    } else if (nd.op == Op::SsmConv || nd.op == Op::DeltaNet) {
      d = o.kv_device ? check(o.kv_device(nd.kv_layer), "a recurrent state layer") : o.default_device;
      if (!o.devices[static_cast<size_t>(d)]->supports(g, i))
        fail(Status::Unsupported, "%s node '%s' of layer %d cannot run on %s, which holds the layer's recurrent state", op_name(nd.op),
             nd.name.c_str(), nd.kv_layer, dev_name(o, d));
    } else {
      // The layer's own device (where its attention and KV cache are), if known.
      const int layer_dev = o.kv_device && nd.segment >= 1 ? o.kv_device(nd.segment - 1) : -1;
      for (int s : nd.src)
        if (s >= 0 && g.node(s).leaf == LeafKind::Weight) { d = g.node(s).device; break; }
      if (d >= 0 && on_host(o, d) && nd.direct_read && o.direct_device) {
        const int dd = o.direct_device(nd.segment - 1);
        if (dd >= 0 && o.devices[static_cast<size_t>(dd)]->supports(g, i)) d = dd;
      } else if (d >= 0 && on_host(o, d) && o.stream_device && is_product(nd.op)) {
        const int sd = o.stream_device(nd.segment - 1);
        if (sd >= 0 && o.devices[static_cast<size_t>(sd)]->supports(g, i)) d = sd;
      }
      // No weight: with the layer's device when an input is there (a residual add after
      // CPU experts stays on the GPU), else with the first computed input.
      if (d < 0)
        for (int s : nd.src)
          if (s >= 0 && placed[static_cast<size_t>(s)] && g.node(s).leaf != LeafKind::Weight && g.node(s).device == layer_dev) { d = layer_dev; break; }
      if (d < 0)
        for (int s : nd.src)
          if (s >= 0 && placed[static_cast<size_t>(s)] && g.node(s).leaf != LeafKind::Weight) { d = g.node(s).device; break; }
      if (d < 0) d = o.default_device;
      if (!o.devices[static_cast<size_t>(d)]->supports(g, i)) {
        const int want = d;
        d = -1;
        if (o.allow_fallback)
          for (int k = 0; k < n_dev && d < 0; ++k)
            if (on_host(o, k) && o.devices[static_cast<size_t>(k)]->supports(g, i)) d = k;
        if (d < 0)
          fail(Status::Unsupported, "%s node '%s' (type %s) cannot run on %s, where its placement puts it%s", op_name(nd.op),
               nd.name.c_str(), nd.src[0] >= 0 ? dtype_name(g.node(nd.src[0]).type) : dtype_name(nd.type), dev_name(o, want),
               o.allow_fallback ? " (and no CPU device runs it either)" : "; allow fallback to run it on the CPU, or place it elsewhere");
      }
    }
    nd.device = d;
    placed[static_cast<size_t>(i)] = true;
  }
  // Inputs (and views of them) go where they are first read: uploads land there directly.
  std::vector<int> first_reader(static_cast<size_t>(n), -1);
  for (int i = n - 1; i >= 0; --i)
    for (int s : g.node(i).src)
      if (s >= 0) first_reader[static_cast<size_t>(s)] = i;
  for (int i = n - 1; i >= 0; --i) {
    Node &nd = g.node(i);
    if (placed[static_cast<size_t>(i)]) continue;
    const int r = first_reader[static_cast<size_t>(i)];
    nd.device = r >= 0 && placed[static_cast<size_t>(r)] ? g.node(r).device : o.default_device;
    placed[static_cast<size_t>(i)] = true;
  }
  for (int i = 0; i < n; ++i)  // views of inputs follow their source
    if (g.node(i).op == Op::View) g.node(i).device = g.node(g.node(i).src[0]).device;
}

// A direct-read product on a GPU reads its weight where it is, in page-locked host memory.
bool reads_in_place(const CompileOptions &o, const Node &reader, const Node &src) {
  return reader.direct_read && src.leaf == LeafKind::Weight && on_host(o, src.device) && !on_host(o, reader.device);
}

// Every read of a value on another device goes through one Transfer node per (value,
// device), placed right after the value is computed (a GPU -> CPU copy then leaves in the
// GPU stretch that made it, so a layer's CPU part needs one host wait, not one per reader);
// node ids are renumbered.
int insert_transfers(Graph &g, const CompileOptions &o) {
  const auto &old = g.nodes();
  const size_t n = old.size();
  // The devices each value is read on, other than its own.
  std::vector<std::vector<int>> wanted(n);
  for (const Node &nd : old)
    for (int s : nd.src) {
      if (s < 0 || nd.op == Op::View) continue;
      const Node &src = old[static_cast<size_t>(s)];
      if (src.device == nd.device || reads_in_place(o, nd, src)) continue;
      auto &w = wanted[static_cast<size_t>(s)];
      if (std::find(w.begin(), w.end(), nd.device) == w.end()) w.push_back(nd.device);
    }
  std::vector<Node> out;
  out.reserve(n + n / 4);
  std::vector<int> remap(n, -1);
  std::map<std::pair<int, int>, int> xfer;  // (old source id, device) -> new Transfer id
  int n_xfer = 0;
  for (size_t i = 0; i < n; ++i) {
    Node nd = old[i];
    for (int &s : nd.src) {
      if (s < 0) continue;
      if (reads_in_place(o, nd, old[static_cast<size_t>(s)])) { s = remap[static_cast<size_t>(s)]; continue; }
      auto it = xfer.find(std::make_pair(s, nd.device));
      s = it != xfer.end() && nd.op != Op::View ? it->second : remap[static_cast<size_t>(s)];
    }
    remap[i] = static_cast<int>(out.size());
    out.push_back(std::move(nd));
    const Node &src = old[i];
    for (int dev : wanted[i]) {
      if (!src.is_contiguous() || src.op == Op::KvStore)
        fail(Status::Internal, "'%s' on %s is read on %s but cannot be copied (%s)", src.name.c_str(), dev_name(o, src.device), dev_name(o, dev),
             src.op == Op::KvStore ? "a KV cache token" : "not contiguous");
      Node t;
      t.op = Op::Transfer;
      t.type = src.type;
      for (int k = 0; k < 4; ++k) { t.ne[k] = src.ne[k]; t.nb[k] = src.nb[k]; }
      t.src[0] = remap[i];
      t.name = src.name + "@" + dev_name(o, dev);
      t.segment = src.segment;
      t.device = dev;
      xfer.emplace(std::make_pair(static_cast<int>(i), dev), static_cast<int>(out.size()));
      out.push_back(std::move(t));
      ++n_xfer;
    }
  }
  std::vector<int> outs;
  for (int id : g.outputs()) outs.push_back(remap[static_cast<size_t>(id)]);
  g.replace_nodes(std::move(out), std::move(outs));
  return n_xfer;
}

// Which executor runs a node: its device, except a Transfer touching a GPU, which the GPU
// runs (its stream does the copy in either direction; the CPU has no way to).
int exec_device(const Graph &g, const Node &n, const CompileOptions &o) {
  if (n.op != Op::Transfer || !on_host(o, n.device)) return n.device;
  const int s = g.node(n.src[0]).device;
  return on_host(o, s) ? n.device : s;
}

// The invariants every later stage relies on: no node reads memory of another device except
// through a Transfer, and no buffer, view or in-place result straddles two devices.
void validate(const Graph &g, const CompileOptions &o) {
  for (const Node &n : g.nodes()) {
    for (int s : n.src) {
      if (s < 0) continue;
      const bool same = g.node(s).device == n.device;
      if (n.op != Op::Transfer && reads_in_place(o, n, g.node(s))) continue;
      if (n.op == Op::Transfer ? same : !same)
        fail(Status::Internal, "placed graph: %s node '%s' on %s reads '%s' on %s", op_name(n.op), n.name.c_str(), dev_name(o, n.device),
             g.node(s).name.c_str(), dev_name(o, g.node(s).device));
    }
    if (n.storage >= 0 && g.node(n.storage).device != n.device)
      fail(Status::Internal, "placed graph: node '%s' on %s shares memory with '%s' on %s", n.name.c_str(), dev_name(o, n.device),
           g.node(n.storage).name.c_str(), dev_name(o, g.node(n.storage).device));
  }
}

// Node::final_output: outputs no node reads (before planning: work sizes may depend on it).
void mark_final_outputs(Graph &g) {
  std::vector<bool> read(g.nodes().size(), false);
  for (const Node &n : g.nodes())
    for (int s : n.src)
      if (s >= 0) read[static_cast<size_t>(s)] = true;
  for (Node &n : g.nodes()) n.final_output = false;
  for (int o : g.outputs()) g.node(o).final_output = !read[static_cast<size_t>(o)];
}

void schedule(CompiledPlan &p, const CompileOptions &o) {
  const Graph &g = p.graph;
  const int n = static_cast<int>(g.nodes().size());
  // Leaves and views run nowhere: they join the executor of the next node that runs (a
  // weight leaf on the CPU between two GPU nodes must not cost a host round trip).
  std::vector<int> ed(static_cast<size_t>(n), -1);
  int next = o.default_device;
  for (int i = n - 1; i >= 0; --i) {
    const Node &nd = g.node(i);
    if (nd.op != Op::Leaf && nd.op != Op::View) next = exec_device(g, nd, o);
    ed[static_cast<size_t>(i)] = next;
  }
  // A GPU stretch of direct-read products starts a segment of its own (see Segment::overlap).
  auto direct_gpu = [&](int i) { return g.node(i).direct_read && !on_host(o, ed[static_cast<size_t>(i)]); };
  int begin = 0;
  for (int i = 1; i <= n; ++i) {
    const Node &b = g.node(begin);
    if (i == n || ed[static_cast<size_t>(i)] != ed[static_cast<size_t>(begin)] || g.node(i).segment != b.segment ||
        (direct_gpu(i) && !direct_gpu(i - 1) && !direct_gpu(begin))) {
      p.segments.push_back({ed[static_cast<size_t>(begin)], begin, i, b.segment});
      begin = i;
    }
  }
  // Overlap holds when no host segment before this device's next segment reads what the
  // stretch computes: it copies nothing to the host and a host reader needs a Transfer.
  for (size_t k = 0; k < p.segments.size(); ++k) {
    Segment &sg = p.segments[k];
    if (!direct_gpu(sg.begin)) continue;
    bool sends_to_host = false;
    for (int i = sg.begin; i < sg.end; ++i)
      if (g.node(i).op == Op::Transfer && on_host(o, g.node(i).device)) sends_to_host = true;
    sg.overlap = !sends_to_host;
  }
}

}  // namespace

std::unique_ptr<CompiledPlan> compile_graph(Graph g, const CompileOptions &o) {
  if (o.devices.empty()) fail(Status::Internal, "compile_graph: no devices");
  if (o.default_device < 0 || o.default_device >= static_cast<int>(o.devices.size()))
    fail(Status::Internal, "compile_graph: default device %d of %zu", o.default_device, o.devices.size());
  auto p = std::make_unique<CompiledPlan>();
  p->graph = std::move(g);
  place(p->graph, o);
  p->n_transfers = insert_transfers(p->graph, o);
  mark_final_outputs(p->graph);
  std::vector<int> keep_until(p->graph.nodes().size(), -1);
  for (size_t d = 0; d < o.devices.size(); ++d) o.devices[d]->extend_lifetimes(p->graph, static_cast<int>(d), keep_until);
  // Timing what-ifs (GpuTuning::skip_launches): integer values (expert ids) keep their bytes for
  // the whole graph, so a replay that leaves out their writer still reads valid ids.
  if (!o.gpu_tuning.skip_launches.empty())
    for (size_t i = 0; i < p->graph.nodes().size(); ++i)
      if (p->graph.node(static_cast<int>(i)).type == DType::I32) keep_until[i] = static_cast<int>(p->graph.nodes().size()) - 1;
  PlanStats st = plan_memory(p->graph, [&](int id) {
    const Node &n = p->graph.node(id);
    return o.devices[static_cast<size_t>(n.device)]->work_size(p->graph, id, o.n_threads, o.gpu_tuning);
  }, keep_until);
  for (int d = 0; d < kMaxDevices; ++d) {
    p->arena_bytes[d] = st.arena_bytes[d];
    p->work_bytes[d] = st.work_bytes[d];
  }
  p->n_inplace = st.n_inplace;
  validate(p->graph, o);
  schedule(*p, o);
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
