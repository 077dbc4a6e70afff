// GBNF parsing and matching: strings each grammar must accept or reject (written from the
// syntax's meaning), partial UTF-8, errors, and the vocabulary mask of GrammarStage against
// a token-by-token check on the real Qwen3 vocabulary.
#include <unistd.h>

#include <catch2/catch.hpp>

#include "core/status.h"
#include "gguf/gguf_reader.h"
#include "sampler/grammar.h"
#include "sampler/grammar_sampler.h"
#include "tokenizer/vocab.h"

using namespace moe;

namespace {

// Whole string matched and the grammar complete there.
bool accepts(const std::string &gbnf, const std::string &s) {
  GrammarMatcher m(parse_gbnf(gbnf));
  return m.accept_bytes(s) && m.is_complete();
}
// s can be continued into a match (every byte kept).
bool prefix_ok(const std::string &gbnf, const std::string &s) {
  GrammarMatcher m(parse_gbnf(gbnf));
  return m.accept_bytes(s);
}
Status parse_error(const std::string &gbnf, std::string *msg = nullptr) {
  try {
    parse_gbnf(gbnf);
  } catch (const Error &e) {
    if (msg) *msg = e.what();
    return e.code();
  }
  return Status::Ok;
}

}  // namespace

TEST_CASE("gbnf: literals and alternation", "[grammar]") {
  const char *g = R"(root ::= "yes" | "no")";
  CHECK(accepts(g, "yes"));
  CHECK(accepts(g, "no"));
  CHECK_FALSE(accepts(g, "ye"));
  CHECK(prefix_ok(g, "ye"));
  CHECK_FALSE(prefix_ok(g, "yesno"));
  CHECK_FALSE(prefix_ok(g, "maybe"));
  CHECK_FALSE(accepts(g, ""));
}

TEST_CASE("gbnf: character classes, ranges and negation", "[grammar]") {
  const char *g = R"(root ::= [a-c]+ [0-9])";
  CHECK(accepts(g, "abc1"));
  CHECK(accepts(g, "a9"));
  CHECK_FALSE(prefix_ok(g, "d"));
  CHECK_FALSE(accepts(g, "abc"));
  CHECK_FALSE(prefix_ok(g, "1"));
  const char *q = R"(root ::= "\"" [^"\\]* "\"")";
  CHECK(accepts(q, "\"hi there\""));
  CHECK(accepts(q, "\"\""));
  CHECK_FALSE(prefix_ok(q, "\"h\"i"));
  CHECK_FALSE(prefix_ok(q, "\"a\\"));
  CHECK(accepts(R"(root ::= [-a]+)", "-a-"));         // '-' first is literal
  CHECK(accepts(R"(root ::= [\]\\]+)", "]\\]"));      // escaped ] and backslash in a class
  CHECK_FALSE(prefix_ok(R"(root ::= [^a-z0-9])", "q"));
  CHECK(accepts(R"(root ::= [^a-z0-9])", "Q"));
}

TEST_CASE("gbnf: repetition operators", "[grammar]") {
  const char *r = R"(root ::= "a"{2,3})";
  CHECK_FALSE(accepts(r, "a"));
  CHECK(accepts(r, "aa"));
  CHECK(accepts(r, "aaa"));
  CHECK_FALSE(prefix_ok(r, "aaaa"));
  CHECK(accepts(R"(root ::= "ab"{2})", "abab"));
  CHECK_FALSE(accepts(R"(root ::= "ab"{2})", "ab"));
  CHECK_FALSE(prefix_ok(R"(root ::= "ab"{2})", "ababa"));
  CHECK(accepts(R"(root ::= "a"{2,} "b")", "aaaaab"));
  CHECK_FALSE(accepts(R"(root ::= "a"{2,} "b")", "ab"));
  CHECK(accepts(R"(root ::= "a"{0,2} "b")", "b"));
  CHECK(accepts(R"(root ::= "x" "y"?)", "x"));
  CHECK(accepts(R"(root ::= "x" "y"?)", "xy"));
  CHECK_FALSE(prefix_ok(R"(root ::= "x" "y"?)", "xyy"));
  CHECK(accepts(R"(root ::= "x"*)", ""));
  CHECK(accepts(R"(root ::= "x"*)", "xxxx"));
  CHECK_FALSE(accepts(R"(root ::= "x"+)", ""));
}

TEST_CASE("gbnf: grouping, rule references and recursion", "[grammar]") {
  const char *g = R"(root ::= ("ab" | "c")* "d")";
  CHECK(accepts(g, "ababcd"));
  CHECK(accepts(g, "d"));
  CHECK_FALSE(prefix_ok(g, "ad"));
  const char *parens = R"g(
    root ::= item*
    item ::= "(" root ")"   # nested
  )g";
  CHECK(accepts(parens, "(()())"));
  CHECK(accepts(parens, ""));
  CHECK_FALSE(accepts(parens, "(()"));
  CHECK_FALSE(prefix_ok(parens, ")("));
  const char *multi = R"(
    # a command language
    root ::= cmd " " arg
    cmd  ::= "go"
           | "look"
    arg  ::= [a-z]+
  )";
  CHECK(accepts(multi, "go north"));
  CHECK(accepts(multi, "look up"));
  CHECK_FALSE(prefix_ok(multi, "jump"));
}

TEST_CASE("gbnf: start rule by name", "[grammar]") {
  GrammarMatcher m(parse_gbnf(R"(expr ::= "1" ("+" expr)?)", "expr"));
  CHECK(m.accept_bytes("1+1+1"));
  CHECK(m.is_complete());
}

TEST_CASE("gbnf: escapes and UTF-8", "[grammar]") {
  CHECK(accepts(R"(root ::= "\x41\u00e9\n" [\t-\r])", "A\xC3\xA9\n\t"));
  CHECK(accepts(R"(root ::= "\U0001F600")", "\xF0\x9F\x98\x80"));
  const char *greek = R"(root ::= [α-ω]+)";
  CHECK(accepts(greek, "\xCE\xB1\xCE\xB2\xCE\xB3"));  // αβγ
  CHECK_FALSE(prefix_ok(greek, "\xCE\xB1" "b"));
  // A token may end inside a character: the first byte of α is kept, € (E2 82 AC) is not.
  GrammarMatcher m(parse_gbnf(greek));
  CHECK(m.accept_bytes("\xCE"));
  CHECK_FALSE(m.is_complete());
  CHECK(m.accept_bytes("\xB1"));
  CHECK(m.is_complete());
  CHECK_FALSE(m.accept_bytes("\xE2\x82"));
  CHECK(m.is_complete());  // the failed bytes changed nothing
  const char *any = R"(root ::= "a" . "c")";
  CHECK(accepts(any, "abc"));
  CHECK(accepts(any, "a\xC3\xA9" "c"));
  CHECK_FALSE(accepts(any, "ac"));
}

TEST_CASE("gbnf: invalid UTF-8 never matches", "[grammar]") {
  const char *g = R"(root ::= .*)";
  CHECK(accepts(g, "ok \xE2\x82\xAC"));
  CHECK_FALSE(prefix_ok(g, "\xED\xA0\x80"));      // surrogate U+D800
  CHECK_FALSE(prefix_ok(g, "\xC0\x80"));          // overlong NUL
  CHECK_FALSE(prefix_ok(g, "\xE0\x80\x80"));      // overlong
  CHECK_FALSE(prefix_ok(g, "\xF4\x90\x80\x80"));  // above U+10FFFF
  CHECK_FALSE(prefix_ok(g, "\x80"));              // continuation without a lead
  CHECK_FALSE(prefix_ok(g, "\xCE" "a"));          // lead without its continuation
}

TEST_CASE("gbnf: completion and the end", "[grammar]") {
  GrammarMatcher one(parse_gbnf(R"(root ::= "a")"));
  CHECK_FALSE(one.is_complete());
  REQUIRE(one.accept_bytes("a"));
  CHECK(one.only_end());
  GrammarMatcher many(parse_gbnf(R"(root ::= "a"+)"));
  REQUIRE(many.accept_bytes("a"));
  CHECK(many.is_complete());
  CHECK_FALSE(many.only_end());
  many.reset();
  CHECK_FALSE(many.is_complete());
}

TEST_CASE("gbnf: errors name the problem", "[grammar]") {
  std::string msg;
  CHECK(parse_error(R"(root ::= item)", &msg) == Status::InvalidArgument);
  CHECK(msg.find("'item'") != std::string::npos);
  CHECK(parse_error(R"(other ::= "a")", &msg) == Status::InvalidArgument);
  CHECK(msg.find("root") != std::string::npos);
  CHECK(parse_error(R"(root ::= root "a" | "a")", &msg) == Status::InvalidArgument);
  CHECK(msg.find("left-recursive") != std::string::npos);
  CHECK(parse_error(R"(root ::= x? root "a" | "a"
x ::= "b")") == Status::InvalidArgument);  // left recursion behind a nullable symbol
  CHECK(parse_error(R"(root ::= ("a")") == Status::InvalidArgument);
  CHECK(parse_error(R"(root ::= [z-a])") == Status::InvalidArgument);
  CHECK(parse_error(R"(root ::= "abc)") == Status::InvalidArgument);
  CHECK(parse_error(R"(root ::= "a"{3,1})") == Status::InvalidArgument);
  CHECK(parse_error(R"(root ::= "\q")") == Status::InvalidArgument);
  CHECK(parse_error("root ::= \"a\"\nroot ::= \"b\"", &msg) == Status::InvalidArgument);
  CHECK(msg.find("twice") != std::string::npos);
  CHECK(parse_error(R"(root = "a")") == Status::InvalidArgument);
}

TEST_CASE("grammar stage: trie mask equals a token-by-token check on the Qwen3 vocabulary", "[grammar]") {
  const std::string path = std::string(MOEINFER_CONFORMANCE_DIR) + "/models/qwen3moe-f16.gguf";
  if (access(path.c_str(), R_OK) != 0) {
    WARN("SKIPPED: " << path << " not found");
    return;
  }
  auto file = GgufFile::open(path);
  auto vocab = Vocab::from_gguf(*file);
  REQUIRE(vocab);
  // Byte-level vocabulary: every byte is a token of its own, so any prefix can be fed.
  std::vector<int32_t> byte_token(256, -1);
  std::vector<std::string> pieces(size_t(vocab->n_tokens()));
  for (int32_t id = 0; id < vocab->n_tokens(); ++id) {
    const std::string &piece = pieces[size_t(id)] = vocab->is_eog(id) ? std::string() : vocab->token_to_piece(id, false);
    if (piece.size() == 1 && byte_token[static_cast<uint8_t>(piece[0])] < 0) byte_token[static_cast<uint8_t>(piece[0])] = id;
  }
  // The string takes any character, or all but a few non-ASCII ones (then a subtree with
  // multi-byte characters cannot be taken whole).
  for (const char *chars : {R"([^"\\])", R"([^"\\\u00e9\u4e00-\u4eff])"}) {
    const std::string g = std::string(R"(root ::= "{\"name\": \"" )") + chars +
                          R"({0,12} "\", \"n\": " [0-9]+ ", \"ok\": " ("true" | "false") "}")";
    INFO("grammar " << g);
    const Grammar grammar = parse_gbnf(g);
    // Positions inside the literal, the string (one inside a character), the number, and after the end.
    for (const std::string prefix : {"", "{\"na", "{\"name\": \"Zo\xC3", "{\"name\": \"Zo\xC3\xA4", "{\"name\": \"x\", \"n\": 4",
                                     "{\"name\": \"\", \"n\": 0, \"ok\": true}"}) {
      GrammarStage stage(grammar, *vocab);
      GrammarMatcher probe(grammar);
      REQUIRE(probe.accept_bytes(prefix));
      for (char c : prefix) {
        REQUIRE(byte_token[static_cast<uint8_t>(c)] >= 0);
        stage.accept(byte_token[static_cast<uint8_t>(c)]);
      }
      std::vector<uint8_t> mask;
      stage.allowed_tokens(mask);
      size_t n_allowed = 0, mismatches = 0;
      for (int32_t id = 0; id < vocab->n_tokens(); ++id) {
        bool expect;
        if (vocab->is_eog(id)) {
          expect = probe.is_complete();
        } else {
          const std::string &piece = pieces[size_t(id)];
          int32_t st = probe.state();
          for (size_t k = 0; k < piece.size() && st >= 0; ++k) st = probe.step(st, static_cast<uint8_t>(piece[k]));
          expect = !piece.empty() && st >= 0;
        }
        n_allowed += mask[size_t(id)];
        mismatches += (mask[size_t(id)] != 0) != expect;
      }
      INFO("prefix '" << prefix << "': " << n_allowed << " allowed");
      CHECK(mismatches == 0);
      CHECK(n_allowed > 0);
    }
    // After the closing brace only end-of-generation tokens remain.
    GrammarStage done(grammar, *vocab);
    for (char c : std::string("{\"name\": \"\", \"n\": 0, \"ok\": true}")) done.accept(byte_token[static_cast<uint8_t>(c)]);
    std::vector<uint8_t> mask;
    done.allowed_tokens(mask);
    size_t wrong = 0;
    for (int32_t id = 0; id < vocab->n_tokens(); ++id) wrong += (mask[size_t(id)] != 0) != vocab->is_eog(id);
    CHECK(wrong == 0);
  }
}
