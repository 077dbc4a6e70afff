// Unicode helpers for the tokenizer: per-code-point category flags (generated tables, see
// tools/gen_unicode_tables.py), UTF-8 decoding that never fails, and UTF-8 encoding.
//
//   uint8_t f = unicode_flags(0x4E2D);            // UF_LETTER
//   size_t n; uint32_t cp = utf8_decode(p, end - p, &n);   // invalid bytes -> U+FFFD, n = 1
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace moe {

// One flags byte per code point. The low seven bits are the general-category class (at most one
// set; none for unassigned code points); UF_WHITESPACE is the White_Space property on top.
enum UnicodeFlag : uint8_t {
  UF_NUMBER = 1 << 0,      // \p{N}
  UF_LETTER = 1 << 1,      // \p{L}
  UF_MARK = 1 << 2,        // \p{M}
  UF_PUNCT = 1 << 3,       // \p{P}
  UF_SYMBOL = 1 << 4,      // \p{S}
  UF_SEPARATOR = 1 << 5,   // \p{Z}
  UF_CONTROL = 1 << 6,     // \p{C} except Cn
  UF_WHITESPACE = 1 << 7,  // \s (White_Space)
};

extern const char *const kUnicodeVersion;
extern const uint16_t kUnicodeStage1[0x110000 >> 8];
extern const uint8_t kUnicodeStage2[];

inline uint8_t unicode_flags(uint32_t cp) {
  if (cp >= 0x110000) return 0;
  return kUnicodeStage2[(size_t(kUnicodeStage1[cp >> 8]) << 8) | (cp & 0xFF)];
}

// Decode one code point from s[0..len) (len >= 1). Ill-formed input (bad lead byte, missing
// continuation, truncated sequence) yields U+FFFD and consumes one byte, as the reference does.
// Like the reference, it does not reject overlong forms or surrogates.
inline uint32_t utf8_decode(const char *s, size_t len, size_t *consumed) {
  const auto *u = reinterpret_cast<const unsigned char *>(s);
  unsigned char c = u[0];
  auto cont = [&](size_t k) { return k < len && (u[k] & 0xC0) == 0x80; };
  if (c < 0x80) { *consumed = 1; return c; }
  if ((c & 0xE0) == 0xC0 && cont(1)) { *consumed = 2; return (uint32_t(c & 0x1F) << 6) | (u[1] & 0x3F); }
  if ((c & 0xF0) == 0xE0 && cont(1) && cont(2)) {
    *consumed = 3;
    return (uint32_t(c & 0x0F) << 12) | (uint32_t(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
  }
  if ((c & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
    uint32_t cp = (uint32_t(c & 0x07) << 18) | (uint32_t(u[1] & 0x3F) << 12) | (uint32_t(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    if (cp < 0x110000) { *consumed = 4; return cp; }  // F5..F7 leads: not encodable, treat as invalid
  }
  *consumed = 1;
  return 0xFFFD;
}

void utf8_append(std::string &out, uint32_t cp);

// Length of the well-formed UTF-8 sequence at s (Unicode Table 3-7: no overlongs, surrogates
// or code points above U+10FFFF); 0 if ill-formed, -1 if it is a valid but incomplete prefix.
int utf8_valid_len(const unsigned char *s, size_t len);

}  // namespace moe
