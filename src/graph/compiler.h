// Graph compiler: turns a built Graph into an executable plan for a set of devices.
//
//   CompileOptions o;  o.devices = {cuda0, cpu};  o.n_threads = 8;  o.gpu_tuning = ctx_params.gpu_tuning;
//   std::unique_ptr<CompiledPlan> plan = compile_graph(std::move(graph), o);
//   // plan->arena_bytes[d]: activation arena needed on device d
//   bind_plan(*plan, arenas, weight_address);   // resolve every node's address
//   for (const Segment &s : plan->segments) executors[s.device]->run(plan->graph, s.begin, s.end, env);
//
// Passes, in order: place (each weight where the placement put it, each node with its
// weights, else its inputs; an op its device cannot run is an error unless allow_fallback),
// insert transfers (one Transfer node per value read on another device: the only way data
// crosses a device boundary), plan memory (liveness arenas per device; nothing is shared
// across devices), validate (those invariants), schedule (segments = maximal runs on one
// executor within one layer; a Transfer touching a GPU runs on that GPU's stream; the
// abort callback is polled between segments).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "core/gpu_tuning.h"
#include "graph/ir.h"
#include "memory/planner.h"

namespace moe {

class Backend;

struct GgufTensorInfo;

struct CompileOptions {
  std::vector<Backend *> devices;  // index = Node::device
  int n_threads = 1;               // for work-size estimates of CPU kernels
  // The GPU options the plan's executors will run with: GPU scratch sizes depend on them.
  GpuTuning gpu_tuning;
  bool allow_fallback = false;     // an op its device cannot run goes to a CPU device (else: an error)
  // Placement: each weight's device and each layer's KV cache device (unset: default_device).
  std::function<int(const GgufTensorInfo *)> weight_device;
  std::function<int(int layer)> kv_device;
  int default_device = 0;          // nodes that read neither weights nor placed values
  // Streaming: a product whose weight sits on a host device runs on stream_device(layer) (a
  // GPU; -1 = none) instead, its weight copied there by a Transfer (big batches: the bus
  // moves the matrix faster than the CPU multiplies it).
  std::function<int(int layer)> stream_device;
  // Direct reads: a Node::direct_read product runs on direct_device(layer) (a GPU that can
  // read the page-locked host weights in place; -1 = none: it stays with its weight).
  std::function<int(int layer)> direct_device;
};

struct Segment {
  int device;      // the executor that runs it
  int begin, end;  // node range [begin, end)
  int layer;       // Node::segment of its nodes
  // A GPU stretch of direct-read products that the host segments after it do not read: the
  // host waits for the GPU work before it, not for it, so the two run at the same time.
  bool overlap = false;
};

struct CompiledPlan {
  Graph graph;
  std::vector<Segment> segments;
  size_t arena_bytes[kMaxDevices] = {0};
  size_t work_bytes[kMaxDevices] = {0};  // largest scratch of one node per device (inside arena_bytes)
  int n_inplace = 0;
  int n_transfers = 0;
  int input_tokens = -1, input_pos = -1, input_out_ids = -1, output_logits = -1;
};

std::unique_ptr<CompiledPlan> compile_graph(Graph g, const CompileOptions &opts);

// Resolve node addresses: arena nodes to arenas[device] + offset, weights through
// weight_addr(node) (host mmap pointer on CPU, uploaded copy on a GPU).
void bind_plan(CompiledPlan &plan, void *const *arenas, const std::function<void *(const Node &)> &weight_addr);

}  // namespace moe
