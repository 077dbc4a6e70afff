#include "chat/jinja_value.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/status.h"

namespace moe::jinja {

Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::array(jinja::Array items) {
  Value v;
  v.kind = Kind::Array;
  v.arr = std::make_shared<jinja::Array>(std::move(items));
  return v;
}
Value Value::object() {
  Value v;
  v.kind = Kind::Object;
  v.obj = std::make_shared<jinja::Object>();
  return v;
}
Value Value::namespace_object() {
  Value v = object();
  v.obj->is_namespace = true;
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.kind = Kind::Function;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}
bool Value::is_namespace() const { return kind == Kind::Object && obj->is_namespace; }

Value Value::get(const std::string &key) const {
  if (kind != Kind::Object) return Value();
  for (const auto &kv : obj->items)
    if (kv.first == key) return kv.second;
  return Value();
}
bool Value::has(const std::string &key) const {
  if (kind != Kind::Object) return false;
  for (const auto &kv : obj->items)
    if (kv.first == key) return true;
  return false;
}
void Value::set(const std::string &key, Value v) {
  for (auto &kv : obj->items)
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  obj->items.emplace_back(key, std::move(v));
}

Value CallArgs::get(size_t index, const char *name) const {
  for (const auto &kv : kwargs)
    if (name && kv.first == name) return kv.second;
  return index < args.size() ? args[index] : Value();
}

const char *kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::Undefined: return "undefined";
    case Value::Kind::None: return "none";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "string";
    case Value::Kind::Array: return "list";
    case Value::Kind::Object: return "dict";
    case Value::Kind::Function: return "function";
  }
  return "?";
}

bool truthy(const Value &v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.b;
    case Value::Kind::Int: return v.i != 0;
    case Value::Kind::Float: return v.f != 0;
    case Value::Kind::String: return !v.s.empty();
    case Value::Kind::Array: return !v.arr->empty();
    case Value::Kind::Object: return v.obj->is_namespace || !v.obj->items.empty();
    case Value::Kind::Function: return true;
  }
  return false;
}

bool equals(const Value &a, const Value &b) {
  const bool an = a.is_number() || a.kind == Value::Kind::Bool, bn = b.is_number() || b.kind == Value::Kind::Bool;
  if (an && bn) return a.as_double() == b.as_double();
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.s == b.s;
    case Value::Kind::Array:
      if (a.arr->size() != b.arr->size()) return false;
      for (size_t k = 0; k < a.arr->size(); ++k)
        if (!equals((*a.arr)[k], (*b.arr)[k])) return false;
      return true;
    case Value::Kind::Object:
      if (a.obj->items.size() != b.obj->items.size()) return false;
      for (const auto &kv : a.obj->items)
        if (!b.has(kv.first) || !equals(kv.second, b.get(kv.first))) return false;
      return true;
    default: return a.fn == b.fn;
  }
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

static std::string repr(const Value &v, int depth = 0);

std::string to_str(const Value &v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.b ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return float_repr(v.f);
    case Value::Kind::String: return v.s;
    default: return repr(v);
  }
}

static std::string repr(const Value &v, int depth) {
  if (depth > 256) throw Error(Status::InvalidArgument, "value nested more than 256 levels (a cycle?)");
  if (v.is_string()) {
    std::string out = "'";
    for (char c : v.s) out += (c == '\'' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    return out + "'";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t k = 0; k < v.arr->size(); ++k) out += (k ? ", " : "") + repr((*v.arr)[k], depth + 1);
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    for (size_t k = 0; k < v.obj->items.size(); ++k)
      out += (k ? ", " : "") + repr(Value(v.obj->items[k].first), depth + 1) + ": " + repr(v.obj->items[k].second, depth + 1);
    return out + "}";
  }
  return to_str(v);
}

static void json_string(const std::string &s, std::string &out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

static void json_write(const Value &v, int indent, int depth, std::string &out) {
  if (depth > 256) throw Error(Status::InvalidArgument, "tojson: value nested more than 256 levels (a cycle?)");
  const std::string nl = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const std::string nl_end = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const char *sep = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.i); return;
    case Value::Kind::Float: {
      const std::string r = float_repr(v.f);
      out += r == "nan" ? "NaN" : r == "inf" ? "Infinity" : r == "-inf" ? "-Infinity" : r;
      return;
    }
    case Value::Kind::String: json_string(v.s, out); return;
    case Value::Kind::Array:
      if (v.arr->empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t k = 0; k < v.arr->size(); ++k) {
        out += k ? sep : "";
        out += nl;
        json_write((*v.arr)[k], indent, depth + 1, out);
      }
      out += nl_end + "]";
      return;
    case Value::Kind::Object:
      if (v.obj->items.empty()) {
        out += "{}";
        return;
      }
      out += "{";
      for (size_t k = 0; k < v.obj->items.size(); ++k) {
        out += k ? sep : "";
        out += nl;
        json_string(v.obj->items[k].first, out);
        out += ": ";
        json_write(v.obj->items[k].second, indent, depth + 1, out);
      }
      out += nl_end + "}";
      return;
    case Value::Kind::Function: throw Error(Status::InvalidArgument, "tojson: a function is not JSON serializable");
  }
}

std::string to_json(const Value &v, int indent) {
  std::string out;
  json_write(v, indent, 0, out);
  return out;
}

size_t utf8_length(const std::string &s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

namespace {

class JsonReader {
public:
  JsonReader(const std::string &t, const char *what) : t_(t), what_(what) {}
  Value document() {
    Value v = value(0);
    ws();
    if (p_ != t_.size()) fail("trailing characters");
    return v;
  }

private:
  const std::string &t_;
  const char *what_;
  size_t p_ = 0;

  [[noreturn]] void fail(const char *why) const {
    throw Error(Status::InvalidArgument, strfmt("%s: invalid JSON at byte %zu: %s", what_, p_, why));
  }
  void ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\n' || t_[p_] == '\r' || t_[p_] == '\t')) ++p_;
  }
  bool eat(const char *lit) {
    const size_t n = std::char_traits<char>::length(lit);
    if (t_.compare(p_, n, lit) != 0) return false;
    p_ += n;
    return true;
  }
  Value value(int depth) {
    if (depth > 128) fail("nested too deeply");
    ws();
    if (p_ >= t_.size()) fail("unexpected end");
    const char c = t_[p_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Value(string());
    if (eat("true")) return Value(true);
    if (eat("false")) return Value(false);
    if (eat("null")) return Value::none();
    return number();
  }
  Value object(int depth) {
    Value o = Value::object();
    ++p_;
    ws();
    if (eat("}")) return o;
    for (;;) {
      ws();
      if (p_ >= t_.size() || t_[p_] != '"') fail("expected a key string");
      std::string key = string();
      ws();
      if (!eat(":")) fail("expected ':'");
      o.set(key, value(depth + 1));
      ws();
      if (eat("}")) return o;
      if (!eat(",")) fail("expected ',' or '}'");
    }
  }
  Value array(int depth) {
    Value a = Value::array();
    ++p_;
    ws();
    if (eat("]")) return a;
    for (;;) {
      a.push(value(depth + 1));
      ws();
      if (eat("]")) return a;
      if (!eat(",")) fail("expected ',' or ']'");
    }
  }
  void put_utf8(uint32_t cp, std::string &out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  uint32_t hex4() {
    if (p_ + 4 > t_.size()) fail("short \\u escape");
    uint32_t cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = t_[p_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') cp |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f') cp |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') cp |= static_cast<uint32_t>(h - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return cp;
  }
  std::string string() {
    std::string out;
    ++p_;
    for (;;) {
      if (p_ >= t_.size()) fail("unterminated string");
      const char c = t_[p_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ >= t_.size()) fail("unterminated escape");
      const char e = t_[p_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && eat("\\u")) {
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(cp, out);
          break;
        }
        default: fail("unknown escape");
      }
    }
  }
  Value number() {
    const size_t start = p_;
    if (p_ < t_.size() && t_[p_] == '-') ++p_;
    bool is_float = false;
    while (p_ < t_.size()) {
      const char c = t_[p_];
      if (c == '.' || c == 'e' || c == 'E' || c == '+' || (c == '-' && p_ > start)) is_float = true;
      else if (c < '0' || c > '9') break;
      ++p_;
    }
    const std::string num = t_.substr(start, p_ - start);
    if (num.empty() || num == "-") fail("unexpected character");
    if (is_float) return Value(std::strtod(num.c_str(), nullptr));
    return Value(static_cast<int64_t>(std::strtoll(num.c_str(), nullptr, 10)));
  }
};

}  // namespace

Value parse_json(const std::string &text, const char *what) { return JsonReader(text, what).document(); }

}  // namespace moe::jinja
