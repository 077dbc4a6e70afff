// moeinfer: header-only C++17 API over the C ABI (moeinfer.h). Nothing here links against
// C++ internals of the library, so it works with any compiler/standard library that can
// call the C functions.
//
//   auto model = moeinfer::Model::load("model.gguf");
//   auto ctx = moeinfer::Context::create(model);
//   auto toks = model.tokenize("Hello", MOE_TOKENIZE_ADD_SPECIAL);
//   auto batch = moeinfer::Batch::create(toks.size());
//   batch.add_sequence(toks.data(), toks.size(), 0, 0, true);
//   ctx.decode(batch);
//   auto sampler = moeinfer::Sampler::create(42);
//   sampler.add_greedy();
//   int32_t next = sampler.sample(ctx, -1);
//
// Errors: by default a failing call throws moeinfer::Error (status() + what() = the
// library's message). Define MOEINFER_NO_EXCEPTIONS (for code built with -fno-exceptions)
// and every fallible function returns moeinfer::Result<T> instead: check ok()/status(),
// then value().
//
// Owners (Model, Context, Batch, Sampler, Detokenizer) are move-only and exactly one pointer in size.
#ifndef MOEINFER_HPP
#define MOEINFER_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moeinfer/moeinfer.h"

#ifndef MOEINFER_NO_EXCEPTIONS
#include <stdexcept>
#endif

namespace moeinfer {

// ---------------------------------------------------------------- errors / results

#ifndef MOEINFER_NO_EXCEPTIONS
// Thrown by every failing call in the default (exception) mode.
class Error : public std::runtime_error {
public:
  Error(moe_status status, const std::string &message)
      : std::runtime_error(message.empty() ? std::string(moe_status_string(status)) : message), status_(status) {}
  moe_status status() const noexcept { return status_; }

private:
  moe_status status_;
};
#endif

// Value-or-status, the return type of fallible calls with MOEINFER_NO_EXCEPTIONS.
template <class T>
class Result {
public:
  Result(T value) : status_(MOE_STATUS_OK), value_(std::move(value)) {}  // NOLINT: implicit on purpose
  explicit Result(moe_status status) : status_(status), value_(), message_(moe_last_error()) {}
  bool ok() const noexcept { return status_ == MOE_STATUS_OK; }
  explicit operator bool() const noexcept { return ok(); }
  moe_status status() const noexcept { return status_; }
  // The library's message at the time of failure ("" on success).
  const std::string &message() const noexcept { return message_; }
  // The value; meaningful only when ok().
  T &value() & { return value_; }
  const T &value() const & { return value_; }
  T &&value() && { return std::move(value_); }

private:
  moe_status status_;
  T value_;
  std::string message_;
};

template <>
class Result<void> {
public:
  Result() : status_(MOE_STATUS_OK) {}
  explicit Result(moe_status status) : status_(status) {
    if (status != MOE_STATUS_OK) message_ = moe_last_error();
  }
  bool ok() const noexcept { return status_ == MOE_STATUS_OK; }
  explicit operator bool() const noexcept { return ok(); }
  moe_status status() const noexcept { return status_; }
  const std::string &message() const noexcept { return message_; }

private:
  moe_status status_;
  std::string message_;
};

#ifdef MOEINFER_NO_EXCEPTIONS
template <class T>
using Ret = Result<T>;
#else
template <class T>
using Ret = T;
#endif

namespace detail {
#ifdef MOEINFER_NO_EXCEPTIONS
template <class T>
inline Result<T> fail(moe_status s) { return Result<T>(s); }
inline Result<void> done() { return Result<void>(); }
inline Result<void> done(moe_status s) { return Result<void>(s); }
#else
template <class T>
[[noreturn]] inline T fail(moe_status s) { throw Error(s, moe_last_error()); }
inline void done() {}
inline void done(moe_status s) {
  if (s != MOE_STATUS_OK) throw Error(s, moe_last_error());
}
#endif
}  // namespace detail

// ---------------------------------------------------------------- library-wide

inline const char *version_string() noexcept { return moe_version_string(); }
inline uint32_t abi_version() noexcept { return moe_abi_version(); }
// callback/user_data as moe_set_log_callback (process-wide; nullptr silences).
inline void set_log_callback(moe_log_callback callback, void *user_data) noexcept {
  moe_set_log_callback(callback, user_data);
}

// Every device (CPU first), as moe_device_info records.
inline Ret<std::vector<moe_device_info>> devices() {
  size_t n = 0;
  moe_status s = moe_device_count(&n);
  if (s != MOE_STATUS_OK) return detail::fail<std::vector<moe_device_info>>(s);
  std::vector<moe_device_info> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i].struct_size = sizeof(moe_device_info);
    if ((s = moe_device_get_info(i, &out[i])) != MOE_STATUS_OK) return detail::fail<std::vector<moe_device_info>>(s);
  }
  return out;
}

// A borrowed view of one row of logits; valid until the next decode / KV op on the context.
struct LogitsView {
  const float *data = nullptr;
  int32_t n_vocab = 0;
  const float *begin() const noexcept { return data; }
  const float *end() const noexcept { return data + n_vocab; }
  float operator[](int32_t i) const noexcept { return data[i]; }
};

// ---------------------------------------------------------------- owners

namespace detail {
// Move-only owner of one C handle (the only member: one pointer in size).
template <class H, void (*Free)(H *)>
class Handle {
public:
  Handle() noexcept = default;
  explicit Handle(H *h) noexcept : h_(h) {}
  Handle(Handle &&o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  Handle &operator=(Handle &&o) noexcept {
    if (this != &o) {
      reset();
      h_ = o.h_;
      o.h_ = nullptr;
    }
    return *this;
  }
  Handle(const Handle &) = delete;
  Handle &operator=(const Handle &) = delete;
  ~Handle() { reset(); }
  // Borrowed C handle (still owned by this object).
  H *get() const noexcept { return h_; }
  // Gives up ownership: caller owns the result; free with the matching moe_*_free.
  H *release() noexcept {
    H *h = h_;
    h_ = nullptr;
    return h;
  }
  void reset() noexcept {
    if (h_) Free(h_);
    h_ = nullptr;
  }
  explicit operator bool() const noexcept { return h_ != nullptr; }

private:
  H *h_ = nullptr;
};
}  // namespace detail

class Model : public detail::Handle<moe_model, moe_model_free> {
public:
  using Handle::Handle;
  static moe_model_params default_params() noexcept { return moe_model_default_params(); }

  // Loads a GGUF model (path must be a file name; copied to add the terminating NUL).
  static Ret<Model> load(std::string_view path, const moe_model_params &params = default_params()) {
    std::string p(path);
    moe_model *m = nullptr;
    moe_status s = moe_model_load(p.c_str(), &params, &m);
    if (s != MOE_STATUS_OK) return detail::fail<Model>(s);
    return Model(m);
  }

  // Dry run of load's placement (moe_model_fit): the plan per device that load(path, params)
  // would use, from the file's metadata alone. Set params.fit = 1 to let it choose the unset
  // placement values within the budgets.
  static Ret<moe_fit_plan> fit(std::string_view path, const moe_model_params &params = default_params()) {
    std::string p(path);
    moe_fit_plan plan{};
    plan.struct_size = sizeof plan;
    moe_status s = moe_model_fit(p.c_str(), &params, &plan);
    if (s != MOE_STATUS_OK) return detail::fail<moe_fit_plan>(s);
    return plan;
  }

  // Before the first CPU context: copy mapped weights into huge pages (default) or not.
  Ret<void> set_cpu_weight_copy(bool enabled) { return detail::done(moe_model_set_cpu_weight_copy(get(), enabled ? 1 : 0)); }

  Ret<moe_model_info> info() const {
    moe_model_info i{};
    i.struct_size = sizeof i;
    moe_status s = moe_model_get_info(get(), &i);
    if (s != MOE_STATUS_OK) return detail::fail<moe_model_info>(s);
    return i;
  }

  // Metadata value of key as text.
  Ret<std::string> meta(std::string_view key) const {
    std::string k(key), v(64, '\0');
    size_t n = 0;
    moe_status s = moe_model_meta_value(get(), k.c_str(), &v[0], v.size(), &n);
    if (s == MOE_STATUS_BUFFER_TOO_SMALL) {
      v.assign(n + 1, '\0');
      s = moe_model_meta_value(get(), k.c_str(), &v[0], v.size(), &n);
    }
    if (s != MOE_STATUS_OK) return detail::fail<std::string>(s);
    v.resize(n);
    return v;
  }

  int32_t bos() const noexcept { return moe_token_bos(get()); }
  int32_t eos() const noexcept { return moe_token_eos(get()); }
  int32_t eot() const noexcept { return moe_token_eot(get()); }
  bool is_eog(int32_t token) const noexcept { return moe_token_is_eog(get(), token) != 0; }

  // flags: MOE_TOKENIZE_ADD_SPECIAL | MOE_TOKENIZE_PARSE_SPECIAL.
  Ret<std::vector<int32_t>> tokenize(std::string_view text, uint32_t flags = MOE_TOKENIZE_ADD_SPECIAL) const {
    std::vector<int32_t> out(text.size() + 8);
    size_t n = 0;
    moe_status s = moe_tokenize(get(), text.data(), text.size(), out.data(), out.size(), &n, flags);
    if (s == MOE_STATUS_BUFFER_TOO_SMALL) {
      out.resize(n);
      s = moe_tokenize(get(), text.data(), text.size(), out.data(), out.size(), &n, flags);
    }
    if (s != MOE_STATUS_OK) return detail::fail<std::vector<int32_t>>(s);
    out.resize(n);
    return out;
  }

  // Raw bytes of one token (may be a partial UTF-8 sequence). flags: MOE_DETOKENIZE_*.
  Ret<std::string> token_to_piece(int32_t token, uint32_t flags = 0) const {
    std::string out(32, '\0');
    size_t n = 0;
    moe_status s = moe_token_to_piece(get(), token, &out[0], out.size(), &n, flags);
    if (s == MOE_STATUS_BUFFER_TOO_SMALL) {
      out.assign(n + 1, '\0');
      s = moe_token_to_piece(get(), token, &out[0], out.size(), &n, flags);
    }
    if (s != MOE_STATUS_OK) return detail::fail<std::string>(s);
    out.resize(n);
    return out;
  }

  Ret<std::string> detokenize(const int32_t *tokens, size_t n_tokens, uint32_t flags = 0) const {
    std::string out(n_tokens * 4 + 16, '\0');
    size_t n = 0;
    moe_status s = moe_detokenize(get(), tokens, n_tokens, &out[0], out.size(), &n, flags);
    if (s == MOE_STATUS_BUFFER_TOO_SMALL) {
      out.assign(n + 1, '\0');
      s = moe_detokenize(get(), tokens, n_tokens, &out[0], out.size(), &n, flags);
    }
    if (s != MOE_STATUS_OK) return detail::fail<std::string>(s);
    out.resize(n);
    return out;
  }
  Ret<std::string> detokenize(const std::vector<int32_t> &tokens, uint32_t flags = 0) const {
    return detokenize(tokens.data(), tokens.size(), flags);
  }
};

// Streaming detokenizer: push() returns the text each token completes (never a broken
// UTF-8 sequence); flush() returns what is held at the end.
class Detokenizer : public detail::Handle<moe_detokenizer, moe_detokenizer_free> {
public:
  using Handle::Handle;
  static Ret<Detokenizer> create(const Model &model, uint32_t flags = 0) {
    moe_detokenizer *d = nullptr;
    moe_status s = moe_detokenizer_create(model.get(), flags, &d);
    if (s != MOE_STATUS_OK) return detail::fail<Detokenizer>(s);
    return Detokenizer(d);
  }
  // Borrowed view, valid until the next call on this detokenizer.
  Ret<std::string_view> push(int32_t token) {
    const char *t = nullptr;
    size_t n = 0;
    moe_status s = moe_detokenizer_push(get(), token, &t, &n);
    if (s != MOE_STATUS_OK) return detail::fail<std::string_view>(s);
    return std::string_view(t, n);
  }
  Ret<std::string_view> flush() {
    const char *t = nullptr;
    size_t n = 0;
    moe_status s = moe_detokenizer_flush(get(), &t, &n);
    if (s != MOE_STATUS_OK) return detail::fail<std::string_view>(s);
    return std::string_view(t, n);
  }
};

class Batch : public detail::Handle<moe_batch, moe_batch_free> {
public:
  using Handle::Handle;
  static Ret<Batch> create(size_t capacity) {
    moe_batch *b = nullptr;
    moe_status s = moe_batch_create(capacity, &b);
    if (s != MOE_STATUS_OK) return detail::fail<Batch>(s);
    return Batch(b);
  }
  Ret<void> clear() { return detail::done(moe_batch_clear(get())); }
  Ret<void> add(int32_t token, int32_t pos, int32_t seq_id, bool logits) {
    return detail::done(moe_batch_add(get(), token, pos, seq_id, logits ? 1 : 0));
  }
  Ret<void> add_sequence(const int32_t *tokens, size_t n, int32_t pos0, int32_t seq_id, bool logits_last) {
    return detail::done(moe_batch_add_sequence(get(), tokens, n, pos0, seq_id, logits_last ? 1 : 0));
  }
  Ret<void> add_sequence(const std::vector<int32_t> &tokens, int32_t pos0, int32_t seq_id, bool logits_last) {
    return add_sequence(tokens.data(), tokens.size(), pos0, seq_id, logits_last);
  }
  size_t size() const noexcept { return moe_batch_size(get()); }
};

class Context : public detail::Handle<moe_context, moe_context_free> {
public:
  using Handle::Handle;
  static moe_context_params default_params() noexcept { return moe_context_default_params(); }

  // The context keeps the model's weights alive; the Model object may go first.
  static Ret<Context> create(const Model &model, const moe_context_params &params = default_params()) {
    moe_context *c = nullptr;
    moe_status s = moe_context_create(model.get(), &params, &c);
    if (s != MOE_STATUS_OK) return detail::fail<Context>(s);
    return Context(c);
  }

  uint32_t n_ctx() const noexcept { return moe_context_n_ctx(get()); }
  uint32_t n_batch() const noexcept { return moe_context_n_batch(get()); }
  uint32_t n_ubatch() const noexcept { return moe_context_n_ubatch(get()); }
  int32_t n_vocab() const noexcept { return moe_context_n_vocab(get()); }

  // Synchronous decode. CONTEXT_FULL / ABORTED / BUSY are errors like any other status.
  Ret<void> decode(const Batch &batch) { return detail::done(moe_decode(get(), batch.get())); }

  // Asynchronous decode: submit, then poll()/wait() each frame; cancel() from anywhere.
  Ret<void> submit(const Batch &batch) { return detail::done(moe_decode_submit(get(), batch.get())); }
  moe_async_state poll() const noexcept {
    int32_t st = MOE_ASYNC_IDLE;
    moe_decode_poll(get(), &st);
    return static_cast<moe_async_state>(st);
  }
  // true: the decode finished successfully; false: still running after `timeout` (not an
  // error). A failed decode (ABORTED, CONTEXT_FULL, ...) is an error.
  Ret<bool> wait(std::chrono::milliseconds timeout) {
    moe_status s = moe_decode_wait(get(), static_cast<int64_t>(timeout.count()));
    if (s == MOE_STATUS_TIMEOUT) return false;
    if (s != MOE_STATUS_OK) return detail::fail<bool>(s);
    return true;
  }
  // Waits without a limit.
  Ret<void> wait() { return detail::done(moe_decode_wait(get(), -1)); }
  void cancel() noexcept { moe_decode_cancel(get()); }

  // callback(user_data) != 0 aborts the running decode; user_data is borrowed.
  // GPU: replay captured CUDA graphs (default) or launch eagerly, from the next decode.
  Ret<void> set_gpu_graphs(bool enabled) { return detail::done(moe_context_set_gpu_graphs(get(), enabled ? 1 : 0)); }
  Ret<void> set_abort_callback(moe_abort_callback callback, void *user_data) {
    return detail::done(moe_context_set_abort_callback(get(), callback, user_data));
  }

  Ret<LogitsView> logits(int32_t i = -1) {
    LogitsView v;
    moe_status s = moe_get_logits(get(), i, &v.data, &v.n_vocab);
    if (s != MOE_STATUS_OK) return detail::fail<LogitsView>(s);
    return v;
  }

  Ret<void> kv_clear() { return detail::done(moe_kv_clear(get())); }
  Ret<void> kv_seq_rm(int32_t seq, int32_t p0, int32_t p1) { return detail::done(moe_kv_seq_rm(get(), seq, p0, p1)); }
  Ret<void> kv_seq_cp(int32_t src, int32_t dst, int32_t p0, int32_t p1) {
    return detail::done(moe_kv_seq_cp(get(), src, dst, p0, p1));
  }
  Ret<void> kv_seq_keep(int32_t seq) { return detail::done(moe_kv_seq_keep(get(), seq)); }
  Ret<int32_t> kv_seq_pos_max(int32_t seq) {
    int32_t p = -1;
    moe_status s = moe_kv_seq_pos_max(get(), seq, &p);
    if (s != MOE_STATUS_OK) return detail::fail<int32_t>(s);
    return p;
  }
  // Sequence state (moe_state_seq_*): save to bytes or a file, restore into this context.
  Ret<std::vector<uint8_t>> save_seq_state(int32_t seq) {
    size_t n = 0;
    moe_status s = moe_state_seq_save(get(), seq, nullptr, 0, &n);
    if (s != MOE_STATUS_BUFFER_TOO_SMALL) return detail::fail<std::vector<uint8_t>>(s == MOE_STATUS_OK ? MOE_STATUS_INTERNAL : s);
    std::vector<uint8_t> out(n);
    s = moe_state_seq_save(get(), seq, out.data(), out.size(), &n);
    if (s != MOE_STATUS_OK) return detail::fail<std::vector<uint8_t>>(s);
    return out;
  }
  Ret<void> load_seq_state(int32_t seq, const std::vector<uint8_t> &state) {
    return detail::done(moe_state_seq_load(get(), seq, state.data(), state.size()));
  }
  Ret<void> save_seq_state_file(int32_t seq, const std::string &path) {
    return detail::done(moe_state_seq_save_file(get(), seq, path.c_str()));
  }
  Ret<void> load_seq_state_file(int32_t seq, const std::string &path) {
    return detail::done(moe_state_seq_load_file(get(), seq, path.c_str()));
  }
};

class Sampler : public detail::Handle<moe_sampler, moe_sampler_free> {
public:
  using Handle::Handle;
  static Ret<Sampler> create(uint64_t seed = moe_sampler_default_params().seed) {
    moe_sampler_params p = moe_sampler_default_params();
    p.seed = seed;
    moe_sampler *h = nullptr;
    moe_status s = moe_sampler_create(&p, &h);
    if (s != MOE_STATUS_OK) return detail::fail<Sampler>(s);
    return Sampler(h);
  }
  Ret<void> add_greedy() { return detail::done(moe_sampler_add_greedy(get())); }
  Ret<void> add_dist() { return detail::done(moe_sampler_add_dist(get())); }
  Ret<void> add_temperature(float t) { return detail::done(moe_sampler_add_temperature(get(), t)); }
  Ret<void> add_top_k(int32_t k) { return detail::done(moe_sampler_add_top_k(get(), k)); }
  Ret<void> add_top_p(float p, size_t min_keep = 1) { return detail::done(moe_sampler_add_top_p(get(), p, min_keep)); }
  Ret<void> add_min_p(float p, size_t min_keep = 1) { return detail::done(moe_sampler_add_min_p(get(), p, min_keep)); }
  Ret<void> add_typical(float p, size_t min_keep = 1) {
    return detail::done(moe_sampler_add_typical(get(), p, min_keep));
  }
  Ret<void> add_penalties(int32_t last_n, float repeat, float frequency = 0.0f, float presence = 0.0f) {
    return detail::done(moe_sampler_add_penalties(get(), last_n, repeat, frequency, presence));
  }
  Ret<void> add_logit_bias(const moe_logit_bias *biases, size_t n) {
    return detail::done(moe_sampler_add_logit_bias(get(), biases, n));
  }
  // Grammar-constrained output (GBNF text, start rule root) over model's vocabulary.
  Ret<void> add_grammar(const Model &model, const std::string &gbnf, const std::string &root = "root") {
    return detail::done(moe_sampler_add_grammar(get(), model.get(), gbnf.c_str(), root.c_str()));
  }
  // Output constrained to JSON valid against schema (JSON Schema text).
  Ret<void> add_json_schema(const Model &model, const std::string &schema) {
    return detail::done(moe_sampler_add_json_schema(get(), model.get(), schema.c_str()));
  }
  Ret<int32_t> sample(const float *logits, int32_t n_vocab) {
    int32_t t = -1;
    moe_status s = moe_sampler_sample(get(), logits, n_vocab, &t);
    if (s != MOE_STATUS_OK) return detail::fail<int32_t>(s);
    return t;
  }
  Ret<int32_t> sample(Context &ctx, int32_t i = -1) {
    int32_t t = -1;
    moe_status s = moe_sampler_sample_context(get(), ctx.get(), i, &t);
    if (s != MOE_STATUS_OK) return detail::fail<int32_t>(s);
    return t;
  }
  Ret<void> accept(int32_t token) { return detail::done(moe_sampler_accept(get(), token)); }
  Ret<void> reset() { return detail::done(moe_sampler_reset(get())); }
  Ret<void> set_seed(uint64_t seed) { return detail::done(moe_sampler_set_seed(get(), seed)); }
};

static_assert(sizeof(Model) == sizeof(void *), "owners are one pointer");
static_assert(sizeof(Context) == sizeof(void *), "owners are one pointer");
static_assert(sizeof(Batch) == sizeof(void *), "owners are one pointer");
static_assert(sizeof(Sampler) == sizeof(void *), "owners are one pointer");
static_assert(sizeof(Detokenizer) == sizeof(void *), "owners are one pointer");

// ---------------------------------------------------------------- chat templates

// One message of a conversation; an empty optional is absent (content: rendered as none).
struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::optional<std::string> c = std::nullopt) : role(std::move(r)), content(std::move(c)) {}
  std::string role;
  std::optional<std::string> content;
  std::optional<std::string> reasoning_content;
  std::optional<std::string> tool_calls;  // JSON array (see moe_chat_message)
  std::optional<std::string> tool_call_id;
  std::optional<std::string> name;
};

// moe_chat_apply_template: renders messages with the model's chat template (or
// params.template_text; model may then be nullptr).
inline Ret<std::string> apply_chat_template(const Model *model, const std::vector<ChatMessage> &messages,
                                            const moe_chat_params &params = moe_chat_default_params()) {
  auto c_str = [](const std::optional<std::string> &s) { return s ? s->c_str() : nullptr; };
  std::vector<moe_chat_message> c(messages.size());
  for (size_t k = 0; k < messages.size(); ++k) {
    const ChatMessage &m = messages[k];
    c[k] = {m.role.c_str(), c_str(m.content), c_str(m.reasoning_content), c_str(m.tool_calls),
            c_str(m.tool_call_id), c_str(m.name)};
  }
  const moe_model *h = model ? model->get() : nullptr;
  size_t n = 0;
  moe_status s = moe_chat_apply_template(h, c.data(), c.size(), &params, nullptr, 0, &n);
  if (s != MOE_STATUS_BUFFER_TOO_SMALL) return detail::fail<std::string>(s == MOE_STATUS_OK ? MOE_STATUS_INTERNAL : s);
  std::string out(n + 1, '\0');
  s = moe_chat_apply_template(h, c.data(), c.size(), &params, &out[0], out.size(), &n);
  if (s != MOE_STATUS_OK) return detail::fail<std::string>(s);
  out.resize(n);
  return out;
}

}  // namespace moeinfer

#endif  // MOEINFER_HPP
