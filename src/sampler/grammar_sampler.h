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
    uint64_t below;      // byte groups (byte_group) of every node below this one
    uint32_t end;        // index after this node's subtree
    uint32_t tok_begin;  // tokens ending here: tokens_[tok_begin, next node's tok_begin)
    uint32_t depth;      // 1 for a first byte
    uint8_t byte;
    bool utf8_below;     // every byte string below, read from a character boundary, is valid
                         // UTF-8 (a last character may be unfinished)
  };
  std::vector<Node> nodes_;  // + a sentinel whose tok_begin is tokens_.size()
  std::vector<int32_t> tokens_;
  uint32_t max_depth_ = 0;
  // Per automaton state (two words): the byte groups whose bytes all lead back to the state,
  // and flags (kComputed; kTransparent: every non-ASCII character leads back too). A subtree
  // whose bytes all come back to the state is allowed whole without walking it: most of a
  // vocabulary inside a JSON string.
  static constexpr uint64_t kComputed = 1, kTransparent = 2;
  mutable std::vector<uint64_t> self_groups_;
  const uint64_t *self_loops(GrammarMatcher &m, int32_t state) const;
  void mark_utf8();
};

// 64 groups: group 0 = every byte >= 0x80 (multi-byte characters, see kTransparent);
// group 1 = bytes 0x00-0x03; other ASCII bytes in pairs (b >> 1).
inline uint32_t byte_group(uint8_t b) { return b >= 0x80 ? 0 : b < 4 ? 1 : b >> 1; }

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
  std::vector<int32_t> eog_ids_;
  TokenTrie trie_;
  std::vector<uint8_t> mask_;
  // Masks of recently seen states (a long string or number revisits one state per token).
  static constexpr size_t kMaskCacheSize = 8;
  std::vector<std::pair<int32_t, std::vector<uint8_t>>> mask_cache_;
  size_t mask_cache_next_ = 0;

  bool token_allowed(int32_t id);
};

}  // namespace moe
