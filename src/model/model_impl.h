// Model internals shared by the loader, the architecture graph builders and the context.
#pragma once
#include <atomic>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>

#include "core/huge_page_buffer.h"

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

  // Weights for CPU kernels: t.data, or its place in the huge-page copy once a CPU context
  // asked for one (ensure_cpu_copy: a mapped model, made once, shared by its contexts).
  const uint8_t *cpu_weights(const GgufTensorInfo &t) const {
    const uint8_t *c = cpu_copy_base.load(std::memory_order_acquire);
    return c ? c + (t.data - gguf->data_section()) : t.data;
  }
  void ensure_cpu_copy() const;
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
