#include "core/log.h"

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "core/status.h"

namespace moe {
namespace {

// The sink and the calls in flight. The callback itself runs outside this mutex, so it may
// call back into the library (moe_set_log_callback included) without deadlocking.
std::mutex g_log_mutex;
std::condition_variable g_calls_done;
LogCallback g_cb = nullptr;
void *g_user = nullptr;
uint64_t g_generation = 0;                  // bumped by every set_log_callback
std::map<uint64_t, size_t> g_in_flight;     // generation -> calls of that sink still running
std::atomic<bool> g_have_cb{false};

// > 0 while this thread runs a log callback: messages the library produces then (because the
// callback called into it) are dropped, so a callback is never re-entered on one thread.
thread_local int t_in_callback = 0;

}  // namespace

void set_log_callback(LogCallback cb, void *user_data) {
  std::unique_lock<std::mutex> lock(g_log_mutex);
  g_cb = cb;
  g_user = user_data;
  const uint64_t gen = ++g_generation;
  g_have_cb.store(cb != nullptr, std::memory_order_release);
  // Outside a callback, return only once no call of an earlier sink is still running on any
  // thread: the host may then free the old user_data. Inside a callback that wait could be on
  // this very thread (or on another thread waiting for this one), so it is skipped there.
  if (t_in_callback == 0) {
    try {
      g_calls_done.wait(lock, [gen] { return g_in_flight.empty() || g_in_flight.begin()->first >= gen; });
    } catch (...) {
      // std::system_error from the wait: the sink is replaced; only the wait is lost.
    }
  }
}

void log_message(LogLevel level, const char *fmt, ...) {
  if (!g_have_cb.load(std::memory_order_acquire)) return;  // silent by default, no formatting cost
  if (t_in_callback > 0) return;                            // nested: dropped (see above)
  // Logging never fails the operation that logs: a message that cannot be formatted or
  // registered (out of memory) is dropped.
  std::string msg;
  LogCallback cb = nullptr;
  void *user = nullptr;
  uint64_t gen = 0;
  va_list ap;
  va_start(ap, fmt);
  bool formatted = true;
  try {
    msg = vstrfmt(fmt, ap);
  } catch (...) {
    formatted = false;
  }
  va_end(ap);
  if (!formatted) return;
  try {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    cb = g_cb;
    user = g_user;
    gen = g_generation;
    if (!cb) return;
    ++g_in_flight[gen];  // last step that may throw: from here on the count is undone below
  } catch (...) {
    return;
  }
  ++t_in_callback;
  try {
    cb(static_cast<int>(level), msg.c_str(), user);
  } catch (...) {
    // A C callback cannot throw; a C++ one that does must not unwind through the library.
  }
  --t_in_callback;
  std::lock_guard<std::mutex> lock(g_log_mutex);
  auto it = g_in_flight.find(gen);
  if (--it->second == 0) {
    g_in_flight.erase(it);
    g_calls_done.notify_all();
  }
}

}  // namespace moe
