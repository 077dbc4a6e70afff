#include "core/log.h"

#include <atomic>
#include <mutex>
#include <string>

#include "core/status.h"

namespace moe {
namespace {
std::mutex g_log_mutex;
LogCallback g_cb = nullptr;
void *g_user = nullptr;
std::atomic<bool> g_have_cb{false};
}  // namespace

void set_log_callback(LogCallback cb, void *user_data) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_cb = cb;
  g_user = user_data;
  g_have_cb.store(cb != nullptr, std::memory_order_release);
}

void log_message(LogLevel level, const char *fmt, ...) {
  if (!g_have_cb.load(std::memory_order_acquire)) return;  // silent by default, no formatting cost
  va_list ap;
  va_start(ap, fmt);
  std::string msg = vstrfmt(fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (g_cb) g_cb(static_cast<int>(level), msg.c_str(), g_user);
}

}  // namespace moe
