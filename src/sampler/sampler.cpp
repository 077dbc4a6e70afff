#include "sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/status.h"

namespace moe {

namespace {
uint64_t splitmix64(uint64_t &x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

constexpr float kInf = std::numeric_limits<float>::infinity();

// A NaN logit ranks as -inf everywhere (init maps it so; this keeps a NaN a later stage
// might produce from breaking the ordering).
inline float rank_key(float l) { return l == l ? l : -kInf; }

// Total order (logit desc, id asc) so sorting is deterministic across std::sort versions.
inline bool better(const TokenCandidate &a, const TokenCandidate &b) {
  const float x = rank_key(a.logit), y = rank_key(b.logit);
  return x > y || (x == y && a.id < b.id);
}

// Index of token id in c.data, or -1. O(1) when the data is still the untouched full vocab.
inline long find_token(const Candidates &c, int32_t id) {
  if (id >= 0 && static_cast<size_t>(id) < c.data.size() && c.data[id].id == id) return id;
  for (size_t i = 0; i < c.data.size(); ++i)
    if (c.data[i].id == id) return static_cast<long>(i);
  return -1;
}
}  // namespace

void Rng::reseed(uint64_t seed) {
  uint64_t x = seed;
  for (auto &s : s_) s = splitmix64(x);
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

void Candidates::init(const float *logits, int32_t n_vocab) {
  data.resize(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) {
    float l = logits[i];
    // NaN would break the sort's ordering; treat it as "never pick".
    if (std::isnan(l)) l = -std::numeric_limits<float>::infinity();
    data[static_cast<size_t>(i)] = {i, l, 0.0f};
  }
  sorted = false;
  selected = -1;
}

void Candidates::sort_desc() {
  if (sorted) return;
  std::sort(data.begin(), data.end(), better);
  sorted = true;
}

void Candidates::sort_prefix(size_t k) {
  if (sorted) return;
  if (k >= data.size()) {
    sort_desc();
    return;
  }
  std::partial_sort(data.begin(), data.begin() + static_cast<long>(k), data.end(), better);
}

// The limits of softmax at the infinities: when some logits are +inf they share the whole
// mass equally (each is "infinitely" more likely than any finite one) and everything else
// gets 0; -inf (and NaN, ranked as -inf) gets 0; when nothing is above -inf the draw is
// uniform over all candidates (there is no better information).
void Candidates::softmax_unsorted() {
  if (data.empty()) return;
  float mx = -kInf;
  size_t n_pos_inf = 0;
  for (const auto &t : data) {
    const float l = rank_key(t.logit);
    mx = std::max(mx, l);
    n_pos_inf += l == kInf;
  }
  if (n_pos_inf > 0) {
    const float share = 1.0f / static_cast<float>(n_pos_inf);
    for (auto &t : data) t.p = rank_key(t.logit) == kInf ? share : 0.0f;
    return;
  }
  if (mx == -kInf) {  // everything banned: fall back to uniform
    for (auto &t : data) t.p = 1.0f / static_cast<float>(data.size());
    return;
  }
  double sum = 0.0;
  for (auto &t : data) {
    const double e = std::exp(static_cast<double>(rank_key(t.logit)) - mx);
    t.p = static_cast<float>(e);
    sum += e;
  }
  const double inv = 1.0 / sum;
  for (auto &t : data) t.p = static_cast<float>(static_cast<double>(t.p) * inv);
}

void Candidates::softmax() {
  sort_desc();
  softmax_unsorted();
}

void GreedyStage::apply(Candidates &c, Rng &) {
  if (c.data.empty()) return;
  size_t best = 0;
  for (size_t i = 1; i < c.data.size(); ++i)
    if (better(c.data[i], c.data[best])) best = i;
  c.selected = static_cast<int32_t>(best);
}

void DistStage::apply(Candidates &c, Rng &rng) {
  if (c.data.empty()) return;
  c.softmax_unsorted();  // drawing needs no order: skipping the sort keeps full-vocab dist cheap
  const double u = rng.next_double();
  double cum = 0.0;
  size_t last_nonzero = 0;
  for (size_t i = 0; i < c.data.size(); ++i) {
    if (c.data[i].p <= 0.0f) continue;
    last_nonzero = i;
    cum += c.data[i].p;
    if (u < cum) {
      c.selected = static_cast<int32_t>(i);
      return;
    }
  }
  c.selected = static_cast<int32_t>(last_nonzero);  // float rounding left cum just below u
}

void TemperatureStage::apply(Candidates &c, Rng &) {
  if (c.data.empty()) return;
  if (t_ <= 0.0f) {  // zero temperature = the best token only
    size_t best = 0;
    for (size_t i = 1; i < c.data.size(); ++i)
      if (better(c.data[i], c.data[best])) best = i;
    TokenCandidate keep = c.data[best];
    c.data.assign(1, keep);
    c.sorted = true;
    return;
  }
  if (t_ != t_) return;  // NaN: no defined scaling (the C ABI rejects it); leave the logits
  // +-inf logits keep their sign at every temperature (forced / banned tokens stay so).
  if (std::isinf(t_)) {  // the limit t -> inf: every finite logit becomes 0 (uniform)
    for (auto &t : c.data)
      if (std::isfinite(t.logit)) t.logit = 0.0f;
    return;
  }
  // logit / t in float, unless that overflows (a tiny t): then the limit t -> 0 must come
  // out, i.e. the best finite logits stay ahead of the rest by an infinite margin. Shifting
  // by the best finite logit first (softmax does not change) keeps it at 0 and lets only the
  // worse ones run to -inf, instead of every positive logit becoming +inf.
  float mx = -kInf, mn = kInf;
  for (const auto &t : c.data)
    if (std::isfinite(t.logit)) mx = std::max(mx, t.logit), mn = std::min(mn, t.logit);
  if (mx == -kInf) return;  // nothing finite to scale
  const double t = static_cast<double>(t_);
  const double big = std::max(std::fabs(static_cast<double>(mx)), std::fabs(static_cast<double>(mn))) / t;
  if (big <= 0.5 * static_cast<double>(std::numeric_limits<float>::max())) {
    for (auto &x : c.data) x.logit /= t_;
    return;
  }
  for (auto &x : c.data)
    if (std::isfinite(x.logit)) x.logit = static_cast<float>((static_cast<double>(x.logit) - mx) / t);
  c.sorted = false;  // increasing map, but rounding to -inf can tie formerly distinct logits
}

void TopKStage::apply(Candidates &c, Rng &) {
  if (k_ <= 0 || static_cast<size_t>(k_) >= c.data.size()) return;
  if (!c.sorted) {
    std::partial_sort(c.data.begin(), c.data.begin() + k_, c.data.end(), better);
  }
  c.data.resize(static_cast<size_t>(k_));
  c.sorted = true;
}

void TopPStage::apply(Candidates &c, Rng &) {
  if (p_ >= 1.0f || c.data.empty()) return;
  c.softmax_unsorted();  // probabilities do not depend on order
  // The kept prefix is usually small: sort only a growing prefix instead of the whole vocab.
  size_t k = std::min<size_t>(c.data.size(), std::max<size_t>(256, min_keep_));
  for (;;) {
    c.sort_prefix(k);
    double cum = 0.0;
    for (size_t i = 0; i < k; ++i) {
      cum += c.data[i].p;
      if (cum >= p_ && i + 1 >= min_keep_) {
        c.data.resize(i + 1);
        c.sorted = true;
        return;
      }
    }
    if (k == c.data.size()) return;  // the whole set is needed to reach p
    k = std::min(c.data.size(), k * 4);
  }
}

void MinPStage::apply(Candidates &c, Rng &) {
  if (p_ <= 0.0f || c.data.empty()) return;
  // p_i >= p * p_max  <=>  logit_i >= logit_max + log(p): no softmax or sort needed.
  float mx = -std::numeric_limits<float>::infinity();
  for (const auto &t : c.data) mx = std::max(mx, t.logit);
  const double thr = static_cast<double>(mx) + std::log(static_cast<double>(p_));
  const size_t min_keep = std::max<size_t>(1, min_keep_);
  size_t n_keep = 0;
  for (const auto &t : c.data) n_keep += static_cast<double>(t.logit) >= thr;
  if (n_keep >= min_keep) {
    const bool was_sorted = c.sorted;
    size_t w = 0;
    for (size_t i = 0; i < c.data.size(); ++i)
      if (static_cast<double>(c.data[i].logit) >= thr) c.data[w++] = c.data[i];
    c.data.resize(w);
    c.sorted = was_sorted;  // order preserved by the filter
  } else {
    c.sort_desc();
    c.data.resize(std::min(min_keep, c.data.size()));
  }
}

void TypicalStage::apply(Candidates &c, Rng &) {
  if (p_ >= 1.0f || c.data.empty()) return;
  c.softmax();
  double entropy = 0.0;
  for (const auto &t : c.data)
    if (t.p > 0.0f) entropy -= static_cast<double>(t.p) * std::log(static_cast<double>(t.p));
  std::vector<std::pair<double, size_t>> order(c.data.size());
  for (size_t i = 0; i < c.data.size(); ++i) {
    const double p = c.data[i].p;
    const double surprise = p > 0.0 ? -std::log(p) : std::numeric_limits<double>::infinity();
    order[i] = {std::fabs(surprise - entropy), i};
  }
  std::sort(order.begin(), order.end());  // ties broken by index = logit order: deterministic
  double cum = 0.0;
  size_t keep = order.size();
  for (size_t i = 0; i < order.size(); ++i) {
    cum += c.data[order[i].second].p;
    if (cum >= p_ && i + 1 >= min_keep_) {
      keep = i + 1;
      break;
    }
  }
  std::vector<TokenCandidate> out;
  out.reserve(keep);
  for (size_t i = 0; i < keep; ++i) out.push_back(c.data[order[i].second]);
  c.data.swap(out);
  c.sorted = false;
}

PenaltiesStage::PenaltiesStage(int32_t last_n, float repeat, float frequency, float presence)
    : last_n_(last_n < 0 ? kMaxHistory : std::min<size_t>(static_cast<size_t>(last_n), kMaxHistory)),
      repeat_(repeat), frequency_(frequency), presence_(presence) {}

void PenaltiesStage::apply(Candidates &c, Rng &) {
  if (last_n_ == 0 || counts_.empty()) return;
  if (repeat_ == 1.0f && frequency_ == 0.0f && presence_ == 0.0f) return;
  for (const auto &kv : counts_) {
    const long idx = find_token(c, kv.first);
    if (idx < 0) continue;
    float &l = c.data[static_cast<size_t>(idx)].logit;
    if (repeat_ != 1.0f) l = l <= 0.0f ? l * repeat_ : l / repeat_;
    l -= static_cast<float>(kv.second) * frequency_ + (kv.second > 0 ? presence_ : 0.0f);
  }
  c.sorted = false;
}

void PenaltiesStage::accept(int32_t token) {
  if (last_n_ == 0) return;
  history_.push_back(token);
  ++counts_[token];
  if (history_.size() > last_n_) {
    const int32_t old = history_.front();
    history_.pop_front();
    auto it = counts_.find(old);
    if (it != counts_.end() && --it->second <= 0) counts_.erase(it);
  }
}

void PenaltiesStage::reset() {
  history_.clear();
  counts_.clear();
}

void LogitBiasStage::apply(Candidates &c, Rng &) {
  bool changed = false;
  for (const auto &b : biases_) {
    const long idx = find_token(c, b.first);
    if (idx < 0) continue;
    float &l = c.data[static_cast<size_t>(idx)].logit;
    // An infinite bias sets the logit: +inf forces the token (whatever its logit was, even
    // -inf or NaN), -inf bans it; adding would give NaN for +inf + -inf.
    l = std::isinf(b.second) ? b.second : l + b.second;
    changed = true;
  }
  if (changed) c.sorted = false;
}

void SamplerChain::apply(Candidates &c) {
  for (auto &s : stages_) {
    s->apply(c, rng_);
    if (c.selected >= 0) break;
  }
}

int32_t SamplerChain::sample(const float *logits, int32_t n_vocab) {
  if (!logits) throw Error(Status::InvalidArgument, "sampler: logits is null");
  if (n_vocab <= 0) throw Error(Status::InvalidArgument, strfmt("sampler: n_vocab %d <= 0", n_vocab));
  if (!stages_.empty() && dynamic_cast<GreedyStage *>(stages_.front().get())) {
    // Greedy first: the answer is the argmax of the raw logits; no candidate list needed.
    int32_t best = -1;
    float best_l = -std::numeric_limits<float>::infinity();
    for (int32_t i = 0; i < n_vocab; ++i)
      if (logits[i] > best_l) best_l = logits[i], best = i;  // NaN never compares greater
    if (best < 0) best = 0;  // all -inf / NaN: same as the candidate path (lowest id)
    accept(best);
    return best;
  }
  scratch_.init(logits, n_vocab);
  apply(scratch_);
  if (scratch_.selected < 0) {
    DistStage dist;  // chain without a selecting stage: draw from what is left
    dist.apply(scratch_, rng_);
  }
  if (scratch_.selected < 0 || static_cast<size_t>(scratch_.selected) >= scratch_.data.size())
    throw Error(Status::Internal, "sampler: no candidate left to select");
  const int32_t tok = scratch_.data[static_cast<size_t>(scratch_.selected)].id;
  accept(tok);
  return tok;
}

void SamplerChain::accept(int32_t token) {
  for (auto &s : stages_) s->accept(token);
}

void SamplerChain::reset() {
  for (auto &s : stages_) s->reset();
  rng_.reseed(seed_);
}

void SamplerChain::set_seed(uint64_t seed) {
  seed_ = seed;
  rng_.reseed(seed);
}

}  // namespace moe
