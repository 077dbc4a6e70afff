// Values of the chat-template interpreter: the Python/Jinja data model reduced to what chat
// templates use (undefined, none, bool, int, float, str, list, dict, namespace, callable).
// Lists and dicts are shared by reference, as in Python; dicts keep insertion order, which
// tojson and items() expose.
//
//   Value msg = Value::object();
//   msg.set("role", Value("user"));
//   std::string s = to_json(msg, -1);   // {"role": "user"}
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace moe::jinja {

struct Value;
struct CallArgs;
using Array = std::vector<Value>;
struct Object;
using Function = std::function<Value(CallArgs &)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Function };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<jinja::Array> arr;
  std::shared_ptr<jinja::Object> obj;
  std::shared_ptr<Function> fn;

  Value() = default;
  explicit Value(bool v) : kind(Kind::Bool), b(v) {}
  explicit Value(int64_t v) : kind(Kind::Int), i(v) {}
  explicit Value(double v) : kind(Kind::Float), f(v) {}
  explicit Value(std::string v) : kind(Kind::String), s(std::move(v)) {}
  explicit Value(const char *v) : kind(Kind::String), s(v) {}
  static Value none();
  static Value array(jinja::Array items = {});
  static Value object();
  static Value namespace_object();
  static Value function(Function f);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_object() const { return kind == Kind::Object; }
  bool is_namespace() const;
  double as_double() const { return kind == Kind::Float ? f : static_cast<double>(kind == Kind::Bool ? b : i); }

  // Dict access (object kinds only). get() returns undefined for a missing key.
  Value get(const std::string &key) const;
  bool has(const std::string &key) const;
  void set(const std::string &key, Value v);
  void push(Value v) { arr->push_back(std::move(v)); }
};

struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // Positional index or keyword name; undefined when absent.
  Value get(size_t index, const char *name) const;
};

const char *kind_name(Value::Kind k);
bool truthy(const Value &v);
bool equals(const Value &a, const Value &b);
// Python str(): "None", "True", 1, 0.5, ['a'], {'k': 1}; undefined is "".
std::string to_str(const Value &v);
// Python repr of a float (shortest round trip, ".0" for integral values).
std::string float_repr(double d);
// json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: one line, ", " / ": ").
std::string to_json(const Value &v, int indent);
// Parses JSON text (RFC 8259) into a Value; throws moe::Error(InvalidArgument) naming the offset.
Value parse_json(const std::string &text, const char *what);
// Code point count of UTF-8 text (Python len of str).
size_t utf8_length(const std::string &s);

}  // namespace moe::jinja
