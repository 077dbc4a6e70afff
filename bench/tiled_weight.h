// Bench helpers. Large quantized weights made fast: Random rows are quantized once per
// distinct pattern and tiled over the tensor: speed depends on shapes and types, not values,
// and quantizing 600M weights would take minutes.
#pragma once
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "../tests/support/graph_runner.h"
#include "kv/kv_cache.h"
#include "quant/dtype.h"

namespace moe_bench {

using namespace moe;

inline const GgufTensorInfo *tiled_weight(moe_test::WeightStore &ws, const char *name, DType t, std::vector<int64_t> ne) {
  const int64_t K = ne[0];
  int64_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> pool(static_cast<size_t>(K * 64));
  for (auto &v : pool) v = nd(rng);
  const size_t rs = row_size(t, K);
  std::vector<uint8_t> qpool(rs * 64);
  for (int r = 0; r < 64; ++r) quantize_row(t, pool.data() + r * K, qpool.data() + r * rs, K);
  auto info = std::make_unique<GgufTensorInfo>();
  info->name = name;
  info->type = t;
  info->n_dims = static_cast<uint32_t>(ne.size());
  for (size_t d = 0; d < ne.size(); ++d) info->ne[d] = ne[d];
  ws.bytes.emplace_back(rs * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) std::memcpy(ws.bytes.back().data() + r * rs, qpool.data() + (r * 2654435761u % 64) * rs, rs);
  info->nbytes = ws.bytes.back().size();
  info->data = ws.bytes.back().data();
  ws.infos.push_back(std::move(info));
  return ws.infos.back().get();
}

// A cache of n cells filled with one sequence at positions 0..n-1, and the ubatch of the
// last T of them (the new tokens of a benchmark step). The vectors must outlive the ubatch.
struct FilledCache {
  std::vector<int32_t> cells, pos, seq;
  UbatchInfo ub;
  FilledCache(KvCache &kv, int32_t n, int32_t T) : cells(static_cast<size_t>(n)), pos(cells.size()), seq(cells.size(), 0) {
    for (size_t i = 0; i < cells.size(); ++i) cells[i] = pos[i] = static_cast<int32_t>(i);
    kv.claim(cells.data(), pos.data(), seq.data(), static_cast<uint32_t>(n));
    ub.n_tokens = T;
    ub.cells = &cells[static_cast<size_t>(n - T)];
    ub.pos = &pos[static_cast<size_t>(n - T)];
    ub.seq = seq.data();
    ub.n_kv = kv.n_kv();
    ub.cell_state = kv.cells();
  }
};

}  // namespace moe_bench
