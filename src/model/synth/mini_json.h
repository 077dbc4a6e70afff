// Minimal JSON DOM parser, enough for Hugging Face tokenizer.json files (objects, arrays,
// strings with \u escapes and surrogate pairs, numbers, true/false/null). The library has
// no JSON dependency, and only the synthetic-model generator needs to read one.
//
//   JsonValue root = parse_json(text);          // throws Error(InvalidArgument, "...at byte N")
//   const JsonValue *vocab = root.get("model") ? root.get("model")->get("vocab") : nullptr;
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moe {

struct JsonValue {
  enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<JsonValue> items;                         // Array
  std::vector<std::pair<std::string, JsonValue>> members;  // Object, in file order

  const JsonValue *get(const std::string &key) const;  // Object member or nullptr
  bool is(Kind k) const { return kind == k; }
};

JsonValue parse_json(const std::string &text);

}  // namespace moe
