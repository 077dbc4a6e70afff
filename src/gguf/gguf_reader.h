// GGUF reader: parses and validates a GGUF v2/v3 file, memory-maps it read-only and exposes
// metadata and tensor data in place (no copy on CPU).
//
//   GgufOpenOptions o;  o.overrides = {"qwen3moe.expert_used_count=int:4"};
//   auto f = GgufFile::open("model.gguf", o);        // throws GgufError on malformed input
//   uint32_t n_layer = f->get_u32("qwen3moe.block_count");
//   const GgufTensorInfo *t = f->tensor("token_embd.weight");   // t->data points into the map
//
// Every malformed input throws GgufError (status InvalidGguf) with a specific GgufErrc and a
// message naming the key or tensor; nothing is read out of bounds.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/huge_page_buffer.h"
#include "core/status.h"
#include "gguf/gguf_value.h"
#include "quant/dtype.h"

namespace moe {

enum class GgufErrc : int {
  None = 0,
  BadMagic,            // not a GGUF file
  BadVersion,          // version other than 2 or 3
  Truncated,           // file ends inside the header, metadata or tensor infos
  BadKey,              // empty or over-long key / string
  DuplicateKey,
  BadValueType,        // unknown metadata value type
  ArrayTooLarge,       // array count does not fit in the file
  BadAlignment,        // general.alignment not a power of two / wrong type
  DuplicateTensor,
  BadRank,             // n_dims 0 or > 4
  BadShape,            // a dimension <= 0
  ElementOverflow,     // element count / byte size overflows
  UnknownTensorType,
  BadBlockMultiple,    // row size not a multiple of the type's block size
  TensorOutOfBounds,   // offset + size past the end of the file
  MisalignedTensor,    // offset not a multiple of the alignment
  TooManyTensors,      // tensor count cannot fit in the file
  BadOverride,         // malformed metadata override
  TypeMismatch,        // key present with the wrong type for the caller's get_*
  MissingKey,
  MemoryLimit,         // parsed metadata would take more memory than kMemPerFileByte x file size (+ slack)
  NotRegularFile,      // the path is a FIFO, directory, device or socket (status IoError)
};
const char *gguf_errc_name(GgufErrc e);

class GgufError : public Error {
public:
  GgufError(GgufErrc e, const std::string &msg, Status s = Status::InvalidGguf) : Error(s, msg), errc_(e) {}
  GgufErrc errc() const { return errc_; }
private:
  GgufErrc errc_;
};

// Parsing limits. Metadata arrays nest at most kMaxArrayDepth + 1 deep; everything parsing
// allocates (values, keys, tensor infos) stays below kMemPerFileByte x the file size plus
// kMemSlack, checked before each allocation (an index node is counted as kIndexNodeBytes).
constexpr int kMaxArrayDepth = 8;
constexpr size_t kMemPerFileByte = 4;
constexpr size_t kMemSlack = size_t(16) << 20;
constexpr size_t kIndexNodeBytes = 64;

struct GgufTensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous (row) dimension
  DType type = DType::F32;
  uint64_t offset = 0;           // relative to the data section
  size_t nbytes = 0;
  const uint8_t *data = nullptr; // into the mapping (or owned buffer); valid while the file lives
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

struct GgufOpenOptions {
  bool use_mmap = true;                 // false: read the whole file into owned memory
  std::vector<std::string> overrides;   // "key=type:value", type in int|float|bool|str|u32|...
};

class GgufFile {
public:
  static std::unique_ptr<GgufFile> open(const std::string &path, const GgufOpenOptions &opts = {});
  // Parse bytes held in memory (tests, fuzzing). The buffer is copied.
  static std::unique_ptr<GgufFile> from_memory(const void *data, size_t size,
                                               const GgufOpenOptions &opts = {});
  ~GgufFile();
  GgufFile(const GgufFile &) = delete;
  GgufFile &operator=(const GgufFile &) = delete;

  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }
  size_t data_offset() const { return data_offset_; }
  const uint8_t *data_section() const { return base_ + data_offset_; }  // tensor data (mapping or owned)
  bool is_mmapped() const { return mapped_; }
  const std::string &path() const { return path_; }  // as given to open ("" from memory)

  // Metadata, in file order.
  const std::vector<std::pair<std::string, GgufValue>> &metadata() const { return kv_; }
  const GgufValue *find(const std::string &key) const;
  bool has(const std::string &key) const { return find(key) != nullptr; }
  // Typed getters: integer getters accept any integer type whose value fits; throw
  // GgufError(MissingKey / TypeMismatch) naming the key.
  uint32_t get_u32(const std::string &key) const;
  uint32_t get_u32(const std::string &key, uint32_t def) const;
  int64_t get_i64(const std::string &key) const;
  float get_f32(const std::string &key) const;
  float get_f32(const std::string &key, float def) const;
  bool get_bool(const std::string &key, bool def) const;
  std::string get_str(const std::string &key) const;
  std::string get_str(const std::string &key, const std::string &def) const;
  // Apply "key=type:value" (also done for GgufOpenOptions::overrides at open).
  void apply_override(const std::string &spec);

  const std::vector<GgufTensorInfo> &tensors() const { return tensors_; }
  const GgufTensorInfo *tensor(const std::string &name) const;

private:
  GgufFile() = default;
  void parse();
  void set_value(const std::string &key, GgufValue v);

  std::string path_;
  const uint8_t *base_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  HugePageBuffer owned_;        // use_mmap = false: the file read into huge-page memory
  std::vector<uint8_t> copy_;   // from_memory
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace moe
