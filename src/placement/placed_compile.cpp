#include "placement/placed_compile.h"

#include "backends/backend.h"

namespace moe {

CompileOptions placed_compile_options(const PlacedCompile &p) {
  CompileOptions co;
  co.devices = p.devices;
  co.n_threads = p.n_threads;
  co.gpu_tuning = p.gpu_tuning;
  co.allow_fallback = p.allow_fallback;
  const Placement *pl = p.placement;
  co.weight_device = [pl](const GgufTensorInfo *t) { return pl->device_of(t); };
  co.kv_device = [pl](int layer) { return pl->kv_device_for(layer); };
  co.default_device = pl->output_device;
  const std::vector<Backend *> devs = p.devices;
  auto layer_gpu = [pl, devs](int layer) {  // the layer's device when it is a GPU, else -1
    const int d = layer >= 0 && layer < static_cast<int>(pl->kv_device.size()) ? pl->kv_device[static_cast<size_t>(layer)] : -1;
    return d >= 0 && !devs[static_cast<size_t>(d)]->host_memory() ? d : -1;
  };
  if (p.stream && p.stream_fallback_gpu >= 0) {
    const int fallback = p.stream_fallback_gpu;
    co.stream_device = [layer_gpu, fallback](int layer) {
      const int d = layer_gpu(layer);
      return d >= 0 ? d : fallback;
    };
  }
  if (p.direct_reads) co.direct_device = layer_gpu;
  return co;
}

}  // namespace moe
