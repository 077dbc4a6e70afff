// JSON Schema -> GBNF. Each schema node becomes a rule; shared primitives (string, number,
// value, ...) are emitted once. Every value rule ends in `space`, so whitespace between
// tokens is bounded (a newline and up to 20 indentation characters).
#include "sampler/json_schema.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <vector>

#include "core/status.h"
#include "model/synth/mini_json.h"

namespace moe {

namespace {

using Kind = JsonValue::Kind;

// Primitive rules by name; a rule is emitted (with those it uses) when first referenced.
const std::map<std::string, std::pair<std::string, std::vector<std::string>>> &primitives() {
  static const std::map<std::string, std::pair<std::string, std::vector<std::string>>> p = {
      {"space", {R"(| " " | "\n" [ \t]{0,20})", {}}},
      {"char", {R"([^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))", {}}},
      {"string", {R"("\"" char* "\"" space)", {"char", "space"}}},
      {"integral-part", {R"([0] | [1-9] [0-9]{0,15})", {}}},
      {"integer", {R"(("-"? integral-part) space)", {"integral-part", "space"}}},
      {"number",
       {R"(("-"? integral-part) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? space)", {"integral-part", "space"}}},
      {"boolean", {R"(("true" | "false") space)", {"space"}}},
      {"null", {R"("null" space)", {"space"}}},
      {"value", {"object | array | string | number | boolean | null",
                 {"object", "array", "string", "number", "boolean", "null"}}},
      {"object", {R"("{" space (string ":" space value ("," space string ":" space value)*)? "}" space)",
                  {"string", "space", "value"}}},
      {"array", {R"("[" space (value ("," space value)*)? "]" space)", {"value", "space"}}},
  };
  return p;
}

// JSON text of a string, then as a GBNF literal (quotes and backslashes escaped).
std::string json_quote(const std::string &s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"') o += "\\\"";
    else if (c == '\\') o += "\\\\";
    else if (c == '\n') o += "\\n";
    else if (c == '\r') o += "\\r";
    else if (c == '\t') o += "\\t";
    else if (c < 0x20) o += strfmt("\\u%04x", c);
    else o += char(c);
  }
  return o + "\"";
}
std::string gbnf_literal(const std::string &bytes) {
  std::string o = "\"";
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\') o += '\\', o += char(c);
    else if (c < 0x20 || c == 0x7F) o += strfmt("\\x%02X", c);
    else o += char(c);
  }
  return o + "\"";
}

std::string json_text(const JsonValue &v) {
  switch (v.kind) {
    case Kind::Null: return "null";
    case Kind::Bool: return v.b ? "true" : "false";
    case Kind::Number:
      if (std::floor(v.num) == v.num && std::fabs(v.num) < 9007199254740992.0) return strfmt("%.0f", v.num);
      return strfmt("%.17g", v.num);
    case Kind::String: return json_quote(v.str);
    case Kind::Array: {
      std::string o = "[";
      for (size_t i = 0; i < v.items.size(); ++i) o += (i ? "," : "") + json_text(v.items[i]);
      return o + "]";
    }
    case Kind::Object: {
      std::string o = "{";
      for (size_t i = 0; i < v.members.size(); ++i)
        o += (i ? "," : "") + json_quote(v.members[i].first) + ":" + json_text(v.members[i].second);
      return o + "}";
    }
  }
  return "null";
}

class Converter {
public:
  explicit Converter(const JsonValue &root) : root_(root) {}

  std::string run() {
    const std::string top = visit(root_, "root");
    if (top != "root") add_rule("root", top);
    std::string out;
    for (const auto &name : order_) out += name + " ::= " + rules_[name] + "\n";
    return out;
  }

private:
  const JsonValue &root_;
  std::map<std::string, std::string> rules_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> refs_;  // $ref -> rule name

  [[noreturn]] static void unsupported(const std::string &kw) {
    fail(Status::Unsupported, "json schema: keyword '%s' is not supported", kw.c_str());
  }
  [[noreturn]] static void invalid(const std::string &what) {
    fail(Status::InvalidArgument, "json schema: %s", what.c_str());
  }

  static std::string sanitize(const std::string &s) {
    std::string o;
    for (char c : s) o += ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) ? c : '-';
    return o.empty() ? "x" : o;
  }

  // Adds name ::= body under a unique name (a suffix when taken); returns the name used.
  std::string add_rule(const std::string &hint, const std::string &body) {
    std::string name = sanitize(hint);
    for (int i = 1; rules_.count(name) && rules_[name] != body; ++i) name = sanitize(hint) + "-" + std::to_string(i);
    if (!rules_.count(name)) order_.push_back(name);
    rules_[name] = body;
    return name;
  }
  std::string prim(const std::string &name) {
    if (rules_.count(name)) return name;
    const auto &p = primitives().at(name);
    rules_[name] = p.first;
    order_.push_back(name);
    for (const auto &dep : p.second) prim(dep);
    return name;
  }

  static size_t count_of(const JsonValue &s, const char *key, size_t dflt) {
    const JsonValue *v = s.get(key);
    if (!v) return dflt;
    if (!v->is(Kind::Number) || v->num < 0 || std::floor(v->num) != v->num || v->num > 4096)
      invalid(std::string(key) + " must be an integer in [0, 4096]");
    return size_t(v->num);
  }
  static std::string repeat(size_t lo, size_t hi, bool unbounded) {
    if (unbounded) return lo == 0 ? "*" : lo == 1 ? "+" : "{" + std::to_string(lo) + ",}";
    return "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
  }

  std::string visit(const JsonValue &s, const std::string &name) {
    if (s.is(Kind::Bool)) {
      if (!s.b) invalid("schema false matches nothing");
      return prim("value");
    }
    if (!s.is(Kind::Object)) invalid("a schema must be an object or a boolean");
    static const std::set<std::string> known = {
        "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
        "maxLength", "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "title", "description",
        "default", "examples", "$schema", "$id", "$comment"};
    for (const auto &m : s.members)
      if (!known.count(m.first)) unsupported(m.first);

    if (const JsonValue *ref = s.get("$ref")) return visit_ref(*ref);
    if (const JsonValue *c = s.get("const")) return add_rule(name, gbnf_literal(json_text(*c)) + " " + prim("space"));
    if (const JsonValue *e = s.get("enum")) {
      if (!e->is(Kind::Array) || e->items.empty()) invalid("enum must be a non-empty array");
      std::string alts;
      for (const JsonValue &v : e->items) alts += (alts.empty() ? "" : " | ") + gbnf_literal(json_text(v));
      return add_rule(name, "(" + alts + ") " + prim("space"));
    }
    for (const char *kw : {"anyOf", "oneOf"})
      if (const JsonValue *list = s.get(kw)) {
        if (!list->is(Kind::Array) || list->items.empty()) invalid(std::string(kw) + " must be a non-empty array");
        std::string alts;
        for (size_t i = 0; i < list->items.size(); ++i)
          alts += (i ? " | " : "") + visit(list->items[i], name + "-" + std::to_string(i));
        return add_rule(name, alts);
      }

    const JsonValue *type = s.get("type");
    if (type && type->is(Kind::Array)) {
      std::string alts;
      for (size_t i = 0; i < type->items.size(); ++i)
        alts += (i ? " | " : "") + visit_type(s, type->items[i], name + "-" + std::to_string(i));
      if (alts.empty()) invalid("type list is empty");
      return add_rule(name, alts);
    }
    if (type) return visit_type(s, *type, name);
    if (s.get("properties") || s.get("additionalProperties")) return visit_object(s, name);
    if (s.get("items")) return visit_array(s, name);
    return prim("value");
  }

  std::string visit_ref(const JsonValue &ref) {
    if (!ref.is(Kind::String)) invalid("$ref must be a string");
    auto it = refs_.find(ref.str);
    if (it != refs_.end()) return it->second;
    const JsonValue *target = nullptr;
    for (const char *prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (ref.str.compare(0, p.size(), p) == 0) {
        const JsonValue *defs = root_.get(p.substr(2, p.size() - 3));
        if (defs) target = defs->get(ref.str.substr(p.size()));
      }
    }
    if (!target) fail(Status::Unsupported, "json schema: $ref '%s' is not a local definition", ref.str.c_str());
    // The name is reserved before visiting so recursive references resolve to it.
    const std::string name = add_rule("ref-" + ref.str.substr(ref.str.rfind('/') + 1), "");
    refs_[ref.str] = name;
    const std::string body = visit(*target, name + "-body");
    rules_[name] = body;
    return name;
  }

  std::string visit_type(const JsonValue &s, const JsonValue &type, const std::string &name) {
    if (!type.is(Kind::String)) invalid("type must be a string or a list of strings");
    const std::string &t = type.str;
    if (t == "object") return visit_object(s, name);
    if (t == "array") return visit_array(s, name);
    if (t == "string") {
      const size_t lo = count_of(s, "minLength", 0);
      const bool unbounded = !s.get("maxLength");
      const size_t hi = count_of(s, "maxLength", 0);
      if (!unbounded && hi < lo) invalid("maxLength below minLength");
      if (lo == 0 && unbounded) return prim("string");
      return add_rule(name, "\"\\\"\" " + prim("char") + repeat(lo, hi, unbounded) + " \"\\\"\" " + prim("space"));
    }
    if (t == "number" || t == "integer" || t == "boolean" || t == "null") return prim(t);
    invalid("unknown type '" + t + "'");
  }

  std::string visit_array(const JsonValue &s, const std::string &name) {
    const JsonValue *items = s.get("items");
    const std::string item = items ? visit(*items, name + "-item") : prim("value");
    const size_t lo = count_of(s, "minItems", 0);
    const bool unbounded = !s.get("maxItems");
    const size_t hi = count_of(s, "maxItems", 0);
    if (!unbounded && hi < lo) invalid("maxItems below minItems");
    const std::string sp = prim("space");
    std::string body = "\"[\" " + sp + " ";
    if (!unbounded && hi == 0) {
      body += "\"]\" " + sp;
    } else {
      const size_t rest_lo = lo > 0 ? lo - 1 : 0;
      const std::string list = item + " (\",\" " + sp + " " + item + ")" + repeat(rest_lo, hi - 1, unbounded);
      body += (lo == 0 ? "(" + list + ")?" : list) + " \"]\" " + sp;
    }
    return add_rule(name, body);
  }

  // Members in schema order; required ones always present, optional ones may be left out,
  // and additional members (when allowed) come last. a<i>: the members from i on with
  // nothing before them; b<i>: the same after a member (each one preceded by a comma).
  std::string visit_object(const JsonValue &s, const std::string &name) {
    struct Member {
      std::string kv;
      bool required;
      bool repeated;
    };
    std::vector<Member> members;
    std::set<std::string> required;
    if (const JsonValue *req = s.get("required")) {
      if (!req->is(Kind::Array)) invalid("required must be an array");
      for (const JsonValue &r : req->items) {
        if (!r.is(Kind::String)) invalid("required entries must be strings");
        required.insert(r.str);
      }
    }
    const std::string sp = prim("space");
    std::set<std::string> listed;
    if (const JsonValue *props = s.get("properties")) {
      if (!props->is(Kind::Object)) invalid("properties must be an object");
      for (const auto &p : props->members) {
        const std::string value = visit(p.second, name + "-" + p.first);
        const std::string kv = gbnf_literal(json_quote(p.first)) + " " + sp + " \":\" " + sp + " " + value;
        members.push_back(Member{add_rule(name + "-" + p.first + "-kv", kv), required.count(p.first) > 0, false});
        listed.insert(p.first);
      }
    }
    for (const auto &r : required)
      if (!listed.count(r)) invalid("required property '" + r + "' is not in properties");
    const JsonValue *extra = s.get("additionalProperties");
    if (extra && !(extra->is(Kind::Bool) && !extra->b)) {
      const std::string value = extra->is(Kind::Bool) ? prim("value") : visit(*extra, name + "-additional");
      // Any key but the listed ones would need negative lookahead; the reference also allows
      // any string here, so a listed key may repeat only through this member.
      const std::string kv = prim("string") + " \":\" " + sp + " " + value;
      members.push_back(Member{add_rule(name + "-additional-kv", kv), false, true});
    }
    std::string a_next, b_next;  // a/b rules of member i + 1 ("" = nothing follows)
    for (size_t k = members.size(); k-- > 0;) {
      const Member &m = members[k];
      const std::string b_tail = b_next.empty() ? "" : " " + b_next;
      std::string b, a;
      if (m.repeated) {
        b = "(\",\" " + sp + " " + m.kv + ")*";
        a = "(" + m.kv + " " + b + ")?";
      } else if (m.required) {
        b = "\",\" " + sp + " " + m.kv + b_tail;
        a = m.kv + b_tail;
      } else {
        b = "(\",\" " + sp + " " + m.kv + ")?" + b_tail;
        a = m.kv + b_tail + (a_next.empty() ? " | " : " | " + a_next);
        if (a_next.empty()) a = "(" + m.kv + b_tail + ")?";
      }
      b_next = add_rule(name + "-b" + std::to_string(k), b);
      a_next = add_rule(name + "-a" + std::to_string(k), a);
    }
    std::string body = "\"{\" " + sp + " ";
    if (!a_next.empty()) body += a_next + " ";
    return add_rule(name, body + "\"}\" " + sp);
  }
};

}  // namespace

std::string json_schema_to_gbnf(const std::string &schema_json) {
  const JsonValue root = parse_json(schema_json);
  return Converter(root).run();
}

}  // namespace moe
