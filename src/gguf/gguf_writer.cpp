#include "gguf/gguf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "core/status.h"
#include "gguf/gguf_reader.h"

namespace moe {

template <typename T> static void put(std::vector<uint8_t> &out, T v) {
  const uint8_t *p = reinterpret_cast<const uint8_t *>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

void gguf_append_string(std::vector<uint8_t> &out, const std::string &s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

static void append_payload(std::vector<uint8_t> &out, const GgufValue &v) {
  switch (v.type) {
    case GgufType::U8: case GgufType::BOOL: put<uint8_t>(out, static_cast<uint8_t>(v.u)); break;
    case GgufType::I8: put<int8_t>(out, static_cast<int8_t>(v.i)); break;
    case GgufType::U16: put<uint16_t>(out, static_cast<uint16_t>(v.u)); break;
    case GgufType::I16: put<int16_t>(out, static_cast<int16_t>(v.i)); break;
    case GgufType::U32: put<uint32_t>(out, static_cast<uint32_t>(v.u)); break;
    case GgufType::I32: put<int32_t>(out, static_cast<int32_t>(v.i)); break;
    case GgufType::U64: put<uint64_t>(out, v.u); break;
    case GgufType::I64: put<int64_t>(out, v.i); break;
    case GgufType::F32: put<float>(out, static_cast<float>(v.f)); break;
    case GgufType::F64: put<double>(out, v.f); break;
    case GgufType::STRING: gguf_append_string(out, v.str); break;
    case GgufType::ARRAY:
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, v.count);
      if (v.elem_type == GgufType::STRING) {
        for (const auto &s : v.strs) gguf_append_string(out, s);
      } else if (v.elem_type == GgufType::ARRAY) {
        for (const auto &a : v.arrays) append_payload(out, a);
      } else {
        out.insert(out.end(), v.raw.begin(), v.raw.end());
      }
      break;
  }
}

void gguf_append_value(std::vector<uint8_t> &out, const GgufValue &v) {
  put<uint32_t>(out, static_cast<uint32_t>(v.type));
  append_payload(out, v);
}

void GgufWriter::set(const std::string &key, GgufValue v) {
  for (auto &kv : kv_)
    if (kv.first == key) { kv.second = std::move(v); return; }
  kv_.emplace_back(key, std::move(v));
}

static size_t tensor_bytes(const std::string &name, DType type, const std::vector<int64_t> &ne) {
  if (ne.empty() || ne.size() > 4) fail(Status::InvalidArgument, "tensor '%s': rank %zu", name.c_str(), ne.size());
  const TypeTraits &tr = type_traits(type);
  if (ne[0] % tr.block_size) fail(Status::InvalidArgument, "tensor '%s': row %lld not a multiple of %lld", name.c_str(), (long long)ne[0], (long long)tr.block_size);
  size_t n = 1;
  for (int64_t d : ne) n *= static_cast<size_t>(d);
  return n / static_cast<size_t>(tr.block_size) * tr.type_size;
}

void GgufWriter::add_tensor(const std::string &name, DType type, std::vector<int64_t> ne, const void *data, size_t nbytes) {
  size_t want = tensor_bytes(name, type, ne);
  if (nbytes != want) fail(Status::InvalidArgument, "tensor '%s': %zu bytes given, shape needs %zu", name.c_str(), nbytes, want);
  Tensor t{name, type, std::move(ne), nbytes, {}, nullptr};
  const uint8_t *p = static_cast<const uint8_t *>(data);
  t.data.assign(p, p + nbytes);
  data_size_ += padded(nbytes);
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor_streamed(const std::string &name, DType type, std::vector<int64_t> ne, FillFn fill) {
  size_t nbytes = tensor_bytes(name, type, ne);
  Tensor t{name, type, std::move(ne), nbytes, {}, std::move(fill)};
  data_size_ += padded(nbytes);
  tensors_.push_back(std::move(t));
}

std::vector<const GgufWriter::Tensor *> GgufWriter::all_tensors() const {
  std::vector<const Tensor *> ts;
  for (const Tensor &t : tensors_) ts.push_back(&t);
  return ts;
}

std::vector<uint8_t> GgufWriter::header(const Metadata &kv, const std::vector<const Tensor *> &ts) const {
  std::vector<uint8_t> head;
  put<uint32_t>(head, 0x46554747u);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, ts.size());
  bool has_align = false;
  for (auto &e : kv) has_align |= e.first == "general.alignment";
  put<uint64_t>(head, kv.size() + ((alignment_ != 32 && !has_align) ? 1 : 0));
  for (auto &e : kv) {
    gguf_append_string(head, e.first);
    gguf_append_value(head, e.second);
  }
  if (alignment_ != 32 && !has_align) {
    gguf_append_string(head, "general.alignment");
    gguf_append_value(head, GgufValue::make_u32(alignment_));
  }
  uint64_t offset = 0;
  for (const Tensor *t : ts) {
    gguf_append_string(head, t->name);
    put<uint32_t>(head, static_cast<uint32_t>(t->ne.size()));
    for (int64_t d : t->ne) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, static_cast<uint32_t>(t->type));
    put<uint64_t>(head, offset);
    offset += padded(t->nbytes);
  }
  head.resize((head.size() + alignment_ - 1) / alignment_ * alignment_, 0);
  return head;
}

void GgufWriter::write_to(const Sink &sink, const Metadata &kv, const std::vector<const Tensor *> &ts, const ProgressFn &progress, uint64_t &done,
                          uint64_t total) const {
  std::vector<uint8_t> head = header(kv, ts);
  sink(head.data(), head.size());
  std::vector<uint8_t> chunk;
  const size_t kChunk = 8u << 20;
  for (const Tensor *t : ts) {
    if (t->fill) {
      for (size_t off = 0; off < t->nbytes; off += kChunk) {
        size_t n = std::min(kChunk, t->nbytes - off);
        chunk.assign(n, 0);
        t->fill(chunk.data(), off, n);
        sink(chunk.data(), n);
        done += n;
        if (progress && !progress(done, total)) fail(Status::Aborted, "GGUF write cancelled");
      }
    } else {
      sink(t->data.data(), t->nbytes);
      done += t->nbytes;
    }
    size_t pad = padded(t->nbytes) - t->nbytes;
    static const uint8_t zeros[256] = {0};
    while (pad) { size_t k = std::min(pad, sizeof zeros); sink(zeros, k); pad -= k; done += k; }
    if (progress && !progress(done, total)) fail(Status::Aborted, "GGUF write cancelled");
  }
}

uint64_t GgufWriter::total_bytes() const {
  return header(kv_, all_tensors()).size() + data_size_;
}

std::vector<uint8_t> GgufWriter::write_memory() const {
  std::vector<uint8_t> out;
  uint64_t done = 0;
  write_to([&](const void *p, size_t n) { const uint8_t *b = static_cast<const uint8_t *>(p); out.insert(out.end(), b, b + n); }, kv_, all_tensors(),
           nullptr, done, data_size_);
  return out;
}

void GgufWriter::write_one(const std::string &path, const Metadata &kv, const std::vector<const Tensor *> &ts, const ProgressFn &progress,
                           uint64_t &done) const {
  std::FILE *f = std::fopen(path.c_str(), "wb");
  if (!f) fail(Status::IoError, "cannot create '%s': %s", path.c_str(), std::strerror(errno));
  try {
    write_to([&](const void *p, size_t n) {
      if (std::fwrite(p, 1, n, f) != n) fail(Status::IoError, "write to '%s' failed: %s", path.c_str(), std::strerror(errno));
    }, kv, ts, progress, done, data_size_);
  } catch (...) {
    std::fclose(f);
    std::remove(path.c_str());
    throw;
  }
  if (std::fclose(f) != 0) fail(Status::IoError, "closing '%s' failed", path.c_str());
}

void GgufWriter::write_file(const std::string &path, const ProgressFn &progress) const {
  uint64_t done = 0;
  write_one(path, kv_, all_tensors(), progress, done);
}

std::vector<std::string> GgufWriter::write_split(const std::string &prefix, uint64_t max_part_bytes, const ProgressFn &progress) const {
  if (max_part_bytes == 0) fail(Status::InvalidArgument, "split GGUF: the maximum part size must be above 0");
  std::vector<std::vector<const Tensor *>> parts(1);
  uint64_t part_bytes = 0;
  for (const Tensor &t : tensors_) {
    if (!parts.back().empty() && part_bytes + padded(t.nbytes) > max_part_bytes) {
      parts.emplace_back();
      part_bytes = 0;
    }
    parts.back().push_back(&t);
    part_bytes += padded(t.nbytes);
  }
  const size_t n = parts.size();
  if (n > 65535) fail(Status::InvalidArgument, "split GGUF: %zu parts (at most 65535: the split keys are 16-bit)", n);
  if (tensors_.size() > INT32_MAX) fail(Status::InvalidArgument, "split GGUF: too many tensors");
  auto split_keys = [&](size_t i) {
    return Metadata{{kGgufSplitNo, GgufValue::make_u16(static_cast<uint16_t>(i))},
                    {kGgufSplitCount, GgufValue::make_u16(static_cast<uint16_t>(n))},
                    {kGgufSplitTensorsCount, GgufValue::make_i32(static_cast<int32_t>(tensors_.size()))}};
  };
  std::vector<std::string> paths;
  uint64_t done = 0;
  try {
    for (size_t i = 0; i < n; ++i) {
      Metadata kv = split_keys(i);
      if (i == 0) {
        for (const auto &e : kv_)
          if (e.first.compare(0, 6, "split.") != 0) kv.push_back(e);
        std::rotate(kv.begin(), kv.begin() + 3, kv.end());  // the model's own keys first, as in a single file
      }
      paths.push_back(gguf_split_path(prefix, static_cast<int>(i), static_cast<int>(n)));
      write_one(paths.back(), kv, parts[i], progress, done);
    }
  } catch (...) {
    for (size_t i = 0; i + 1 < paths.size(); ++i) std::remove(paths[i].c_str());  // the failed one removed itself
    throw;
  }
  return paths;
}

}  // namespace moe
