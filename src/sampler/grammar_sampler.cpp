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
      nodes_.push_back(Node{0, 0, uint32_t(tokens_.size()), uint32_t(d + 1), static_cast<uint8_t>(s[d])});
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
  nodes_.push_back(Node{0, 0, uint32_t(tokens_.size()), 0, 0});  // sentinel
}

uint64_t TokenTrie::self_loops(GrammarMatcher &m, int32_t state) const {
  const size_t at = size_t(state) * 2;
  if (self_groups_.size() < at + 2) self_groups_.resize(at + 2, 0);
  if (self_groups_[at + 1]) return self_groups_[at];
  uint64_t groups = 0;
  for (uint32_t g = 1; g < 64; ++g)
    if (m.step(state, uint8_t(2 * g)) == state && m.step(state, uint8_t(2 * g + 1)) == state) groups |= uint64_t(1) << g;
  self_groups_[at] = groups;
  self_groups_[at + 1] = 1;
  return groups;
}

void TokenTrie::walk(GrammarMatcher &m, int32_t state, uint8_t *allowed) const {
  std::vector<int32_t> at(max_depth_ + 1);
  at[0] = state;
  const uint32_t n = uint32_t(nodes_.size() - 1);
  const std::vector<int32_t> &table = m.transitions();
  int32_t loop_state = -1;  // the state whose self-loop groups are in loops
  uint64_t loops = 0;
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
        loops = self_loops(m, s);
        loop_state = s;
      }
      if ((node.below & ~loops) == 0) {  // everything below stays in s: all allowed
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
