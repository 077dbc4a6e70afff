#pragma once
// CompileOptions for a model's placement: the one place that turns a Placement into the
// compiler's device callbacks, for contexts (src/engine/context.cpp) and the fit's dry run
// (src/placement/fit.cpp) alike, so both plan the same graph.
#include <vector>

#include "graph/compiler.h"
#include "placement/placement.h"

namespace moe {

struct PlacedCompile {
  const Placement *placement = nullptr;  // must outlive the returned options
  std::vector<Backend *> devices;        // the placement's devices, same order
  int n_threads = 1;
  GpuTuning gpu_tuning;                  // the context's (CompileOptions::gpu_tuning)
  bool allow_fallback = false;
  // Host-resident products go to a GPU: the layer's own, else stream_fallback_gpu.
  bool stream = false;                   // ubatch at or above the streaming threshold
  int stream_fallback_gpu = -1;          // -1: no streaming
  bool direct_reads = false;             // Node::direct_read products run on the layer's GPU
};

CompileOptions placed_compile_options(const PlacedCompile &p);

}  // namespace moe
