// GGUF writer (v3): metadata plus tensors, either from memory or streamed through a fill
// callback so multi-gigabyte files never sit in memory.
//
//   GgufWriter w;
//   w.set("general.architecture", GgufValue::make_str("qwen3moe"));
//   w.add_tensor("token_embd.weight", DType::F16, {n_embd, n_vocab}, bytes.data(), bytes.size());
//   w.add_tensor_streamed("blk.0.ffn_up_exps.weight", DType::Q4_K, {2048, 768, 128},
//                         [](uint8_t *dst, size_t off, size_t n) { /* fill n bytes */ });
//   w.write_file("out.gguf", progress);      // or: std::vector<uint8_t> b = w.write_memory();
//   w.write_split("out", 4ull << 30);        // out-00001-of-0000N.gguf, ... (split.* keys)
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
  // A split model as the reference engine's gguf-split writes it: parts
  // gguf_split_path(prefix, i, n), tensors in order, a new part started when the next tensor's
  // data would take the current part's data past max_part_bytes (a larger tensor gets a part
  // of its own); the first part carries all metadata, every part the split.* keys. Returns
  // the paths written (one part when everything fits).
  std::vector<std::string> write_split(const std::string &prefix, uint64_t max_part_bytes, const ProgressFn &progress = nullptr) const;

private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    size_t nbytes;
    std::vector<uint8_t> data;  // empty when streamed
    FillFn fill;
  };
  using Metadata = std::vector<std::pair<std::string, GgufValue>>;
  using Sink = std::function<void(const void *, size_t)>;
  uint64_t padded(size_t nbytes) const { return (nbytes + alignment_ - 1) / alignment_ * alignment_; }
  std::vector<const Tensor *> all_tensors() const;
  // magic .. tensor infos, padded to the alignment
  std::vector<uint8_t> header(const Metadata &kv, const std::vector<const Tensor *> &ts) const;
  // One file's bytes; done counts data bytes across the files of one write (progress).
  void write_to(const Sink &sink, const Metadata &kv, const std::vector<const Tensor *> &ts, const ProgressFn &progress, uint64_t &done,
                uint64_t total) const;
  void write_one(const std::string &path, const Metadata &kv, const std::vector<const Tensor *> &ts, const ProgressFn &progress, uint64_t &done) const;
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
