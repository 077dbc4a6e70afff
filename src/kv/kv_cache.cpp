#include "kv/kv_cache.h"

#include <algorithm>

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
    rs_.push_back(nullptr);
    if (d.recurrent() > 0) {
      // On the layer's device: the compiler places the layer's recurrent ops there.
      rs_.back() = dev.alloc(recurrent_bytes(static_cast<int>(l)), "recurrent state");
      rs_.back()->clear();
      has_recurrent_ = true;
    }
  }
  rs_cur_.assign(n_seq_max, 0);
  rs_written_.assign(n_seq_max, 0);
}

KvCache::~KvCache() = default;

size_t KvCache::bytes_per_token() const { return cells_.empty() ? 0 : bytes_ / cells_.size(); }
void *KvCache::k_data(int layer) const { auto &b = k_[static_cast<size_t>(layer)]; return b ? b->data() : nullptr; }
void *KvCache::v_data(int layer) const { auto &b = v_[static_cast<size_t>(layer)]; return b ? b->data() : nullptr; }

void KvCache::read_rows(int layer, int which, uint32_t c0, uint32_t n, void *dst) const {
  const size_t rb = which ? v_row_bytes(layer) : k_row_bytes(layer);
  const auto &b = (which ? v_ : k_)[static_cast<size_t>(layer)];
  if (!b || !n) return;
  if (size_t(c0) + n > cells_.size()) fail(Status::Internal, "KV rows [%u, %u) past %zu cells", c0, c0 + n, cells_.size());
  b->download(size_t(c0) * rb, dst, size_t(n) * rb);
}

void KvCache::write_rows(int layer, int which, uint32_t c0, uint32_t n, const void *src) {
  const size_t rb = which ? v_row_bytes(layer) : k_row_bytes(layer);
  const auto &b = (which ? v_ : k_)[static_cast<size_t>(layer)];
  if (!b || !n) return;
  if (size_t(c0) + n > cells_.size()) fail(Status::Internal, "KV rows [%u, %u) past %zu cells", c0, c0 + n, cells_.size());
  b->upload(size_t(c0) * rb, src, size_t(n) * rb);
}

bool KvCache::find_slots(uint32_t n, int32_t *out) const {
  if (n > cells_.size() - used_) return false;
  uint32_t k = 0;
  for (size_t i = 0; i < cells_.size() && k < n; ++i)
    if (cells_[i].pos < 0) out[k++] = static_cast<int32_t>(i);
  return k == n;
}

void KvCache::claim(const int32_t *cells, const int32_t *pos, const int32_t *seq, uint32_t n) {
  if (has_recurrent_) {
    // A recurrent state holds every earlier token of its sequence: a token can only follow
    // them. Checked before anything changes.
    std::vector<int32_t> last(n_seq_max_);
    for (uint32_t s = 0; s < n_seq_max_; ++s) last[s] = seq_pos_max(static_cast<int32_t>(s));
    for (uint32_t i = 0; i < n; ++i) {
      int32_t &lp = last[static_cast<size_t>(seq[i])];
      if (pos[i] <= lp)
        fail(Status::InvalidArgument, "decode: position %d of sequence %d does not follow its last position %d (a model with recurrent layers cannot insert or rewrite earlier positions; remove the sequence first)",
             pos[i], seq[i], lp);
      lp = pos[i];
    }
    // The first ubatch of a call that touches a sequence reads its committed state; later
    // ubatches of the same call read what the earlier ones wrote.
    for (uint32_t i = 0; i < n; ++i) rs_written_[static_cast<size_t>(seq[i])] |= 2;
  }
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
  // The states this call wrote are dropped; the committed ones stay current.
  std::fill(rs_written_.begin(), rs_written_.end(), 0);
}

// rs_written_ bits: 2 = claimed by a ubatch of the running call (its kernels write the other
// copy), 1 = an earlier ubatch of the call already wrote it (read the other copy).
size_t KvCache::rs_offset(int layer, int32_t seq, int which) const {
  const size_t per = static_cast<size_t>(layers_[static_cast<size_t>(layer)].recurrent());
  return (static_cast<size_t>(which) * n_seq_max_ + static_cast<size_t>(seq)) * per * sizeof(float);
}

float *KvCache::rs_copy(int layer, int32_t seq, int which) const {
  return recurrent_base(layer) + rs_offset(layer, seq, which) / sizeof(float);
}

float *KvCache::recurrent_base(int layer) const {
  const auto &b = rs_[static_cast<size_t>(layer)];
  return b ? static_cast<float *>(b->data()) : nullptr;
}

int KvCache::recurrent_src_copy(int32_t seq) const {
  const size_t s = static_cast<size_t>(seq);
  return (rs_written_[s] & 1) ? 1 - rs_cur_[s] : rs_cur_[s];
}

int KvCache::recurrent_dst_copy(int32_t seq) const { return 1 - rs_cur_[static_cast<size_t>(seq)]; }

const float *KvCache::recurrent_src(int layer, int32_t seq) const { return rs_copy(layer, seq, recurrent_src_copy(seq)); }
float *KvCache::recurrent_dst(int layer, int32_t seq) const { return rs_copy(layer, seq, recurrent_dst_copy(seq)); }

void KvCache::read_recurrent(int layer, int32_t seq, float *dst) const {
  const auto &b = rs_[static_cast<size_t>(layer)];
  if (!b) return;
  b->download(rs_offset(layer, seq, rs_cur_[static_cast<size_t>(seq)]), dst, static_cast<size_t>(dims(layer).recurrent()) * sizeof(float));
}

void KvCache::write_recurrent(int layer, int32_t seq, const float *src) {
  const auto &b = rs_[static_cast<size_t>(layer)];
  if (!b) return;
  const size_t s = static_cast<size_t>(seq);
  const int which = rs_written_[s] ? 1 - rs_cur_[s] : rs_cur_[s];
  b->upload(rs_offset(layer, seq, which), src, static_cast<size_t>(dims(layer).recurrent()) * sizeof(float));
}

void KvCache::end_ubatch() {
  for (uint8_t &w : rs_written_)
    if (w & 2) w = 1;
}

void KvCache::commit_recurrent() {
  end_ubatch();
  for (size_t s = 0; s < rs_written_.size(); ++s)
    if (rs_written_[s]) { rs_cur_[s] = static_cast<uint8_t>(1 - rs_cur_[s]); rs_written_[s] = 0; }
}

void KvCache::rs_zero(int32_t seq) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    const size_t bytes = static_cast<size_t>(layers_[l].recurrent()) * sizeof(float);
    if (!bytes) continue;
    for (int which : {0, 1}) rs_[l]->clear_range(rs_offset(static_cast<int>(l), seq, which), bytes);
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
  for (auto &b : rs_)
    if (b) b->clear();
  std::fill(rs_cur_.begin(), rs_cur_.end(), 0);
  std::fill(rs_written_.begin(), rs_written_.end(), 0);
}

static bool in_range(int32_t pos, int32_t p0, int32_t p1) {
  if (p0 < 0) p0 = 0;
  return pos >= p0 && (p1 < 0 || pos < p1);
}

// How [p0, p1) meets the cells of seq: *all = every cell of seq is inside. Returns whether
// any is.
bool KvCache::seq_is_recurrent_range(int32_t seq, int32_t p0, int32_t p1, bool *all) const {
  bool any = false;
  *all = true;
  for (const auto &c : cells_) {
    if (c.pos < 0 || !(c.seq >> seq & 1)) continue;
    if (in_range(c.pos, p0, p1)) any = true;
    else *all = false;
  }
  return any;
}

bool KvCache::seq_rm(int32_t seq, int32_t p0, int32_t p1) {
  if (seq >= static_cast<int32_t>(n_seq_max_)) return false;
  if (has_recurrent_) {
    // All or nothing per sequence: checked for every sequence before anything changes.
    std::vector<int32_t> emptied;
    for (int32_t s = seq < 0 ? 0 : seq; s < (seq < 0 ? static_cast<int32_t>(n_seq_max_) : seq + 1); ++s) {
      bool all = false;
      if (!seq_is_recurrent_range(s, p0, p1, &all)) continue;
      if (!all)
        fail(Status::Unsupported, "kv_seq_rm: positions [%d, %d) of sequence %d: a model with recurrent layers can only remove a whole sequence "
             "or nothing (its state cannot be rewound to an earlier position)", p0, p1, s);
      emptied.push_back(s);
    }
    for (int32_t s : emptied) rs_zero(s);
  }
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
  if (has_recurrent_ && src != dst) {
    bool all = false;
    if (!seq_is_recurrent_range(src, p0, p1, &all)) return;  // nothing to copy
    if (!all)
      fail(Status::Unsupported, "kv_seq_cp: positions [%d, %d) of sequence %d: a model with recurrent layers can only copy a whole sequence", p0, p1, src);
    if (seq_pos_max(dst) >= 0)
      fail(Status::Unsupported, "kv_seq_cp: sequence %d is not empty: with recurrent layers the destination's state would be replaced; remove it first", dst);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const size_t bytes = static_cast<size_t>(layers_[l].recurrent()) * sizeof(float);
      if (!bytes) continue;
      const int li = static_cast<int>(l);
      rs_[l]->copy_within(rs_offset(li, dst, rs_cur_[static_cast<size_t>(dst)]), rs_offset(li, src, rs_cur_[static_cast<size_t>(src)]), bytes);
    }
  }
  for (auto &c : cells_)
    if (c.pos >= 0 && (c.seq >> src & 1) && in_range(c.pos, p0, p1)) c.seq |= 1ull << dst;
}

void KvCache::seq_keep(int32_t seq) {
  if (seq < 0 || seq >= static_cast<int32_t>(n_seq_max_)) fail(Status::InvalidArgument, "seq_keep: sequence id %d out of range", seq);
  if (has_recurrent_)
    for (int32_t s = 0; s < static_cast<int32_t>(n_seq_max_); ++s)
      if (s != seq) rs_zero(s);
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
