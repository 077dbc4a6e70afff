#include "gguf/gguf_reader.h"

#include "core/alloc_test_hook.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

namespace moe {

const char *gguf_errc_name(GgufErrc e) {
  switch (e) {
    case GgufErrc::None: return "none";
    case GgufErrc::BadMagic: return "bad magic";
    case GgufErrc::BadVersion: return "unsupported version";
    case GgufErrc::Truncated: return "truncated";
    case GgufErrc::BadKey: return "bad key or string";
    case GgufErrc::DuplicateKey: return "duplicate key";
    case GgufErrc::BadValueType: return "bad value type";
    case GgufErrc::ArrayTooLarge: return "array too large";
    case GgufErrc::BadAlignment: return "bad alignment";
    case GgufErrc::DuplicateTensor: return "duplicate tensor";
    case GgufErrc::BadRank: return "bad rank";
    case GgufErrc::BadShape: return "bad shape";
    case GgufErrc::ElementOverflow: return "element count overflow";
    case GgufErrc::UnknownTensorType: return "unknown tensor type";
    case GgufErrc::BadBlockMultiple: return "row not a multiple of the block size";
    case GgufErrc::TensorOutOfBounds: return "tensor data out of bounds";
    case GgufErrc::MisalignedTensor: return "misaligned tensor";
    case GgufErrc::TooManyTensors: return "too many tensors";
    case GgufErrc::BadOverride: return "bad metadata override";
    case GgufErrc::TypeMismatch: return "type mismatch";
    case GgufErrc::MissingKey: return "missing key";
    case GgufErrc::MemoryLimit: return "metadata too large for its file";
    case GgufErrc::NotRegularFile: return "not a regular file";
    case GgufErrc::MissingPart: return "missing part of a split model";
    case GgufErrc::BadSplit: return "inconsistent split model";
  }
  return "?";
}

[[noreturn]] static void gguf_fail(GgufErrc e, const std::string &msg) {
  throw GgufError(e, std::string("GGUF: ") + msg);
}

namespace {

// Bounds-checked cursor over the file bytes.
class Cursor {
public:
  Cursor(const uint8_t *p, size_t n) : p_(p), n_(n) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return n_ - pos_; }
  void need(size_t k, const char *what) const {
    if (k > remaining()) gguf_fail(GgufErrc::Truncated, strfmt("file ends while reading %s (offset %zu)", what, pos_));
  }
  template <typename T> T read(const char *what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char *what) {
    uint64_t len = read<uint64_t>(what);
    if (len > remaining()) gguf_fail(GgufErrc::Truncated, strfmt("string of %llu bytes in %s runs past the end of the file", (unsigned long long)len, what));
    std::string s(reinterpret_cast<const char *>(p_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }
  const uint8_t *take(size_t k, const char *what) {
    need(k, what);
    const uint8_t *q = p_ + pos_;
    pos_ += k;
    return q;
  }
private:
  const uint8_t *p_;
  size_t n_;
  size_t pos_ = 0;
};

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::F64); }

// What parsing may allocate: a fixed multiple of the file size (kMemPerFileByte) plus a
// constant. Every metadata value, key and tensor info is charged before it is allocated, so a
// hostile file (millions of nested empty arrays, tiny keys, empty strings: 8-12 bytes on disk,
// 30-150 bytes as objects) is rejected before it can take more, and at once when an array's
// count alone says it would not fit.
class MemBudget {
public:
  explicit MemBudget(size_t file_size)
      : left_(file_size > (SIZE_MAX - kMemSlack) / kMemPerFileByte ? SIZE_MAX : file_size * kMemPerFileByte + kMemSlack),
        total_(left_) {}
  void charge(uint64_t n, uint64_t count, const std::string &key, const char *what) {
    if (count != 0 && n > left_ / count)  // count objects of n bytes each
      gguf_fail(GgufErrc::MemoryLimit, strfmt("key '%s': %s would need more memory than %zu bytes (%zu times the file size + %zu MiB)", key.c_str(),
                                              what, total_, kMemPerFileByte, kMemSlack >> 20));
    left_ -= static_cast<size_t>(n * count);
  }
private:
  size_t left_, total_;
};

GgufValue read_value(Cursor &c, GgufType type, const std::string &key, int depth, MemBudget &mem) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::STRING:
      v.str = c.read_string(key.c_str());
      mem.charge(v.str.size(), 1, key, "a string");
      return v;
    case GgufType::ARRAY: {
      if (depth > kMaxArrayDepth)
        gguf_fail(GgufErrc::BadValueType, strfmt("key '%s': arrays nested deeper than %d", key.c_str(), kMaxArrayDepth));
      uint32_t et = c.read<uint32_t>(key.c_str());
      if (!valid_value_type(et)) gguf_fail(GgufErrc::BadValueType, strfmt("key '%s': unknown array element type %u", key.c_str(), et));
      v.elem_type = static_cast<GgufType>(et);
      v.count = c.read<uint64_t>(key.c_str());
      // Every element takes at least one byte (strings: 8), so a count larger than the rest
      // of the file is corrupt; checking first avoids huge allocations.
      size_t min_elem = v.elem_type == GgufType::STRING ? 8 : v.elem_type == GgufType::ARRAY ? 12 : gguf_scalar_size(v.elem_type);
      if (v.count > c.remaining() / min_elem)
        gguf_fail(GgufErrc::ArrayTooLarge, strfmt("key '%s': array of %llu elements does not fit in the file", key.c_str(), (unsigned long long)v.count));
      if (v.elem_type == GgufType::STRING) {
        mem.charge(sizeof(std::string), v.count, key, strfmt("an array of %llu strings", (unsigned long long)v.count).c_str());
        v.strs.reserve(static_cast<size_t>(v.count));
        for (uint64_t k = 0; k < v.count; ++k) {
          v.strs.push_back(c.read_string(key.c_str()));
          mem.charge(v.strs.back().size(), 1, key, "a string");
        }
      } else if (v.elem_type == GgufType::ARRAY) {
        mem.charge(sizeof(GgufValue), v.count, key, strfmt("an array of %llu arrays", (unsigned long long)v.count).c_str());
        v.arrays.reserve(static_cast<size_t>(v.count));
        for (uint64_t k = 0; k < v.count; ++k) v.arrays.push_back(read_value(c, GgufType::ARRAY, key, depth + 1, mem));
      } else {
        size_t bytes = static_cast<size_t>(v.count) * min_elem;
        const uint8_t *p = c.take(bytes, key.c_str());
        mem.charge(bytes, 1, key, "an array");
        v.raw.assign(p, p + bytes);
      }
      return v;
    }
    default: break;
  }
  size_t sz = gguf_scalar_size(type);
  const uint8_t *p = c.take(sz, key.c_str());
  switch (type) {
    case GgufType::U8: v.u = p[0]; v.i = p[0]; break;
    case GgufType::BOOL:
      if (p[0] > 1) gguf_fail(GgufErrc::BadValueType, strfmt("key '%s': bool value %u is neither 0 nor 1", key.c_str(), p[0]));
      v.u = p[0]; v.i = p[0]; break;
    case GgufType::I8: { int8_t x; std::memcpy(&x, p, 1); v.i = x; v.u = static_cast<uint64_t>(x); break; }
    case GgufType::U16: { uint16_t x; std::memcpy(&x, p, 2); v.u = x; v.i = x; break; }
    case GgufType::I16: { int16_t x; std::memcpy(&x, p, 2); v.i = x; v.u = static_cast<uint64_t>(x); break; }
    case GgufType::U32: { uint32_t x; std::memcpy(&x, p, 4); v.u = x; v.i = x; break; }
    case GgufType::I32: { int32_t x; std::memcpy(&x, p, 4); v.i = x; v.u = static_cast<uint64_t>(x); break; }
    case GgufType::U64: { uint64_t x; std::memcpy(&x, p, 8); v.u = x; v.i = static_cast<int64_t>(x); break; }
    case GgufType::I64: { int64_t x; std::memcpy(&x, p, 8); v.i = x; v.u = static_cast<uint64_t>(x); break; }
    case GgufType::F32: { float x; std::memcpy(&x, p, 4); v.f = x; break; }
    case GgufType::F64: { double x; std::memcpy(&x, p, 8); v.f = x; break; }
    default: break;
  }
  if (v.is_integer()) v.f = static_cast<double>(v.i);
  return v;
}

}  // namespace

GgufFile::~GgufFile() {
  if (mapped_ && base_) munmap(const_cast<uint8_t *>(base_), size_);
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string &path, const GgufOpenOptions &opts) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below); it
  // changes nothing for the regular files that pass.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) fail(Status::IoError, "cannot open '%s': %s", path.c_str(), std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail(Status::IoError, "cannot stat '%s': %s", path.c_str(), std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char *kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISCHR(st.st_mode) ? "a character device"
                       : S_ISBLK(st.st_mode) ? "a block device" : S_ISSOCK(st.st_mode) ? "a socket" : "not a regular file";
    throw GgufError(GgufErrc::NotRegularFile, strfmt("cannot load '%s': it is %s, not a regular file", path.c_str(), kind), Status::IoError);
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ == 0) {
    ::close(fd);
    gguf_fail(GgufErrc::Truncated, strfmt("'%s' is empty", path.c_str()));
  }
  try {  // an allocation the test hook fails (or a real out-of-memory) must not leak the descriptor
    if (opts.use_mmap) allocation_point(f->size_, "the model file's mapping");
    else f->owned_ = HugePageBuffer(f->size_);  // (an allocation point of its own)
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (opts.use_mmap) {
    void *p = mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail(Status::IoError, "cannot mmap '%s': %s", path.c_str(), std::strerror(e));
    }
    f->base_ = static_cast<const uint8_t *>(p);
    f->mapped_ = true;
  } else {
    size_t got = 0;
    while (got < f->size_) {
      ssize_t r = ::read(fd, f->owned_.data() + got, f->size_ - got);
      if (r <= 0) {
        int e = errno;
        ::close(fd);
        fail(Status::IoError, "cannot read '%s': %s", path.c_str(), r == 0 ? "unexpected end" : std::strerror(e));
      }
      got += static_cast<size_t>(r);
    }
    f->base_ = f->owned_.data();
  }
  ::close(fd);
  f->parse();
  if (!opts.single_part) f->open_parts(opts);  // before the overrides: the parts' metadata is compared as stored
  for (const auto &o : opts.overrides) f->apply_override(o);
  return f;
}

std::unique_ptr<GgufFile> GgufFile::from_memory(const void *data, size_t size, const GgufOpenOptions &opts) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  const uint8_t *p = static_cast<const uint8_t *>(data);
  f->copy_.assign(p, p + size);
  f->base_ = f->copy_.data();
  f->size_ = size;
  f->parse();
  for (const auto &o : opts.overrides) f->apply_override(o);
  return f;
}

void GgufFile::parse() {
  Cursor c(base_, size_);
  MemBudget mem(size_);
  uint32_t magic = c.read<uint32_t>("magic");
  if (magic != 0x46554747u) gguf_fail(GgufErrc::BadMagic, "not a GGUF file (bad magic)");
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) gguf_fail(GgufErrc::BadVersion, strfmt("version %u is not supported (2 or 3)", version_));
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A key/value takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least 8+4+8+4+8.
  if (n_kv > c.remaining() / 13) gguf_fail(GgufErrc::Truncated, strfmt("metadata count %llu cannot fit in the file", (unsigned long long)n_kv));
  if (n_tensors > c.remaining() / 32) gguf_fail(GgufErrc::TooManyTensors, strfmt("tensor count %llu cannot fit in the file", (unsigned long long)n_tensors));

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.read_string("metadata key");
    if (key.empty()) gguf_fail(GgufErrc::BadKey, strfmt("metadata entry %llu has an empty key", (unsigned long long)k));
    // The entry, its index node and the key twice (the entry's and the index's copy).
    mem.charge(sizeof(kv_[0]) + kIndexNodeBytes + 2 * key.size(), 1, key, "the entry");
    uint32_t t = c.read<uint32_t>(key.c_str());
    if (!valid_value_type(t)) gguf_fail(GgufErrc::BadValueType, strfmt("key '%s': unknown value type %u", key.c_str(), t));
    GgufValue v = read_value(c, static_cast<GgufType>(t), key, 0, mem);
    if (kv_index_.count(key)) gguf_fail(GgufErrc::DuplicateKey, strfmt("key '%s' appears twice", key.c_str()));
    kv_index_[key] = kv_.size();
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue *a = find("general.alignment")) {
    if (!a->is_integer() || a->type == GgufType::BOOL || a->i <= 0 || (a->i & (a->i - 1)) != 0 || a->i > (1 << 20))
      gguf_fail(GgufErrc::BadAlignment, "key 'general.alignment' must be a power-of-two integer");
    alignment_ = static_cast<size_t>(a->i);
  }

  mem.charge(sizeof(GgufTensorInfo) + kIndexNodeBytes, n_tensors, "(tensor infos)", strfmt("%llu tensor infos", (unsigned long long)n_tensors).c_str());
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    t.name = c.read_string("tensor name");
    const char *nm = t.name.c_str();
    if (t.name.empty()) gguf_fail(GgufErrc::BadKey, strfmt("tensor %llu has an empty name", (unsigned long long)k));
    if (tensor_index_.count(t.name)) gguf_fail(GgufErrc::DuplicateTensor, strfmt("tensor '%s' appears twice", nm));
    mem.charge(2 * t.name.size(), 1, t.name, "the tensor name");
    t.n_dims = c.read<uint32_t>(nm);
    if (t.n_dims == 0 || t.n_dims > 4) gguf_fail(GgufErrc::BadRank, strfmt("tensor '%s': rank %u (must be 1..4)", nm, t.n_dims));
    uint64_t total = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      uint64_t ne = c.read<uint64_t>(nm);
      if (ne == 0 || ne > (uint64_t)std::numeric_limits<int64_t>::max())
        gguf_fail(GgufErrc::BadShape, strfmt("tensor '%s': dimension %u is %llu", nm, d, (unsigned long long)ne));
      if (total > (uint64_t)std::numeric_limits<int64_t>::max() / ne)
        gguf_fail(GgufErrc::ElementOverflow, strfmt("tensor '%s': element count overflows", nm));
      total *= ne;
      t.ne[d] = static_cast<int64_t>(ne);
    }
    uint32_t type = c.read<uint32_t>(nm);
    if (!is_known_dtype(type)) gguf_fail(GgufErrc::UnknownTensorType, strfmt("tensor '%s': unknown type id %u", nm, type));
    t.type = static_cast<DType>(type);
    const TypeTraits &tr = type_traits(t.type);
    if (t.ne[0] % tr.block_size != 0)
      gguf_fail(GgufErrc::BadBlockMultiple, strfmt("tensor '%s': row of %lld elements is not a multiple of the %s block size %lld",
                                                   nm, (long long)t.ne[0], tr.name, (long long)tr.block_size));
    uint64_t blocks = total / static_cast<uint64_t>(tr.block_size);
    if (blocks > std::numeric_limits<uint64_t>::max() / tr.type_size)
      gguf_fail(GgufErrc::ElementOverflow, strfmt("tensor '%s': byte size overflows", nm));
    t.nbytes = static_cast<size_t>(blocks * tr.type_size);
    t.offset = c.read<uint64_t>(nm);
    if (t.offset % alignment_ != 0)
      gguf_fail(GgufErrc::MisalignedTensor, strfmt("tensor '%s': offset %llu is not a multiple of the alignment %zu", nm, (unsigned long long)t.offset, alignment_));
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  size_t pos = c.pos();
  data_offset_ = (pos + alignment_ - 1) / alignment_ * alignment_;
  for (auto &t : tensors_) {
    uint64_t avail = data_offset_ <= size_ ? size_ - data_offset_ : 0;
    if (t.offset > avail || t.nbytes > avail - t.offset)
      gguf_fail(GgufErrc::TensorOutOfBounds, strfmt("tensor '%s': data [%llu, +%zu) runs past the end of the file", t.name.c_str(), (unsigned long long)t.offset, t.nbytes));
    t.data = base_ + data_offset_ + t.offset;
  }
}

const GgufValue *GgufFile::find(const std::string &key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensorInfo *GgufFile::tensor(const std::string &name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

static const GgufValue &need_key(const GgufFile &f, const std::string &key) {
  const GgufValue *v = f.find(key);
  if (!v) gguf_fail(GgufErrc::MissingKey, strfmt("required key '%s' is missing", key.c_str()));
  return *v;
}

uint32_t GgufFile::get_u32(const std::string &key) const {
  const GgufValue &v = need_key(*this, key);
  if (!v.is_integer() || v.type == GgufType::BOOL || v.i < 0 || v.i > (int64_t)UINT32_MAX)
    gguf_fail(GgufErrc::TypeMismatch, strfmt("key '%s' must be a non-negative 32-bit integer (is %s)", key.c_str(), gguf_type_name(v.type)));
  return static_cast<uint32_t>(v.i);
}
uint32_t GgufFile::get_u32(const std::string &key, uint32_t def) const { return has(key) ? get_u32(key) : def; }
int64_t GgufFile::get_i64(const std::string &key) const {
  const GgufValue &v = need_key(*this, key);
  if (!v.is_integer()) gguf_fail(GgufErrc::TypeMismatch, strfmt("key '%s' must be an integer (is %s)", key.c_str(), gguf_type_name(v.type)));
  return v.i;
}
float GgufFile::get_f32(const std::string &key) const {
  const GgufValue &v = need_key(*this, key);
  if (!v.is_float() && !(v.is_integer() && v.type != GgufType::BOOL))
    gguf_fail(GgufErrc::TypeMismatch, strfmt("key '%s' must be a number (is %s)", key.c_str(), gguf_type_name(v.type)));
  return static_cast<float>(v.f);
}
float GgufFile::get_f32(const std::string &key, float def) const { return has(key) ? get_f32(key) : def; }
bool GgufFile::get_bool(const std::string &key, bool def) const {
  const GgufValue *v = find(key);
  if (!v) return def;
  if (!v->is_integer()) gguf_fail(GgufErrc::TypeMismatch, strfmt("key '%s' must be a bool (is %s)", key.c_str(), gguf_type_name(v->type)));
  return v->i != 0;
}
std::string GgufFile::get_str(const std::string &key) const {
  const GgufValue &v = need_key(*this, key);
  if (v.type != GgufType::STRING) gguf_fail(GgufErrc::TypeMismatch, strfmt("key '%s' must be a string (is %s)", key.c_str(), gguf_type_name(v.type)));
  return v.str;
}
std::string GgufFile::get_str(const std::string &key, const std::string &def) const { return has(key) ? get_str(key) : def; }

void GgufFile::set_value(const std::string &key, GgufValue v) {
  auto it = kv_index_.find(key);
  if (it != kv_index_.end()) {
    kv_[it->second].second = std::move(v);
  } else {
    kv_index_[key] = kv_.size();
    kv_.emplace_back(key, std::move(v));
  }
}

void GgufFile::apply_override(const std::string &spec) {
  size_t eq = spec.find('=');
  size_t colon = eq == std::string::npos ? eq : spec.find(':', eq);
  if (eq == 0 || eq == std::string::npos || colon == std::string::npos)
    gguf_fail(GgufErrc::BadOverride, strfmt("override '%s' is not key=type:value", spec.c_str()));
  std::string key = spec.substr(0, eq), tname = spec.substr(eq + 1, colon - eq - 1), val = spec.substr(colon + 1);
  GgufType t;
  if (!gguf_type_from_name(tname, &t))
    gguf_fail(GgufErrc::BadOverride, strfmt("override '%s': unknown type '%s' (int, float, bool, str)", spec.c_str(), tname.c_str()));
  GgufValue v;
  v.type = t;
  errno = 0;
  char *end = nullptr;
  switch (t) {
    case GgufType::STRING: v.str = val; break;
    case GgufType::BOOL:
      if (val == "true" || val == "1") v.i = v.u = 1;
      else if (val == "false" || val == "0") v.i = v.u = 0;
      else gguf_fail(GgufErrc::BadOverride, strfmt("override '%s': '%s' is not a bool", spec.c_str(), val.c_str()));
      v.f = static_cast<double>(v.i);
      break;
    case GgufType::F32: case GgufType::F64:
      v.f = std::strtod(val.c_str(), &end);
      if (val.empty() || *end || errno || !std::isfinite(v.f))
        gguf_fail(GgufErrc::BadOverride, strfmt("override '%s': '%s' is not a finite number", spec.c_str(), val.c_str()));
      break;
    default:
      v.i = std::strtoll(val.c_str(), &end, 10);
      if (val.empty() || *end || errno)
        gguf_fail(GgufErrc::BadOverride, strfmt("override '%s': '%s' is not an integer", spec.c_str(), val.c_str()));
      v.u = static_cast<uint64_t>(v.i);
      v.f = static_cast<double>(v.i);
      break;
  }
  // Keep the stored type of an existing key when the new value is compatible, so typed
  // getters keep working (an "int" override of a u32 key stays a u32).
  if (const GgufValue *old = find(key)) {
    if (old->is_integer() && v.is_integer() && old->type != GgufType::BOOL && v.type != GgufType::BOOL) v.type = old->type;
    if (old->is_float() && v.is_float()) v.type = old->type;
  }
  set_value(key, std::move(v));
}

}  // namespace moe
