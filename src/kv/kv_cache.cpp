#include "kv/kv_cache.h"

#include "backends/backend.h"
#include "core/status.h"

namespace moe {

DType kv_dtype(KvType t) {
  switch (t) {
    case KvType::F32: return DType::F32;
    case KvType::F16: return DType::F16;
    case KvType::Q8_0: return DType::Q8_0;
  }
  return DType::F16;
}

KvCache::KvCache(uint32_t n_cells, uint32_t n_seq_max, KvType type, std::vector<KvLayerDims> layers, Backend &dev)
    : KvCache(n_cells, n_seq_max, type, layers, std::vector<Backend *>(layers.size(), &dev)) {}

KvCache::KvCache(uint32_t n_cells, uint32_t n_seq_max, KvType type, std::vector<KvLayerDims> layers, const std::vector<Backend *> &layer_dev)
    : cells_(n_cells), n_seq_max_(n_seq_max), type_(type), dtype_(kv_dtype(type)), layers_(std::move(layers)) {
  if (layer_dev.size() != layers_.size()) fail(Status::Internal, "KV cache: %zu layer devices for %zu layers", layer_dev.size(), layers_.size());
  if (n_seq_max == 0 || n_seq_max > 64) fail(Status::InvalidArgument, "n_seq_max %u must be 1..64", n_seq_max);
  const int64_t bs = type_traits(dtype_).block_size;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const KvLayerDims &d = layers_[l];
    if (d.k_row % bs || d.v_row % bs)
      fail(Status::Unsupported, "KV type %s needs rows that are multiples of %lld (layer %zu has %lld/%lld)",
           kv_type_name(type), (long long)bs, l, (long long)d.k_row, (long long)d.v_row);
    size_t kb = row_size(dtype_, d.k_row) * n_cells, vb = row_size(dtype_, d.v_row) * n_cells;
    Backend &dev = *layer_dev[l];
    k_.push_back(kb ? dev.alloc(kb, "kv cache") : nullptr);
    v_.push_back(vb ? dev.alloc(vb, "kv cache") : nullptr);
    if (k_.back()) k_.back()->clear();
    if (v_.back()) v_.back()->clear();
    bytes_ += kb + vb;
  }
}

KvCache::~KvCache() = default;

size_t KvCache::bytes_per_token() const { return cells_.empty() ? 0 : bytes_ / cells_.size(); }
void *KvCache::k_data(int layer) const { auto &b = k_[static_cast<size_t>(layer)]; return b ? b->data() : nullptr; }
void *KvCache::v_data(int layer) const { auto &b = v_[static_cast<size_t>(layer)]; return b ? b->data() : nullptr; }

bool KvCache::find_slots(uint32_t n, int32_t *out) const {
  if (n > cells_.size() - used_) return false;
  uint32_t k = 0;
  for (size_t i = 0; i < cells_.size() && k < n; ++i)
    if (cells_[i].pos < 0) out[k++] = static_cast<int32_t>(i);
  return k == n;
}

void KvCache::claim(const int32_t *cells, const int32_t *pos, const int32_t *seq, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    KvCell &c = cells_[static_cast<size_t>(cells[i])];
    c.pos = pos[i];
    c.seq = 1ull << seq[i];
  }
  used_ += n;
}

void KvCache::release(const int32_t *cells, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    KvCell &c = cells_[static_cast<size_t>(cells[i])];
    if (c.pos >= 0) { c.pos = -1; c.seq = 0; --used_; }
  }
}

int32_t KvCache::n_kv() const {
  for (size_t i = cells_.size(); i > 0; --i)
    if (cells_[i - 1].pos >= 0) return static_cast<int32_t>(i);
  return 0;
}

void KvCache::clear() {
  for (auto &c : cells_) c = KvCell{};
  used_ = 0;
}

static bool in_range(int32_t pos, int32_t p0, int32_t p1) {
  if (p0 < 0) p0 = 0;
  return pos >= p0 && (p1 < 0 || pos < p1);
}

bool KvCache::seq_rm(int32_t seq, int32_t p0, int32_t p1) {
  if (seq >= static_cast<int32_t>(n_seq_max_)) return false;
  for (auto &c : cells_) {
    if (c.pos < 0 || !in_range(c.pos, p0, p1)) continue;
    if (seq < 0) c.seq = 0;
    else c.seq &= ~(1ull << seq);
    if (!c.seq) { c.pos = -1; --used_; }
  }
  return true;
}

void KvCache::seq_cp(int32_t src, int32_t dst, int32_t p0, int32_t p1) {
  if (src < 0 || dst < 0 || src >= static_cast<int32_t>(n_seq_max_) || dst >= static_cast<int32_t>(n_seq_max_))
    fail(Status::InvalidArgument, "seq_cp: sequence ids %d -> %d out of range [0, %u)", src, dst, n_seq_max_);
  for (auto &c : cells_)
    if (c.pos >= 0 && (c.seq >> src & 1) && in_range(c.pos, p0, p1)) c.seq |= 1ull << dst;
}

void KvCache::seq_keep(int32_t seq) {
  if (seq < 0 || seq >= static_cast<int32_t>(n_seq_max_)) fail(Status::InvalidArgument, "seq_keep: sequence id %d out of range", seq);
  for (auto &c : cells_) {
    if (c.pos < 0) continue;
    c.seq &= 1ull << seq;
    if (!c.seq) { c.pos = -1; --used_; }
  }
}

int32_t KvCache::seq_pos_max(int32_t seq) const {
  int32_t m = -1;
  if (seq < 0 || seq >= 64) return -1;
  for (auto &c : cells_)
    if (c.pos >= 0 && (c.seq >> seq & 1) && c.pos > m) m = c.pos;
  return m;
}

bool KvCache::seq_has_pos(int32_t seq, int32_t pos) const {
  for (auto &c : cells_)
    if (c.pos == pos && (c.seq >> seq & 1)) return true;
  return false;
}

}  // namespace moe
