// Placement: which device holds each weight (and so runs the nodes that read it), and where
// each layer's KV cache lives, resolved once per model from PlacementParams (engine.h).
//
//   Placement p = resolve_placement(gguf, hp, params.placement, available_devices, wanted);
//   p.devices[p.device_of(tensor)]   // "cuda0"
//   p.kv_device[layer]               // index into p.devices
//
// Rules, first that applies: an override "REGEX=DEVICE" whose regex is found in the tensor
// name; a routed-expert tensor ("_exps") of a layer under cpu_moe / n_cpu_moe -> the CPU; a
// layer tensor ("blk.N.") -> its layer's device (the first L - n_gpu_layers layers on the
// CPU, the rest split over the GPUs in tensor_split proportions, default: their memory);
// output_norm / output -> main_device (default: the last layer's device); token_embd -> the
// first layer's device; anything else -> the last layer's device. Settings that contradict
// each other are an InvalidArgument error naming both.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "engine/engine.h"

namespace moe {

class GgufFile;
struct GgufTensorInfo;
struct Hparams;

struct Placement {
  std::vector<std::string> devices;   // the model's devices, GPUs first in the order given, then the CPU
  std::vector<bool> is_gpu;           // per device
  std::unordered_map<const GgufTensorInfo *, int> tensor_device;
  std::vector<int> layer_device;      // per layer: where its (non-override) tensors went
  std::vector<int> kv_device;         // per layer: where its attention (and KV cache) runs
  int output_device = 0;

  int device_of(const GgufTensorInfo *t) const;  // InvalidArgument for a tensor of another file
  // Where layer's attention and KV cache run; the output device for a layer index outside
  // the model (the embedding's -1, the head's n_layer).
  int kv_device_for(int layer) const {
    return layer >= 0 && layer < static_cast<int>(kv_device.size()) ? kv_device[static_cast<size_t>(layer)] : output_device;
  }
  int find(const std::string &name) const;       // -1 when absent
  int cpu() const { return find("cpu"); }
  // Bytes of weights per device (256-byte aligned each, as DeviceWeights stores them).
  std::vector<uint64_t> weight_bytes() const;
  // Every tensor on devices[d]?
  bool all_on(int d) const;
};

// Layer index of "blk.N.*" tensors, else -1.
int tensor_layer(const std::string &name);
// A routed-expert tensor (moved by cpu_moe / n_cpu_moe).
bool is_expert_tensor(const std::string &name);

// available: every device the registry has (with the test twin); wanted: ModelLoadParams::devices
// (empty = all). Throws InvalidArgument on unknown devices and contradicting settings.
Placement resolve_placement(const GgufFile &f, const Hparams &hp, const PlacementParams &p, const std::vector<DeviceInfo> &available,
                            const std::vector<std::string> &wanted);

}  // namespace moe
