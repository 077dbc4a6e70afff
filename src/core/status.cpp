#include "core/status.h"

#include <cstdio>
#include <vector>

namespace moe {

const char *status_name(Status s) {
  switch (s) {
    case Status::Ok: return "ok";
    case Status::InvalidArgument: return "invalid argument";
    case Status::OutOfMemory: return "out of memory";
    case Status::IoError: return "I/O error";
    case Status::InvalidGguf: return "invalid GGUF";
    case Status::Unsupported: return "unsupported";
    case Status::InvalidModel: return "invalid model";
    case Status::ContextFull: return "context full";
    case Status::Timeout: return "timeout";
    case Status::Aborted: return "aborted";
    case Status::DeviceError: return "device error";
    case Status::InvalidVocab: return "invalid vocabulary";
    case Status::BufferTooSmall: return "buffer too small";
    case Status::Busy: return "busy";
    case Status::ContextUnusable: return "context unusable";
    case Status::Internal: return "internal error";
    case Status::NumericError: return "numeric error";
  }
  return "unknown status";
}

std::string vstrfmt(const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap2);
  va_end(ap2);
  if (n <= 0) return std::string();
  std::string out(static_cast<size_t>(n), '\0');
  std::vsnprintf(out.data(), out.size() + 1, fmt, ap);
  return out;
}

std::string strfmt(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrfmt(fmt, ap);
  va_end(ap);
  return s;
}

void fail(Status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrfmt(fmt, ap);
  va_end(ap);
  throw Error(code, s);
}

}  // namespace moe
