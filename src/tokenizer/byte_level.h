// GPT-2 byte-level alphabet: every byte is shown as a printable code point so that BPE
// vocabularies store arbitrary bytes as text ("Ġ" is byte 0x20).
//
//   uint32_t cp = byte_to_cp(0x20);         // 0x120 'Ġ'
//   int b = cp_to_byte(0x120);              // 0x20; -1 for code points outside the alphabet
#pragma once
#include <cstdint>

namespace moe {

// Printable bytes map to themselves; the other 68 (0x00-0x20, 0x7F-0xA0, 0xAD) follow from 0x100.
inline bool byte_is_printable(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

inline uint32_t byte_to_cp(uint8_t b) {
  if (byte_is_printable(b)) return b;
  int n = 0;  // rank of b among the non-printable bytes
  for (int c = 0; c < b; ++c) n += !byte_is_printable(c);
  return 0x100 + uint32_t(n);
}

inline int cp_to_byte(uint32_t cp) {
  if (cp < 0x100) return byte_is_printable(int(cp)) ? int(cp) : -1;
  if (cp >= 0x100 + 68) return -1;
  int n = int(cp - 0x100);
  for (int c = 0; c < 256; ++c) {
    if (!byte_is_printable(c) && n-- == 0) return c;
  }
  return -1;
}

// Table form of byte_to_cp (256 entries).
inline const uint32_t *byte_to_cp_table() {
  struct T {
    uint32_t v[256];
    T() { for (int b = 0; b < 256; ++b) v[b] = byte_to_cp(uint8_t(b)); }
  };
  static const T t;
  return t.v;
}

}  // namespace moe
