// GBNF grammars (the reference engine's syntax) and the matcher that constrains sampling.
//
//   Grammar g = parse_gbnf(R"(root ::= "yes" | "no")", "root");   // throws Error(InvalidArgument)
//   GrammarMatcher m(g);
//   m.accept_bytes("ye");          // false when the bytes break the grammar (state unchanged)
//   m.is_complete();               // true once the root rule can end here
//
// Syntax: `name ::= alternatives` rules; `|` alternation; `( )` grouping; `*`, `+`, `?`,
// `{m}`, `{m,}`, `{m,n}` repetition; "string" literals; [a-z0-9] classes, [^...] negation;
// `.` any character; escapes \n \r \t \\ \" \] \[ \- \xHH \uHHHH \UHHHHHHHH; `#` comments.
//
// Matching works on code points; the byte-level automaton (GrammarMatcher) takes UTF-8 bytes,
// so a token ending inside a multi-byte character is allowed when some character starting
// with those bytes can continue the grammar. States (sets of parse stacks plus a partial
// character) are interned and their byte transitions cached, so after warm-up one byte costs
// one table lookup.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moe {

// A set of code points: ranges [lo, hi], optionally negated; ASCII membership is a bitmap.
struct CharClass {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  bool negated = false;
  uint64_t ascii[2] = {0, 0};

  void finish();  // fills the ASCII bitmap from ranges and negated
  bool contains(uint32_t cp) const;
  // Whether some code point in [lo, hi] is in the class (partial UTF-8 characters).
  bool intersects(uint32_t lo, uint32_t hi) const;
  // Whether every code point in [lo, hi] except surrogates is in the class.
  bool covers(uint32_t lo, uint32_t hi) const;
};

// Compiled grammar: every rule is a list of alternatives laid out in `elems`, each a sequence
// of Char / Rule elements closed by an End element. Repetition and groups became helper rules.
struct Grammar {
  enum class Kind : uint8_t { End, Char, Rule };
  struct Elem {
    Kind kind;
    uint32_t arg;  // Char: index in classes; Rule: rule id
  };
  std::vector<Elem> elems;
  std::vector<CharClass> classes;
  std::vector<std::vector<uint32_t>> rule_alts;  // per rule: start index of each alternative
  std::vector<std::string> rule_names;           // helper rules are named "<parent>-<n>"
  uint32_t root = 0;
};

// Parses GBNF text; root names the start rule. Errors (syntax, undefined rule, missing root,
// left recursion) throw Error(InvalidArgument) naming the rule and line.
Grammar parse_gbnf(const std::string &text, const std::string &root = "root");

// Byte-level matcher over a Grammar: the automaton (interned states, cached transitions)
// plus the current state. step() walks the automaton from any state without moving the
// matcher, which is how the sampler tests every token of the vocabulary.
class GrammarAutomaton;

class GrammarMatcher {
public:
  explicit GrammarMatcher(const Grammar &g);
  ~GrammarMatcher();
  GrammarMatcher(const GrammarMatcher &) = delete;
  GrammarMatcher &operator=(const GrammarMatcher &) = delete;

  // Feeds bytes; returns false (and keeps the state) when they break the grammar.
  bool accept_bytes(const std::string &bytes);
  // Whether the grammar can end here (no partial character pending).
  bool is_complete() const;
  // Whether nothing but the end can follow (complete and no character continues it).
  bool only_end() const;
  // Restarts at the root.
  void reset();

  // Low-level access for the vocabulary walk: state ids, -1 = dead.
  int32_t state() const { return state_; }
  int32_t step(int32_t state, uint8_t byte);
  // The transition cache: entry state * 256 + byte is the next state, -1 dead, kNotComputed
  // unknown (then call step). Read it afresh after step(): it grows with new states.
  const std::vector<int32_t> &transitions() const;
  // Whether every non-ASCII character does the same thing from state (each parse's next
  // class holds all of them or none), so one character tells what all of them do.
  bool non_ascii_uniform(int32_t state) const;
  static constexpr int32_t kNotComputed = -2;
  bool state_complete(int32_t state) const;
  size_t n_states() const;

private:
  std::unique_ptr<GrammarAutomaton> a_;
  int32_t initial_;
  int32_t state_;
};

}  // namespace moe
