// GBNF text -> Grammar. A recursive-descent parser builds rules of symbol sequences;
// groups and repetitions become helper rules; then the rules are laid out flat and checked
// (every referenced rule defined, the root present, no left recursion).
#include <algorithm>
#include <functional>
#include <unordered_map>

#include "core/status.h"
#include "sampler/grammar.h"

namespace moe {

namespace {

struct Sym {
  bool rule;
  uint32_t id;  // rule id or class index
};
using Seq = std::vector<Sym>;
using Alts = std::vector<Seq>;

// Most repetitions one {m,n} may expand to: the rules grow linearly with it.
constexpr uint32_t kMaxRepeat = 4096;

class Parser {
public:
  explicit Parser(const std::string &text) : s_(text) {}

  void parse_all() {
    skip_space();
    while (pos_ < s_.size()) {
      const size_t line = line_of(pos_);
      const std::string name = parse_name();
      skip_space();
      if (s_.compare(pos_, 3, "::=") != 0) error("expected ::= after rule name '" + name + "'");
      pos_ += 3;
      const uint32_t id = rule_id(name);
      if (defined_[id]) error("rule '" + name + "' defined twice");
      defined_[id] = true;
      def_line_[id] = line;
      rules_[id] = parse_alternatives(name);
      skip_space();
    }
  }

  Grammar finish(const std::string &root);

private:
  const std::string &s_;
  size_t pos_ = 0;
  std::vector<Alts> rules_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<size_t> def_line_;
  std::vector<size_t> ref_line_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<CharClass> classes_;

  [[noreturn]] void error(const std::string &what) const {
    fail(Status::InvalidArgument, "grammar: %s at line %zu", what.c_str(), line_of(pos_));
  }
  size_t line_of(size_t p) const {
    return size_t(1) + size_t(std::count(s_.begin(), s_.begin() + std::min(p, s_.size()), '\n'));
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  void skip_space() {
    while (!at_end()) {
      const char c = s_[pos_];
      if (c == '#') {
        while (!at_end() && s_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }
  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  std::string parse_name() {
    const size_t b = pos_;
    while (!at_end() && name_char(s_[pos_])) ++pos_;
    if (pos_ == b) error(std::string("expected a rule name, found '") + peek() + "'");
    return s_.substr(b, pos_ - b);
  }
  // A name followed by ::= starts the next rule and so ends the current sequence.
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < s_.size() && name_char(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n' || s_[p] == '\r')) ++p;
    return s_.compare(p, 3, "::=") == 0;
  }

  uint32_t rule_id(const std::string &name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const auto id = uint32_t(names_.size());
    ids_.emplace(name, id);
    names_.push_back(name);
    rules_.emplace_back();
    defined_.push_back(false);
    def_line_.push_back(0);
    ref_line_.push_back(line_of(pos_));
    return id;
  }
  uint32_t helper_rule(const std::string &parent, Alts alts) {
    const std::string name = parent + "-" + std::to_string(names_.size());
    const uint32_t id = rule_id(name);
    defined_[id] = true;
    rules_[id] = std::move(alts);
    return id;
  }

  Alts parse_alternatives(const std::string &rule) {
    Alts alts;
    alts.push_back(parse_sequence(rule));
    skip_space();
    while (peek() == '|') {
      ++pos_;
      alts.push_back(parse_sequence(rule));
      skip_space();
    }
    return alts;
  }

  Seq parse_sequence(const std::string &rule) {
    Seq seq;
    for (;;) {
      skip_space();
      const char c = peek();
      if (at_end() || c == '|' || c == ')' || at_rule_start()) return seq;
      const size_t start = seq.size();
      if (c == '"') {
        ++pos_;
        while (peek() != '"') {
          if (at_end()) error("unterminated string literal");
          const uint32_t cp = parse_char();
          seq.push_back(Sym{false, single_class(cp)});
        }
        ++pos_;
      } else if (c == '[') {
        seq.push_back(Sym{false, parse_class()});
      } else if (c == '.') {
        ++pos_;
        CharClass any;
        any.negated = true;
        seq.push_back(Sym{false, add_class(std::move(any))});
      } else if (c == '(') {
        ++pos_;
        Alts inner = parse_alternatives(rule);
        skip_space();
        if (peek() != ')') error("expected ')'");
        ++pos_;
        seq.push_back(Sym{true, helper_rule(rule, std::move(inner))});
      } else if (name_char(c)) {
        const std::string name = parse_name();
        seq.push_back(Sym{true, rule_id(name)});
      } else {
        error(std::string("unexpected character '") + c + "'");
      }
      parse_repetition(rule, seq, start);
    }
  }

  // Applies a postfix operator to seq[start..): the item (a literal may be several symbols).
  void parse_repetition(const std::string &rule, Seq &seq, size_t start) {
    const char c = peek();
    if (c != '*' && c != '+' && c != '?' && c != '{') return;
    uint32_t lo = 0, hi = 0;
    bool unbounded = false;
    ++pos_;
    if (c == '*') {
      unbounded = true;
    } else if (c == '+') {
      lo = 1;
      unbounded = true;
    } else if (c == '?') {
      hi = 1;
    } else {
      skip_space();
      lo = parse_count();
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
        if (peek() == '}') unbounded = true;
        else hi = parse_count();
      } else {
        hi = lo;
      }
      skip_space();
      if (peek() != '}') error("expected '}'");
      ++pos_;
      if (!unbounded && hi < lo) error("repetition {" + std::to_string(lo) + "," + std::to_string(hi) + "} has max < min");
    }
    const Seq item(seq.begin() + long(start), seq.end());
    seq.resize(start);
    for (uint32_t i = 0; i < lo; ++i) seq.insert(seq.end(), item.begin(), item.end());
    if (unbounded) {
      // R ::= item R | (empty)
      const uint32_t r = rule_id_placeholder(rule);
      Seq rec = item;
      rec.push_back(Sym{true, r});
      rules_[r] = Alts{rec, Seq{}};
      seq.push_back(Sym{true, r});
    } else if (hi > lo) {
      // (item (item (...)?)?)? nested hi - lo deep: R_k ::= item R_{k-1} | (empty)
      uint32_t inner = helper_rule(rule, Alts{item, Seq{}});
      for (uint32_t k = lo + 1; k < hi; ++k) {
        Seq next = item;
        next.push_back(Sym{true, inner});
        inner = helper_rule(rule, Alts{next, Seq{}});
      }
      seq.push_back(Sym{true, inner});
    }
  }
  uint32_t rule_id_placeholder(const std::string &parent) { return helper_rule(parent, Alts{}); }

  uint32_t parse_count() {
    const size_t b = pos_;
    uint64_t v = 0;
    while (!at_end() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      v = v * 10 + uint64_t(s_[pos_] - '0');
      if (v > kMaxRepeat) error("repetition count above " + std::to_string(kMaxRepeat));
      ++pos_;
    }
    if (pos_ == b) error("expected a repetition count");
    return uint32_t(v);
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      uint32_t d;
      if (c >= '0' && c <= '9') d = uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') d = uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') d = uint32_t(c - 'A' + 10);
      else error("bad hex escape");
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  // One character of a literal or class: an escape or a UTF-8 sequence, as a code point.
  uint32_t parse_char() {
    const auto b = static_cast<unsigned char>(s_[pos_]);
    if (b == '\\') {
      ++pos_;
      if (at_end()) error("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': return uint32_t(e);
        default: error(std::string("unknown escape \\") + e);
      }
    }
    int n = b < 0x80 ? 0 : b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : -1;
    if (n < 0) error("invalid UTF-8 in grammar");
    uint32_t cp = n == 0 ? b : n == 1 ? (b & 0x1Fu) : n == 2 ? (b & 0x0Fu) : (b & 0x07u);
    ++pos_;
    for (; n > 0; --n) {
      if (at_end() || (static_cast<unsigned char>(s_[pos_]) & 0xC0) != 0x80) error("invalid UTF-8 in grammar");
      cp = (cp << 6) | (static_cast<unsigned char>(s_[pos_++]) & 0x3Fu);
    }
    return cp;
  }

  uint32_t add_class(CharClass cc) {
    cc.finish();
    classes_.push_back(std::move(cc));
    return uint32_t(classes_.size() - 1);
  }
  uint32_t single_class(uint32_t cp) {
    CharClass cc;
    cc.ranges.emplace_back(cp, cp);
    return add_class(std::move(cc));
  }
  uint32_t parse_class() {
    ++pos_;  // '['
    CharClass cc;
    if (peek() == '^') {
      cc.negated = true;
      ++pos_;
    }
    while (peek() != ']') {
      if (at_end()) error("unterminated character class");
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
        ++pos_;
        hi = parse_char();
        if (hi < lo) error("character range with end before start");
      }
      cc.ranges.emplace_back(lo, hi);
    }
    ++pos_;
    return add_class(std::move(cc));
  }
};

Grammar Parser::finish(const std::string &root) {
  for (size_t i = 0; i < names_.size(); ++i)
    if (!defined_[i])
      fail(Status::InvalidArgument, "grammar: rule '%s' (used at line %zu) is not defined", names_[i].c_str(),
           ref_line_[i]);
  auto it = ids_.find(root);
  if (it == ids_.end()) fail(Status::InvalidArgument, "grammar: no root rule '%s'", root.c_str());

  // Left recursion would expand forever: find a cycle through the symbols a rule can start
  // with (a symbol after nullable ones counts too).
  const size_t n = rules_.size();
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Seq &alt : rules_[r]) {
        const bool all = std::all_of(alt.begin(), alt.end(), [&](const Sym &s) { return s.rule && nullable[s.id]; });
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  std::vector<int> mark(n, 0);  // 0 unvisited, 1 on the path, 2 done
  std::function<void(uint32_t)> visit = [&](uint32_t r) {
    mark[r] = 1;
    for (const Seq &alt : rules_[r])
      for (const Sym &s : alt) {
        if (!s.rule) break;
        if (mark[s.id] == 1)
          fail(Status::InvalidArgument, "grammar: rule '%s' is left-recursive (through '%s')", names_[s.id].c_str(),
               names_[r].c_str());
        if (mark[s.id] == 0) visit(s.id);
        if (!nullable[s.id]) break;
      }
    mark[r] = 2;
  };
  for (uint32_t r = 0; r < n; ++r)
    if (mark[r] == 0) visit(r);

  Grammar g;
  g.classes = std::move(classes_);
  g.rule_names = names_;
  g.root = it->second;
  g.rule_alts.resize(n);
  for (size_t r = 0; r < n; ++r)
    for (const Seq &alt : rules_[r]) {
      g.rule_alts[r].push_back(uint32_t(g.elems.size()));
      for (const Sym &s : alt) g.elems.push_back(Grammar::Elem{s.rule ? Grammar::Kind::Rule : Grammar::Kind::Char, s.id});
      g.elems.push_back(Grammar::Elem{Grammar::Kind::End, 0});
    }
  return g;
}

}  // namespace

void CharClass::finish() {
  ascii[0] = ascii[1] = 0;
  for (const auto &r : ranges)
    for (uint32_t c = r.first; c <= std::min<uint32_t>(r.second, 127); ++c) ascii[c >> 6] |= uint64_t(1) << (c & 63);
  if (negated) {
    ascii[0] = ~ascii[0];
    ascii[1] = ~ascii[1];
  }
}

bool CharClass::contains(uint32_t cp) const {
  if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
  bool in = false;
  for (const auto &r : ranges)
    if (cp >= r.first && cp <= r.second) {
      in = true;
      break;
    }
  return in != negated;
}

bool CharClass::intersects(uint32_t lo, uint32_t hi) const {
  if (!negated) {
    for (const auto &r : ranges)
      if (r.first <= hi && r.second >= lo) return true;
    return false;
  }
  // Negated: some code point of [lo, hi] lies outside every range unless one range covers it.
  for (const auto &r : ranges)
    if (r.first <= lo && r.second >= hi) return false;
  return true;
}

bool CharClass::covers(uint32_t lo, uint32_t hi) const {
  // Merge the ranges (minus surrogates, which no character is) and look for a gap in [lo, hi].
  std::vector<std::pair<uint32_t, uint32_t>> r = ranges;
  r.emplace_back(0xD800, 0xDFFF);
  std::sort(r.begin(), r.end());
  uint32_t next = lo;  // first code point not yet known to be covered (by the ranges, or by their absence if negated)
  if (!negated) {
    for (const auto &x : r) {
      if (x.first > next) break;
      if (x.second >= next) next = x.second + 1;
      if (next > hi) return true;
    }
    return next > hi;
  }
  // Negated: covered when no range other than the surrogates touches [lo, hi].
  for (const auto &x : ranges)
    if (x.first <= hi && x.second >= lo) return false;
  return true;
}

Grammar parse_gbnf(const std::string &text, const std::string &root) {
  Parser p(text);
  p.parse_all();
  return p.finish(root);
}

}  // namespace moe
