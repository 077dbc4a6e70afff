// Grammar-constrained sampling: a chain stage that sets the logit of every token that would
// break the grammar to -INFINITY, and advances the grammar by each accepted token.
//
//   auto stage = std::make_unique<GrammarStage>(parse_gbnf(text, "root"), *vocab);
//   chain.add(std::move(stage));   // first in the chain, before any stage that selects
//
// A token is matched over its bytes (token_to_piece without special rendering); tokens with
// no bytes (control tokens) are never allowed, except end-of-generation tokens, which are
// allowed exactly when the grammar is complete. Once nothing but the end can follow, only
// end-of-generation tokens remain.
#pragma once
#include <string>
#include <vector>

#include "sampler/grammar.h"
#include "sampler/sampler.h"

namespace moe {

class Vocab;

// The byte strings of a vocabulary as a trie in preorder: walking it against the grammar
// automaton skips a whole subtree at the first byte that breaks the grammar, so the cost is
// the number of live prefixes, not the vocabulary size times token length.
class TokenTrie {
public:
  explicit TokenTrie(const std::vector<std::string> &pieces);  // empty pieces are left out
  // allowed[id] = 1 for every token whose bytes lead from state to a live state.
  void walk(GrammarMatcher &m, int32_t state, uint8_t *allowed) const;
  size_t n_nodes() const { return nodes_.size(); }

private:
  struct Node {
    uint32_t end;        // index after this node's subtree
    uint32_t tok_begin;  // tokens ending here: tokens_[tok_begin, tok_end)
    uint32_t tok_end;
    uint32_t depth;      // 1 for a first byte
    uint8_t byte;
  };
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
  uint32_t max_depth_ = 0;
};

class GrammarStage : public SamplerStage {
public:
  GrammarStage(const Grammar &g, const Vocab &vocab);
  void apply(Candidates &c, Rng &rng) override;
  // Throws Error(InvalidArgument) for a token the grammar does not allow (nothing changes).
  void accept(int32_t token) override;
  void reset() override;

  // Fills allowed[0..n_vocab) for the current state (1 = may be sampled).
  void allowed_tokens(std::vector<uint8_t> &allowed);
  bool is_complete() const { return matcher_.is_complete(); }

private:
  GrammarMatcher matcher_;
  std::vector<std::string> pieces_;
  std::vector<uint8_t> eog_;
  TokenTrie trie_;
  std::vector<uint8_t> mask_;

  bool token_allowed(int32_t id);
};

}  // namespace moe
