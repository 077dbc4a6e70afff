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
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return pieces[size_t(a)] < pieces[size_t(b)] || (pieces[size_t(a)] == pieces[size_t(b)] && a < b); });
  // In sorted order each string adds the nodes of its bytes after the prefix it shares with
  // the previous one; that sequence of nodes is the trie's preorder.
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
      nodes_.push_back(Node{0, 0, 0, uint32_t(d + 1), static_cast<uint8_t>(s[d])});
    }
    Node &last = nodes_[path.back()];
    if (last.tok_begin == last.tok_end) last.tok_begin = last.tok_end = uint32_t(tokens_.size());
    tokens_.push_back(id);
    last.tok_end = uint32_t(tokens_.size());
    max_depth_ = std::max(max_depth_, uint32_t(s.size()));
    prev = &s;
  }
  // Subtree ends: a node's subtree stops at the next node no deeper than itself.
  std::vector<uint32_t> open;
  for (uint32_t i = 0; i < nodes_.size(); ++i) {
    while (!open.empty() && nodes_[open.back()].depth >= nodes_[i].depth) {
      nodes_[open.back()].end = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  for (uint32_t i : open) nodes_[i].end = uint32_t(nodes_.size());
}

void TokenTrie::walk(GrammarMatcher &m, int32_t state, uint8_t *allowed) const {
  std::vector<int32_t> at(max_depth_ + 1);
  at[0] = state;
  const uint32_t n = uint32_t(nodes_.size());
  for (uint32_t i = 0; i < n;) {
    const Node &node = nodes_[i];
    const int32_t s = m.step(at[node.depth - 1], node.byte);
    if (s < 0) {
      i = node.end;
      continue;
    }
    at[node.depth] = s;
    for (uint32_t t = node.tok_begin; t < node.tok_end; ++t) allowed[tokens_[t]] = 1;
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
  for (int32_t id : vocab.eog_ids()) eog_[size_t(id)] = 1;
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
  allowed.assign(pieces_.size(), 0);
  trie_.walk(matcher_, matcher_.state(), allowed.data());
  const bool complete = matcher_.is_complete();
  for (size_t i = 0; i < eog_.size(); ++i)
    if (eog_[i]) allowed[i] = complete ? 1 : 0;
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
