// Byte automaton over a Grammar, built lazily. A state is a set of parse stacks (each stack
// lists grammar positions, the top being a character element to match next; an empty stack
// means the root is complete) plus the bytes of an unfinished UTF-8 character. States are
// interned so equal situations share an id, and every (state, byte) transition is computed
// once and kept in a flat table.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "core/status.h"
#include "sampler/grammar.h"

namespace moe {

namespace {

using Stack = std::vector<uint32_t>;
using StackSet = std::vector<Stack>;  // sorted, unique

// Limits that keep a pathological grammar a clear error instead of unbounded memory.
constexpr size_t kMaxStacks = 8192;
constexpr size_t kMaxStates = 1 << 16;
constexpr int32_t kUnknown = GrammarMatcher::kNotComputed;
constexpr int32_t kDead = -1;

}  // namespace

class GrammarAutomaton {
public:
  explicit GrammarAutomaton(const Grammar &g) : g_(g) {}

  int32_t initial() {
    StackSet set;
    Stack s;
    for (uint32_t alt : g_.rule_alts[g_.root]) {
      s.clear();
      if (g_.elems[alt].kind != Grammar::Kind::End) s.push_back(alt);
      expand(s, set);
    }
    return intern(std::move(set), 0, 0, 0);
  }

  int32_t step(int32_t state, uint8_t byte) {
    int32_t &slot = trans_[size_t(state) * 256 + byte];
    if (slot == kUnknown) {
      const int32_t next = compute(state, byte);
      trans_[size_t(state) * 256 + byte] = next;  // intern may have grown trans_
      return next;
    }
    return slot;
  }

  const std::vector<int32_t> &transitions() const { return trans_; }
  bool non_ascii_uniform(int32_t state) const {
    const State &st = states_[size_t(state)];
    if (st.remaining) return false;
    for (const Stack &s : *sets_[size_t(st.set)]) {
      if (s.empty()) continue;
      const CharClass &c = top_class(s);
      if (c.intersects(0x80, 0x10FFFF) && !c.covers(0x80, 0x10FFFF)) return false;
    }
    return true;
  }
  bool complete(int32_t state) const { return states_[size_t(state)].complete; }
  bool only_end(int32_t state) const { return states_[size_t(state)].only_end; }
  size_t n_states() const { return states_.size(); }

private:
  struct State {
    int32_t set;
    uint32_t partial;    // code point bits of an unfinished character
    uint8_t remaining;   // continuation bytes still expected (0 = none)
    uint8_t total;       // length of that character in bytes (2..4; 0 = none)
    bool complete;
    bool only_end;
  };

  Grammar g_;
  std::map<StackSet, int32_t> set_ids_;
  std::vector<const StackSet *> sets_;
  std::unordered_map<uint64_t, int32_t> state_ids_;
  std::vector<State> states_;
  std::vector<int32_t> trans_;

  // Pushes the positions a stack can be at so that its top is a character element.
  void expand(const Stack &s, StackSet &out) const {
    if (s.empty() || g_.elems[s.back()].kind == Grammar::Kind::Char) {
      out.push_back(s);
      if (out.size() > kMaxStacks)
        fail(Status::InvalidArgument, "grammar: more than %zu simultaneous parses (too ambiguous)", kMaxStacks);
      return;
    }
    const uint32_t pos = s.back();
    Stack base(s.begin(), s.end() - 1);
    if (g_.elems[pos + 1].kind != Grammar::Kind::End) base.push_back(pos + 1);
    for (uint32_t alt : g_.rule_alts[g_.elems[pos].arg]) {
      Stack next = base;
      if (g_.elems[alt].kind != Grammar::Kind::End) next.push_back(alt);
      expand(next, out);
    }
  }

  int32_t intern(StackSet set, uint32_t partial, uint8_t remaining, uint8_t total) {
    std::sort(set.begin(), set.end());
    set.erase(std::unique(set.begin(), set.end()), set.end());
    if (set.empty()) return kDead;
    auto it = set_ids_.find(set);
    if (it == set_ids_.end()) {
      it = set_ids_.emplace(std::move(set), int32_t(sets_.size())).first;
      sets_.push_back(&it->first);
    }
    const int32_t set_id = it->second;
    const uint64_t key = (uint64_t(uint32_t(set_id)) << 32) | (uint64_t(partial) << 4) | (uint64_t(total) << 2) | remaining;
    auto sit = state_ids_.find(key);
    if (sit != state_ids_.end()) return sit->second;
    if (states_.size() >= kMaxStates)
      fail(Status::InvalidArgument, "grammar: more than %zu automaton states", kMaxStates);
    const StackSet &ss = *sets_[size_t(set_id)];
    const bool has_empty = ss.front().empty();  // sorted: the empty stack comes first
    State st{set_id, partial, remaining, total, has_empty && remaining == 0,
             has_empty && ss.size() == 1 && remaining == 0};
    const auto id = int32_t(states_.size());
    states_.push_back(st);
    trans_.resize(states_.size() * 256, kUnknown);
    state_ids_.emplace(key, id);
    return id;
  }

  const CharClass &top_class(const Stack &s) const { return g_.classes[g_.elems[s.back()].arg]; }

  int32_t advance(int32_t set_id, uint32_t cp) {
    StackSet out;
    for (const Stack &s : *sets_[size_t(set_id)]) {
      if (s.empty() || !top_class(s).contains(cp)) continue;
      Stack next(s.begin(), s.end() - 1);
      if (g_.elems[s.back() + 1].kind != Grammar::Kind::End) next.push_back(s.back() + 1);
      expand(next, out);
    }
    return intern(std::move(out), 0, 0, 0);
  }

  // Smallest code point a character of n bytes may encode (shorter forms are overlong).
  static uint32_t min_code_point(uint8_t n) { return n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000; }
  static bool valid_code_point(uint32_t cp, uint8_t n) {
    return cp >= min_code_point(n) && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
  }

  // A partial character is kept only if some valid character it can still become matches a
  // top (so a token never leaves the grammar where no byte can follow).
  int32_t partial_state(int32_t set_id, uint32_t bits, uint8_t remaining, uint8_t total) {
    uint32_t lo = std::max(bits << (6 * remaining), min_code_point(total));
    uint32_t hi = std::min((bits << (6 * remaining)) | ((uint32_t(1) << (6 * remaining)) - 1), uint32_t(0x10FFFF));
    if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
    if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
    if (lo > hi) return kDead;
    for (const Stack &s : *sets_[size_t(set_id)])
      if (!s.empty() && top_class(s).intersects(lo, hi)) {
        StackSet copy = *sets_[size_t(set_id)];
        return intern(std::move(copy), bits, remaining, total);
      }
    return kDead;
  }

  int32_t compute(int32_t state, uint8_t b) {
    const State st = states_[size_t(state)];
    if (st.remaining == 0) {
      if (b < 0x80) return advance(st.set, b);
      if (b >= 0xC2 && b <= 0xDF) return partial_state(st.set, b & 0x1Fu, 1, 2);
      if (b >= 0xE0 && b <= 0xEF) return partial_state(st.set, b & 0x0Fu, 2, 3);
      if (b >= 0xF0 && b <= 0xF4) return partial_state(st.set, b & 0x07u, 3, 4);
      return kDead;  // a continuation byte with no lead, or a byte UTF-8 never uses
    }
    if ((b & 0xC0) != 0x80) return kDead;
    const uint32_t bits = (st.partial << 6) | (b & 0x3Fu);
    if (st.remaining == 1) return valid_code_point(bits, st.total) ? advance(st.set, bits) : kDead;
    return partial_state(st.set, bits, uint8_t(st.remaining - 1), st.total);
  }
};

GrammarMatcher::GrammarMatcher(const Grammar &g) : a_(std::make_unique<GrammarAutomaton>(g)) {
  initial_ = a_->initial();
  if (initial_ < 0) fail(Status::InvalidArgument, "grammar: the root rule matches nothing");
  state_ = initial_;
}

GrammarMatcher::~GrammarMatcher() = default;

bool GrammarMatcher::accept_bytes(const std::string &bytes) {
  int32_t s = state_;
  for (char c : bytes) {
    s = a_->step(s, static_cast<uint8_t>(c));
    if (s < 0) return false;
  }
  state_ = s;
  return true;
}

bool GrammarMatcher::is_complete() const { return a_->complete(state_); }
bool GrammarMatcher::only_end() const { return a_->only_end(state_); }
void GrammarMatcher::reset() { state_ = initial_; }
int32_t GrammarMatcher::step(int32_t state, uint8_t byte) { return a_->step(state, byte); }
bool GrammarMatcher::state_complete(int32_t state) const { return a_->complete(state); }
size_t GrammarMatcher::n_states() const { return a_->n_states(); }
const std::vector<int32_t> &GrammarMatcher::transitions() const { return a_->transitions(); }
bool GrammarMatcher::non_ascii_uniform(int32_t state) const { return a_->non_ascii_uniform(state); }

}  // namespace moe
