// Asynchronous decode for one Context: a single worker thread (started on the first
// submit, not per call) runs Context::decode while the caller polls or waits with a
// timeout, so a game loop can spend a bounded time per frame. cancel() uses the engine's
// abort hook (polled between layers, and on the CPU after every node), composed with the
// host's own abort callback.
//
//   AsyncDecoder ad(*ctx);
//   ad.submit(tokens);
//   AsyncResult r;
//   if (!ad.wait(16, &r)) { /* still running: render a frame, wait again later */ }
//   else if (r.status != Status::Ok) { /* r.message says why */ }
//
// Thread model: submit/decode/wait/set_user_abort are called by the context's owner
// thread; state() and cancel() may be called from any thread. The C ABI makes every other
// use of the context exclusive with try_lease(): a call made while a decode runs (or while
// another call is inside the context) is refused (Busy) instead of racing with it.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"

namespace moe {

struct AsyncResult {
  Status status = Status::Ok;
  std::string message;  // empty on success
};

class AsyncDecoder {
public:
  enum class State : int { Idle = 0, Running = 1, Done = 2 };

  // Borrows ctx (must outlive this object) and installs the composed abort callback on it.
  explicit AsyncDecoder(Context &ctx);
  // Cancels an in-flight decode, joins the worker, removes the abort callback.
  ~AsyncDecoder();
  AsyncDecoder(const AsyncDecoder &) = delete;
  AsyncDecoder &operator=(const AsyncDecoder &) = delete;

  // Host abort callback polled with our cancel flag. Throws Busy while not Idle.
  void set_user_abort(AbortCallback cb, void *user_data);

  // Synchronous decode on the calling thread (cancel() still works from another thread).
  // Throws Busy while an async decode is not collected; rethrows the engine's errors.
  void decode(const BatchToken *tokens, size_t n_tokens);

  // Queues a decode of `tokens` (moved in) on the worker. Throws Busy unless Idle.
  void submit(std::vector<BatchToken> tokens);

  // Lock-free: poll and wait(0) never wait for the worker.
  State state() const;
  bool idle() const { return state() == State::Idle; }

  // Exclusive use of the context for one call: false while a decode runs (synchronous, or
  // asynchronous until its result is collected with wait) or another lease is held. The
  // holder may call decode() and submit(); end_lease() gives it back.
  bool try_lease();
  void end_lease();

  // Waits up to timeout_ms (< 0: no limit; 0: just check). Returns false on timeout (the
  // decode continues). Returns true when finished: *out gets the decode's result and the
  // state goes back to Idle. Throws InvalidArgument when nothing was submitted.
  bool wait(int64_t timeout_ms, AsyncResult *out);

  // Asks a running decode (async or synchronous) to stop at the next poll of the abort
  // hook (the next node on the CPU, the next layer on a GPU).
  void cancel();

private:
  static bool abort_trampoline(void *self);
  void worker_main();
  void run_decode(const BatchToken *tokens, size_t n, AsyncResult *out);
  void set_state(State s);  // under mu_

  Context &ctx_;
  mutable std::mutex mu_;
  std::condition_variable cv_job_;   // worker waits for a job / stop
  std::condition_variable cv_done_;  // waiters wait for Done
  State state_ = State::Idle;
  std::atomic<State> state_seen_{State::Idle};  // state_, readable without mu_
  bool sync_running_ = false;
  bool leased_ = false;
  bool stop_ = false;
  std::vector<BatchToken> job_;
  AsyncResult result_;
  std::atomic<bool> cancel_{false};
  AbortCallback user_cb_ = nullptr;
  void *user_data_ = nullptr;
  std::thread worker_;
};

}  // namespace moe
