// Model internals shared by the loader, the architecture graph builders and the context.
#pragma once
#include <atomic>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>

#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "core/huge_page_buffer.h"
#include "engine/weight_upload.h"
#include "placement/placement.h"

#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "model/hparams.h"

namespace moe {

struct ArchSpec;

struct Model::Impl {
  std::unique_ptr<GgufFile> gguf;
  Hparams hp;
  std::unique_ptr<Vocab> vocab;
  const ArchSpec *arch = nullptr;
  uint64_t n_params = 0;
  uint64_t weight_bytes = 0;
  bool vocab_only = false;
  bool cpu_weight_copy = true;  // ModelLoadParams::cpu_weight_copy

  // Placement (src/placement/placement.h) and the weights it put on GPUs, uploaded at load
  // and shared by every context (index = placement device; null for host devices).
  PlacementParams placement_params;
  Placement placement;
  std::unique_ptr<BackendRegistry> registry;  // allocates the device weights (lives as long as they do)
  std::vector<std::unique_ptr<DeviceWeights>> dev_weights;
  std::vector<std::string> devices;  // ModelLoadParams::devices
  bool metadata_only = false;        // Model::load_metadata: no weights on devices, no contexts

  // Weights for CPU kernels: t.data, or its place in the huge-page copy once a CPU context
  // asked for one (ensure_cpu_copy: a mapped model, made once, shared by its contexts; it
  // holds the tensors placed on host devices, or every tensor when all are).
  const uint8_t *cpu_weights(const GgufTensorInfo &t) const {
    const uint8_t *c = cpu_copy_base.load(std::memory_order_acquire);
    if (!c) return t.data;
    auto it = cpu_copy_off.find(&t);
    return it == cpu_copy_off.end() ? t.data : c + it->second;
  }
  mutable std::unordered_map<const GgufTensorInfo *, size_t> cpu_copy_off;  // written before cpu_copy_base is published
  void ensure_cpu_copy() const;
  // Page-lock the CPU weights (the huge-page copy) for gpu's copy engine, once per model;
  // false when there is no copy to lock or the device cannot (then nothing streams).
  bool pin_cpu_weights(Backend &gpu) const;
  mutable std::unique_ptr<HostRegistration> cpu_copy_pin;
  ~Impl();
  // Placement from placement_params and devices; then (upload) the GPU weights, each from
  // its mapped pages, which are released as they are copied.
  void resolve_and_upload(const std::function<void(float)> &progress, bool upload);
  mutable std::mutex cpu_copy_mu;
  mutable HugePageBuffer cpu_copy;
  // Published once the copy is complete: contexts may bind plans while another is created.
  mutable std::atomic<const uint8_t *> cpu_copy_base{nullptr};

  const GgufTensorInfo *find(const std::string &name) const { return gguf->tensor(name); }
  // The tensor with this exact shape (ne[0] first) or an InvalidModel error naming it.
  const GgufTensorInfo *require(const std::string &name, std::initializer_list<int64_t> shape) const;
  // Same, but a missing tensor returns nullptr (optional weights such as biases).
  const GgufTensorInfo *optional(const std::string &name, std::initializer_list<int64_t> shape) const;
};

}  // namespace moe
