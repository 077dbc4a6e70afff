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
//
// Split models (the reference engine's layout, written by its gguf-split and by
// `moeinfer-cli mkmodel --split-max-size`): "NAME-00001-of-00003.gguf" holds all metadata plus
// "split.no" = 0, "split.count" = 3, "split.tensors.count" = total tensors; the later parts
// hold the split keys and their own tensors. open() of the first part opens every part (each
// validated like a single file) and lists all tensors, each with `data` in its own part's
// mapping and `part` naming that part. Opening a later part directly is an InvalidModel error
// that names the first part (as the reference does); GgufOpenOptions::single_part opens just
// that file. A part is matched to the first by its split keys and by any metadata key the two
// share; the reference's keys carry no model identity, so a part of another model with the
// same part count and tensor count is caught only by the architecture's shape checks.
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
  MissingPart,         // a part of a split model cannot be opened (status IoError)
  BadSplit,            // parts that do not form one model (status InvalidModel)
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
  uint16_t part = 0;             // split models: the part holding the data (GgufFile::part_path)
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

struct GgufOpenOptions {
  bool use_mmap = true;                 // false: read the whole file into owned memory
  std::vector<std::string> overrides;   // "key=type:value", type in int|float|bool|str|u32|...
  bool single_part = false;             // a split model's part: open only this file
};

// The reference engine's split metadata keys and part names.
extern const char *const kGgufSplitNo;            // "split.no" (u16, 0-based)
extern const char *const kGgufSplitCount;         // "split.count" (u16)
extern const char *const kGgufSplitTensorsCount;  // "split.tensors.count" (i32, all parts)
// "PREFIX-%05d-of-%05d.gguf" with the part number counted from 1 (index + 1).
std::string gguf_split_path(const std::string &prefix, int index, int count);

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

  // Every tensor (of every part of a split model).
  const std::vector<GgufTensorInfo> &tensors() const { return tensors_; }
  const GgufTensorInfo *tensor(const std::string &name) const;

  // Split models: the parts, the first being this file (a single file is one part).
  size_t n_parts() const { return 1 + parts_.size(); }
  const GgufFile &part(size_t i) const { return i == 0 ? *this : *parts_[i - 1]; }
  const std::string &part_path(size_t i) const { return part(i).path(); }

private:
  GgufFile() = default;
  void parse();
  void open_parts(const GgufOpenOptions &opts);  // gguf_split.cpp
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
  std::vector<std::unique_ptr<GgufFile>> parts_;  // the later parts of a split model
};

}  // namespace moe
