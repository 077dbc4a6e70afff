// Tokenizer on small self-made vocabularies: BPE merges, special tokens, flags, malformed
// vocabularies, decoding, streaming, round trips. Expected ids are worked out by hand from the
// vocabulary definitions (byte b has id b; merge k produces id 256 + k).
#include <catch2/catch.hpp>

#include "core/status.h"
#include "test_tokenizer_util.h"
#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/vocab.h"

using namespace moe;
using namespace tok_test;

namespace {

std::vector<int32_t> bytes_of(const std::string &s) {
  std::vector<int32_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

BpeSpec hello_spec() {
  BpeSpec s;
  s.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"},
              {"o", "r"}, {" w", "or"}, {"l", "d"}, {" wor", "ld"}};  // ids 256..264
  s.extra = {{"<|endoftext|>", TOKEN_TYPE_CONTROL}, {"<think>", TOKEN_TYPE_USER_DEFINED}};  // 265, 266
  return s;
}

Status vocab_status(const BpeSpec &s, bool allow_unknown_pre = false) {
  try {
    load_vocab(s.write(), allow_unknown_pre);
  } catch (const Error &e) {
    return e.code();
  }
  return Status::Ok;
}

bool valid_utf8(const std::string &s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

}  // namespace

TEST_CASE("tokenizer: BPE merges apply by rank", "[tokenizer]") {
  auto v = load_vocab(hello_spec().write());
  REQUIRE(v);
  CHECK(v->n_tokens() == 267);
  CHECK(v->n_merges() == 9);
  CHECK(v->encode("hello world", false, false) == std::vector<int32_t>{259, 264});
  CHECK(v->encode("hello", false, false) == std::vector<int32_t>{259});
  // no merge for "hel" beyond "he": h e l -> he l
  CHECK(v->encode("hel", false, false) == std::vector<int32_t>{256, 'l'});
  CHECK(v->encode("", true, true).empty());

  // The lower rank wins regardless of position: with "b c" ranked before "a b", "abc" -> a|bc.
  BpeSpec s1;
  s1.merges = {{"b", "c"}, {"a", "b"}};
  CHECK(load_vocab(s1.write())->encode("abc", false, false) == std::vector<int32_t>{'a', 256});
  BpeSpec s2;
  s2.merges = {{"a", "b"}, {"b", "c"}};
  CHECK(load_vocab(s2.write())->encode("abc", false, false) == std::vector<int32_t>{256, 'c'});
  // Equal ranks cannot happen, but the same pair twice must merge leftmost first: "aaa" -> aa|a.
  BpeSpec s3;
  s3.merges = {{"a", "a"}};
  CHECK(load_vocab(s3.write())->encode("aaa", false, false) == std::vector<int32_t>{256, 'a'});
}

TEST_CASE("tokenizer: long words use the same merge order as short ones", "[tokenizer]") {
  BpeSpec s;
  s.merges = {{"a", "b"}, {"ab", "ab"}, {"c", "d"}};  // 256 ab, 257 abab, 258 cd
  auto v = load_vocab(s.write());
  std::string w;
  std::vector<int32_t> want;
  for (int i = 0; i < 50; ++i) { w += "ababcd"; want.push_back(257); want.push_back(258); }
  // 300 letters in one word: goes through the priority-queue path
  CHECK(v->encode(w, false, false) == want);
  CHECK(v->encode("ababcd", false, false) == std::vector<int32_t>{257, 258});
}

TEST_CASE("tokenizer: special and user-defined tokens", "[tokenizer]") {
  auto v = load_vocab(hello_spec().write());
  std::string text = "<think>hi<|endoftext|>";
  // parse_special on: both matched
  CHECK(v->encode(text, false, true) == std::vector<int32_t>{266, 'h', 'i', 265});
  // off: the control token is plain text, the user-defined one still matches
  std::vector<int32_t> want{266, 'h', 'i'};
  for (int32_t b : bytes_of("<|endoftext|>")) want.push_back(b);
  CHECK(v->encode(text, false, false) == want);
  // <|endoftext|> is an end-of-generation token found by name
  CHECK(v->is_eog(265));
  CHECK(v->token_type(265) == TOKEN_TYPE_CONTROL);
  CHECK(v->token_type(266) == TOKEN_TYPE_USER_DEFINED);
  CHECK(v->eot() == 265);

  // Longer special tokens are cut out first, even when a shorter one starts earlier.
  BpeSpec s;
  s.extra = {{"ABC", TOKEN_TYPE_USER_DEFINED}, {"XA", TOKEN_TYPE_USER_DEFINED}};  // 256, 257
  auto v2 = load_vocab(s.write());
  CHECK(v2->encode("XABC", false, false) == std::vector<int32_t>{'X', 256});
  CHECK(v2->encode("XAXABC", false, false) == std::vector<int32_t>{257, 'X', 256});
  // Non-overlapping, leftmost first: "XAA" is XA|A
  CHECK(v2->encode("XAA", false, false) == std::vector<int32_t>{257, 'A'});
}

TEST_CASE("tokenizer: add_special follows the vocabulary flags", "[tokenizer]") {
  BpeSpec s = hello_spec();
  s.ints["tokenizer.ggml.bos_token_id"] = 265;
  s.ints["tokenizer.ggml.eos_token_id"] = 266;
  auto v = load_vocab(s.write());
  CHECK_FALSE(v->add_bos());  // gpt2 default
  CHECK(v->encode("hello", true, false) == std::vector<int32_t>{259});
  CHECK(v->bos() == 265);
  CHECK(v->eos() == 266);
  CHECK(v->is_eog(266));  // the eos is always end-of-generation

  s.flags["tokenizer.ggml.add_bos_token"] = true;
  s.flags["tokenizer.ggml.add_eos_token"] = true;
  v = load_vocab(s.write());
  CHECK(v->add_bos());
  CHECK(v->encode("hello", true, false) == std::vector<int32_t>{265, 259, 266});
  CHECK(v->encode("hello", false, false) == std::vector<int32_t>{259});
  CHECK(v->encode("", true, false) == std::vector<int32_t>{265, 266});

  // llama3 pre-tokenizers add BOS by default and take whole words from the vocabulary
  BpeSpec l3 = hello_spec();
  l3.pre = "llama-bpe";
  l3.ints["tokenizer.ggml.bos_token_id"] = 265;
  auto v3 = load_vocab(l3.write());
  CHECK(v3->add_bos());
  CHECK(v3->encode("hello", true, false) == std::vector<int32_t>{265, 259});
}

TEST_CASE("tokenizer: malformed vocabularies are rejected with InvalidVocab", "[tokenizer]") {
  CHECK(vocab_status(hello_spec()) == Status::Ok);
  {
    BpeSpec s = hello_spec();
    s.raw_merges = {bl("q") + " " + bl("\xff\xfe")};  // second half is not a token
    CHECK(vocab_status(s) == Status::InvalidVocab);
  }
  {
    BpeSpec s = hello_spec();
    s.raw_merges = {bl("x") + " " + bl("y")};  // "xy" is not a token
    CHECK(vocab_status(s) == Status::InvalidVocab);
  }
  {
    BpeSpec s = hello_spec();
    s.raw_merges = {"abc"};  // no separator
    CHECK(vocab_status(s) == Status::InvalidVocab);
  }
  {
    BpeSpec s = hello_spec();
    s.extra.push_back({bl("he"), TOKEN_TYPE_NORMAL});  // duplicate of merge result 256
    CHECK(vocab_status(s) == Status::InvalidVocab);
  }
  {
    BpeSpec s = hello_spec();
    s.ints["tokenizer.ggml.bos_token_id"] = 267;  // == n_tokens
    CHECK(vocab_status(s) == Status::InvalidVocab);
    s.ints["tokenizer.ggml.bos_token_id"] = 266;
    s.ints["tokenizer.ggml.padding_token_id"] = 100000;
    CHECK(vocab_status(s) == Status::InvalidVocab);
  }
  {
    BpeSpec s = hello_spec();
    s.extra.push_back({"<weird>", 9});  // unknown token type
    CHECK(vocab_status(s) == Status::InvalidVocab);
  }
  {
    BpeSpec s = hello_spec();
    s.model = "bert";
    CHECK(vocab_status(s) == Status::InvalidVocab);
  }
  {
    BpeSpec s = hello_spec();
    s.pre = "no-such-pre";
    CHECK(vocab_status(s) == Status::InvalidVocab);
    CHECK(vocab_status(s, /*allow_unknown_pre=*/true) == Status::Ok);
    auto v = load_vocab(s.write(), true);
    CHECK(v->pre_tokenizer().type() == PreType::Gpt2);
    s.has_pre = false;  // a missing name is unknown too
    CHECK(vocab_status(s) == Status::InvalidVocab);
  }
  {
    // token_type array of the wrong length
    GgufWriter w;
    w.set("tokenizer.ggml.model", GgufValue::make_str("gpt2"));
    w.set("tokenizer.ggml.pre", GgufValue::make_str("gpt2"));
    w.set("tokenizer.ggml.tokens", GgufValue::make_str_array({"a", "b"}));
    w.set("tokenizer.ggml.token_type", GgufValue::make_i32_array({1}));
    w.set("tokenizer.ggml.merges", GgufValue::make_str_array({}));
    auto b = w.write_memory();
    CHECK_THROWS_MATCHES(load_vocab(b), Error, Catch::Predicate<Error>([](const Error &e) { return e.code() == Status::InvalidVocab; }));
  }
  {
    // gpt2 without merges, tokens of the wrong type
    GgufWriter w;
    w.set("tokenizer.ggml.model", GgufValue::make_str("gpt2"));
    w.set("tokenizer.ggml.pre", GgufValue::make_str("gpt2"));
    w.set("tokenizer.ggml.tokens", GgufValue::make_str_array({"a", "b"}));
    auto b = w.write_memory();
    CHECK_THROWS_AS(load_vocab(b), Error);
    GgufWriter w2;
    w2.set("tokenizer.ggml.model", GgufValue::make_str("gpt2"));
    w2.set("tokenizer.ggml.tokens", GgufValue::make_i32_array({1, 2}));
    auto b2 = w2.write_memory();
    CHECK_THROWS_AS(load_vocab(b2), Error);
  }
  {
    // no tokenizer at all: not an error, just no vocabulary
    GgufWriter w;
    w.set("general.architecture", GgufValue::make_str("x"));
    CHECK(load_vocab(w.write_memory()) == nullptr);
  }
}

TEST_CASE("tokenizer: error messages name the offending item", "[tokenizer]") {
  BpeSpec s = hello_spec();
  s.raw_merges = {bl("q") + " " + bl("zz")};
  try {
    load_vocab(s.write());
    FAIL("accepted a merge naming a missing token");
  } catch (const Error &e) {
    CHECK(e.code() == Status::InvalidVocab);
    CHECK(std::string(e.what()).find("zz") != std::string::npos);
  }
}

TEST_CASE("tokenizer: decode, pieces and render_special", "[tokenizer]") {
  auto v = load_vocab(hello_spec().write());
  CHECK(v->token_to_piece(264, false) == " world");
  CHECK(v->token_to_piece(' ', false) == " ");
  CHECK(v->token_to_piece(0x80, false) == std::string(1, '\x80'));
  CHECK(v->token_to_piece(265, false).empty());
  CHECK(v->token_to_piece(265, true) == "<|endoftext|>");
  CHECK(v->token_to_piece(266, false) == "<think>");  // user-defined text is always shown
  CHECK(v->token_text(264) == bl(" world"));
  CHECK_THROWS_AS(v->token_to_piece(267, false), Error);
  CHECK_THROWS_AS(v->token_to_piece(-1, true), Error);
  try {
    v->token_to_piece(1000, false);
  } catch (const Error &e) {
    CHECK(e.code() == Status::InvalidArgument);
  }
  std::vector<int32_t> ids{266, 259, 264, 265};
  CHECK(v->decode(ids.data(), ids.size(), false) == "<think>hello world");
  CHECK(v->decode(ids.data(), ids.size(), true) == "<think>hello world<|endoftext|>");
}

TEST_CASE("tokenizer: stream detokenizer holds back partial characters", "[tokenizer]") {
  auto v = load_vocab(hello_spec().write());
  // U+1F600 = F0 9F 98 80, fed one byte token at a time
  StreamDetokenizer sd(*v, false);
  CHECK(sd.push('a') == "a");
  CHECK(sd.push(0xF0) == "");
  CHECK(sd.push(0x9F) == "");
  CHECK(sd.push(0x98) == "");
  CHECK(sd.push(0x80) == "\xF0\x9F\x98\x80");
  CHECK(sd.pending_bytes() == 0);
  // a byte that cannot start a character, and a lead byte followed by ASCII
  CHECK(sd.push(0x80) == "\xEF\xBF\xBD");
  CHECK(sd.push(0xE4) == "");
  CHECK(sd.push('b') == "\xEF\xBF\xBD" "b");
  // unfinished character at the end
  CHECK(sd.push(0xE4) == "");
  CHECK(sd.flush() == "\xEF\xBF\xBD");
  CHECK(sd.flush() == "");
  // control tokens follow render_special
  CHECK(sd.push(265) == "");
  StreamDetokenizer sd2(*v, true);
  CHECK(sd2.push(265) == "<|endoftext|>");
  CHECK_THROWS_AS(sd2.push(5000), Error);
}

TEST_CASE("tokenizer: streaming a random token sequence never emits broken UTF-8", "[tokenizer]") {
  auto v = load_vocab(hello_spec().write());
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string text = random_text(rng, 20);
    std::vector<int32_t> ids = v->encode(text, false, false);
    StreamDetokenizer sd(*v, false);
    std::string streamed;
    for (int32_t id : ids) {
      std::string chunk = sd.push(id);
      REQUIRE(valid_utf8(chunk));
      streamed += chunk;
    }
    streamed += sd.flush();
    REQUIRE(streamed == text);  // valid input: nothing replaced, nothing lost
  }
  // random ids (any byte order) still only produce valid UTF-8
  StreamDetokenizer sd(*v, true);
  std::uniform_int_distribution<int32_t> any(0, v->n_tokens() - 1);
  for (int i = 0; i < 2000; ++i) REQUIRE(valid_utf8(sd.push(any(rng))));
  REQUIRE(valid_utf8(sd.flush()));
}

TEST_CASE("tokenizer: decode(encode(s)) == s for every pre-tokenizer on a self-made vocabulary", "[tokenizer]") {
  for (const char *pre : {"gpt2", "llama-bpe", "qwen2", "deepseek-v3", "gpt-4o", "deepseek-llm"}) {
    BpeSpec s = hello_spec();
    s.pre = pre;
    auto v = load_vocab(s.write());
    std::mt19937 rng(1234);
    for (int round = 0; round < 300; ++round) {
      std::string text = random_text(rng, 1 + round % 40);
      std::vector<int32_t> ids = v->encode(text, false, false);
      INFO("pre " << pre << " round " << round);
      REQUIRE(v->decode(ids.data(), ids.size(), false) == text);
    }
  }
}

TEST_CASE("tokenizer: invalid UTF-8 input becomes U+FFFD like the reference", "[tokenizer]") {
  auto v = load_vocab(hello_spec().write());
  std::vector<int32_t> ids = v->encode(std::string("a\xff" "b\xe4", 4), false, false);
  CHECK(v->decode(ids.data(), ids.size(), false) == "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
}

// ---- SentencePiece-style ("llama") vocabulary ---------------------------------------------

namespace {

std::vector<uint8_t> spm_vocab(bool add_space_prefix = true) {
  std::vector<std::string> toks{"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types{TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_CONTROL};
  std::vector<float> scores{0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    toks.push_back(buf);
    types.push_back(TOKEN_TYPE_BYTE);
    scores.push_back(0);
  }
  const std::pair<const char *, float> normal[] = {
      {"\xe2\x96\x81", -1.0f}, {"h", -2.0f}, {"e", -2.0f}, {"l", -2.0f}, {"o", -2.0f},        // 259..263
      {"\xe2\x96\x81h", -0.5f}, {"ll", -0.4f}, {"\xe2\x96\x81he", -0.3f}, {"llo", -0.2f},    // 264..267
      {"\xe2\x96\x81hello", -0.1f},                                                         // 268
  };
  for (const auto &p : normal) {
    toks.push_back(p.first);
    types.push_back(TOKEN_TYPE_NORMAL);
    scores.push_back(p.second);
  }
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufValue::make_str("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::make_str_array(toks));
  w.set("tokenizer.ggml.token_type", GgufValue::make_i32_array(types));
  w.set("tokenizer.ggml.scores", GgufValue::make_f32_array(scores));
  w.set("tokenizer.ggml.add_space_prefix", GgufValue::make_bool(add_space_prefix));
  return w.write_memory();
}

}  // namespace

TEST_CASE("tokenizer: SentencePiece merges by score with byte fallback", "[tokenizer]") {
  auto v = load_vocab(spm_vocab());
  REQUIRE(v);
  CHECK(v->kind() == VocabKind::SPM);
  CHECK(v->bos() == 1);
  CHECK(v->eos() == 2);
  CHECK(v->add_bos());
  // ll (-0.4) first, then llo (-0.2), then ▁h (-0.5), ▁he (-0.3), ▁hello (-0.1)
  CHECK(v->encode("hello", false, false) == std::vector<int32_t>{268});
  CHECK(v->encode("hello", true, false) == std::vector<int32_t>{1, 268});
  // 'i' is not a token: byte fallback <0x69> = 3 + 0x69
  CHECK(v->encode("hi", false, false) == std::vector<int32_t>{264, 3 + 0x69});
  // special tokens parsed, and a space is prefixed again after them
  CHECK(v->encode("<s>hello", false, true) == std::vector<int32_t>{1, 268});
  std::vector<int32_t> ids{264, 3 + 0x69};
  CHECK(v->decode(ids.data(), ids.size(), false) == "hi");
  CHECK(v->token_to_piece(264, false) == " h");
  CHECK(v->token_to_piece(3 + 0x69, false) == "i");
  CHECK(v->token_to_piece(0, false).empty());
  CHECK(v->token_to_piece(0, true) == "<unk>");

  auto nv = load_vocab(spm_vocab(false));
  CHECK(nv->encode("hello", false, false) == std::vector<int32_t>{260, 261, 267});  // h e llo
}

TEST_CASE("tokenizer: SentencePiece round trip over random text", "[tokenizer]") {
  auto v = load_vocab(spm_vocab());
  std::mt19937 rng(99);
  for (int round = 0; round < 300; ++round) {
    std::string text = random_text(rng, 1 + round % 30);
    std::vector<int32_t> ids = v->encode(text, false, false);
    REQUIRE(v->decode(ids.data(), ids.size(), false) == text);
  }
}
