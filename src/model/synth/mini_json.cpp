#include "model/synth/mini_json.h"

#include <cstdlib>

#include "core/status.h"

namespace moe {

const JsonValue *JsonValue::get(const std::string &key) const {
  if (kind != Kind::Object) return nullptr;
  for (const auto &m : members)
    if (m.first == key) return &m.second;
  return nullptr;
}

namespace {

struct Parser {
  const std::string &s;
  size_t i = 0;
  int depth = 0;

  [[noreturn]] void error(const char *what) const {
    fail(Status::InvalidArgument, "JSON: %s at byte %zu", what, i);
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  bool lit(const char *w) {
    size_t k = 0;
    while (w[k]) { if (i + k >= s.size() || s[i + k] != w[k]) return false; ++k; }
    i += k;
    return true;
  }
  static void utf8(std::string &out, uint32_t cp) {
    if (cp < 0x80) out += char(cp);
    else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) { out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F)); }
    else { out += char(0xF0 | (cp >> 18)); out += char(0x80 | ((cp >> 12) & 0x3F)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F)); }
  }
  uint32_t hex4() {
    if (i + 4 > s.size()) error("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s[i++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') v |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= uint32_t(c - 'A' + 10);
      else error("bad \\u escape");
    }
    return v;
  }
  std::string string() {
    if (s[i] != '"') error("expected string");
    ++i;
    std::string out;
    for (;;) {
      if (i >= s.size()) error("unterminated string");
      char c = s[i++];
      if (c == '"') return out;
      if (c != '\\') { out += c; continue; }
      if (i >= s.size()) error("unterminated escape");
      char e = s[i++];
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
          if (cp >= 0xD800 && cp < 0xDC00 && i + 6 <= s.size() && s[i] == '\\' && s[i + 1] == 'u') {
            size_t save = i;
            i += 2;
            uint32_t lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else i = save;  // lone high surrogate: keep as is
          }
          utf8(out, cp);
          break;
        }
        default: error("bad escape");
      }
    }
  }
  JsonValue value() {
    ws();
    if (i >= s.size()) error("unexpected end");
    if (++depth > 256) error("nesting too deep");
    JsonValue v;
    char c = s[i];
    if (c == '{') {
      v.kind = JsonValue::Kind::Object;
      ++i; ws();
      if (i < s.size() && s[i] == '}') { ++i; --depth; return v; }
      for (;;) {
        ws();
        if (i >= s.size()) error("unterminated object");
        std::string k = string();
        ws();
        if (i >= s.size() || s[i] != ':') error("expected ':'");
        ++i;
        v.members.emplace_back(std::move(k), value());
        ws();
        if (i < s.size() && s[i] == ',') { ++i; continue; }
        if (i < s.size() && s[i] == '}') { ++i; break; }
        error("expected ',' or '}'");
      }
    } else if (c == '[') {
      v.kind = JsonValue::Kind::Array;
      ++i; ws();
      if (i < s.size() && s[i] == ']') { ++i; --depth; return v; }
      for (;;) {
        v.items.push_back(value());
        ws();
        if (i < s.size() && s[i] == ',') { ++i; continue; }
        if (i < s.size() && s[i] == ']') { ++i; break; }
        error("expected ',' or ']'");
      }
    } else if (c == '"') {
      v.kind = JsonValue::Kind::String;
      v.str = string();
    } else if (lit("true")) { v.kind = JsonValue::Kind::Bool; v.b = true; }
    else if (lit("false")) { v.kind = JsonValue::Kind::Bool; }
    else if (lit("null")) { v.kind = JsonValue::Kind::Null; }
    else if (c == '-' || (c >= '0' && c <= '9')) {
      const char *begin = s.c_str() + i;
      char *end = nullptr;
      v.kind = JsonValue::Kind::Number;
      v.num = std::strtod(begin, &end);
      if (end == begin) error("bad number");
      i += size_t(end - begin);
    } else {
      error("unexpected character");
    }
    --depth;
    return v;
  }
};

}  // namespace

JsonValue parse_json(const std::string &text) {
  Parser p{text};
  JsonValue v = p.value();
  p.ws();
  if (p.i != text.size()) p.error("trailing characters");
  return v;
}

}  // namespace moe
