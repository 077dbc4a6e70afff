// Pre-tokenizer splits and Unicode category tables. Expected splits are derived by hand from
// the patterns (and the reference's way of running them, see pretokenizer.h); categories come
// from the Unicode Character Database.
#include <catch2/catch.hpp>

#include "test_tokenizer_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

using namespace moe;

namespace {

std::vector<std::string> split(const char *pre, const std::string &text) {
  PreTokenizer p;
  REQUIRE(PreTokenizer::from_name(pre, &p));
  std::vector<uint32_t> cps;
  std::vector<size_t> starts;
  for (size_t i = 0; i < text.size();) {
    size_t n;
    starts.push_back(i);
    cps.push_back(utf8_decode(text.data() + i, text.size() - i, &n));
    i += n;
  }
  starts.push_back(text.size());
  std::vector<uint32_t> lens;
  p.split(cps.data(), cps.size(), lens);
  std::vector<std::string> words;
  size_t at = 0;
  for (uint32_t l : lens) {
    REQUIRE(l > 0);
    words.push_back(text.substr(starts[at], starts[at + l] - starts[at]));
    at += l;
  }
  REQUIRE(at == cps.size());
  return words;
}

using W = std::vector<std::string>;

}  // namespace

TEST_CASE("pretokenizer: gpt2 pattern", "[tokenizer]") {
  CHECK(split("gpt2", "Hello world") == W{"Hello", " world"});
  CHECK(split("gpt2", "a  b") == W{"a", " ", " b"});
  CHECK(split("gpt2", "I'm here's") == W{"I", "'m", " here", "'s"});
  CHECK(split("gpt2", "don'T") == W{"don", "'", "T"});  // contractions are case-sensitive here
  CHECK(split("gpt2", "abc123") == W{"abc", "123"});
  CHECK(split("gpt2", "x  \n") == W{"x", "  \n"});
  CHECK(split("gpt2", "x\t\ty") == W{"x", "\t", "\t", "y"});
  CHECK(split("gpt2", "").empty());
}

TEST_CASE("pretokenizer: llama3 and qwen2 patterns", "[tokenizer]") {
  CHECK(split("llama-bpe", "12345") == W{"123", "45"});
  CHECK(split("llama-bpe", "Hello, World!!\n\nok") == W{"Hello", ",", " World", "!!\n\n", "ok"});
  CHECK(split("llama-bpe", "don'T") == W{"don", "'T"});
  CHECK(split("llama-bpe", " \n\n x") == W{" \n\n", " x"});
  CHECK(split("qwen2", "12345") == W{"1", "2", "3", "4", "5"});
  CHECK(split("qwen2", "x2 y") == W{"x", "2", " y"});
  CHECK(split("qwen2", "\xe4\xbd\xa0\xe5\xa5\xbd, \xe4\xb8\x96\xe7\x95\x8c") ==
        W{"\xe4\xbd\xa0\xe5\xa5\xbd", ",", " \xe4\xb8\x96\xe7\x95\x8c"});  // 你好, 世界
}

TEST_CASE("pretokenizer: gpt-4o (o200k) pattern", "[tokenizer]") {
  CHECK(split("gpt-4o", "HelloWORLD") == W{"Hello", "WORLD"});
  CHECK(split("gpt-4o", "\xc3\xa9" "ABC") == W{"\xc3\xa9", "ABC"});  // éABC
  CHECK(split("gpt-4o", "don't") == W{"don't"});
  CHECK(split("gpt-4o", "DON'T stop") == W{"DON'T", " stop"});
  CHECK(split("gpt-4o", "hello/world") == W{"hello", "/world"});
  CHECK(split("gpt-4o", "1234567") == W{"123", "456", "7"});
  CHECK(split("gpt-4o", "a, b!!\n/\nc") == W{"a", ",", " b", "!!\n/\n", "c"});
  // Devanagari: combining marks are not letters in the reference's run of this pattern
  CHECK(split("gpt-4o", "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80") ==
        W{"\xe0\xa4\xb9", "\xe0\xa4\xbf\xe0\xa4\xa8", "\xe0\xa5\x8d\xe0\xa4\xa6", "\xe0\xa5\x80"});
}

TEST_CASE("pretokenizer: deepseek-v3 pattern", "[tokenizer]") {
  CHECK(split("deepseek-v3", "abc123def") == W{"abc", "123", "def"});
  CHECK(split("deepseek-v3", "1234") == W{"123", "4"});
  CHECK(split("deepseek-v3", "\xe4\xb8\xad\xe6\x96\x87" "abc") == W{"\xe4\xb8\xad\xe6\x96\x87", "abc"});  // 中文abc
  CHECK(split("deepseek-v3", "(foo)") == W{"(foo", ")"});
  CHECK(split("deepseek-v3", "a~b") == W{"a", "~b"});
  CHECK(split("deepseek-v3", " ~~") == W{" ", "~~"});  // '~' is neither \p{P} nor \p{S} there
  CHECK(split("deepseek-v3", "e\xcc\x81t\xc3\xa9") == W{"e\xcc\x81t\xc3\xa9"});  // marks join letters
}

TEST_CASE("pretokenizer: deepseek-llm (DeepSeek-V2) pattern", "[tokenizer]") {
  CHECK(split("deepseek-llm", "Hello world\n") == W{"Hello", " world", "\n"});
  CHECK(split("deepseek-llm", "abc 123") == W{"abc", " ", "123"});
  CHECK(split("deepseek-llm", "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c") ==
        W{"\xe4\xbd\xa0\xe5\xa5\xbd", "\xef\xbc\x8c", "\xe4\xb8\x96\xe7\x95\x8c"});  // 你好，世界
  CHECK(split("deepseek-llm", "x  ") == W{"x", "  "});
  // U+3000 lies in the CJK range of the pattern but is whitespace there
  CHECK(split("deepseek-llm", "\xe3\x80\x80\xe5\xad\x97") == W{"\xe3\x80\x80", "\xe5\xad\x97"});
}

TEST_CASE("pretokenizer: splits cover the input exactly, for every pattern and random text", "[tokenizer]") {
  std::mt19937 rng(5);
  for (const char *pre : {"gpt2", "llama-bpe", "qwen2", "deepseek-v3", "gpt-4o", "deepseek-llm"}) {
    for (int round = 0; round < 200; ++round) {
      std::string text = tok_test::random_text(rng, 30);
      std::string joined;
      for (const auto &w : split(pre, text)) joined += w;
      REQUIRE(joined == text);
    }
  }
}

TEST_CASE("pretokenizer: names", "[tokenizer]") {
  PreTokenizer p;
  CHECK(PreTokenizer::from_name("qwen2", &p));
  CHECK(p.type() == PreType::Qwen2);
  CHECK(PreTokenizer::from_name("llama-bpe", &p));
  CHECK(p.ignore_merges());
  CHECK(PreTokenizer::from_name("gpt-4o", &p));
  CHECK(p.type() == PreType::Gpt4o);
  CHECK(PreTokenizer::from_name("deepseek-v3", &p));
  CHECK(p.type() == PreType::DeepseekV3);
  CHECK(PreTokenizer::from_name("deepseek-llm", &p));
  CHECK(p.type() == PreType::DeepseekLlm);
  CHECK_FALSE(PreTokenizer::from_name("default", &p));
  CHECK_FALSE(PreTokenizer::from_name("", &p));
}

TEST_CASE("unicode: general categories across planes", "[tokenizer]") {
  auto cat = [](uint32_t cp) { return unicode_flags(cp) & ~uint8_t(UF_WHITESPACE); };
  CHECK(cat('A') == UF_LETTER);
  CHECK(cat('5') == UF_NUMBER);
  CHECK(cat('~') == UF_SYMBOL);
  CHECK(cat('_') == UF_PUNCT);
  CHECK(cat(0x0663) == UF_NUMBER);   // ARABIC-INDIC DIGIT THREE (Nd)
  CHECK(cat(0x2160) == UF_NUMBER);   // ROMAN NUMERAL ONE (Nl)
  CHECK(cat(0x00B2) == UF_NUMBER);   // SUPERSCRIPT TWO (No)
  CHECK(cat(0x0301) == UF_MARK);     // COMBINING ACUTE ACCENT (Mn)
  CHECK(cat(0x093F) == UF_MARK);     // DEVANAGARI VOWEL SIGN I (Mc)
  CHECK(cat(0x3002) == UF_PUNCT);    // IDEOGRAPHIC FULL STOP
  CHECK(cat(0x20AC) == UF_SYMBOL);   // EURO SIGN
  CHECK(cat(0x1F600) == UF_SYMBOL);  // GRINNING FACE
  CHECK(cat(0x1F1E6) == UF_SYMBOL);  // REGIONAL INDICATOR A
  CHECK(cat(0xE000) == UF_CONTROL);  // private use (Co)
  CHECK(cat(0x200B) == UF_CONTROL);  // ZERO WIDTH SPACE (Cf)
  CHECK(cat(0x0378) == 0);           // unassigned
  CHECK(cat(0x10FFFF) == 0);         // noncharacter
  CHECK(cat(0x110000) == 0);         // beyond Unicode
  CHECK(cat(0x4E2D) == UF_LETTER);   // CJK (range entry in UnicodeData.txt)
  CHECK(cat(0x20000) == UF_LETTER);  // CJK Extension B, plane 2
  CHECK(cat(0x30000) == UF_LETTER);  // CJK Extension G, plane 3
  CHECK(cat(0xAC00) == UF_LETTER);   // Hangul syllable (range)
  CHECK(cat(0xD7A3) == UF_LETTER);
  CHECK(cat(0x10400) == UF_LETTER);  // DESERET CAPITAL LONG I
  CHECK(cat(0xE0100) == UF_MARK);    // VARIATION SELECTOR-17, plane 14
  CHECK(cat(0x100000) == UF_CONTROL);  // plane 16 private use
  CHECK((unicode_flags(0x3000) & UF_WHITESPACE));
  CHECK((unicode_flags(0x0085) & UF_WHITESPACE));
  CHECK((unicode_flags(0x00A0) & UF_WHITESPACE));
  CHECK((unicode_flags(0x1680) & UF_WHITESPACE));
  CHECK((unicode_flags('\v') & UF_WHITESPACE));
  CHECK_FALSE((unicode_flags(0x200B) & UF_WHITESPACE));
  CHECK_FALSE((unicode_flags(0x1C) & UF_WHITESPACE));
  CHECK(std::string(kUnicodeVersion).size() > 0);
}

TEST_CASE("unicode: UTF-8 decoding never fails", "[tokenizer]") {
  size_t n = 0;
  CHECK(utf8_decode("\xe4\xb8\xad", 3, &n) == 0x4E2D);
  CHECK(n == 3);
  CHECK(utf8_decode("\xf0\x9f\x98\x80", 4, &n) == 0x1F600);
  CHECK(n == 4);
  CHECK(utf8_decode("\xe4\xb8", 2, &n) == 0xFFFD);  // truncated
  CHECK(n == 1);
  CHECK(utf8_decode("\x80", 1, &n) == 0xFFFD);
  CHECK(utf8_decode("\xf7\xbf\xbf\xbf", 4, &n) == 0xFFFD);  // above U+10FFFF
  unsigned char ok[] = {0xF0, 0x9F};
  CHECK(utf8_valid_len(ok, 2) == -1);
  unsigned char sur[] = {0xED, 0xA0, 0x80};
  CHECK(utf8_valid_len(sur, 3) == 0);
}
