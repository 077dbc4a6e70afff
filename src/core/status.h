// Internal status codes and the exception type used inside the library.
//
// Inside src/ a failure is thrown as moe::Error{code, message}; bindings/c catches every
// exception at the ABI boundary and turns it into a moe_status plus last-error text, so
// nothing ever escapes to the host. Codes mirror moe_status in include/moeinfer/moeinfer.h.
//
//   if (n > limit) throw Error(Status::InvalidArgument, fmt("n=%d exceeds %d", n, limit));
#pragma once
#include <cstdarg>
#include <stdexcept>
#include <string>

namespace moe {

enum class Status : int {
  Ok = 0,
  InvalidArgument = 1,   // bad parameter from the caller
  OutOfMemory = 2,       // host or device allocation failed
  IoError = 3,           // open/read/mmap/write failed
  InvalidGguf = 4,       // malformed GGUF container (header, metadata, tensor infos)
  Unsupported = 5,       // valid input we do not implement (arch, type, op on device)
  InvalidModel = 6,      // GGUF is fine but the model is inconsistent (missing tensor, bad shape)
  ContextFull = 7,       // decoding would exceed n_ctx
  Timeout = 8,           // an async wait ran out of time
  Aborted = 9,           // abort callback or cancel asked to stop
  DeviceError = 10,      // backend/device failure (e.g. a CUDA error)
  InvalidVocab = 11,     // tokenizer data inconsistent
  BufferTooSmall = 12,   // caller buffer too small; required size reported
  Busy = 13,             // context has an async decode in flight
  ContextUnusable = 14,  // an earlier sticky error disabled this context
  Internal = 15,         // a bug of ours
  NumericError = 16,     // a decode produced non-finite (NaN / infinite) logits
};

const char *status_name(Status s);

class Error : public std::runtime_error {
public:
  Error(Status code, const std::string &msg) : std::runtime_error(msg), code_(code) {}
  Status code() const { return code_; }
private:
  Status code_;
};

// printf-style formatting into std::string (used for error messages everywhere).
std::string strfmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vstrfmt(const char *fmt, va_list ap);

[[noreturn]] void fail(Status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace moe
