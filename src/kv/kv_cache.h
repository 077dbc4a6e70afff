// KV cache: n_cells slots shared by all sequences, each slot holding one token's K and V
// rows for every layer. A cell records its position and the set of sequences that see it,
// so sequences can share a prefix (kv_seq_cp) and attention masks by (sequence, position).
//
//   KvCache kv(n_cells, n_seq_max, type, layer_dims, backend);
//   std::vector<int32_t> cells;
//   if (!kv.find_slots(batch, cells)) -> ContextFull    // nothing evicted, nothing shifted
//   kv.commit(batch, cells);                              // after a successful ubatch
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "quant/dtype.h"

namespace moe {

class Backend;
class DeviceBuffer;

struct KvCell {
  int32_t pos = -1;   // -1: free
  uint64_t seq = 0;   // bit s set: sequence s sees this cell
};

// Per-ubatch runtime data the KvStore/Attention kernels read (filled before each run).
struct UbatchInfo {
  int32_t n_tokens = 0;
  const int32_t *cells = nullptr;   // cell index of each token
  const int32_t *pos = nullptr;
  const int32_t *seq = nullptr;
  int32_t n_kv = 0;                 // cells [0, n_kv) may be attended to
  const KvCell *cell_state = nullptr;  // state including this ubatch's tokens
};

struct KvLayerDims {
  int64_t k_row = 0;  // K values per token (all kv heads)
  int64_t v_row = 0;  // V values per token
};

class KvCache {
public:
  KvCache(uint32_t n_cells, uint32_t n_seq_max, KvType type, std::vector<KvLayerDims> layers, Backend &dev);
  // Each layer's K/V buffers on its own device (a placed model: the device of its attention).
  KvCache(uint32_t n_cells, uint32_t n_seq_max, KvType type, std::vector<KvLayerDims> layers, const std::vector<Backend *> &layer_dev);
  ~KvCache();

  uint32_t n_cells() const { return static_cast<uint32_t>(cells_.size()); }
  DType dtype() const { return dtype_; }
  KvType kv_type() const { return type_; }
  size_t bytes() const { return bytes_; }
  size_t layer_bytes(int layer) const {
    return (k_row_bytes(layer) + v_row_bytes(layer)) * cells_.size();
  }
  int n_layer() const { return static_cast<int>(layers_.size()); }
  size_t bytes_per_token() const;

  void *k_data(int layer) const;
  void *v_data(int layer) const;
  size_t k_row_bytes(int layer) const { return row_size(dtype_, layers_[static_cast<size_t>(layer)].k_row); }
  size_t v_row_bytes(int layer) const { return row_size(dtype_, layers_[static_cast<size_t>(layer)].v_row); }
  const KvLayerDims &dims(int layer) const { return layers_[static_cast<size_t>(layer)]; }

  // Pick free cells for n tokens (lowest free indices). False when not enough are free.
  bool find_slots(uint32_t n, int32_t *cells_out) const;
  // Claim cells for tokens (pos, seq); returns nothing, undo with release().
  void claim(const int32_t *cells, const int32_t *pos, const int32_t *seq, uint32_t n);
  void release(const int32_t *cells, uint32_t n);
  int32_t n_kv() const;  // 1 + highest used cell index

  const KvCell *cells() const { return cells_.data(); }
  void clear();
  bool seq_rm(int32_t seq, int32_t p0, int32_t p1);
  void seq_cp(int32_t src, int32_t dst, int32_t p0, int32_t p1);
  void seq_keep(int32_t seq);
  int32_t seq_pos_max(int32_t seq) const;
  bool seq_has_pos(int32_t seq, int32_t pos) const;
  uint32_t used() const { return used_; }

private:
  std::vector<KvCell> cells_;
  uint32_t n_seq_max_;
  uint32_t used_ = 0;
  KvType type_;
  DType dtype_;
  std::vector<KvLayerDims> layers_;
  std::vector<std::unique_ptr<DeviceBuffer>> k_, v_;
  size_t bytes_ = 0;
};

DType kv_dtype(KvType t);

}  // namespace moe
