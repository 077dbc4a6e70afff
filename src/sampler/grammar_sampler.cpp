// GrammarStage and the vocabulary trie it walks.
#include "sampler/grammar_sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/status.h"
#include "tokenizer/vocab.h"

namespace moe {

TokenTrie::TokenTrie(const std::vector<std::string> &pieces) {
  std::vector<int32_t> order;
  for (size_t i = 0; i < pieces.size(); ++i)
    if (!pieces[i].empty()) order.push_back(int32_t(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const std::string &pa = pieces[size_t(a)], &pb = pieces[size_t(b)];
    return pa < pb || (pa == pb && a < b);
  });
  // In sorted order each string adds the nodes of its bytes after the prefix it shares with
  // the previous one; that sequence of nodes is the trie's preorder, and the tokens ending
  // at each node come in the same order.
  std::vector<uint32_t> path;  // node index per depth of the previous string
  const std::string *prev = nullptr;
  for (int32_t id : order) {
    const std::string &s = pieces[size_t(id)];
    size_t common = 0;
    if (prev)
      while (common < s.size() && common < prev->size() && s[common] == (*prev)[common]) ++common;
    path.resize(common);
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(uint32_t(nodes_.size()));
      nodes_.push_back(Node{0, 0, uint32_t(tokens_.size()), uint32_t(d + 1), static_cast<uint8_t>(s[d]), false});
    }
    tokens_.push_back(id);
    max_depth_ = std::max(max_depth_, uint32_t(s.size()));
    prev = &s;
  }
  // Subtree ends (the next node no deeper) and the byte groups below each node.
  std::vector<uint32_t> open;
  auto close = [&](uint32_t at) {
    Node &done = nodes_[open.back()];
    done.end = at;
    open.pop_back();
    if (!open.empty()) nodes_[open.back()].below |= done.below | (uint64_t(1) << byte_group(done.byte));
  };
  for (uint32_t i = 0; i < nodes_.size(); ++i) {
    while (!open.empty() && nodes_[open.back()].depth >= nodes_[i].depth) close(i);
    open.push_back(i);
  }
  while (!open.empty()) close(uint32_t(nodes_.size()));
  nodes_.push_back(Node{0, 0, uint32_t(tokens_.size()), 0, 0, false});  // sentinel
  mark_utf8();
}

namespace {

// UTF-8 validation as a small automaton over bytes: the boundary state, "n continuation
// bytes to go", and the four leads whose second byte has a narrower range (E0: no overlong
// forms, ED: no surrogates, F0: no overlong forms, F4: nothing above U+10FFFF).
enum Utf8State : uint8_t { kBoundary, kNeed1, kNeed2, kNeed3, kAfterE0, kAfterED, kAfterF0, kAfterF4, kUtf8States };

int utf8_next(int st, uint8_t b) {  // -1 = invalid
  const bool cont = (b & 0xC0) == 0x80;
  switch (st) {
    case kBoundary:
      if (b < 0x80) return kBoundary;
      if (b >= 0xC2 && b <= 0xDF) return kNeed1;
      if (b == 0xE0) return kAfterE0;
      if (b == 0xED) return kAfterED;
      if (b >= 0xE1 && b <= 0xEF) return kNeed2;
      if (b == 0xF0) return kAfterF0;
      if (b == 0xF4) return kAfterF4;
      if (b >= 0xF1 && b <= 0xF3) return kNeed3;
      return -1;
    case kNeed1: return cont ? kBoundary : -1;
    case kNeed2: return cont ? kNeed1 : -1;
    case kNeed3: return cont ? kNeed2 : -1;
    case kAfterE0: return b >= 0xA0 && b <= 0xBF ? kNeed1 : -1;
    case kAfterED: return b >= 0x80 && b <= 0x9F ? kNeed1 : -1;
    case kAfterF0: return b >= 0x90 && b <= 0xBF ? kNeed2 : -1;
    case kAfterF4: return b >= 0x80 && b <= 0x8F ? kNeed2 : -1;
    default: return -1;
  }
}

}  // namespace

// Bottom-up (reverse preorder): ok(node, d) = the node's byte is valid in UTF-8 state d and
// every child is ok from the state after it; utf8_below = every child ok from a boundary.
void TokenTrie::mark_utf8() {
  const size_t n = nodes_.size() - 1;
  std::vector<uint8_t> child_and(max_depth_ + 2, 0xFF);  // per depth: AND of ok-masks of the children seen
  for (size_t i = n; i-- > 0;) {
    Node &node = nodes_[i];
    const uint8_t kids = child_and[node.depth + 1];
    child_and[node.depth + 1] = 0xFF;
    node.utf8_below = (kids >> kBoundary) & 1;
    uint8_t ok = 0;
    for (int d = 0; d < kUtf8States; ++d) {
      const int next = utf8_next(d, node.byte);
      if (next >= 0 && ((kids >> next) & 1)) ok |= uint8_t(1u << d);
    }
    child_and[node.depth] &= ok;
  }
}

const uint64_t *TokenTrie::self_loops(GrammarMatcher &m, int32_t state) const {
  const size_t at = size_t(state) * 2;
  if (self_groups_.size() < at + 2) self_groups_.resize(at + 2, 0);
  if (self_groups_[at + 1] & kComputed) return &self_groups_[at];
  uint64_t groups = 0;
  auto loops = [&](uint32_t b0, uint32_t b1) {
    for (uint32_t b = b0; b <= b1; ++b)
      if (m.step(state, uint8_t(b)) != state) return false;
    return true;
  };
  if (loops(0, 3)) groups |= uint64_t(1) << 1;
  for (uint32_t g = 2; g < 64; ++g)
    if (loops(2 * g, 2 * g + 1)) groups |= uint64_t(1) << g;
  uint64_t flags = kComputed;
  // One non-ASCII character (U+00E9) stands for all of them when they all act alike.
  if (m.non_ascii_uniform(state)) {
    const int32_t mid = m.step(state, 0xC3);
    if (mid >= 0 && m.step(mid, 0xA9) == state) flags |= kTransparent;
  }
  self_groups_[at] = groups;
  self_groups_[at + 1] = flags;
  return &self_groups_[at];
}

void TokenTrie::walk(GrammarMatcher &m, int32_t state, uint8_t *allowed) const {
  std::vector<int32_t> at(max_depth_ + 1);
  at[0] = state;
  const uint32_t n = uint32_t(nodes_.size() - 1);
  const std::vector<int32_t> &table = m.transitions();
  int32_t loop_state = -1;  // the state whose self-loop groups are in loops
  uint64_t loops = 0;
  bool transparent = false;
  for (uint32_t i = 0; i < n;) {
    const Node &node = nodes_[i];
    const int32_t from = at[node.depth - 1];
    int32_t s = table[size_t(from) * 256 + node.byte];  // cached after the first steps
    if (s == GrammarMatcher::kNotComputed) s = m.step(from, node.byte);
    if (s < 0) {
      i = node.end;
      continue;
    }
    if (node.below != 0) {
      if (s != loop_state) {
        const uint64_t *sl = self_loops(m, s);
        loops = sl[0];
        transparent = (sl[1] & kTransparent) != 0;
        loop_state = s;
      }
      // Everything below stays in s (ASCII bytes that loop; whole characters when s takes
      // every one and the bytes below are valid UTF-8): all allowed.
      const uint64_t ascii_below = node.below & ~uint64_t(1);
      const bool high_ok = !(node.below & 1) || (transparent && node.utf8_below);
      if ((ascii_below & ~loops) == 0 && high_ok) {
        for (uint32_t t = node.tok_begin; t < nodes_[node.end].tok_begin; ++t) allowed[tokens_[t]] = 1;
        i = node.end;
        continue;
      }
    }
    at[node.depth] = s;
    for (uint32_t t = node.tok_begin; t < nodes_[i + 1].tok_begin; ++t) allowed[tokens_[t]] = 1;
    ++i;
  }
}

namespace {

std::vector<std::string> vocab_pieces(const Vocab &v) {
  std::vector<std::string> p(size_t(v.n_tokens()));
  for (int32_t i = 0; i < v.n_tokens(); ++i)
    if (!v.is_eog(i)) p[size_t(i)] = v.token_to_piece(i, false);
  return p;
}

}  // namespace

GrammarStage::GrammarStage(const Grammar &g, const Vocab &vocab)
    : matcher_(g), pieces_(vocab_pieces(vocab)), eog_(size_t(vocab.n_tokens()), 0), trie_(pieces_) {
  for (int32_t id : vocab.eog_ids())
    if (id >= 0 && id < vocab.n_tokens()) {
      eog_[size_t(id)] = 1;
      eog_ids_.push_back(id);
    }
}

bool GrammarStage::token_allowed(int32_t id) {
  if (id < 0 || size_t(id) >= pieces_.size()) return false;
  if (eog_[size_t(id)]) return matcher_.is_complete();
  const std::string &p = pieces_[size_t(id)];
  if (p.empty()) return false;
  int32_t s = matcher_.state();
  for (char c : p) {
    s = matcher_.step(s, static_cast<uint8_t>(c));
    if (s < 0) return false;
  }
  return true;
}

void GrammarStage::allowed_tokens(std::vector<uint8_t> &allowed) {
  const int32_t state = matcher_.state();
  for (const auto &cached : mask_cache_)
    if (cached.first == state) {
      allowed = cached.second;
      return;
    }
  allowed.assign(pieces_.size(), 0);
  trie_.walk(matcher_, state, allowed.data());
  const uint8_t eog_ok = matcher_.is_complete() ? 1 : 0;
  for (int32_t id : eog_ids_) allowed[size_t(id)] = eog_ok;
  if (mask_cache_.size() < kMaskCacheSize) mask_cache_.emplace_back(state, allowed);
  else mask_cache_[mask_cache_next_++ % kMaskCacheSize] = {state, allowed};
}

void GrammarStage::apply(Candidates &c, Rng & /*rng*/) {
  size_t kept = 0;
  // A long candidate list is masked from one trie walk; a short one (after top-k) token by token.
  if (c.data.size() * 8 >= pieces_.size()) {
    allowed_tokens(mask_);
    for (TokenCandidate &t : c.data) {
      const bool ok = t.id >= 0 && size_t(t.id) < mask_.size() && mask_[size_t(t.id)];
      if (!ok) t.logit = -INFINITY;
      kept += ok;
    }
  } else {
    for (TokenCandidate &t : c.data) {
      const bool ok = token_allowed(t.id);
      if (!ok) t.logit = -INFINITY;
      kept += ok;
    }
  }
  c.sorted = false;
  if (kept == 0)
    fail(Status::InvalidArgument,
         "grammar: no candidate token can continue the grammar (put the grammar stage before stages that drop "
         "candidates)");
}

void GrammarStage::accept(int32_t token) {
  if (token < 0 || size_t(token) >= pieces_.size())
    fail(Status::InvalidArgument, "grammar: token %d is outside the vocabulary", token);
  if (eog_[size_t(token)]) {
    if (!matcher_.is_complete())
      fail(Status::InvalidArgument, "grammar: end-of-generation token %d before the grammar is complete", token);
    return;
  }
  const std::string &p = pieces_[size_t(token)];
  if (p.empty() || !matcher_.accept_bytes(p))
    fail(Status::InvalidArgument, "grammar: token %d (\"%s\") does not continue the grammar", token, p.c_str());
}

void GrammarStage::reset() { matcher_.reset(); }

}  // namespace moe
