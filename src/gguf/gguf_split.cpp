// Split models: the first part names the others ("PREFIX-00002-of-00003.gguf", ...); each is
// opened and validated like a single file, checked against the first (split keys, shared
// metadata) and its tensors join the first part's list with their data in their own mapping.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "gguf/gguf_reader.h"

namespace moe {

const char *const kGgufSplitNo = "split.no";
const char *const kGgufSplitCount = "split.count";
const char *const kGgufSplitTensorsCount = "split.tensors.count";

std::string gguf_split_path(const std::string &prefix, int index, int count) {
  return prefix + strfmt("-%05d-of-%05d.gguf", index + 1, count);
}

namespace {

// The reference engine's split keys are 16-bit.
constexpr uint32_t kMaxParts = 65535;

[[noreturn]] void split_fail(const std::string &msg) { throw GgufError(GgufErrc::BadSplit, msg, Status::InvalidModel); }

// The prefix of "PREFIX-%05d-of-%05d.gguf" for part `index` of `count`, or "" when the name
// does not follow the pattern.
std::string split_prefix(const std::string &path, uint32_t index, uint32_t count) {
  const std::string tail = gguf_split_path("", static_cast<int>(index), static_cast<int>(count));
  if (path.size() <= tail.size() || path.compare(path.size() - tail.size(), tail.size(), tail) != 0) return "";
  return path.substr(0, path.size() - tail.size());
}

// Same type and value; nested arrays compare by element type and count only (no metadata
// key the loader reads is one).
bool same_value(const GgufValue &a, const GgufValue &b) {
  if (a.type != b.type) return false;
  if (a.type == GgufType::STRING) return a.str == b.str;
  if (a.type != GgufType::ARRAY) return a.i == b.i && a.u == b.u && (a.f == b.f || (a.f != a.f && b.f != b.f));
  return a.elem_type == b.elem_type && a.count == b.count && a.strs == b.strs && a.raw == b.raw;
}

// The later part's split keys and shared metadata against the first part's.
void check_part(const GgufFile &first, const GgufFile &p, uint32_t index, uint32_t count) {
  const char *name = p.path().c_str();
  if (!p.has(kGgufSplitCount) || !p.has(kGgufSplitNo))
    split_fail(strfmt("split model '%s': part '%s' has no '%s'/'%s' keys: it is not a part of a split model", first.path().c_str(), name,
                      kGgufSplitNo, kGgufSplitCount));
  const uint32_t n = p.get_u32(kGgufSplitCount), no = p.get_u32(kGgufSplitNo);
  if (n != count)
    split_fail(strfmt("split model '%s': part '%s' says %s = %u, the first part says %u", first.path().c_str(), name, kGgufSplitCount, n, count));
  if (no != index)
    split_fail(strfmt("split model '%s': part '%s' says %s = %u, its name says %u", first.path().c_str(), name, kGgufSplitNo, no, index));
  for (const auto &kv : p.metadata()) {
    if (kv.first == kGgufSplitNo) continue;
    const GgufValue *mine = first.find(kv.first);
    if (mine && !same_value(*mine, kv.second))
      split_fail(strfmt("split model '%s': part '%s' belongs to another model (its '%s' differs from the first part's)", first.path().c_str(), name,
                        kv.first.c_str()));
  }
}

}  // namespace

void GgufFile::open_parts(const GgufOpenOptions &opts) {
  if (!has(kGgufSplitCount)) return;
  const uint32_t count = get_u32(kGgufSplitCount), index = get_u32(kGgufSplitNo, 0);
  if (count <= 1 && index == 0) return;  // a split of one part is a single file
  if (count > kMaxParts || index >= count)
    split_fail(strfmt("'%s': %s = %u and %s = %u do not describe a part of a split model", path_.c_str(), kGgufSplitNo, index, kGgufSplitCount, count));
  const std::string prefix = split_prefix(path_, index, count);
  if (index != 0) {
    const std::string first = prefix.empty() ? strfmt("its -00001-of-%05u.gguf file", count) : "'" + gguf_split_path(prefix, 0, static_cast<int>(count)) + "'";
    split_fail(strfmt("'%s' is part %u of %u of a split model: load the first part, %s", path_.c_str(), index + 1, count, first.c_str()));
  }
  if (prefix.empty())
    split_fail(strfmt("'%s' is the first of %u parts of a split model, but its name does not end in '-00001-of-%05u.gguf', so the other parts "
                      "cannot be found",
                      path_.c_str(), count, count));
  GgufOpenOptions po;
  po.use_mmap = opts.use_mmap;
  po.single_part = true;
  for (uint32_t i = 1; i < count; ++i) {
    const std::string path = gguf_split_path(prefix, static_cast<int>(i), static_cast<int>(count));
    struct stat st;
    if (::stat(path.c_str(), &st) != 0)
      throw GgufError(GgufErrc::MissingPart, strfmt("split model '%s': part %u of %u, '%s', cannot be opened: %s", path_.c_str(), i + 1, count,
                                                    path.c_str(), std::strerror(errno)), Status::IoError);
    std::unique_ptr<GgufFile> p;
    try {
      p = open(path, po);
    } catch (const GgufError &e) {
      throw GgufError(e.errc(), strfmt("split model '%s', part '%s': %s", path_.c_str(), path.c_str(), e.what()), e.code());
    } catch (const Error &e) {
      throw Error(e.code(), strfmt("split model '%s', part '%s': %s", path_.c_str(), path.c_str(), e.what()));
    }
    check_part(*this, *p, i, count);
    for (const GgufTensorInfo &t : p->tensors()) {
      auto it = tensor_index_.find(t.name);
      if (it != tensor_index_.end())
        split_fail(strfmt("split model '%s': tensor '%s' of part '%s' is also in part '%s'", path_.c_str(), t.name.c_str(), path.c_str(),
                          part_path(tensors_[it->second].part).c_str()));
      tensor_index_[t.name] = tensors_.size();
      tensors_.push_back(t);
      tensors_.back().part = static_cast<uint16_t>(i);
    }
    parts_.push_back(std::move(p));
  }
  if (has(kGgufSplitTensorsCount)) {
    const int64_t want = get_i64(kGgufSplitTensorsCount);
    if (want != static_cast<int64_t>(tensors_.size()))
      split_fail(strfmt("split model '%s': %s says %lld tensors, its %u parts hold %zu", path_.c_str(), kGgufSplitTensorsCount, (long long)want,
                        count, tensors_.size()));
  }
}

}  // namespace moe
