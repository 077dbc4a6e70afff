// Filters, tests and methods of the chat-template interpreter: the subset of Jinja's and
// Python's that real chat templates use, with Python semantics (str.split, str.strip,
// json.dumps separators). Anything else returns false so the caller reports "unsupported".
#include <algorithm>
#include <cctype>
#include <cstring>
#include <climits>
#include <cmath>

#include "chat/jinja_eval.h"
#include "core/status.h"

namespace moe::jinja {
namespace {

[[noreturn]] void bad(const std::string &why) { throw Error(Status::InvalidArgument, why); }

const char *const kWhitespace = " \t\n\r\v\f";

std::string strip(const std::string &s, const Value &chars, bool left, bool right) {
  const std::string set = chars.is_string() ? chars.s : kWhitespace;
  size_t b = 0, e = s.size();
  if (left) while (b < e && set.find(s[b]) != std::string::npos) ++b;
  if (right) while (e > b && set.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

std::string map_ascii(std::string s, int (*f)(int)) {
  for (char &c : s)
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(f(static_cast<unsigned char>(c)));
  return s;
}

std::string capitalize(const std::string &s) {
  std::string out = map_ascii(s, [](int c) { return std::tolower(c); });
  if (!out.empty() && static_cast<unsigned char>(out[0]) < 0x80) out[0] = static_cast<char>(std::toupper(out[0]));
  return out;
}

std::string title(const std::string &s) {
  std::string out = s;
  bool start = true;
  for (char &c : out) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x80) {
      start = false;
      continue;
    }
    c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
    start = !std::isalpha(u);
  }
  return out;
}

Value split(const std::string &s, const Value &sep, const Value &maxsplit) {
  Value out = Value::array();
  int64_t left = maxsplit.kind == Value::Kind::Int ? maxsplit.i : -1;
  if (!sep.is_string() || sep.is_none()) {  // whitespace split, empty pieces dropped
    size_t k = 0;
    while (k < s.size()) {
      while (k < s.size() && std::strchr(kWhitespace, s[k]) && s[k]) ++k;
      if (k >= s.size()) break;
      if (left == 0) {
        out.push(Value(strip(s.substr(k), Value(), false, true)));
        break;
      }
      size_t e = k;
      while (e < s.size() && !(std::strchr(kWhitespace, s[e]) && s[e])) ++e;
      out.push(Value(s.substr(k, e - k)));
      --left;
      k = e;
    }
    return out;
  }
  if (sep.s.empty()) bad("split: empty separator");
  size_t k = 0;
  for (;;) {
    const size_t at = left == 0 ? std::string::npos : s.find(sep.s, k);
    if (at == std::string::npos) {
      out.push(Value(s.substr(k)));
      return out;
    }
    out.push(Value(s.substr(k, at - k)));
    k = at + sep.s.size();
    --left;
  }
}

std::string replace(const std::string &s, const Value &from, const Value &to, const Value &count) {
  if (!from.is_string() || !to.is_string()) bad("replace: arguments must be strings");
  int64_t left = count.kind == Value::Kind::Int ? count.i : -1;
  if (from.s.empty()) bad("replace: empty search string");
  std::string out;
  size_t k = 0;
  for (;;) {
    const size_t at = left == 0 ? std::string::npos : s.find(from.s, k);
    if (at == std::string::npos) return out + s.substr(k);
    out += s.substr(k, at - k) + to.s;
    k = at + from.s.size();
    --left;
  }
}

Value items_of(const Value &v) {
  if (!v.is_object()) bad(strfmt("items: expected a dict, got %s", kind_name(v.kind)));
  Value out = Value::array();
  for (const auto &kv : v.obj->items) out.push(Value::array({Value(kv.first), kv.second}));
  return out;
}

std::vector<Value> as_list(const Value &v, const char *what) {
  if (v.is_array()) return *v.arr;
  std::vector<Value> out;
  if (v.is_object()) {
    for (const auto &kv : v.obj->items) out.emplace_back(kv.first);
    return out;
  }
  if (v.is_string()) {
    for (size_t k = 0; k < v.s.size();) {
      const unsigned char c = static_cast<unsigned char>(v.s[k]);
      const size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      out.emplace_back(v.s.substr(k, n));
      k += n;
    }
    return out;
  }
  if (v.is_undefined()) return out;
  bad(strfmt("%s: expected a sequence, got %s", what, kind_name(v.kind)));
}

// Attribute path "a.b" of an item, as map/selectattr read it.
Value attr_path(const Value &item, const std::string &path) {
  Value cur = item;
  size_t k = 0;
  while (k <= path.size()) {
    const size_t dot = path.find('.', k);
    const std::string part = path.substr(k, dot == std::string::npos ? std::string::npos : dot - k);
    cur = cur.get(part);
    if (dot == std::string::npos) break;
    k = dot + 1;
  }
  return cur;
}

bool select_pass(const Value &item, const Value &test, CallArgs &args, size_t first_extra) {
  if (!test.is_string()) return truthy(item);
  CallArgs targs;
  for (size_t k = first_extra; k < args.args.size(); ++k) targs.args.push_back(args.args[k]);
  bool out = false;
  if (!apply_test(test.s, item, targs, out)) throw Error(Status::Unsupported, "unsupported test '" + test.s + "'");
  return out;
}

}  // namespace

bool apply_filter(const std::string &name, const Value &in, CallArgs &a, Value &out) {
  if (name == "safe") {
    out = in;
  } else if (name == "string") {
    out = Value(to_str(in));
  } else if (name == "trim") {
    out = Value(strip(to_str(in), a.get(0, "chars"), true, true));
  } else if (name == "upper" || name == "lower") {
    out = Value(map_ascii(to_str(in), name == "upper" ? [](int c) { return std::toupper(c); } : [](int c) { return std::tolower(c); }));
  } else if (name == "capitalize") {
    out = Value(capitalize(to_str(in)));
  } else if (name == "title") {
    out = Value(title(to_str(in)));
  } else if (name == "replace") {
    out = Value(replace(to_str(in), a.get(0, "old"), a.get(1, "new"), a.get(2, "count")));
  } else if (name == "length" || name == "count") {
    if (in.is_string()) out = Value(static_cast<int64_t>(utf8_length(in.s)));
    else if (in.is_array()) out = Value(static_cast<int64_t>(in.arr->size()));
    else if (in.is_object()) out = Value(static_cast<int64_t>(in.obj->items.size()));
    else if (in.is_undefined()) out = Value(int64_t{0});
    else bad(strfmt("length: a %s has no length", kind_name(in.kind)));
  } else if (name == "tojson") {
    const Value indent = a.get(0, "indent");
    for (const auto &kv : a.kwargs)
      if (kv.first != "indent" && kv.first != "ensure_ascii" && kv.first != "sort_keys" && kv.first != "separators")
        bad("tojson: unknown argument '" + kv.first + "'");
    if (truthy(a.get(99, "sort_keys"))) throw Error(Status::Unsupported, "unsupported tojson(sort_keys=true)");
    if (!a.get(99, "separators").is_undefined()) throw Error(Status::Unsupported, "unsupported tojson(separators=...)");
    if (truthy(a.get(99, "ensure_ascii"))) throw Error(Status::Unsupported, "unsupported tojson(ensure_ascii=true)");
    out = Value(to_json(in, indent.kind == Value::Kind::Int ? static_cast<int>(indent.i) : -1));
  } else if (name == "items") {
    out = items_of(in);
  } else if (name == "list") {
    out = Value::array(as_list(in, "list"));
  } else if (name == "first" || name == "last") {
    const auto l = as_list(in, name.c_str());
    out = l.empty() ? Value() : (name == "first" ? l.front() : l.back());
  } else if (name == "reverse") {
    auto l = as_list(in, "reverse");
    std::reverse(l.begin(), l.end());
    if (in.is_string()) {
      std::string s;
      for (const auto &c : l) s += c.s;
      out = Value(s);
    } else {
      out = Value::array(std::move(l));
    }
  } else if (name == "join") {
    const Value sep = a.get(0, "d");
    const Value attr = a.get(1, "attribute");
    std::string s;
    bool first = true;
    for (const auto &v : as_list(in, "join")) {
      s += first ? "" : (sep.is_string() ? sep.s : "");
      s += to_str(attr.is_string() ? attr_path(v, attr.s) : v);
      first = false;
    }
    out = Value(s);
  } else if (name == "default" || name == "d") {
    const bool boolean = truthy(a.get(1, "boolean"));
    out = (in.is_undefined() || (boolean && !truthy(in))) ? (a.args.empty() ? Value("") : a.get(0, "default_value")) : in;
  } else if (name == "map") {
    Value result = Value::array();
    const Value attr = a.get(99, "attribute");
    for (const auto &v : as_list(in, "map")) {
      if (attr.is_string()) {
        Value got = attr_path(v, attr.s);
        if (got.is_undefined()) got = a.get(99, "default");
        result.push(got);
        continue;
      }
      const Value fname = a.get(0, nullptr);
      if (!fname.is_string()) bad("map: expected a filter name or attribute=");
      CallArgs rest;
      for (size_t k = 1; k < a.args.size(); ++k) rest.args.push_back(a.args[k]);
      Value mapped;
      if (!apply_filter(fname.s, v, rest, mapped)) throw Error(Status::Unsupported, "unsupported filter '" + fname.s + "'");
      result.push(mapped);
    }
    out = result;
  } else if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_pass = name == "select" || name == "selectattr";
    const Value attr = by_attr ? a.get(0, nullptr) : Value();
    if (by_attr && !attr.is_string()) bad(name + ": expected an attribute name");
    const Value test = a.get(by_attr ? 1 : 0, nullptr);
    Value result = Value::array();
    for (const auto &v : as_list(in, name.c_str()))
      if (select_pass(by_attr ? attr_path(v, attr.s) : v, test, a, by_attr ? 2 : 1) == keep_pass) result.push(v);
    out = result;
  } else if (name == "unique") {
    Value result = Value::array();
    for (const auto &v : as_list(in, "unique")) {
      bool seen = false;
      for (const auto &u : *result.arr) seen = seen || equals(u, v);
      if (!seen) result.push(v);
    }
    out = result;
  } else if (name == "dictsort") {
    Value result = items_of(in);
    std::stable_sort(result.arr->begin(), result.arr->end(),
                     [](const Value &x, const Value &y) { return (*x.arr)[0].s < (*y.arr)[0].s; });
    out = result;
  } else if (name == "int") {
    if (in.kind == Value::Kind::Float && !(std::fabs(in.f) < 9.2e18)) bad("int: value out of range");
    if (in.kind == Value::Kind::Float) out = Value(static_cast<int64_t>(in.f));
    else if (in.kind == Value::Kind::Int || in.kind == Value::Kind::Bool) out = Value(static_cast<int64_t>(in.as_double()));
    else if (in.is_string()) out = Value(static_cast<int64_t>(std::strtoll(in.s.c_str(), nullptr, 10)));
    else out = Value(int64_t{0});
  } else if (name == "float") {
    out = in.is_string() ? Value(std::strtod(in.s.c_str(), nullptr)) : Value(in.is_number() ? in.as_double() : 0.0);
  } else if (name == "abs") {
    if (in.kind == Value::Kind::Int && in.i == INT64_MIN) bad("abs: integer overflow");
    if (in.kind == Value::Kind::Int) out = Value(in.i < 0 ? -in.i : in.i);
    else if (in.kind == Value::Kind::Float) out = Value(std::fabs(in.f));
    else bad("abs: expected a number");
  } else {
    return false;
  }
  return true;
}

bool apply_test(const std::string &name, const Value &v, CallArgs &a, bool &out) {
  using K = Value::Kind;
  if (name == "defined") out = !v.is_undefined();
  else if (name == "undefined") out = v.is_undefined();
  else if (name == "none") out = v.is_none();
  else if (name == "string") out = v.is_string();
  else if (name == "mapping") out = v.is_object();
  else if (name == "iterable") out = v.is_array() || v.is_object() || v.is_string();
  else if (name == "sequence") out = v.is_array() || v.is_object() || v.is_string();
  else if (name == "number") out = v.is_number();
  else if (name == "integer") out = v.kind == K::Int;
  else if (name == "float") out = v.kind == K::Float;
  else if (name == "boolean") out = v.kind == K::Bool;
  else if (name == "true") out = v.kind == K::Bool && v.b;
  else if (name == "false") out = v.kind == K::Bool && !v.b;
  else if (name == "callable") out = v.kind == K::Function;
  else if (name == "odd" || name == "even") {
    if (v.kind != K::Int) bad("'" + name + "' test needs an integer");
    out = ((v.i % 2) != 0) == (name == "odd");
  } else if (name == "eq" || name == "equalto" || name == "==") out = equals(v, a.get(0, nullptr));
  else if (name == "ne" || name == "!=") out = !equals(v, a.get(0, nullptr));
  else if (name == "in") {
    const Value c = a.get(0, nullptr);
    out = false;
    if (c.is_array()) for (const auto &x : *c.arr) out = out || equals(x, v);
    else if (c.is_string() && v.is_string()) out = c.s.find(v.s) != std::string::npos;
    else if (c.is_object() && v.is_string()) out = c.has(v.s);
  } else if (name == "lower" || name == "upper") {
    out = v.is_string() && v.s == map_ascii(v.s, name == "lower" ? [](int c) { return std::tolower(c); } : [](int c) { return std::toupper(c); });
  } else return false;
  return true;
}

bool call_method(const Value &self, const std::string &name, CallArgs &a, Value &out) {
  if (self.is_string()) {
    const std::string &s = self.s;
    if (name == "startswith" || name == "endswith") {
      const Value p = a.get(0, nullptr);
      std::vector<std::string> options;
      if (p.is_string()) options.push_back(p.s);
      else if (p.is_array()) for (const auto &x : *p.arr) options.push_back(to_str(x));
      else bad(name + ": expected a string");
      bool hit = false;
      for (const auto &o : options)
        hit = hit || (o.size() <= s.size() && (name == "startswith" ? s.compare(0, o.size(), o) == 0
                                                                    : s.compare(s.size() - o.size(), o.size(), o) == 0));
      out = Value(hit);
    } else if (name == "strip" || name == "lstrip" || name == "rstrip") {
      out = Value(strip(s, a.get(0, "chars"), name != "rstrip", name != "lstrip"));
    } else if (name == "split") {
      out = split(s, a.get(0, "sep"), a.get(1, "maxsplit"));
    } else if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "replace") {
      return apply_filter(name, self, a, out);
    } else if (name == "find") {
      const Value p = a.get(0, nullptr);
      if (!p.is_string()) bad("find: expected a string");
      const size_t at = s.find(p.s);
      out = Value(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(utf8_length(s.substr(0, at))));
    } else {
      return false;
    }
    return true;
  }
  if (self.is_object() && !self.is_namespace()) {
    if (name == "items") out = items_of(self);
    else if (name == "keys" || name == "values") {
      out = Value::array();
      for (const auto &kv : self.obj->items) out.push(name == "keys" ? Value(kv.first) : kv.second);
    } else if (name == "get") {
      const Value key = a.get(0, nullptr);
      out = key.is_string() && self.has(key.s) ? self.get(key.s) : (a.args.size() > 1 ? a.args[1] : Value::none());
    } else {
      return false;
    }
    return true;
  }
  return false;
}

}  // namespace moe::jinja
