// Graph compiler: turns a built Graph into an executable plan for a set of devices.
//
//   CompileOptions o;  o.devices = {cuda0, cpu};  o.n_threads = 8;
//   std::unique_ptr<CompiledPlan> plan = compile_graph(std::move(graph), o);
//   // plan->arena_bytes[d]: activation arena needed on device d
//   bind_plan(*plan, arenas, weight_address);   // resolve every node's address
//   for (const Segment &s : plan->segments) executors[s.device]->run(plan->graph, s.begin, s.end, env);
//
// Passes, in order: validate (every node supported somewhere), place (first device in
// preference order that supports the node; the user's device choice is never overridden
// by a silent fallback unless allow_fallback), plan memory (liveness arenas per device),
// schedule (segments = maximal runs on one device within one layer; the abort callback is
// polled between segments).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "graph/ir.h"
#include "memory/planner.h"

namespace moe {

class Backend;

struct CompileOptions {
  std::vector<Backend *> devices;  // preference order; index = Node::device
  int n_threads = 1;               // for work-size estimates of CPU kernels
  bool allow_fallback = true;      // nodes unsupported on devices[0] may run on a later device
};

struct Segment {
  int device;
  int begin, end;  // node range [begin, end)
  int layer;       // Node::segment of its nodes
};

struct CompiledPlan {
  Graph graph;
  std::vector<Segment> segments;
  size_t arena_bytes[kMaxDevices] = {0};
  int n_inplace = 0;
  int input_tokens = -1, input_pos = -1, input_out_ids = -1, output_logits = -1;
};

std::unique_ptr<CompiledPlan> compile_graph(Graph g, const CompileOptions &opts);

// Resolve node addresses: arena nodes to arenas[device] + offset, weights through
// weight_addr(node) (host mmap pointer on CPU, uploaded copy on a GPU).
void bind_plan(CompiledPlan &plan, void *const *arenas, const std::function<void *(const Node &)> &weight_addr);

}  // namespace moe
