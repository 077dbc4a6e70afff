// Reliability of sampling at the edges of float (issue 19): every stage takes +-inf and NaN
// logits, and extreme temperatures, to their mathematical limits. +inf logits win (several:
// dist uniform among them, greedy the lowest id), -inf is never chosen, NaN counts as -inf,
// temperature -> 0 is greedy, temperature -> inf is uniform, a +inf bias forces its token.
// Checked through the C ABI, where the findings were made.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "moeinfer/moeinfer.h"

namespace {

const float kInf = INFINITY;

// A sampler built by `build`, run `n` times on `logits` (seeds 1..n); token -> count.
std::map<int32_t, int> draws(const std::function<void(moe_sampler *)> &build, const std::vector<float> &logits, int n) {
  std::map<int32_t, int> hits;
  moe_sampler *s = nullptr;
  REQUIRE(moe_sampler_create(nullptr, &s) == MOE_STATUS_OK);
  build(s);
  for (int i = 0; i < n; ++i) {
    REQUIRE(moe_sampler_set_seed(s, uint64_t(i + 1)) == MOE_STATUS_OK);
    int32_t tok = -1;
    REQUIRE(moe_sampler_sample(s, logits.data(), int32_t(logits.size()), &tok) == MOE_STATUS_OK);
    ++hits[tok];
  }
  moe_sampler_free(s);
  return hits;
}

// Counts of n draws are uniform over `tokens` (each within 5 sigma) and nothing else drawn.
void require_uniform(const std::map<int32_t, int> &hits, const std::vector<int32_t> &tokens, int n) {
  for (const auto &h : hits) {
    INFO("drew token " << h.first);
    REQUIRE(std::find(tokens.begin(), tokens.end(), h.first) != tokens.end());
  }
  const double p = 1.0 / double(tokens.size()), sigma = std::sqrt(double(n) * p * (1 - p));
  for (int32_t t : tokens) {
    const auto it = hits.find(t);
    const double got = it == hits.end() ? 0.0 : double(it->second);
    INFO("token " << t << " drawn " << got << " times of " << n);
    CHECK(std::fabs(got - n * p) < 5 * sigma);
  }
}

auto dist_only = [](moe_sampler *s) { REQUIRE(moe_sampler_add_dist(s) == MOE_STATUS_OK); };

std::vector<float> random_logits(std::mt19937 &rng, size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> l(n);
  for (auto &x : l) x = d(rng);
  return l;
}

int32_t argmax(const std::vector<float> &l) {
  int32_t best = 0;
  for (size_t i = 1; i < l.size(); ++i)
    if (l[i] > l[size_t(best)]) best = int32_t(i);
  return best;
}

}  // namespace

TEST_CASE("reliability: dist over a +inf logit always returns it", "[reliability][sampler]") {
  std::vector<float> l(8, 0.0f);
  l[1] = kInf;
  auto hits = draws(dist_only, l, 200);
  CHECK(hits.size() == 1);
  CHECK(hits[1] == 200);  // returned 7 before (NaN probabilities)
  // after top-k too (returned 3)
  hits = draws([](moe_sampler *s) {
    REQUIRE(moe_sampler_add_top_k(s, 4) == MOE_STATUS_OK);
    REQUIRE(moe_sampler_add_dist(s) == MOE_STATUS_OK);
  }, l, 200);
  CHECK(hits.size() == 1);
  CHECK(hits[1] == 200);
}

TEST_CASE("reliability: several +inf logits: dist uniform among them and greedy the lowest id", "[reliability][sampler]") {
  std::vector<float> l = {3.0f, kInf, -1.0f, kInf, 100.0f, kInf, 0.0f, -kInf};
  const int n = 6000;
  require_uniform(draws(dist_only, l, n), {1, 3, 5}, n);
  auto greedy = draws([](moe_sampler *s) { REQUIRE(moe_sampler_add_greedy(s) == MOE_STATUS_OK); }, l, 10);
  CHECK(greedy.size() == 1);
  CHECK(greedy.begin()->first == 1);
  // A chain without a selecting stage samples like dist.
  require_uniform(draws([](moe_sampler *s) { REQUIRE(moe_sampler_add_top_k(s, 5) == MOE_STATUS_OK); }, l, n), {1, 3, 5}, n);
}

TEST_CASE("reliability: every stage keeps a single +inf logit the winner", "[reliability][sampler]") {
  std::mt19937 rng(3);
  std::vector<float> l = random_logits(rng, 50, 3.0f);
  l[17] = kInf;
  const std::vector<std::function<void(moe_sampler *)>> stages = {
      [](moe_sampler *s) { REQUIRE(moe_sampler_add_top_p(s, 0.9f, 1) == MOE_STATUS_OK); },
      [](moe_sampler *s) { REQUIRE(moe_sampler_add_min_p(s, 0.05f, 1) == MOE_STATUS_OK); },
      [](moe_sampler *s) { REQUIRE(moe_sampler_add_typical(s, 0.9f, 1) == MOE_STATUS_OK); },
      [](moe_sampler *s) { REQUIRE(moe_sampler_add_temperature(s, 0.7f) == MOE_STATUS_OK); },
      [](moe_sampler *s) { REQUIRE(moe_sampler_add_temperature(s, 1e-39f) == MOE_STATUS_OK); },
      [](moe_sampler *s) { REQUIRE(moe_sampler_add_temperature(s, 1e30f) == MOE_STATUS_OK); },
      [](moe_sampler *s) { REQUIRE(moe_sampler_add_temperature(s, kInf) == MOE_STATUS_OK); },
      [](moe_sampler *s) { REQUIRE(moe_sampler_add_penalties(s, 8, 1.3f, 0.5f, 0.5f) == MOE_STATUS_OK); },
      [](moe_sampler *s) { REQUIRE(moe_sampler_add_top_k(s, 3) == MOE_STATUS_OK); },
  };
  for (size_t k = 0; k < stages.size(); ++k) {
    INFO("stage " << k);
    auto hits = draws([&](moe_sampler *s) {
      stages[k](s);
      if (k == 7) REQUIRE(moe_sampler_accept(s, 17) == MOE_STATUS_OK);  // the penalty hits the +inf token
      REQUIRE(moe_sampler_add_dist(s) == MOE_STATUS_OK);
    }, l, 100);
    CHECK(hits.size() == 1);
    CHECK(hits.begin()->first == 17);
  }
}

TEST_CASE("reliability: -inf and NaN logits are never drawn", "[reliability][sampler]") {
  std::vector<float> l = {-kInf, NAN, 0.0f, -kInf, NAN, -50.0f, NAN};
  auto hits = draws(dist_only, l, 300);
  for (const auto &h : hits) CHECK((h.first == 2 || h.first == 5));
  // -50 against 0: e^-50 — never in 300 draws
  CHECK(hits[2] == 300);
  // Everything banned: there is no information, dist draws uniformly; greedy takes id 0.
  std::vector<float> none = {-kInf, NAN, -kInf, NAN};
  require_uniform(draws(dist_only, none, 4000), {0, 1, 2, 3}, 4000);
  auto g = draws([](moe_sampler *s) { REQUIRE(moe_sampler_add_greedy(s) == MOE_STATUS_OK); }, none, 5);
  CHECK(g.begin()->first == 0);
}

TEST_CASE("reliability: a +inf logit bias forces its token", "[reliability][sampler]") {
  std::mt19937 rng(9);
  for (int round = 0; round < 20; ++round) {
    std::vector<float> l = random_logits(rng, 40, 4.0f);
    const int32_t forced = int32_t(rng() % 40);
    if (round % 4 == 1) l[size_t(forced)] = -kInf;  // even a banned token
    if (round % 4 == 2) l[size_t(forced)] = NAN;
    const moe_logit_bias b = {forced, kInf};
    for (bool greedy : {false, true}) {
      auto hits = draws([&](moe_sampler *s) {
        REQUIRE(moe_sampler_add_logit_bias(s, &b, 1) == MOE_STATUS_OK);
        REQUIRE((greedy ? moe_sampler_add_greedy(s) : moe_sampler_add_dist(s)) == MOE_STATUS_OK);
      }, l, 50);
      INFO("round " << round << " greedy " << greedy);
      CHECK(hits.size() == 1);
      CHECK(hits.begin()->first == forced);
    }
  }
  // -inf bias bans a token even when its logit is +inf.
  std::vector<float> l = {kInf, 1.0f, 2.0f};
  const moe_logit_bias ban = {0, -kInf};
  auto hits = draws([&](moe_sampler *s) {
    REQUIRE(moe_sampler_add_logit_bias(s, &ban, 1) == MOE_STATUS_OK);
    REQUIRE(moe_sampler_add_greedy(s) == MOE_STATUS_OK);
  }, l, 5);
  CHECK(hits.begin()->first == 2);
}

TEST_CASE("reliability: temperature -> 0 is greedy and temperature -> inf is uniform", "[reliability][sampler]") {
  std::mt19937 rng(21);
  for (float t : {1e-39f, 1e-45f, FLT_MIN, 1e-30f, 1e-20f}) {
    for (int round = 0; round < 30; ++round) {
      std::vector<float> l = random_logits(rng, 64, round % 2 ? 100.0f : 0.01f);
      if (round % 3 == 0)
        for (auto &x : l) x = -std::fabs(x) - 1.0f;  // all negative: returned the worst token before
      l[size_t(rng() % 64)] = -kInf;
      auto hits = draws([t](moe_sampler *s) {
        REQUIRE(moe_sampler_add_temperature(s, t) == MOE_STATUS_OK);
        REQUIRE(moe_sampler_add_dist(s) == MOE_STATUS_OK);
      }, l, 20);
      INFO("t = " << t << " round " << round);
      CHECK(hits.size() == 1);
      CHECK(hits.begin()->first == argmax(l));
    }
  }
  // Ties at the top stay ties: uniform among them, as the limit of softmax(l / t).
  std::vector<float> tie = {1.0f, 5.0f, -3.0f, 5.0f, 4.999f};
  require_uniform(draws([](moe_sampler *s) {
    REQUIRE(moe_sampler_add_temperature(s, 1e-39f) == MOE_STATUS_OK);
    REQUIRE(moe_sampler_add_dist(s) == MOE_STATUS_OK);
  }, tie, 4000), {1, 3}, 4000);
  // Huge temperatures: every finite logit alike, -inf still banned.
  std::vector<float> l = {30.0f, -30.0f, 0.0f, 1e30f, -kInf, -1e30f};
  for (float t : {1e38f, FLT_MAX, kInf}) {
    INFO("t = " << t);
    require_uniform(draws([t](moe_sampler *s) {
      REQUIRE(moe_sampler_add_temperature(s, t) == MOE_STATUS_OK);
      REQUIRE(moe_sampler_add_dist(s) == MOE_STATUS_OK);
    }, l, 5000), {0, 1, 2, 3, 5}, 5000);
  }
}
