#include "core/alloc_test_hook.h"

#include <atomic>
#include <new>

#include "core/status.h"

namespace moe {

namespace {
std::atomic<int64_t> g_countdown{-1};   // < 0: off
std::atomic<bool> g_bad_alloc{false};
std::atomic<int64_t> g_points{0};
}  // namespace

void test_fail_allocation_after(int64_t n, bool bad_alloc) {
  g_bad_alloc.store(bad_alloc, std::memory_order_relaxed);
  g_points.store(0, std::memory_order_relaxed);
  g_countdown.store(n < 0 ? -1 : n, std::memory_order_seq_cst);
}

int64_t test_allocation_points() { return g_points.load(std::memory_order_relaxed); }

void allocation_point(size_t bytes, const char *what) {
  if (g_countdown.load(std::memory_order_relaxed) < 0) return;
  g_points.fetch_add(1, std::memory_order_relaxed);
  // Take one step of the countdown; the caller that moves it from 0 to -1 fails.
  int64_t c = g_countdown.load(std::memory_order_relaxed);
  while (c >= 0 && !g_countdown.compare_exchange_weak(c, c - 1, std::memory_order_relaxed)) {
  }
  if (c != 0) return;
  if (g_bad_alloc.load(std::memory_order_relaxed)) throw std::bad_alloc();
  fail(Status::OutOfMemory, "cannot allocate %zu bytes for %s (test_fail_allocation_after)", bytes, what ? what : "a buffer");
}

}  // namespace moe
