#include "tokenizer/pretokenizer.h"

#include <cstring>

#include "tokenizer/unicode.h"

namespace moe {

namespace {

constexpr uint8_t kCat = UF_NUMBER | UF_LETTER | UF_MARK | UF_PUNCT | UF_SYMBOL;

// The reference runs qwen2 / deepseek-v3 / gpt-4o through a regex engine on a "collapsed" text:
// ASCII stays as is (with the engine's own ASCII classes), every other code point becomes one
// placeholder per category (whitespace first). These are the resulting flags.
uint8_t collapsed_flags(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z')) return UF_LETTER;
    if (cp >= '0' && cp <= '9') return UF_NUMBER;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return UF_WHITESPACE;
    // The reference's ASCII stand-ins for \p{P} and \p{S}; '~' is in neither.
    if (std::strchr("$+<=>^`|", int(cp)) && cp) return UF_SYMBOL;
    if (std::strchr("!\"#%&'()*,-./:;?@[\\]_{}", int(cp)) && cp) return UF_PUNCT;
    return 0;
  }
  uint8_t f = unicode_flags(cp);
  if (f & UF_WHITESPACE) return UF_WHITESPACE;
  return f & kCat;
}

// Cursor over one segment [0, n) of code points with their flags.
struct Seg {
  const uint32_t *cp;
  const uint8_t *fl;
  size_t n;
  uint32_t c(size_t i) const { return i < n ? cp[i] : 0xFFFFFFFFu; }
  uint8_t f(size_t i) const { return i < n ? fl[i] : 0; }
  bool in(size_t i) const { return i < n; }
  bool ws(size_t i) const { return f(i) & UF_WHITESPACE; }
  bool letter(size_t i) const { return f(i) & UF_LETTER; }
  bool number(size_t i) const { return f(i) & UF_NUMBER; }
  bool crlf(size_t i) const { return c(i) == '\r' || c(i) == '\n'; }
};

inline uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at i: returns its length or 0.
size_t contraction(const Seg &s, size_t i) {
  if (s.c(i) != '\'' || !s.in(i + 1)) return 0;
  uint32_t a = ascii_lower(s.c(i + 1));
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (!s.in(i + 2)) return 0;
  uint32_t b = ascii_lower(s.c(i + 2));
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// Whitespace tail alternatives shared by several patterns:
//   [\s*[\r\n]+ |] \s+(?!\S) | \s+      (with_newline_run selects the first one)
size_t match_spaces(const Seg &s, size_t i, bool with_newline_run) {
  size_t j = i, last_nl = 0;
  while (s.ws(j)) {
    if (s.crlf(j)) last_nl = j + 1;
    ++j;
  }
  if (j == i) return i;
  if (with_newline_run && last_nl) return last_nl;
  if (j - i > 1 && s.in(j)) return j - 1;  // leave one space to prefix the next word
  return j;
}

// --- gpt2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const Seg &s, size_t i) {
  if (s.c(i) == '\'' && s.in(i + 1)) {  // case-sensitive contractions
    uint32_t a = s.c(i + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (s.in(i + 2)) {
      uint32_t b = s.c(i + 2);
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
  }
  size_t k = (s.c(i) == ' ') ? i + 1 : i;
  if (s.letter(k)) { while (s.letter(k)) ++k; return k; }
  if (s.number(k)) { while (s.number(k)) ++k; return k; }
  auto other = [&](size_t x) { return s.in(x) && !(s.f(x) & (UF_WHITESPACE | UF_LETTER | UF_NUMBER)); };
  if (other(k)) { while (other(k)) ++k; return k; }
  return match_spaces(s, i, false);
}

// --- llama3 / qwen2:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_llama3(const Seg &s, size_t i, size_t max_digits) {
  if (size_t c = contraction(s, i)) return i + c;
  if (!s.crlf(i) && !s.number(i) && (s.letter(i) || s.letter(i + 1))) {
    size_t k = i + 1;
    while (s.letter(k)) ++k;
    return k;
  }
  if (s.number(i)) {
    size_t k = i;
    while (k - i < max_digits && s.number(k)) ++k;
    return k;
  }
  auto other = [&](size_t x) { return s.in(x) && !(s.f(x) & (UF_WHITESPACE | UF_LETTER | UF_NUMBER)); };
  size_t k = (s.c(i) == ' ' && other(i + 1)) ? i + 1 : i;
  if (other(k)) {
    while (other(k)) ++k;
    while (s.crlf(k)) ++k;
    return k;
  }
  return match_spaces(s, i, true);
}

// --- gpt-4o / o200k, as the reference runs it (letters are collapsed, so a non-ASCII letter is
// both "upper" and "lower"; marks are not letters):
// [^\r\n\p{L}\p{N}]?U*W+C?|[^\r\n\p{L}\p{N}]?U+W*C?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with U = letter but not a-z, W = letter but not A-Z, C = optional contraction.
size_t match_gpt4o(const Seg &s, size_t i) {
  auto U = [&](size_t x) { return s.letter(x) && !(s.c(x) >= 'a' && s.c(x) <= 'z'); };
  auto W = [&](size_t x) { return s.letter(x) && !(s.c(x) >= 'A' && s.c(x) <= 'Z'); };
  bool prefix = s.in(i) && !s.crlf(i) && !s.letter(i) && !s.number(i);
  size_t st = prefix ? i + 1 : i;  // with a prefix char the prefix-less try cannot match either
  // alternative 1: U* greedy, backtracking until a W can follow
  {
    size_t u = st;
    while (U(u)) ++u;
    for (size_t k = u + 1; k-- > st;) {
      if (W(k)) {
        size_t w = k;
        while (W(w)) ++w;
        return w + contraction(s, w);
      }
    }
  }
  // alternative 2: U+ W*
  if (U(st)) {
    size_t u = st;
    while (U(u)) ++u;
    while (W(u)) ++u;
    return u + contraction(s, u);
  }
  if (s.number(i)) {
    size_t k = i;
    while (k - i < 3 && s.number(k)) ++k;
    return k;
  }
  auto other = [&](size_t x) { return s.in(x) && !(s.f(x) & (UF_WHITESPACE | UF_LETTER | UF_NUMBER)); };
  size_t k = (s.c(i) == ' ' && other(i + 1)) ? i + 1 : i;
  if (other(k)) {
    while (other(k)) ++k;
    while (s.crlf(k) || s.c(k) == '/') ++k;
    return k;
  }
  return match_spaces(s, i, true);
}

// --- deepseek-v3, three passes: \p{N}{1,3}, then [一-龥぀-ゟ゠-ヿ]+, then
// [!-/:-@[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_digits3(const Seg &s, size_t i) {
  size_t k = i;
  while (k - i < 3 && s.number(k)) ++k;
  return k;
}

size_t match_cjk(const Seg &s, size_t i) {
  auto cjk = [&](size_t x) {
    uint32_t c = s.c(x);
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF);
  };
  size_t k = i;
  while (cjk(k)) ++k;
  return k;
}

size_t match_deepseek_words(const Seg &s, size_t i) {
  auto ascii_alpha = [&](size_t x) { uint32_t c = s.c(x); return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); };
  uint32_t c0 = s.c(i);
  bool ascii_punct = (c0 >= 0x21 && c0 <= 0x2F) || (c0 >= 0x3A && c0 <= 0x40) || (c0 >= 0x5B && c0 <= 0x60) ||
                     (c0 >= 0x7B && c0 <= 0x7E);
  if (ascii_punct && ascii_alpha(i + 1)) {
    size_t k = i + 1;
    while (ascii_alpha(k)) ++k;
    return k;
  }
  auto LM = [&](size_t x) { return (s.f(x) & (UF_LETTER | UF_MARK)) != 0; };
  auto PS = [&](size_t x) { return (s.f(x) & (UF_PUNCT | UF_SYMBOL)) != 0; };
  bool prefix = s.in(i) && !s.crlf(i) && !(s.f(i) & (UF_LETTER | UF_PUNCT | UF_SYMBOL));
  size_t st = (prefix && LM(i + 1)) ? i + 1 : i;
  if (LM(st)) {
    size_t k = st;
    while (LM(k)) ++k;
    return k;
  }
  size_t k = (c0 == ' ' && PS(i + 1)) ? i + 1 : i;
  if (PS(k)) {
    while (PS(k)) ++k;
    while (s.crlf(k)) ++k;
    return k;
  }
  return match_spaces(s, i, true);
}

// --- deepseek-llm (DeepSeek-V2), six passes run on the raw code points (non-ASCII whitespace
// counts as \s): [\r\n] | \s?[cased letters]+ | \s?[punctuation]+ | \s+$ | [CJK, Hangul]+ | \p{N}+
bool wide_ws(const Seg &s, size_t x) {
  uint32_t c = s.c(x);
  return s.in(x) && (c < 0x80 ? (c == ' ' || (c >= 0x09 && c <= 0x0D)) : (unicode_flags(c) & UF_WHITESPACE) != 0);
}

bool in_ranges(uint32_t c, const uint32_t (*r)[2], size_t n) {
  size_t lo = 0, hi = n;  // ranges sorted by start
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c < r[mid][0]) hi = mid;
    else if (c > r[mid][1]) lo = mid + 1;
    else return true;
  }
  return false;
}

// The cased letters (Lu, Ll, Lt) listed in the DeepSeek-V2 tokenizer's pattern.
const uint32_t kDsCased[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA}, {0x1BC, 0x1BF},
    {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377}, {0x37B, 0x37D}, {0x37F, 0x37F},
    {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481},
    {0x48A, 0x52F}, {0x531, 0x556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
    {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D},
    {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC},
    {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102},
    {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3},
    {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF},
    {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3},
    {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
// ASCII and fullwidth punctuation (and ASCII letters: the pattern's :-~ covers them), curly
// quotes, 、 and 。 (U+3000 itself is whitespace and never matches).
const uint32_t kDsPunct[][2] = {{0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F}, {0x3001, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}};

size_t match_newline(const Seg &s, size_t i) { return s.crlf(i) ? i + 1 : i; }

template <size_t N>
size_t match_ws_opt_run(const Seg &s, size_t i, const uint32_t (&r)[N][2]) {
  auto in = [&](size_t x) { return s.in(x) && !wide_ws(s, x) && in_ranges(s.c(x), r, N); };
  size_t k = (wide_ws(s, i) && in(i + 1)) ? i + 1 : i;
  if (!in(k)) return i;
  while (in(k)) ++k;
  return k;
}

size_t match_cjk_hangul(const Seg &s, size_t i) {
  auto cjk = [&](size_t x) {  // whitespace inside the range (U+1680, U+2028, U+3000) is \s there
    uint32_t c = s.c(x);
    return ((c >= 0x800 && c <= 0x9FA5) || (c >= 0xAC00 && c <= 0xD7FF)) && !wide_ws(s, x);
  };
  size_t k = i;
  while (cjk(k)) ++k;
  return k;
}

size_t match_numbers(const Seg &s, size_t i) {
  size_t k = i;
  while (s.number(k)) ++k;
  return k;
}

// Run one pattern over each current segment, like a regex iterator: matches become words and
// the unmatched stretches between them become words too.
template <typename M>
void apply(const uint32_t *cps, const uint8_t *fl, const std::vector<uint32_t> &in, std::vector<uint32_t> &out, M match) {
  size_t base = 0;
  for (uint32_t len : in) {
    Seg s{cps + base, fl + base, len};
    size_t i = 0, gap = 0;
    while (i < len) {
      size_t e = match(s, i);
      if (e > i) {
        if (i > gap) out.push_back(uint32_t(i - gap));
        out.push_back(uint32_t(e - i));
        i = gap = e;
      } else {
        ++i;
      }
    }
    if (len > gap) out.push_back(uint32_t(len - gap));
    base += len;
  }
}

// \s+$ : the whitespace run that ends a segment, if any.
void apply_trailing_ws(const uint32_t *cps, const uint8_t *fl, const std::vector<uint32_t> &in, std::vector<uint32_t> &out) {
  size_t base = 0;
  for (uint32_t len : in) {
    Seg s{cps + base, fl + base, len};
    size_t t = len;
    while (t > 0 && wide_ws(s, t - 1)) --t;
    if (t > 0) out.push_back(uint32_t(t));
    if (t < len) out.push_back(uint32_t(len - t));
    base += len;
  }
}

}  // namespace

bool PreTokenizer::from_name(const std::string &name, PreTokenizer *out) {
  static const struct { const char *name; PreType type; bool ignore_merges; } kNames[] = {
      {"gpt2", PreType::Gpt2, false},        {"gpt-2", PreType::Gpt2, false},
      {"phi-2", PreType::Gpt2, false},       {"mpt", PreType::Gpt2, false},
      {"olmo", PreType::Gpt2, false},        {"jais", PreType::Gpt2, false},
      {"roberta-bpe", PreType::Gpt2, false}, {"exaone4", PreType::Gpt2, false},
      {"llama3", PreType::Llama3, true},     {"llama-v3", PreType::Llama3, true},
      {"llama-bpe", PreType::Llama3, true},  {"falcon3", PreType::Llama3, true},
      {"pixtral", PreType::Llama3, true},    {"dbrx", PreType::Llama3, false},
      {"smaug-bpe", PreType::Llama3, false}, {"glm4", PreType::Llama3, false},
      {"chatglm-bpe", PreType::Llama3, false},
      {"qwen2", PreType::Qwen2, false},      {"deepseek-r1-qwen", PreType::Qwen2, false},
      {"megrez", PreType::Qwen2, false},     {"stablelm2", PreType::Qwen2, false},
      {"hunyuan", PreType::Qwen2, false},    {"grok-2", PreType::Qwen2, false},
      {"deepseek-v3", PreType::DeepseekV3, false}, {"hunyuan-dense", PreType::DeepseekV3, false},
      {"deepseek-llm", PreType::DeepseekLlm, false},
      {"gpt-4o", PreType::Gpt4o, false},     {"llama4", PreType::Gpt4o, false},
      {"minimax-m2", PreType::Gpt4o, false},
  };
  for (const auto &k : kNames) {
    if (name == k.name) {
      *out = PreTokenizer(k.type, k.ignore_merges);
      return true;
    }
  }
  return false;
}

const char *PreTokenizer::type_name(PreType t) {
  switch (t) {
    case PreType::Gpt2: return "gpt2";
    case PreType::Llama3: return "llama3";
    case PreType::Qwen2: return "qwen2";
    case PreType::DeepseekV3: return "deepseek-v3";
    case PreType::DeepseekLlm: return "deepseek-llm";
    case PreType::Gpt4o: return "gpt-4o";
  }
  return "?";
}

void PreTokenizer::split(const uint32_t *cps, size_t n, std::vector<uint32_t> &word_lens) const {
  if (n == 0) return;
  std::vector<uint8_t> fl(n);
  bool collapsed = type_ == PreType::Qwen2 || type_ == PreType::DeepseekV3 || type_ == PreType::Gpt4o ||
                   type_ == PreType::DeepseekLlm;
  for (size_t i = 0; i < n; ++i) fl[i] = collapsed ? collapsed_flags(cps[i]) : unicode_flags(cps[i]);
  std::vector<uint32_t> whole{uint32_t(n)};
  switch (type_) {
    case PreType::Gpt2:
      apply(cps, fl.data(), whole, word_lens, match_gpt2);
      break;
    case PreType::Llama3:
      apply(cps, fl.data(), whole, word_lens, [](const Seg &s, size_t i) { return match_llama3(s, i, 3); });
      break;
    case PreType::Qwen2:
      apply(cps, fl.data(), whole, word_lens, [](const Seg &s, size_t i) { return match_llama3(s, i, 1); });
      break;
    case PreType::Gpt4o:
      apply(cps, fl.data(), whole, word_lens, match_gpt4o);
      break;
    case PreType::DeepseekV3: {
      std::vector<uint32_t> a, b;
      apply(cps, fl.data(), whole, a, match_digits3);
      apply(cps, fl.data(), a, b, match_cjk);
      apply(cps, fl.data(), b, word_lens, match_deepseek_words);
      break;
    }
    case PreType::DeepseekLlm: {
      std::vector<uint32_t> a, b;
      apply(cps, fl.data(), whole, a, match_newline);
      apply(cps, fl.data(), a, b, [](const Seg &s, size_t i) { return match_ws_opt_run(s, i, kDsCased); });
      a.clear();
      apply(cps, fl.data(), b, a, [](const Seg &s, size_t i) { return match_ws_opt_run(s, i, kDsPunct); });
      b.clear();
      apply_trailing_ws(cps, fl.data(), a, b);
      a.clear();
      apply(cps, fl.data(), b, a, match_cjk_hangul);
      apply(cps, fl.data(), a, word_lens, match_numbers);
      break;
    }
  }
}

}  // namespace moe
