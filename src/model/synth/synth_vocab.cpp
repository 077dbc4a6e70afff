#include "model/synth/synth_vocab.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/status.h"
#include "model/synth/mini_json.h"

namespace moe {

static void append_utf8(std::string &out, uint32_t cp) {
  if (cp < 0x80) out += char(cp);
  else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
  else { out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F)); }
}

static bool printable_byte(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

std::string byte_token(uint8_t b) {
  // Printable bytes map to themselves; the others to U+0100.. in byte order.
  uint32_t cp = b;
  if (!printable_byte(b)) {
    uint32_t n = 0;
    for (int k = 0; k < b; ++k) n += !printable_byte(k);
    cp = 256 + n;
  }
  std::string s;
  append_utf8(s, cp);
  return s;
}

SynthVocab make_synthetic_vocab(const SynthPreset &p) {
  SynthVocab v;
  const uint32_t n = p.n_vocab;
  v.tokens.assign(n, std::string());
  v.types.assign(n, kTokNormal);
  std::vector<bool> taken(n, false);
  for (const auto &c : p.controls) {
    if (c.first >= n) fail(Status::Internal, "preset %s: control id %u past vocab", p.name.c_str(), c.first);
    v.tokens[c.first] = c.second;
    v.types[c.first] = kTokControl;
    taken[c.first] = true;
  }
  // Normal tokens in id order: bytes (GPT-2 order: printable first), then merges built
  // breadth-first from letters so every merge's parts already exist.
  std::vector<std::string> normal;
  for (int b = 0; b < 256; ++b) if (printable_byte(b)) normal.push_back(byte_token(uint8_t(b)));
  for (int b = 0; b < 256; ++b) if (!printable_byte(b)) normal.push_back(byte_token(uint8_t(b)));
  const std::string letters = "etaoinshrdlcumwfgypbvkjxqz";
  const std::string space = byte_token(' ');
  size_t want = 0;
  for (uint32_t id = 0; id < std::min(n, p.n_vocab_real); ++id) want += !taken[id];
  std::vector<std::string> level;  // tokens of the previous length, in creation order
  auto add_merge = [&](const std::string &a, const std::string &b) {
    if (normal.size() >= want) return false;
    normal.push_back(a + b);
    v.merges.push_back(a + " " + b);
    level.push_back(a + b);
    return true;
  };
  for (char c : letters) add_merge(space, std::string(1, c));
  for (char a : letters)
    for (char b : letters) add_merge(std::string(1, a), std::string(1, b));
  size_t start = 0;
  while (normal.size() < want) {
    size_t end = level.size();
    for (size_t k = start; k < end && normal.size() < want; ++k)
      for (char c : letters)
        if (!add_merge(level[k], std::string(1, c))) break;
    start = end;
  }
  size_t next = 0;
  for (uint32_t id = 0; id < n; ++id) {
    if (taken[id]) continue;
    if (id < p.n_vocab_real && next < normal.size()) {
      v.tokens[id] = normal[next++];
    } else {
      v.tokens[id] = "[PAD" + std::to_string(id) + "]";
      v.types[id] = kTokUnused;
    }
  }
  v.bos = p.bos; v.eos = p.eos; v.pad = p.pad;
  return v;
}

static bool looks_control(const std::string &s) {
  auto wrapped = [&](const char *open, const char *close) {
    size_t lo = std::strlen(open), lc = std::strlen(close);
    return s.size() > lo + lc && s.compare(0, lo, open) == 0 && s.compare(s.size() - lc, lc, close) == 0;
  };
  return wrapped("<|", "|>") || wrapped("<｜", "｜>");
}

SynthVocab load_hf_vocab(const std::string &path, const SynthPreset &p) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Status::IoError, "cannot open '%s': %s", path.c_str(), std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  JsonValue root;
  try {
    root = parse_json(ss.str());
  } catch (const Error &e) {
    fail(Status::InvalidArgument, "%s: %s", path.c_str(), e.what());
  }
  const JsonValue *model = root.get("model");
  const JsonValue *vocab = model ? model->get("vocab") : nullptr;
  if (!vocab || !vocab->is(JsonValue::Kind::Object))
    fail(Status::InvalidArgument, "%s: no model.vocab object (not a BPE tokenizer.json?)", path.c_str());

  struct Entry { uint32_t id; std::string text; int32_t type; };
  std::vector<Entry> entries;
  uint32_t max_id = 0;
  auto add = [&](const JsonValue &idv, const std::string &text, int32_t type) {
    if (!idv.is(JsonValue::Kind::Number) || idv.num < 0 || idv.num > 16e6)
      fail(Status::InvalidArgument, "%s: bad id for token '%s'", path.c_str(), text.c_str());
    uint32_t id = uint32_t(idv.num);
    entries.push_back({id, text, type});
    max_id = std::max(max_id, id);
  };
  for (const auto &m : vocab->members) add(m.second, m.first, kTokNormal);
  if (const JsonValue *added = root.get("added_tokens"); added && added->is(JsonValue::Kind::Array)) {
    for (const auto &t : added->items) {
      const JsonValue *id = t.get("id"), *content = t.get("content"), *special = t.get("special");
      if (!id || !content || !content->is(JsonValue::Kind::String))
        fail(Status::InvalidArgument, "%s: added_tokens entry without id/content", path.c_str());
      bool is_special = special && special->is(JsonValue::Kind::Bool) && special->b;
      add(*id, content->str, is_special || looks_control(content->str) ? kTokControl : kTokUserDefined);
    }
  }
  SynthVocab v;
  const uint32_t n = std::max<uint32_t>(p.n_vocab, max_id + 1);
  v.tokens.assign(n, std::string());
  v.types.assign(n, kTokUnused);
  std::vector<bool> set(n, false);
  for (const auto &e : entries) {  // added_tokens come last and override the vocab entry
    v.tokens[e.id] = e.text;
    v.types[e.id] = e.type;
    set[e.id] = true;
  }
  for (uint32_t id = 0; id < n; ++id)
    if (!set[id]) v.tokens[id] = "[PAD" + std::to_string(id) + "]";

  if (const JsonValue *merges = model->get("merges"); merges && merges->is(JsonValue::Kind::Array)) {
    v.merges.reserve(merges->items.size());
    for (const auto &m : merges->items) {
      if (m.is(JsonValue::Kind::String)) v.merges.push_back(m.str);
      else if (m.is(JsonValue::Kind::Array) && m.items.size() == 2 && m.items[0].is(JsonValue::Kind::String) &&
               m.items[1].is(JsonValue::Kind::String))
        v.merges.push_back(m.items[0].str + " " + m.items[1].str);
      else fail(Status::InvalidArgument, "%s: merge entry is neither \"a b\" nor [a, b]", path.c_str());
    }
  }
  std::unordered_map<std::string, uint32_t> by_text;
  for (uint32_t id = 0; id < n; ++id)
    if (set[id]) by_text.emplace(v.tokens[id], id);
  auto resolve = [&](uint32_t preset_id) {
    for (const auto &c : p.controls)
      if (c.first == preset_id) {
        auto it = by_text.find(c.second);
        if (it != by_text.end()) return it->second;
      }
    return preset_id < n ? preset_id : 0u;
  };
  v.bos = resolve(p.bos); v.eos = resolve(p.eos); v.pad = resolve(p.pad);
  return v;
}

}  // namespace moe
