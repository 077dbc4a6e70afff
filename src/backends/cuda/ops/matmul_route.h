// MatMulId's device routing (matmul.cu route_kernel) for product kernels outside matmul.cu:
// the (token, slot) entries grouped by expert, and tiles of at most NT entries of one expert.
//
//   entries[i] = (activation row, output row): activation row X == 1 ? t : t * X + j, output
//                row t * n_used + j, for entry (token t, slot j)
//   tiles[b]   = (expert, first entry, count, 0); count 0: an idle tile (max_tiles is a bound)
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace moe {

// Tiles a launch needs at most for n_used * T entries over E experts in tiles of NT.
inline int cuda_route_max_tiles(int n_used, int T, int64_t E, int NT) {
  const int n = n_used * T;
  return (n + NT - 1) / NT + static_cast<int>(E < n ? E : n);
}

// One launch on stream s; ids [T][ids_nb1] int32 (row stride in elements). Expert ids outside
// [0, E) are reported in err and left out of every tile.
void cuda_launch_route(cudaStream_t s, const int32_t *ids, int64_t ids_nb1, int n_used, int T, int E, int X, int NT, int2 *entries,
                       int4 *tiles, int max_tiles, unsigned *err);

}  // namespace moe
