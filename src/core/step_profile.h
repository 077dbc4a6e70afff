#pragma once
// Where a decode step's wall time goes, for diagnostic builds only: configure with
// -DCMAKE_CXX_FLAGS=-DMOEINFER_STEP_PROFILE and every MOE_PROF_ADD sums into a process-wide
// table; moe::step_profile::report() returns it as text (key, calls, total ms, mean us) for
// the program to print (moeinfer-cli bench does, to stderr). In normal builds the macros
// compile to nothing, so the library stays silent and free of global state.
#ifdef MOEINFER_STEP_PROFILE
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

namespace moe::step_profile {
struct Table {
  std::mutex mu;
  std::map<std::string, std::pair<double, long>> rows;
};
inline Table &table() {
  static Table t;
  return t;
}
inline std::string report() {
  Table &t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::string out;
  char line[160];
  for (const auto &[key, v] : t.rows) {
    std::snprintf(line, sizeof line, "profile %-28s %9ld calls %10.2f ms %9.2f us/call\n", key.c_str(), v.second, v.first / 1e3,
                  v.first / double(v.second));
    out += line;
  }
  return out;
}
inline double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline void add(const char *key, double us) {
  Table &t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto &r = t.rows[key];
  r.first += us;
  r.second += 1;
}
}  // namespace moe::step_profile
#define MOE_PROF_NOW() ::moe::step_profile::now_us()
#define MOE_PROF_ADD(key, t0) ::moe::step_profile::add((key), ::moe::step_profile::now_us() - (t0))
#else
#define MOE_PROF_NOW() 0.0
#define MOE_PROF_ADD(key, t0) ((void)(t0))
#endif
