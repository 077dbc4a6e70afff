// Sequence state save/restore (format in state_io.h). K/V rows go through KvCache::read_rows /
// write_rows and recurrent states through read_recurrent / write_recurrent, so a cache on any
// device (host or GPU, or split across both) is covered: a save
// copies each layer's span of the sequence's cells once, a restore one run of adjacent cells
// at a time.
#include "engine/state_io.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "backends/backend.h"
#include "core/status.h"
#include "engine/context_impl.h"
#include "gguf/gguf_reader.h"
#include "kv/kv_cache.h"
#include "model/hparams.h"

namespace moe {

namespace {

constexpr char kMagic[8] = {'M', 'O', 'E', 'S', 'T', 'A', 'T', 'E'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kRecurrentTag = 0x52434552;  // "RECR"
constexpr uint32_t kRecurrentVersion = 1;

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(const void *p, size_t n) {
    const auto *b = static_cast<const uint8_t *>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  template <class T>
  void add(const T &v) {
    add(&v, sizeof v);
  }
};

class Writer {
public:
  std::vector<uint8_t> out;
  void bytes(const void *p, size_t n) {
    const auto *b = static_cast<const uint8_t *>(p);
    out.insert(out.end(), b, b + n);
  }
  template <class T>
  void put(const T &v) {
    bytes(&v, sizeof v);
  }
};

class Reader {
public:
  Reader(const uint8_t *p, size_t n) : p_(p), n_(n) {}
  const uint8_t *bytes(size_t n) {
    if (n > n_ - at_) fail(Status::InvalidArgument, "state: truncated (%zu bytes, needs more than %zu)", n_, at_ + n);
    const uint8_t *r = p_ + at_;
    at_ += n;
    return r;
  }
  template <class T>
  T get() {
    T v;
    std::memcpy(&v, bytes(sizeof v), sizeof v);
    return v;
  }
  size_t at() const { return at_; }

private:
  const uint8_t *p_;
  size_t n_, at_ = 0;
};

KvCache &kv_of(const Context &ctx) { return *ctx.impl().kv; }

void check_seq(const Context &ctx, int32_t seq) {
  const uint32_t n = ctx.params().n_seq_max;
  if (seq < 0 || uint32_t(seq) >= n)
    fail(Status::InvalidArgument, "state: sequence %d out of range [0, %u)", seq, n);
}

}  // namespace

uint64_t model_fingerprint(const Model &model) {
  const Hparams &hp = model.hparams();
  Fnv f;
  f.add(hp.arch.data(), hp.arch.size());
  for (uint32_t v : {hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v,
                     hp.n_ff, hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_ff_shexp, hp.n_expert_shared, hp.n_rot,
                     hp.n_leading_dense, hp.kv_lora_rank})
    f.add(v);
  for (float v : {hp.rms_eps, hp.rope_theta, hp.rope_scale_factor, hp.expert_weights_scale}) f.add(v);
  for (const GgufTensorInfo &t : model.gguf().tensors()) {
    f.add(t.name.data(), t.name.size());
    f.add(static_cast<uint32_t>(t.type));
    f.add(t.n_dims);
    f.add(t.ne);
  }
  return f.h;
}

std::vector<uint8_t> save_seq_state(const Context &ctx, int32_t seq) {
  check_seq(ctx, seq);
  const KvCache &kv = kv_of(ctx);
  std::vector<int32_t> cells;
  for (uint32_t c = 0; c < kv.n_cells(); ++c)
    if (kv.cells()[c].pos >= 0 && (kv.cells()[c].seq >> seq) & 1) cells.push_back(int32_t(c));
  std::sort(cells.begin(), cells.end(), [&](int32_t a, int32_t b) { return kv.cells()[a].pos < kv.cells()[b].pos; });

  Writer w;
  w.bytes(kMagic, sizeof kMagic);
  w.put(kVersion);
  w.put(model_fingerprint(ctx.model()));
  w.put(static_cast<uint32_t>(kv.kv_type()));
  w.put(static_cast<uint32_t>(kv.n_layer()));
  w.put(static_cast<uint32_t>(cells.size()));
  for (int32_t c : cells) w.put(kv.cells()[c].pos);
  // Each layer's rows are read as one span [c_lo, c_hi] (one device copy), then picked in
  // position order.
  uint32_t c_lo = 0, c_hi = 0;
  if (!cells.empty()) {
    c_lo = uint32_t(*std::min_element(cells.begin(), cells.end()));
    c_hi = uint32_t(*std::max_element(cells.begin(), cells.end()));
  }
  std::vector<uint8_t> span;
  for (int l = 0; l < kv.n_layer(); ++l) {
    const bool has_kv = kv.k_data(l) != nullptr;
    const uint64_t kb = has_kv ? kv.k_row_bytes(l) : 0, vb = has_kv ? kv.v_row_bytes(l) : 0;
    w.put(kb);
    w.put(vb);
    if (!has_kv || cells.empty()) continue;
    for (int which = 0; which < 2; ++which) {
      const size_t rb = which ? vb : kb;
      span.resize(size_t(c_hi - c_lo + 1) * rb);
      kv.read_rows(l, which, c_lo, c_hi - c_lo + 1, span.data());
      for (int32_t c : cells) w.bytes(span.data() + size_t(uint32_t(c) - c_lo) * rb, rb);
    }
  }
  w.put(kRecurrentTag);
  w.put(kRecurrentVersion);
  std::vector<float> rec;
  for (int l = 0; l < kv.n_layer(); ++l) {
    const uint64_t n = uint64_t(kv.dims(l).recurrent());
    w.put(n);
    if (!n) continue;
    rec.resize(size_t(n));
    kv.read_recurrent(l, seq, rec.data());
    w.bytes(rec.data(), size_t(n) * sizeof(float));
  }
  Fnv sum;
  sum.add(w.out.data(), w.out.size());
  w.put(sum.h);
  return std::move(w.out);
}

void restore_seq_state(Context &ctx, int32_t seq, const uint8_t *data, size_t size) {
  check_seq(ctx, seq);
  if (!data) fail(Status::InvalidArgument, "state: data is NULL");
  KvCache &kv = kv_of(ctx);
  // Validate everything before changing anything.
  if (size < sizeof kMagic + sizeof(uint64_t) || std::memcmp(data, kMagic, sizeof kMagic) != 0)
    fail(Status::InvalidArgument, "state: not a moeinfer sequence state (bad magic)");
  Fnv sum;
  sum.add(data, size - sizeof(uint64_t));
  uint64_t stored;
  std::memcpy(&stored, data + size - sizeof stored, sizeof stored);
  Reader r(data, size - sizeof(uint64_t));
  r.bytes(sizeof kMagic);
  const auto version = r.get<uint32_t>();
  if (version != kVersion) fail(Status::Unsupported, "state: format version %u (this library reads %u)", version, kVersion);
  if (stored != sum.h) fail(Status::InvalidArgument, "state: corrupt (checksum mismatch)");
  const auto fp = r.get<uint64_t>();
  if (fp != model_fingerprint(ctx.model()))
    fail(Status::InvalidArgument, "state: saved from another model (fingerprint %016llx, this model %016llx)",
         static_cast<unsigned long long>(fp), static_cast<unsigned long long>(model_fingerprint(ctx.model())));
  const auto type = r.get<uint32_t>();
  if (type != static_cast<uint32_t>(kv.kv_type()))
    fail(Status::InvalidArgument, "state: KV rows are %s, this context's cache is %s",
         kv_type_name(static_cast<KvType>(type)), kv_type_name(kv.kv_type()));
  const auto n_layer = r.get<uint32_t>();
  if (n_layer != uint32_t(kv.n_layer())) fail(Status::InvalidArgument, "state: %u layers, the cache has %d", n_layer, kv.n_layer());
  const auto n = r.get<uint32_t>();
  std::vector<int32_t> pos(n);
  for (auto &p : pos) {
    p = r.get<int32_t>();
    if (p < 0) fail(Status::InvalidArgument, "state: negative position %d", p);
  }
  struct LayerRows {
    const uint8_t *k = nullptr, *v = nullptr;
    uint64_t kb = 0, vb = 0;
  };
  std::vector<LayerRows> rows(n_layer);
  for (uint32_t l = 0; l < n_layer; ++l) {
    LayerRows &lr = rows[l];
    lr.kb = r.get<uint64_t>();
    lr.vb = r.get<uint64_t>();
    const bool has_kv = kv.k_data(int(l)) != nullptr;
    if (lr.kb != (has_kv ? kv.k_row_bytes(int(l)) : 0) || lr.vb != (has_kv ? kv.v_row_bytes(int(l)) : 0))
      fail(Status::InvalidArgument, "state: layer %u rows of %llu/%llu bytes do not match the cache", l,
           static_cast<unsigned long long>(lr.kb), static_cast<unsigned long long>(lr.vb));
    lr.k = r.bytes(size_t(lr.kb) * n);
    lr.v = r.bytes(size_t(lr.vb) * n);
  }
  if (r.get<uint32_t>() != kRecurrentTag) fail(Status::InvalidArgument, "state: recurrent section missing");
  const auto rversion = r.get<uint32_t>();
  if (rversion != kRecurrentVersion) fail(Status::Unsupported, "state: recurrent section version %u", rversion);
  std::vector<const uint8_t *> rec(n_layer, nullptr);
  for (uint32_t l = 0; l < n_layer; ++l) {
    const auto cnt = r.get<uint64_t>();
    if (cnt != uint64_t(kv.dims(int(l)).recurrent()))
      fail(Status::InvalidArgument, "state: layer %u recurrent state of %llu values, the cache holds %lld", l,
           static_cast<unsigned long long>(cnt), static_cast<long long>(kv.dims(int(l)).recurrent()));
    if (cnt) rec[l] = r.bytes(size_t(cnt) * sizeof(float));
  }
  if (kv.has_recurrent())
    for (uint32_t i = 1; i < n; ++i)
      if (pos[i] <= pos[i - 1]) fail(Status::InvalidArgument, "state: positions not increasing (%d after %d)", pos[i], pos[i - 1]);
  // Room: free cells plus the cells only this sequence uses (they are replaced).
  uint32_t room = kv.n_cells() - kv.used();
  for (uint32_t c = 0; c < kv.n_cells(); ++c)
    if (kv.cells()[c].pos >= 0 && kv.cells()[c].seq == (uint64_t(1) << seq)) ++room;
  if (n > room) fail(Status::ContextFull, "state: %u cells needed, %u available for sequence %d", n, room, seq);

  kv.seq_rm(seq, -1, -1);
  // The previous decode's logits describe another state: none are readable until the next decode.
  Context::Impl &im = ctx.impl();
  std::fill(im.logit_row.begin(), im.logit_row.end(), -1);
  im.n_outputs = 0;
  std::vector<int32_t> cells(n), seqs(n, seq);
  if (n && !kv.find_slots(n, cells.data())) fail(Status::Internal, "state: cells counted free were not found");
  if (n) kv.claim(cells.data(), pos.data(), seqs.data(), n);
  // Token i goes to cells[i] (ascending): write each run of adjacent cells with one copy.
  for (uint32_t i = 0; i < n;) {
    uint32_t j = i + 1;
    while (j < n && cells[j] == cells[j - 1] + 1) ++j;
    for (uint32_t l = 0; l < n_layer; ++l) {
      kv.write_rows(int(l), 0, uint32_t(cells[i]), j - i, rows[l].k + size_t(i) * rows[l].kb);
      kv.write_rows(int(l), 1, uint32_t(cells[i]), j - i, rows[l].v + size_t(i) * rows[l].vb);
    }
    i = j;
  }
  if (kv.has_recurrent()) {
    // claim() marked the sequence's state as written this call: write_recurrent fills the
    // copy that commit_recurrent() makes current (the blob's bytes may be unaligned: staged).
    std::vector<float> vals;
    for (uint32_t l = 0; l < n_layer; ++l) {
      if (!rec[l]) continue;
      vals.resize(size_t(kv.dims(int(l)).recurrent()));
      std::memcpy(vals.data(), rec[l], vals.size() * sizeof(float));
      kv.write_recurrent(int(l), seq, vals.data());
    }
    kv.commit_recurrent();
  }
}

}  // namespace moe
