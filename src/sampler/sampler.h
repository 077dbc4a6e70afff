// Sampler chain: turns a row of logits into a token. Stages run in order over a candidate
// list; the chain's own PRNG (xoshiro256**, seeded through splitmix64) makes results
// identical for a given seed on every standard library.
//
//   SamplerChain chain(/*seed*/ 42);
//   chain.add(std::make_unique<TopKStage>(40));
//   chain.add(std::make_unique<TemperatureStage>(0.8f));
//   chain.add(std::make_unique<DistStage>());
//   int32_t tok = chain.sample(logits, n_vocab);   // also records tok for penalties
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

namespace moe {

// xoshiro256** (Blackman & Vigna): small, fast, fully specified, so sequences do not depend
// on the standard library.
class Rng {
public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed);
  uint64_t next_u64();
  double next_double();  // uniform in [0, 1), 53 random bits
private:
  uint64_t s_[4];
};

struct TokenCandidate {
  int32_t id;
  float logit;
  float p;  // filled by softmax()
};

struct Candidates {
  std::vector<TokenCandidate> data;
  bool sorted = false;     // by logit, descending
  int32_t selected = -1;   // index into data once a selecting stage ran

  void init(const float *logits, int32_t n_vocab);
  void sort_desc();
  // p = softmax(logit) over data (sorts first). Max-subtracted, accumulated in double.
  void softmax();
  // The same probabilities without sorting (order unchanged): what dist needs.
  void softmax_unsorted();
  // Makes data[0..k) the k best in order (partial sort); the rest stays unordered.
  // Sets sorted when k covers everything.
  void sort_prefix(size_t k);
};

class SamplerStage {
public:
  virtual ~SamplerStage() = default;
  virtual void apply(Candidates &c, Rng &rng) = 0;
  virtual void accept(int32_t /*token*/) {}
  virtual void reset() {}
  virtual bool selects() const { return false; }  // greedy/dist pick the token
};

class GreedyStage : public SamplerStage {
public:
  void apply(Candidates &c, Rng &rng) override;
  bool selects() const override { return true; }
};

class DistStage : public SamplerStage {
public:
  void apply(Candidates &c, Rng &rng) override;
  bool selects() const override { return true; }
};

class TemperatureStage : public SamplerStage {
public:
  explicit TemperatureStage(float t) : t_(t) {}
  void apply(Candidates &c, Rng &rng) override;
private:
  float t_;
};

class TopKStage : public SamplerStage {
public:
  explicit TopKStage(int32_t k) : k_(k) {}
  void apply(Candidates &c, Rng &rng) override;
private:
  int32_t k_;
};

class TopPStage : public SamplerStage {
public:
  TopPStage(float p, size_t min_keep) : p_(p), min_keep_(min_keep) {}
  void apply(Candidates &c, Rng &rng) override;
private:
  float p_;
  size_t min_keep_;
};

class MinPStage : public SamplerStage {
public:
  MinPStage(float p, size_t min_keep) : p_(p), min_keep_(min_keep) {}
  void apply(Candidates &c, Rng &rng) override;
private:
  float p_;
  size_t min_keep_;
};

class TypicalStage : public SamplerStage {
public:
  TypicalStage(float p, size_t min_keep) : p_(p), min_keep_(min_keep) {}
  void apply(Candidates &c, Rng &rng) override;
private:
  float p_;
  size_t min_keep_;
};

class PenaltiesStage : public SamplerStage {
public:
  // last_n: 0 = off, < 0 = kMaxHistory.
  PenaltiesStage(int32_t last_n, float repeat, float frequency, float presence);
  void apply(Candidates &c, Rng &rng) override;
  void accept(int32_t token) override;
  void reset() override;
  static constexpr size_t kMaxHistory = 4096;
private:
  size_t last_n_;
  float repeat_, frequency_, presence_;
  std::deque<int32_t> history_;
  std::unordered_map<int32_t, int32_t> counts_;
};

class LogitBiasStage : public SamplerStage {
public:
  explicit LogitBiasStage(std::vector<std::pair<int32_t, float>> biases) : biases_(std::move(biases)) {}
  void apply(Candidates &c, Rng &rng) override;
private:
  std::vector<std::pair<int32_t, float>> biases_;
};

class SamplerChain {
public:
  explicit SamplerChain(uint64_t seed) : seed_(seed), rng_(seed) {}
  void add(std::unique_ptr<SamplerStage> stage) { stages_.push_back(std::move(stage)); }
  // Runs every stage; when none selected a token, draws from the remaining distribution.
  // Records the token (accept). Throws InvalidArgument for null logits / n_vocab <= 0.
  int32_t sample(const float *logits, int32_t n_vocab);
  // Runs the stages on c without selecting or accepting (tests, inspection).
  void apply(Candidates &c);
  void accept(int32_t token);
  void reset();
  void set_seed(uint64_t seed);
  size_t n_stages() const { return stages_.size(); }
private:
  uint64_t seed_;
  Rng rng_;
  std::vector<std::unique_ptr<SamplerStage>> stages_;
  Candidates scratch_;  // reused across calls to avoid a per-token allocation
};

}  // namespace moe
