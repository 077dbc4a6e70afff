// GGUF writer (v3): metadata plus tensors, either from memory or streamed through a fill
// callback so multi-gigabyte files never sit in memory.
//
//   GgufWriter w;
//   w.set("general.architecture", GgufValue::make_str("qwen3moe"));
//   w.add_tensor("token_embd.weight", DType::F16, {n_embd, n_vocab}, bytes.data(), bytes.size());
//   w.add_tensor_streamed("blk.0.ffn_up_exps.weight", DType::Q4_K, {2048, 768, 128},
//                         [](uint8_t *dst, size_t off, size_t n) { /* fill n bytes */ });
//   w.write_file("out.gguf", progress);      // or: std::vector<uint8_t> b = w.write_memory();
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf_value.h"
#include "quant/dtype.h"

namespace moe {

class GgufWriter {
public:
  // Fill `n` bytes of the tensor's data starting at byte `offset` (chunks arrive in order).
  using FillFn = std::function<void(uint8_t *dst, size_t offset, size_t n)>;
  // Progress: bytes written so far, total bytes; return false to cancel (throws Aborted).
  using ProgressFn = std::function<bool(uint64_t done, uint64_t total)>;

  explicit GgufWriter(uint32_t alignment = 32) : alignment_(alignment) {}
  void set(const std::string &key, GgufValue v);
  void add_tensor(const std::string &name, DType type, std::vector<int64_t> ne, const void *data, size_t nbytes);
  void add_tensor_streamed(const std::string &name, DType type, std::vector<int64_t> ne, FillFn fill);
  uint64_t total_bytes() const;  // size of the file write() will produce

  void write_file(const std::string &path, const ProgressFn &progress = nullptr) const;
  std::vector<uint8_t> write_memory() const;

private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    size_t nbytes;
    uint64_t offset;
    std::vector<uint8_t> data;  // empty when streamed
    FillFn fill;
  };
  std::vector<uint8_t> header() const;  // magic .. tensor infos, padded to the alignment
  void write_to(const std::function<void(const void *, size_t)> &sink, const ProgressFn &progress) const;
  uint32_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
  uint64_t data_size_ = 0;
};

// Serialise just one metadata value (used by the writer, exposed for tests that hand-craft
// malformed files).
void gguf_append_value(std::vector<uint8_t> &out, const GgufValue &v);
void gguf_append_string(std::vector<uint8_t> &out, const std::string &s);

}  // namespace moe
