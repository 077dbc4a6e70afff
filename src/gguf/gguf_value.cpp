#include "gguf/gguf_value.h"

#include <cstring>

namespace moe {

const char *gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "str";
    case GgufType::ARRAY: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "?";
}

bool gguf_type_from_name(const std::string &n, GgufType *out) {
  struct { const char *name; GgufType t; } table[] = {
      {"int", GgufType::I64}, {"float", GgufType::F64}, {"bool", GgufType::BOOL},
      {"str", GgufType::STRING}, {"u8", GgufType::U8}, {"i8", GgufType::I8},
      {"u16", GgufType::U16}, {"i16", GgufType::I16}, {"u32", GgufType::U32},
      {"i32", GgufType::I32}, {"f32", GgufType::F32}, {"u64", GgufType::U64},
      {"i64", GgufType::I64}, {"f64", GgufType::F64}};
  for (auto &e : table)
    if (n == e.name) { *out = e.t; return true; }
  return false;
}

size_t gguf_scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    default: return 0;
  }
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
    case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64:
    case GgufType::BOOL: return true;
    default: return false;
  }
}

template <typename T> static T load(const uint8_t *p) { T v; std::memcpy(&v, p, sizeof v); return v; }

int64_t GgufValue::elem_i64(uint64_t k) const {
  const uint8_t *p = raw.data() + k * gguf_scalar_size(elem_type);
  switch (elem_type) {
    case GgufType::U8: case GgufType::BOOL: return load<uint8_t>(p);
    case GgufType::I8: return load<int8_t>(p);
    case GgufType::U16: return load<uint16_t>(p);
    case GgufType::I16: return load<int16_t>(p);
    case GgufType::U32: return load<uint32_t>(p);
    case GgufType::I32: return load<int32_t>(p);
    case GgufType::U64: return static_cast<int64_t>(load<uint64_t>(p));
    case GgufType::I64: return load<int64_t>(p);
    case GgufType::F32: return static_cast<int64_t>(load<float>(p));
    case GgufType::F64: return static_cast<int64_t>(load<double>(p));
    default: return 0;
  }
}

double GgufValue::elem_f64(uint64_t k) const {
  const uint8_t *p = raw.data() + k * gguf_scalar_size(elem_type);
  if (elem_type == GgufType::F32) return load<float>(p);
  if (elem_type == GgufType::F64) return load<double>(p);
  return static_cast<double>(elem_i64(k));
}

GgufValue GgufValue::make_u16(uint16_t v) { GgufValue x; x.type = GgufType::U16; x.u = v; x.i = v; x.f = v; return x; }
GgufValue GgufValue::make_u32(uint32_t v) { GgufValue x; x.type = GgufType::U32; x.u = v; x.i = v; x.f = v; return x; }
GgufValue GgufValue::make_i32(int32_t v) { GgufValue x; x.type = GgufType::I32; x.i = v; x.u = static_cast<uint64_t>(v); x.f = v; return x; }
GgufValue GgufValue::make_u64(uint64_t v) { GgufValue x; x.type = GgufType::U64; x.u = v; x.i = static_cast<int64_t>(v); x.f = static_cast<double>(v); return x; }
GgufValue GgufValue::make_f32(float v) { GgufValue x; x.type = GgufType::F32; x.f = v; return x; }
GgufValue GgufValue::make_bool(bool v) { GgufValue x; x.type = GgufType::BOOL; x.u = v; x.i = v; return x; }
GgufValue GgufValue::make_str(std::string v) { GgufValue x; x.type = GgufType::STRING; x.str = std::move(v); return x; }
GgufValue GgufValue::make_str_array(std::vector<std::string> v) {
  GgufValue x; x.type = GgufType::ARRAY; x.elem_type = GgufType::STRING; x.count = v.size(); x.strs = std::move(v); return x;
}
GgufValue GgufValue::make_array_of(GgufType elem, const void *data, uint64_t n) {
  GgufValue x; x.type = GgufType::ARRAY; x.elem_type = elem; x.count = n;
  const uint8_t *p = static_cast<const uint8_t *>(data);
  x.raw.assign(p, p + n * gguf_scalar_size(elem));
  return x;
}
GgufValue GgufValue::make_i32_array(const std::vector<int32_t> &v) { return make_array_of(GgufType::I32, v.data(), v.size()); }
GgufValue GgufValue::make_f32_array(const std::vector<float> &v) { return make_array_of(GgufType::F32, v.data(), v.size()); }

}  // namespace moe
