#include "engine/async_decode.h"

#include <chrono>
#include <new>

namespace moe {

AsyncDecoder::AsyncDecoder(Context &ctx) : ctx_(ctx) {
  ctx_.set_abort_callback(&AsyncDecoder::abort_trampoline, this);
  ctx_.set_cancel_flag(&cancel_);
}

AsyncDecoder::~AsyncDecoder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (state_ == State::Running) cancel_.store(true);
  }
  cv_job_.notify_all();
  if (worker_.joinable()) worker_.join();
  ctx_.set_abort_callback(nullptr, nullptr);
  ctx_.set_cancel_flag(nullptr);
}

bool AsyncDecoder::abort_trampoline(void *p) {
  auto *self = static_cast<AsyncDecoder *>(p);
  if (self->cancel_.load(std::memory_order_relaxed)) return true;
  // user_cb_ only changes while no decode runs, so reading it here needs no lock.
  return self->user_cb_ && self->user_cb_(self->user_data_);
}

void AsyncDecoder::set_user_abort(AbortCallback cb, void *user_data) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::Idle || sync_running_)
    throw Error(Status::Busy, "cannot change the abort callback while a decode is in flight");
  user_cb_ = cb;
  user_data_ = user_data;
}

void AsyncDecoder::run_decode(const BatchToken *tokens, size_t n, AsyncResult *out) {
  try {
    ctx_.decode(tokens, n);
    out->status = Status::Ok;
    out->message.clear();
  } catch (const Error &e) {
    out->status = e.code();
    out->message = e.what();
  } catch (const std::bad_alloc &) {
    out->status = Status::OutOfMemory;
    out->message = "out of memory during decode";
  } catch (const std::exception &e) {
    out->status = Status::Internal;
    out->message = std::string("unexpected exception during decode: ") + e.what();
  } catch (...) {
    out->status = Status::Internal;
    out->message = "unknown exception during decode";
  }
}

void AsyncDecoder::decode(const BatchToken *tokens, size_t n_tokens) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::Idle || sync_running_)
      throw Error(Status::Busy, "an asynchronous decode is in flight (collect it with wait)");
    sync_running_ = true;
    cancel_.store(false);
  }
  struct Reset {
    AsyncDecoder *self;
    ~Reset() {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->sync_running_ = false;
    }
  } reset{this};
  ctx_.decode(tokens, n_tokens);
}

void AsyncDecoder::submit(std::vector<BatchToken> tokens) {
  if (tokens.empty()) throw Error(Status::InvalidArgument, "empty batch");
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ != State::Idle || sync_running_)
    throw Error(Status::Busy, state_ == State::Done
                                  ? "the previous asynchronous decode was not collected (call wait)"
                                  : "a decode is already in flight");
  if (!worker_.joinable()) worker_ = std::thread(&AsyncDecoder::worker_main, this);
  job_ = std::move(tokens);
  cancel_.store(false);
  set_state(State::Running);
  lock.unlock();
  cv_job_.notify_one();
}

void AsyncDecoder::worker_main() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_job_.wait(lock, [&] { return stop_ || (state_ == State::Running && !job_.empty()); });
    if (state_ == State::Running && !job_.empty()) {
      std::vector<BatchToken> job = std::move(job_);
      job_.clear();
      lock.unlock();
      AsyncResult r;
      run_decode(job.data(), job.size(), &r);
      lock.lock();
      result_ = std::move(r);
      set_state(State::Done);
      cv_done_.notify_all();
      continue;
    }
    if (stop_) return;
  }
}

bool AsyncDecoder::try_lease() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::Idle || sync_running_ || leased_) return false;
  leased_ = true;
  return true;
}

void AsyncDecoder::end_lease() {
  std::lock_guard<std::mutex> lock(mu_);
  leased_ = false;
}

void AsyncDecoder::set_state(State s) {
  state_ = s;
  state_seen_.store(s, std::memory_order_release);
}

AsyncDecoder::State AsyncDecoder::state() const { return state_seen_.load(std::memory_order_acquire); }

bool AsyncDecoder::wait(int64_t timeout_ms, AsyncResult *out) {
  // "Just check" never queues behind the mutex (a game loop calls it every frame).
  if (timeout_ms == 0 && state() == State::Running) return false;
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ == State::Idle) throw Error(Status::InvalidArgument, "no asynchronous decode was submitted");
  auto finished = [&] { return state_ != State::Running; };
  // Beyond ~30 years wait_for's time_point arithmetic could overflow: treat as "no limit".
  if (timeout_ms < 0 || timeout_ms > (int64_t{1} << 40)) {
    cv_done_.wait(lock, finished);
  } else if (!cv_done_.wait_for(lock, std::chrono::milliseconds(timeout_ms), finished)) {
    return false;
  }
  // Two threads waiting on one decode: the first collects, the other is told so.
  if (state_ == State::Idle) throw Error(Status::InvalidArgument, "the result was collected by another wait");
  if (out) *out = std::move(result_);
  result_ = AsyncResult{};
  set_state(State::Idle);
  cv_done_.notify_all();
  return true;
}

void AsyncDecoder::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::Running || sync_running_) cancel_.store(true);
}

}  // namespace moe
