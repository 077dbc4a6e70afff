// Checks route_kernel (included after the kernel by gen_route.py) against a host reference:
// the tiles exactly (expert order, first entry, count, idle tail), each expert's entries as a
// multiset (the scatter's order within an expert depends on its atomics), bad ids reported and
// left out. Cases: skewed and uniform routing, one expert for every token, empty experts, the
// same expert twice for a token, X = 1 (shared activation row) and X = n_used, odd n_used,
// 512 experts, batches past one round of loads, and bad ids.
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

namespace {
using namespace moe;

struct Case {
  const char *name;
  int T, n_used, E, X, NT;
  int mode;  // 0 random, 1 all to expert 3, 2 half the experts empty, 3 duplicates, 4 bad ids
};

int run_case(const Case &c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int n = c.T * c.n_used;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    int e = static_cast<int>(rng() % static_cast<unsigned>(c.E));
    if (c.mode == 1) e = 3;
    if (c.mode == 2) e = 2 * (e / 2);
    if (c.mode == 3 && i % c.n_used == 1) e = ids[static_cast<size_t>(i - 1)];
    if (c.mode == 4 && i % 37 == 5) e = (i % 2) ? -1 : c.E + 7;
    ids[static_cast<size_t>(i)] = e;
  }
  const int max_tiles = (n + c.NT - 1) / c.NT + std::min(c.E, n);
  std::vector<int2> entries(static_cast<size_t>(n), make_int2(-1, -1));
  std::vector<int4> tiles(static_cast<size_t>(max_tiles), make_int4(-9, -9, -9, -9));
  unsigned err[4] = {0, 0, 0, 0};
  RouteTables rt{entries.data(), tiles.data()};
  emu_launch(dim3(1), kRouteThreads, route_kernel, ids.data(), static_cast<int64_t>(c.n_used), c.n_used, c.T, c.E, c.X, c.NT, rt, max_tiles,
             err);
  // Reference: per expert its entries in token order, then tiles of NT.
  std::vector<std::vector<std::pair<int, int>>> per(static_cast<size_t>(c.E));
  int bad = 0;
  for (int t = 0; t < c.T; ++t)
    for (int j = 0; j < c.n_used; ++j) {
      const int e = ids[static_cast<size_t>(t * c.n_used + j)];
      if (e < 0 || e >= c.E) { ++bad; continue; }
      per[static_cast<size_t>(e)].push_back({c.X == 1 ? t : t * c.X + j, t * c.n_used + j});
    }
  int fails = 0, first = 0, tile = 0;
  for (int e = 0; e < c.E; ++e) {
    const auto &v = per[static_cast<size_t>(e)];
    const int cnt = static_cast<int>(v.size());
    for (int k = 0; k < cnt; k += c.NT, ++tile) {
      const int4 want = make_int4(e, first + k, std::min(c.NT, cnt - k), 0), got = tiles[static_cast<size_t>(tile)];
      if (got.x != want.x || got.y != want.y || got.z != want.z || got.w != 0) ++fails;
    }
    std::vector<std::pair<int, int>> have;
    for (int p = first; p < first + cnt; ++p) have.push_back({entries[static_cast<size_t>(p)].x, entries[static_cast<size_t>(p)].y});
    std::vector<std::pair<int, int>> want = v;
    std::sort(have.begin(), have.end());
    std::sort(want.begin(), want.end());
    if (have != want) ++fails;
    first += cnt;
  }
  for (int i = tile; i < max_tiles; ++i) {
    const int4 got = tiles[static_cast<size_t>(i)];
    if (got.x != 0 || got.y != 0 || got.z != 0 || got.w != 0) ++fails;
  }
  const bool reported = err[0] != 0u;
  if (reported != (bad > 0)) ++fails;
  std::printf("%-34s T=%-4d n_used=%-2d E=%-3d X=%d NT=%-2d bad=%-3d %s\n", c.name, c.T, c.n_used, c.E, c.X, c.NT, bad, fails ? "FAIL" : "ok");
  return fails ? 1 : 0;
}
}  // namespace

int main() {
  const Case cases[] = {
      {"pp512, 8 of 128, X = 1 (gate/up)", 512, 8, 128, 1, 64, 0},
      {"pp512, 8 of 128, X = 8 (down)", 512, 8, 128, 8, 64, 0},
      {"every token to one expert", 300, 8, 128, 1, 64, 1},
      {"half the experts empty", 97, 8, 128, 1, 64, 2},
      {"the same expert twice for a token", 64, 8, 128, 8, 64, 3},
      {"bad ids reported, left out", 200, 4, 32, 4, 64, 4},
      {"512 experts, 2 rounds of loads", 1500, 8, 512, 1, 64, 0},
      {"odd n_used (3), small tiles", 333, 3, 64, 3, 8, 0},
      {"one token", 1, 8, 128, 1, 64, 0},
      {"n_used = E = 512", 3, 512, 512, 1, 64, 0},
  };
  int fails = 0;
  uint32_t seed = 1;
  for (const Case &c : cases) fails += run_case(c, seed++);
  std::printf("%d of %zu cases failed\n", fails, sizeof(cases) / sizeof(cases[0]));
  return fails ? 1 : 0;
}
