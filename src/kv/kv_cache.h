// Sequence state: n_cells slots shared by all sequences, each slot holding one token's K and V
// rows for every attention layer. A cell records its position and the set of sequences that see
// it, so sequences can share a prefix (kv_seq_cp) and attention masks by (sequence, position).
// Recurrent layers (gated DeltaNet) keep instead one fixed-size F32 state per sequence (the
// convolution tail and the matrix state), declared by the architecture in KvLayerDims.
//
// Recurrent states are double-buffered per sequence: a decode call reads the committed copy and
// writes the other one (kernels: recurrent_src / recurrent_dst); commit_recurrent() at the end
// of a successful call makes the written copy current, release() (a failed call) drops it, so a
// failed decode leaves every sequence's state as it was. A layer's states live on its device
// (host or GPU memory, like its K/V rows): sequence operations work on them there, and
// read_recurrent / write_recurrent copy one sequence's state to or from host memory.
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
  // Recurrent layers: F32 values per sequence, independent of the number of tokens.
  int64_t conv_state = 0;  // causal convolution tail ((kernel - 1) x channels)
  int64_t ssm_state = 0;   // DeltaNet matrix state (value heads x d x d)
  int64_t recurrent() const { return conv_state + ssm_state; }
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
    return (k_row_bytes(layer) + v_row_bytes(layer)) * cells_.size() + recurrent_bytes(layer);
  }
  // Both copies of every sequence's recurrent state of a layer (0 for attention layers).
  size_t recurrent_bytes(int layer) const {
    return 2 * n_seq_max_ * static_cast<size_t>(layers_[static_cast<size_t>(layer)].recurrent()) * sizeof(float);
  }
  bool has_recurrent() const { return has_recurrent_; }
  int n_layer() const { return static_cast<int>(layers_.size()); }
  size_t bytes_per_token() const;

  void *k_data(int layer) const;
  void *v_data(int layer) const;
  size_t k_row_bytes(int layer) const { return row_size(dtype_, layers_[static_cast<size_t>(layer)].k_row); }
  size_t v_row_bytes(int layer) const { return row_size(dtype_, layers_[static_cast<size_t>(layer)].v_row); }
  const KvLayerDims &dims(int layer) const { return layers_[static_cast<size_t>(layer)]; }
  // K (which 0) or V (1) rows of cells [c0, c0 + n) of a layer, copied to or from host memory
  // whatever the layer's device: one copy per call (a GPU download waits for the context's
  // stream, so it sees every finished decode; an upload is ordered before the next decode).
  void read_rows(int layer, int which, uint32_t c0, uint32_t n, void *dst) const;
  void write_rows(int layer, int which, uint32_t c0, uint32_t n, const void *src);

  // Pick free cells for n tokens (lowest free indices). False when not enough are free.
  bool find_slots(uint32_t n, int32_t *cells_out) const;
  // Claim cells for tokens (pos, seq); returns nothing, undo with release().
  void claim(const int32_t *cells, const int32_t *pos, const int32_t *seq, uint32_t n);
  void release(const int32_t *cells, uint32_t n);
  int32_t n_kv() const;  // 1 + highest used cell index

  const KvCell *cells() const { return cells_.data(); }
  // Sequence operations. On recurrent layers: clear zeroes every state; seq_cp copies the state
  // when [p0, p1) covers all of src (a partial copy is Unsupported); seq_rm of every position of
  // a sequence zeroes its state, of no position is a no-op, of anything else is Unsupported (a
  // recurrent state cannot be rewound); seq_keep zeroes the other sequences' states.
  void clear();
  bool seq_rm(int32_t seq, int32_t p0, int32_t p1);
  void seq_cp(int32_t src, int32_t dst, int32_t p0, int32_t p1);
  void seq_keep(int32_t seq);
  // Recurrent state of (layer, seq): the copy a kernel reads (committed, or the one written by
  // an earlier ubatch of the same call) and the copy it writes, as addresses in the layer's
  // device memory. conv values first, then ssm.
  const float *recurrent_src(int layer, int32_t seq) const;
  float *recurrent_dst(int layer, int32_t seq) const;
  // The same choice as copy indices, for device-side tables (a GPU kernel uploaded once per
  // ubatch addresses copy c of seq as recurrent_base(layer) + (c * n_seq_max + seq) * recurrent()).
  int recurrent_src_copy(int32_t seq) const;
  int recurrent_dst_copy(int32_t seq) const;
  float *recurrent_base(int layer) const;
  uint32_t n_seq_max() const { return n_seq_max_; }
  // One sequence's recurrent state of a layer (dims(layer).recurrent() floats) to or from host
  // memory whatever the layer's device: read copies the committed state (outside a decode
  // call); write fills the copy that is current after this call (after claim(): the one
  // commit_recurrent() makes current). GPU: ordered on the device's stream like read_rows.
  void read_recurrent(int layer, int32_t seq, float *dst) const;
  void write_recurrent(int layer, int32_t seq, const float *src);
  // A ubatch ran: later ubatches of the call read the states it wrote.
  void end_ubatch();
  // A decode call succeeded: the states it wrote become the committed ones.
  void commit_recurrent();
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
  // Recurrent states: per layer [2 copies][n_seq_max][recurrent()] floats on the layer's device.
  std::vector<std::unique_ptr<DeviceBuffer>> rs_;
  bool has_recurrent_ = false;
  std::vector<uint8_t> rs_cur_;      // per sequence: the committed copy (0 or 1)
  std::vector<uint8_t> rs_written_;  // per sequence: this call wrote the other copy
  float *rs_copy(int layer, int32_t seq, int which) const;
  size_t rs_offset(int layer, int32_t seq, int which) const;  // bytes into rs_[layer]
  void rs_zero(int32_t seq);
  bool seq_is_recurrent_range(int32_t seq, int32_t p0, int32_t p1, bool *all) const;
};

DType kv_dtype(KvType t);

}  // namespace moe
