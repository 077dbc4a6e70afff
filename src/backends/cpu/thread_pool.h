// Persistent worker threads for one context's CPU work. A job runs on every thread
// (the caller is thread 0) and may synchronise with barrier(); between jobs workers spin
// briefly and then sleep, so an idle host application costs no CPU.
//
//   ThreadPool pool(4);
//   pool.run([&](int ith, int nth) { ... pool.barrier(); ... });
//
// A job that throws on any thread ends the job on every thread: the first exception is
// kept, threads waiting in (or later reaching) a barrier of that job leave it by an internal
// unwind, and run() rethrows the kept exception on the calling thread once all threads are
// out of the job. The pool stays usable.
//
// Stop polling: with set_stop_poll(poll, data) the calling thread (thread 0) calls
// poll(data) from take_items() at most every kStopPollInterval while a job runs; once it
// returns true take_items() hands out no more items, so every kernel that shares its work
// through it (the matmuls, the MoE experts) ends early on every thread. Worker threads
// only read the resulting flag; they never call poll.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moe {

class ThreadPool {
public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  int size() const { return n_; }
  // Runs fn(ith, nth) on all threads and returns when all are done; rethrows the first
  // exception any thread's fn threw (after every thread left the job). Not reentrant.
  void run(const std::function<void(int, int)> &fn);
  // All threads of the current job meet here. In a job that failed on another thread it
  // does not wait: it unwinds the calling thread out of the job.
  void barrier();
  // Dynamic work sharing inside one job step: every barrier restarts the item counter at
  // 0, so after a barrier every thread takes item indices from take_items() until it gets
  // one past its last item (and then must pass a barrier before the counter is used again).
  // A descheduled thread then delays the step by its current item only, not by a fixed
  // share (2 threads on a busy host otherwise lost to 1).
  // After a stop (see set_stop_poll) it returns kNoMoreItems, past any item count.
  int64_t take_items(int64_t n = 1) {
    if (stop_requested_.load(std::memory_order_relaxed) || flag_says_stop()) return kNoMoreItems;
    if (stop_poll_ && std::this_thread::get_id() == caller_) poll_stop();
    return items_.fetch_add(n, std::memory_order_relaxed);
  }
  // For kernels that split their rows statically: call per row (group); true = stop now.
  bool stop_point(int ith) {
    if (ith == 0 && stop_poll_) poll_stop();
    return stop_requested_.load(std::memory_order_relaxed) || flag_says_stop();
  }
  // Restarts the item counter without a barrier: only while no other thread can take items
  // (thread 0 running a node alone while the others wait at the next barrier).
  void reset_items() { items_.store(0, std::memory_order_relaxed); }
  static constexpr int64_t kNoMoreItems = INT64_MAX / 4;
  static constexpr int64_t kStopPollIntervalNs = 250000;  // 0.25 ms between polls inside a kernel

  // The stop poll of the following jobs (nullptr: none). Set between jobs only.
  void set_stop_poll(bool (*poll)(void *), void *data) {
    stop_poll_ = poll;
    stop_data_ = data;
  }
  // A stop flag of the following jobs (nullptr: none), read by every thread at every item:
  // moe_decode_cancel's flag, so a cancel does not wait for thread 0 to finish its item and
  // reach a poll. Set between jobs only.
  void set_stop_flag(const std::atomic<bool> *flag) { stop_flag_ = flag; }
  // A poll inside take_items() said stop during the current (or last) job.
  bool stop_requested() const { return stop_requested_.load(std::memory_order_relaxed); }
  // Thread 0's own poll between nodes said stop: recorded like a poll inside the pool, so the
  // callback is not asked again while the job winds down (a barrier's wait polls too).
  void request_stop() { stop_requested_.store(true, std::memory_order_relaxed); }

private:
  void worker(int ith);
  void call_job(const std::function<void(int, int)> &fn, int ith) noexcept;
  void abort_job();
  [[noreturn]] void leave_job();
  void poll_stop();
  int n_;
  std::vector<std::thread> threads_;
  const std::function<void(int, int)> *job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> done_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
  // Barrier state (sense-reversing).
  alignas(64) std::atomic<int> bar_count_{0};
  alignas(64) std::atomic<uint32_t> bar_phase_{0};
  std::atomic<int> bar_sleepers_{0};  // threads asleep on bar_phase_ (futex)
  alignas(64) std::atomic<int64_t> items_{0};
  // The job failed: set by the first thread that threw; barriers then release everyone.
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;  // the first exception of the current job (written by the thread that set failed_)
  // Stop polling: poll and data set between jobs; caller_ and next_poll_ns_ are written by
  // run() before the job is published and then used by thread 0 only.
  bool flag_says_stop() {
    if (!stop_flag_ || !stop_flag_->load(std::memory_order_relaxed)) return false;
    stop_requested_.store(true, std::memory_order_relaxed);
    return true;
  }
  const std::atomic<bool> *stop_flag_ = nullptr;
  bool (*stop_poll_)(void *) = nullptr;
  void *stop_data_ = nullptr;
  std::thread::id caller_;
  int64_t next_poll_ns_ = 0;
  alignas(64) std::atomic<bool> stop_requested_{false};
};

// Number of physical cores (default thread count).
int physical_core_count();

}  // namespace moe
