// Library logging: messages go to a callback owned by whoever configured it (the C ABI's
// moe_set_log_callback); with no callback the library is silent. Never writes to stdout.
//
//   MOE_LOG_INFO("loaded %zu tensors", n);
#pragma once
#include <cstdarg>

namespace moe {

enum class LogLevel : int { Debug = 0, Info = 1, Warn = 2, Error = 3 };
using LogCallback = void (*)(int level, const char *message, void *user_data);

// The sink is process-wide by necessity (it is how the host receives messages from any
// thread); it is set by the host, never by the library itself.
void set_log_callback(LogCallback cb, void *user_data);
void log_message(LogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace moe

#define MOE_LOG_DEBUG(...) ::moe::log_message(::moe::LogLevel::Debug, __VA_ARGS__)
#define MOE_LOG_INFO(...) ::moe::log_message(::moe::LogLevel::Info, __VA_ARGS__)
#define MOE_LOG_WARN(...) ::moe::log_message(::moe::LogLevel::Warn, __VA_ARGS__)
#define MOE_LOG_ERROR(...) ::moe::log_message(::moe::LogLevel::Error, __VA_ARGS__)
