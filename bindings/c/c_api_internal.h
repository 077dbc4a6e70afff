// Shared machinery of the C ABI implementation: handle structs, the exception guard and
// the thread-local last-error buffer. Nothing here is visible outside libmoeinfer.
#pragma once
#include <cstdarg>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include "core/status.h"
#include "engine/async_decode.h"
#include "engine/engine.h"
#include "moeinfer/moeinfer.h"
#include "sampler/sampler.h"

// Handles. Models are shared so a context keeps its model alive even if the host frees the
// model handle first (moe_model_free order mistakes must not become use-after-free).
struct moe_model {
  std::shared_ptr<moe::Model> model;
};

struct moe_context {
  std::shared_ptr<moe::Model> model;
  std::unique_ptr<moe::Context> ctx;
  std::unique_ptr<moe::AsyncDecoder> async;  // declared after ctx: destroyed first
  moe_abort_callback user_abort = nullptr;
  void *user_abort_data = nullptr;
};

struct moe_batch {
  std::vector<moe::BatchToken> tokens;
  size_t capacity = 0;
};

struct moe_sampler {
  std::unique_ptr<moe::SamplerChain> chain;
  uint64_t seed = 0;
};

namespace moe_c {

// Thread-local last error (fixed buffer: setting it never allocates, so never throws).
void set_last_error(const char *msg) noexcept;
const char *last_error() noexcept;
void clear_last_error() noexcept;
moe_status fail(moe_status s, const char *fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

inline moe_status to_c(moe::Status s) { return static_cast<moe_status>(static_cast<int>(s)); }

// Runs f (returning moe_status) and converts every exception into a status + message.
// This is the only way C entry points reach C++ code: nothing escapes the ABI.
template <class F>
moe_status guard(F &&f) noexcept {
  clear_last_error();  // the message always describes the most recent status-returning call
  try {
    return f();
  } catch (const moe::Error &e) {
    set_last_error(e.what());
    return to_c(e.code());
  } catch (const std::bad_alloc &) {
    set_last_error("out of memory");
    return MOE_STATUS_OUT_OF_MEMORY;
  } catch (const std::exception &e) {
    fail(MOE_STATUS_INTERNAL, "internal error: %s", e.what());
    return MOE_STATUS_INTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return MOE_STATUS_INTERNAL;
  }
}

// Reads a caller params struct of v1 size min_size .. sizeof(T): fields the caller's
// (older) struct lacks keep the defaults in *out. Returns false for an invalid size.
template <class T>
bool read_params(const T *in, const T &defaults, size_t min_size, T *out) {
  static_assert(std::is_trivially_copyable<T>::value, "params must be trivially copyable");
  *out = defaults;
  if (!in) return true;
  if (in->struct_size < min_size || in->struct_size > sizeof(T)) return false;
  std::memcpy(static_cast<void *>(out), in, in->struct_size);
  out->struct_size = sizeof(T);
  return true;
}

// Writes the first out->struct_size bytes of a fully filled result (old callers get the
// prefix they know). Caller validated the size.
template <class T>
void write_result(const T &full, T *out) {
  const size_t n = out->struct_size;
  std::memcpy(static_cast<void *>(out), &full, n);
  out->struct_size = n;
}

// One call at a time inside a context: every entry point that reads or changes a context
// (decode, submit, logits, KV cache, callbacks, settings, check) holds its lease for the
// call's duration. While a decode runs on another thread (or an asynchronous decode is not
// yet collected) or another call holds the lease, enter() fails with MOE_STATUS_BUSY
// instead of racing. moe_decode_poll, moe_decode_wait and moe_decode_cancel take none.
class ContextUse {
public:
  ContextUse() = default;
  ContextUse(const ContextUse &) = delete;
  ContextUse &operator=(const ContextUse &) = delete;
  ~ContextUse() {
    if (ctx_) ctx_->async->end_lease();
  }
  // OK, or INVALID_ARGUMENT (NULL ctx), BUSY, CONTEXT_UNUSABLE (check_usable: an earlier
  // device error disabled the context), with the message set.
  moe_status enter(const moe_context *ctx, const char *fn, bool check_usable = true) noexcept;

private:
  const moe_context *ctx_ = nullptr;
};

// Copies s (+ NUL) into buf with the moe buffer protocol.
moe_status copy_string(const std::string &s, char *buf, size_t buf_size, size_t *out_len);

}  // namespace moe_c

#define MOE_CHECK_ARG(cond, ...)                                      \
  do {                                                                \
    if (!(cond)) return ::moe_c::fail(MOE_STATUS_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)
