// Activation memory planner: gives every computed tensor of a scheduled graph an offset in
// its device's arena, reusing memory once a tensor is dead (liveness over the schedule).
//
//   PlanStats s = plan_memory(graph, work_size_fn);   // fills node.storage/offset/work_*
//   arena_bytes[dev] = s.arena_bytes[dev];
//
// In-place: an elementwise op may write over its first input only when the planner proves
// that input is dead after this op, lives in the same device arena, is not a graph input
// or output, and has exactly the output's size. Views share their source's storage and
// extend its lifetime.
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "graph/ir.h"

namespace moe {

constexpr int kMaxDevices = 8;
constexpr size_t kArenaAlign = 64;  // cache line / vector width; also fine for cudaMalloc'd bases

struct PlanStats {
  size_t arena_bytes[kMaxDevices] = {0};
  size_t work_bytes[kMaxDevices] = {0};  // largest single-node scratch per device
  int n_inplace = 0;
};

// work_size(node_index) -> scratch bytes the node's kernel needs on its device.
using WorkSizeFn = std::function<size_t(int)>;

// Ops whose kernels are written to tolerate dst == src0 (elementwise, row-local).
bool op_can_run_in_place(Op op);

// keep_until (optional, one entry per node or empty): node i's value stays intact at least until
// node keep_until[i] has run (-1: until its last reader, the default). For a backend whose fused
// launch reads a value after it wrote outputs the planner would otherwise place over it
// (Backend::extend_lifetimes).
PlanStats plan_memory(Graph &g, const WorkSizeFn &work_size, const std::vector<int> &keep_until = {});

}  // namespace moe
