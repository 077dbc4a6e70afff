// Sampler chain: every stage's output distribution against an independent float64
// computation, seeded determinism, and empirical sampling frequencies.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "core/status.h"
#include "sampler/sampler.h"

using namespace moe;

namespace {

using Dist = std::map<int32_t, double>;  // token -> probability

const std::vector<float> kLogits = {1.5f, -0.5f, 3.0f, 0.25f, 2.0f, -2.0f, 0.0f, 2.5f, -1.0f, 1.0f};

// Softmax in float64 over a subset of tokens with (possibly modified) logits.
Dist softmax64(const std::map<int32_t, double> &logit) {
  double mx = -INFINITY;
  for (auto &kv : logit) mx = std::max(mx, kv.second);
  double sum = 0;
  for (auto &kv : logit) sum += std::exp(kv.second - mx);
  Dist d;
  for (auto &kv : logit) d[kv.first] = std::exp(kv.second - mx) / sum;
  return d;
}

std::map<int32_t, double> all_logits(const std::vector<float> &l) {
  std::map<int32_t, double> m;
  for (size_t i = 0; i < l.size(); ++i) m[static_cast<int32_t>(i)] = l[i];
  return m;
}

// Tokens ordered by probability descending (ties: lower id first).
std::vector<int32_t> by_prob(const Dist &d) {
  std::vector<int32_t> ids;
  for (auto &kv : d) ids.push_back(kv.first);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return d.at(a) > d.at(b) || (d.at(a) == d.at(b) && a < b);
  });
  return ids;
}

// Runs one stage over kLogits and returns softmax of what is left.
Dist run_stage(SamplerStage &stage, const std::vector<float> &logits = kLogits) {
  Candidates c;
  c.init(logits.data(), static_cast<int32_t>(logits.size()));
  Rng rng(1);
  stage.apply(c, rng);
  c.softmax();
  Dist d;
  for (auto &t : c.data) d[t.id] = t.p;
  return d;
}

void require_same(const Dist &got, const Dist &want, double tol = 1e-6) {
  REQUIRE(got.size() == want.size());
  for (auto &kv : want) {
    INFO("token " << kv.first);
    REQUIRE(got.count(kv.first) == 1);
    CHECK(got.at(kv.first) == Approx(kv.second).margin(tol));
  }
}

Dist restrict_to(const std::map<int32_t, double> &logits, const std::vector<int32_t> &keep) {
  std::map<int32_t, double> m;
  for (int32_t id : keep) m[id] = logits.at(id);
  return softmax64(m);
}

}  // namespace

TEST_CASE("xoshiro256** matches the reference sequence", "[sampler]") {
  // Values from an independent Python implementation (splitmix64 seeding).
  Rng r(42);
  CHECK(r.next_u64() == 0x15780b2e0c2ec716ull);
  CHECK(r.next_u64() == 0x6104d9866d113a7eull);
  CHECK(r.next_u64() == 0xae17533239e499a1ull);
  Rng z(0);
  CHECK(z.next_u64() == 0x99ec5f36cb75f2b4ull);
  for (int i = 0; i < 1000; ++i) {
    double u = z.next_double();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
  }
}

TEST_CASE("greedy picks the argmax, ties to the lowest id", "[sampler]") {
  SamplerChain chain(0);
  chain.add(std::make_unique<GreedyStage>());
  CHECK(chain.sample(kLogits.data(), static_cast<int32_t>(kLogits.size())) == 2);
  std::vector<float> tie = {0.f, 5.f, 1.f, 5.f};
  CHECK(chain.sample(tie.data(), 4) == 1);
  std::vector<float> nan = {NAN, -1.f, NAN};
  CHECK(chain.sample(nan.data(), 3) == 1);
}

TEST_CASE("temperature scales logits", "[sampler]") {
  for (float t : {0.5f, 1.0f, 2.0f}) {
    TemperatureStage s(t);
    auto want_l = all_logits(kLogits);
    for (auto &kv : want_l) kv.second = static_cast<double>(static_cast<float>(kv.second) / t);
    require_same(run_stage(s), softmax64(want_l));
  }
  TemperatureStage zero(0.0f);
  Dist d = run_stage(zero);
  REQUIRE(d.size() == 1);
  CHECK(d.begin()->first == 2);
}

TEST_CASE("top-k keeps the k most likely", "[sampler]") {
  auto l = all_logits(kLogits);
  auto order = by_prob(softmax64(l));
  for (int k : {1, 3, 5}) {
    TopKStage s(k);
    require_same(run_stage(s), restrict_to(l, std::vector<int32_t>(order.begin(), order.begin() + k)));
  }
  TopKStage none(0);
  require_same(run_stage(none), softmax64(l));
  TopKStage big(100);
  require_same(run_stage(big), softmax64(l));
}

TEST_CASE("top-p keeps the smallest prefix reaching p", "[sampler]") {
  auto l = all_logits(kLogits);
  Dist full = softmax64(l);
  auto order = by_prob(full);
  for (double p : {0.3, 0.6, 0.9, 0.99}) {
    double cum = 0;
    size_t keep = 0;
    while (keep < order.size()) {
      cum += full.at(order[keep++]);
      if (cum >= p) break;
    }
    TopPStage s(static_cast<float>(p), 1);
    INFO("p = " << p);
    require_same(run_stage(s), restrict_to(l, std::vector<int32_t>(order.begin(), order.begin() + keep)));
  }
  TopPStage mk(0.01f, 4);  // min_keep wins over a tiny p
  CHECK(run_stage(mk).size() == 4);
}

TEST_CASE("min-p keeps tokens above p * max probability", "[sampler]") {
  auto l = all_logits(kLogits);
  Dist full = softmax64(l);
  double pmax = 0;
  for (auto &kv : full) pmax = std::max(pmax, kv.second);
  for (double p : {0.05, 0.2, 0.5}) {
    std::vector<int32_t> keep;
    for (auto &kv : full)
      if (kv.second >= p * pmax) keep.push_back(kv.first);
    MinPStage s(static_cast<float>(p), 1);
    INFO("p = " << p);
    require_same(run_stage(s), restrict_to(l, keep));
  }
  MinPStage mk(0.99f, 3);
  CHECK(run_stage(mk).size() == 3);
}

TEST_CASE("typical-p keeps tokens with surprise closest to the entropy", "[sampler]") {
  auto l = all_logits(kLogits);
  Dist full = softmax64(l);
  double H = 0;
  for (auto &kv : full) H -= kv.second * std::log(kv.second);
  std::vector<int32_t> ids;
  for (auto &kv : full) ids.push_back(kv.first);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return std::fabs(-std::log(full.at(a)) - H) < std::fabs(-std::log(full.at(b)) - H);
  });
  for (double p : {0.2, 0.5, 0.9}) {
    double cum = 0;
    size_t keep = 0;
    while (keep < ids.size()) {
      cum += full.at(ids[keep++]);
      if (cum >= p) break;
    }
    TypicalStage s(static_cast<float>(p), 1);
    INFO("p = " << p);
    require_same(run_stage(s), restrict_to(l, std::vector<int32_t>(ids.begin(), ids.begin() + keep)));
  }
}

TEST_CASE("repetition, frequency and presence penalties over the last N tokens", "[sampler]") {
  const float rep = 1.3f, freq = 0.4f, pres = 0.25f;
  PenaltiesStage s(/*last_n*/ 4, rep, freq, pres);
  // History 9, 1, 2, 2, 7, 2 -> window of 4 = {2, 2, 7, 2}: counts 2:3, 7:1.
  for (int32_t t : {9, 1, 2, 2, 7, 2}) s.accept(t);
  auto l = all_logits(kLogits);
  auto pen = [&](double x, int cnt) {
    double y = x <= 0 ? x * rep : x / rep;
    return y - cnt * freq - pres;
  };
  l[2] = pen(kLogits[2], 3);
  l[7] = pen(kLogits[7], 1);
  require_same(run_stage(s), softmax64(l), 1e-5);
  s.reset();
  require_same(run_stage(s), softmax64(all_logits(kLogits)));
  // Negative logits are multiplied by the repetition penalty.
  PenaltiesStage neg(8, 2.0f, 0.0f, 0.0f);
  neg.accept(5);
  auto l2 = all_logits(kLogits);
  l2[5] = kLogits[5] * 2.0;
  require_same(run_stage(neg), softmax64(l2), 1e-5);
}

TEST_CASE("logit bias adds to logits and can ban tokens", "[sampler]") {
  LogitBiasStage s({{0, 2.0f}, {2, -INFINITY}, {99, 5.0f}});
  auto l = all_logits(kLogits);
  l[0] += 2.0;
  l.erase(2);  // -inf: probability 0
  Dist got = run_stage(s);
  CHECK(got.at(2) == 0.0);
  got.erase(2);
  require_same(got, softmax64(l));
}

TEST_CASE("dist draws match the float64 distribution", "[sampler]") {
  SamplerChain chain(1234);
  chain.add(std::make_unique<TopKStage>(5));
  chain.add(std::make_unique<TemperatureStage>(0.7f));
  chain.add(std::make_unique<DistStage>());
  auto l = all_logits(kLogits);
  auto order = by_prob(softmax64(l));
  std::map<int32_t, double> kept;
  for (int i = 0; i < 5; ++i) kept[order[i]] = static_cast<double>(static_cast<float>(l[order[i]]) / 0.7f);
  Dist want = softmax64(kept);
  const int N = 200000;
  std::map<int32_t, int> hits;
  for (int i = 0; i < N; ++i) ++hits[chain.sample(kLogits.data(), static_cast<int32_t>(kLogits.size()))];
  for (auto &kv : hits) REQUIRE(want.count(kv.first) == 1);
  for (auto &kv : want) {
    const double freq = static_cast<double>(hits[kv.first]) / N;
    const double sigma = std::sqrt(kv.second * (1 - kv.second) / N);
    INFO("token " << kv.first << " p=" << kv.second << " freq=" << freq);
    CHECK(std::fabs(freq - kv.second) < 5 * sigma + 1e-9);
  }
}

TEST_CASE("same seed gives the same tokens; reset replays", "[sampler]") {
  auto make = [](uint64_t seed) {
    auto c = std::make_unique<SamplerChain>(seed);
    c->add(std::make_unique<PenaltiesStage>(16, 1.1f, 0.1f, 0.1f));
    c->add(std::make_unique<TopPStage>(0.95f, 1));
    c->add(std::make_unique<MinPStage>(0.02f, 1));
    c->add(std::make_unique<TemperatureStage>(1.2f));
    c->add(std::make_unique<DistStage>());
    return c;
  };
  auto run = [&](SamplerChain &c) {
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(c.sample(kLogits.data(), static_cast<int32_t>(kLogits.size())));
    return out;
  };
  auto a = make(7), b = make(7), d = make(8);
  auto ta = run(*a);
  CHECK(ta == run(*b));
  CHECK(ta != run(*d));
  a->reset();
  CHECK(run(*a) == ta);
}

TEST_CASE("a chain without a selecting stage samples like dist", "[sampler]") {
  SamplerChain c1(5), c2(5);
  c1.add(std::make_unique<TopKStage>(3));
  c2.add(std::make_unique<TopKStage>(3));
  c2.add(std::make_unique<DistStage>());
  for (int i = 0; i < 50; ++i)
    CHECK(c1.sample(kLogits.data(), 10) == c2.sample(kLogits.data(), 10));
}

TEST_CASE("sampler rejects null logits and empty vocab", "[sampler]") {
  SamplerChain c(0);
  c.add(std::make_unique<GreedyStage>());
  CHECK_THROWS_AS(c.sample(nullptr, 3), Error);
  CHECK_THROWS_AS(c.sample(kLogits.data(), 0), Error);
}

TEST_CASE("top-p on a large flat vocabulary (partial-sort expansion) matches float64", "[sampler]") {
  // 5000 logits in a narrow range: reaching p needs thousands of tokens, so the growing
  // partial sort has to expand several times.
  std::vector<float> big(5000);
  Rng r(9);
  for (auto &x : big) x = static_cast<float>(r.next_double() * 2.0 - 1.0);
  auto l = all_logits(big);
  Dist full = softmax64(l);
  auto order = by_prob(full);
  for (double p : {0.05, 0.5, 0.9}) {
    double cum = 0;
    size_t keep = 0;
    while (keep < order.size()) {
      cum += full.at(order[keep++]);
      if (cum >= p) break;
    }
    TopPStage s(static_cast<float>(p), 1);
    INFO("p = " << p << " keep = " << keep);
    Dist got = run_stage(s, big);
    // float32 cumulative sums may cross p one token earlier/later than float64.
    REQUIRE(std::llabs(static_cast<long long>(got.size()) - static_cast<long long>(keep)) <= 1);
    const size_t n = std::min(got.size(), keep);
    for (size_t i = 0; i < n; ++i) REQUIRE(got.count(order[i]) == 1);
  }
}
