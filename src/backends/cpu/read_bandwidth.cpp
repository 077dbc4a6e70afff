// How fast this machine streams memory into its cores: every hardware thread reads its slice
// of a buffer far larger than the caches; the denominator of the decode roofline that
// `moeinfer-cli bench` reports. Measured once per process.
#include "backends/cpu/read_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace moe {

namespace {

// Sum of the slice's 8-byte words, four independent chains (the loads overlap).
uint64_t read_slice(const uint64_t *p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) { a += p[i]; b += p[i + 1]; c += p[i + 2]; d += p[i + 3]; }
  for (; i < n; ++i) a += p[i];
  return a + b + c + d;
}

double measure(size_t bytes) {
  void *mem = std::aligned_alloc(4096, bytes);
  if (!mem) return 0.0;
  std::memset(mem, 1, bytes);
  const auto *p = static_cast<const uint64_t *>(mem);
  const size_t words = bytes / 8;
  const unsigned nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<uint64_t> sums(nt);
  double best = 0.0;
  for (int rep = 0; rep < 4; ++rep) {  // the first run warms up (page faults, clocks)
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> th;
    for (unsigned k = 0; k < nt; ++k)
      th.emplace_back([&, k] {
        const size_t b = words * k / nt, e = words * (k + 1) / nt;
        sums[k] = read_slice(p + b, e - b);
      });
    for (auto &t : th) t.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0 && s > 0) best = std::max(best, double(bytes) / s);
  }
  volatile uint64_t keep = 0;  // the sums are used: the reads cannot be dropped
  for (uint64_t v : sums) keep = keep + v;
  std::free(mem);
  return best;
}

}  // namespace

double cpu_read_bandwidth() {
  static std::once_flag once;
  static double bw = 0.0;
  std::call_once(once, [] { bw = measure(size_t(512) << 20); });
  return bw;
}

}  // namespace moe
