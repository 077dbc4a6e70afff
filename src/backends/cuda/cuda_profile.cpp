#include "backends/cuda/cuda_profile.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/status.h"

namespace moe {

void CudaProfile::add(const std::string &label, double ms) {
  std::lock_guard<std::mutex> lk(mu_);
  Entry &e = entries_[label];
  e.count++;
  e.ms += ms;
}

int64_t CudaProfile::calls() {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t n = 0;
  for (const auto &e : entries_) n += e.second.count;
  return n;
}

std::string CudaProfile::report(bool reset) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::pair<std::string, Entry>> v(entries_.begin(), entries_.end());
  std::sort(v.begin(), v.end(), [](const auto &a, const auto &b) { return a.second.ms > b.second.ms; });
  double total = 0;
  for (auto &e : v) total += e.second.ms;
  std::string out = strfmt("%-34s %8s %10s %9s %6s\n", "op", "calls", "total ms", "us/call", "share");
  for (auto &e : v)
    out += strfmt("%-34s %8lld %10.3f %9.2f %5.1f%%\n", e.first.c_str(), (long long)e.second.count, e.second.ms,
                  1000.0 * e.second.ms / static_cast<double>(e.second.count), total > 0 ? 100.0 * e.second.ms / total : 0.0);
  out += strfmt("%-34s %8s %10.3f\n", "total (kernel time)", "", total);
  if (reset) entries_.clear();
  return out;
}

}  // namespace moe
