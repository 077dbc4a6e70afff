// Lattice tables of the 1-, 2- and 3-bit i-quants, as the GGUF formats define them (GGML's
// iq2xxs_grid, iq2xs_grid, iq2s_grid, iq3xxs_grid, iq3s_grid, iq1s_grid, ksigns_iq2xs).
// A grid entry packs 8 (or 4) unsigned magnitudes, one per byte, little endian; IQ1 entries
// pack 8 signed bytes in {-1, 0, 1}.
//
//   uint8_t mag = static_cast<uint8_t>(kIq2xxsGrid[idx] >> (8 * j));   // value j of entry idx
//   uint8_t signs = kIq2SignBytes[s7];   // 7 stored sign bits + the parity bit as bit 7
#pragma once
#include <cstdint>

namespace moe {

extern const uint8_t kIq2SignBytes[128];
extern const uint64_t kIq2xxsGrid[256];
extern const uint64_t kIq2xsGrid[512];
extern const uint64_t kIq2sGrid[1024];
extern const uint32_t kIq3xxsGrid[256];
extern const uint32_t kIq3sGrid[512];
extern const uint64_t kIq1sGrid[2048];

}  // namespace moe
