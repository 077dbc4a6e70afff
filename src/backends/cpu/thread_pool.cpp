#include "backends/cpu/thread_pool.h"

#include <chrono>
#include <climits>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__)
#include <immintrin.h>
#define MOE_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define MOE_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define MOE_CPU_RELAX() ((void)0)
#endif

namespace moe {

ThreadPool::ThreadPool(int n_threads) : n_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto &t : threads_) t.join();
}

namespace {
// Thrown by barrier() in a job that failed on another thread; caught by call_job, never
// seen outside the pool.
struct JobUnwind {};
}  // namespace

void ThreadPool::call_job(const std::function<void(int, int)> &fn, int ith) noexcept {
  try {
    fn(ith, n_);
  } catch (const JobUnwind &) {
    // Left a failed job at a barrier.
  } catch (...) {
    bool expected = false;
    if (failed_.compare_exchange_strong(expected, true, std::memory_order_seq_cst)) {
      error_ = std::current_exception();
      abort_job();
    }
  }
}

namespace {
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void ThreadPool::poll_stop() {
  // Once the callback said stop it is not asked again: the threads are only leaving.
  if (stop_requested_.load(std::memory_order_relaxed)) return;
  const int64_t now = steady_ns();
  if (now < next_poll_ns_) return;
  next_poll_ns_ = now + kStopPollIntervalNs;
  if (stop_poll_(stop_data_)) stop_requested_.store(true, std::memory_order_relaxed);
}

void ThreadPool::run(const std::function<void(int, int)> &fn) {
  // Published to the workers by the generation change below.
  stop_requested_.store(false, std::memory_order_relaxed);
  caller_ = std::this_thread::get_id();
  next_poll_ns_ = stop_poll_ ? steady_ns() + kStopPollIntervalNs : 0;
  if (n_ == 1) { fn(0, 1); return; }
  job_ = &fn;
  done_.store(0, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleepers_.load(std::memory_order_acquire) > 0) cv_.notify_all();
  call_job(fn, 0);
  // Wait for the workers to finish this job (a failed job too: fn must outlive them).
  int spins = 0;
  while (done_.load(std::memory_order_acquire) != n_ - 1) {
    if (++spins > 1000) std::this_thread::yield();
    else MOE_CPU_RELAX();
  }
  job_ = nullptr;
  if (failed_.load(std::memory_order_acquire)) {
    // Every thread is out of the job: reset the barrier for the next one, then report.
    bar_count_.store(0, std::memory_order_relaxed);
    items_.store(0, std::memory_order_relaxed);
    std::exception_ptr e = std::move(error_);
    error_ = nullptr;
    failed_.store(false, std::memory_order_release);
    std::rethrow_exception(e);
  }
}

void ThreadPool::worker(int ith) {
  uint64_t seen = 0;
  for (;;) {
    // Spin for a short while (decode steps come back to back), then sleep.
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      if (++spins < 20000) { MOE_CPU_RELAX(); continue; }
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      sleepers_.fetch_sub(1);
      break;
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    call_job(*job_, ith);
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

namespace {

// Sleep while *word == expected / wake every sleeper (Linux futex; elsewhere a yield loop).
// timeout_ns 0: no limit. A timeout or a spurious wake returns too: callers re-check.
void futex_wait(std::atomic<uint32_t> *word, uint32_t expected, int64_t timeout_ns = 0) {
#if defined(__linux__)
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT_PRIVATE, expected, timeout_ns > 0 ? &ts : nullptr,
          nullptr, 0);
#else
  (void)word, (void)expected, (void)timeout_ns;
  std::this_thread::yield();
#endif
}

void futex_wake_all(std::atomic<uint32_t> *word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

// Barrier spin budget (~75 us): a partner that is running arrives within it; one that lost
// its core does not, and then sleeping frees this core so the scheduler can run the
// partner here instead of leaving it queued behind another process (spinning or yielding
// kept 2 threads slower than 1 on a busy host). 400 spins (~20 us) put the hybrid models'
// small ops to sleep at every barrier (tiny-qwen3next tg 650 t/s at 2 threads vs 2,830 at 1);
// 1500 costs 6% on a host with one core taken (docs/perf/cpu_engine.md).
constexpr int kBarrierSpins = 1500;

}  // namespace

// A thread threw: release every thread waiting in a barrier (the phase moves on; they see
// failed_ and unwind) and keep later barriers of this job from waiting.
void ThreadPool::abort_job() {
  bar_phase_.fetch_add(1, std::memory_order_seq_cst);
  if (bar_sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&bar_phase_);
}

void ThreadPool::leave_job() { throw JobUnwind{}; }

void ThreadPool::barrier() {
  if (n_ == 1) {
    items_.store(0, std::memory_order_relaxed);
    return;
  }
  if (failed_.load(std::memory_order_acquire)) leave_job();
  const uint32_t phase = bar_phase_.load(std::memory_order_acquire);
  if (bar_count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
    bar_count_.store(0, std::memory_order_relaxed);
    items_.store(0, std::memory_order_relaxed);  // published by the phase change below
    bar_phase_.fetch_add(1, std::memory_order_seq_cst);
    if (bar_sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&bar_phase_);
    return;
  }
  for (int spins = 0; spins < kBarrierSpins; ++spins) {
    if (bar_phase_.load(std::memory_order_acquire) != phase) {
      if (failed_.load(std::memory_order_acquire)) leave_job();
      return;
    }
    MOE_CPU_RELAX();
  }
  // Announce the sleep before re-checking: the last arriver (or a failing thread) either
  // sees the sleeper and wakes it, or changed the phase before the check (then the futex
  // returns at once).
  bar_sleepers_.fetch_add(1, std::memory_order_seq_cst);
  // The decoding thread keeps polling the stop callback while it waits for slower threads
  // (a descheduled worker, a larger static share): a stop it sees makes them leave their
  // kernels early, so a cancel does not wait for the whole node.
  const bool polls = stop_poll_ && std::this_thread::get_id() == caller_;
  while (bar_phase_.load(std::memory_order_seq_cst) == phase) {
    if (polls) poll_stop();
    futex_wait(&bar_phase_, phase, polls ? kStopPollIntervalNs : 0);
  }
  bar_sleepers_.fetch_sub(1, std::memory_order_relaxed);
  if (failed_.load(std::memory_order_acquire)) leave_job();
}

int physical_core_count() {
  // Count distinct (physical id, core id) pairs; fall back to hardware_concurrency.
  std::ifstream f("/proc/cpuinfo");
  std::set<std::pair<int, int>> cores;
  std::string line;
  int phys = 0;
  while (std::getline(f, line)) {
    if (line.rfind("physical id", 0) == 0) phys = std::atoi(line.substr(line.find(':') + 1).c_str());
    else if (line.rfind("core id", 0) == 0) cores.insert({phys, std::atoi(line.substr(line.find(':') + 1).c_str())});
  }
  int n = static_cast<int>(cores.size());
  int hw = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = hw > 0 ? hw : 1;
  return n;
}

}  // namespace moe
