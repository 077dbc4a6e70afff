// GGUF metadata values: every value type of GGUF v2/v3, including nested arrays.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moe {

enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char *gguf_type_name(GgufType t);
bool gguf_type_from_name(const std::string &name, GgufType *out);  // "int", "u32", "float", "bool", "str"...
size_t gguf_scalar_size(GgufType t);  // 0 for STRING/ARRAY

struct GgufValue {
  GgufType type = GgufType::U8;
  // Scalars: integers in i (signed) / u (unsigned) — both filled; floats in f; bools in u.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string str;                 // STRING
  GgufType elem_type = GgufType::U8;  // ARRAY: element type
  std::vector<std::string> strs;   // ARRAY of STRING
  std::vector<uint8_t> raw;        // ARRAY of numeric/bool: packed little-endian elements
  std::vector<GgufValue> arrays;   // ARRAY of ARRAY (nested)
  uint64_t count = 0;              // ARRAY: number of elements

  bool is_array() const { return type == GgufType::ARRAY; }
  bool is_integer() const;
  bool is_float() const { return type == GgufType::F32 || type == GgufType::F64; }
  // Numeric element access for arrays of numbers/bools (no bounds check; callers validate).
  int64_t elem_i64(uint64_t k) const;
  double elem_f64(uint64_t k) const;

  static GgufValue make_u16(uint16_t v);
  static GgufValue make_u32(uint32_t v);
  static GgufValue make_i32(int32_t v);
  static GgufValue make_u64(uint64_t v);
  static GgufValue make_f32(float v);
  static GgufValue make_bool(bool v);
  static GgufValue make_str(std::string v);
  static GgufValue make_str_array(std::vector<std::string> v);
  static GgufValue make_i32_array(const std::vector<int32_t> &v);
  static GgufValue make_f32_array(const std::vector<float> &v);
  static GgufValue make_array_of(GgufType elem, const void *data, uint64_t n);  // numeric
};

}  // namespace moe
