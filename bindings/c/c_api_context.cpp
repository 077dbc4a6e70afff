// C ABI: context, batch, synchronous and asynchronous decode, logits, KV cache.
#include <cstddef>
#include <string>

#include "c_api_internal.h"

using namespace moe_c;

namespace {

// Fields of the first layout: it ends at cpu_float_order, whose bytes were its tail padding.
constexpr size_t kContextParamsV1Fields = offsetof(moe_context_params, cpu_float_order);
constexpr size_t kMaxBatchCapacity = size_t{1} << 24;

moe_context_params default_context_params() {
  moe_context_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.n_ctx = 0;
  p.n_batch = 512;
  p.n_ubatch = 512;
  p.n_seq_max = 1;
  p.kv_type = MOE_KV_TYPE_F16;
  p.n_threads = 0;
  p.device = nullptr;
  p.flash_attn = 1;
  return p;
}

// Reads a caller's struct of one of the published layouts (by struct_size); a first-layout
// caller's padding is never read, so cpu_float_order keeps its default for it.
bool read_context_params(const moe_context_params *in, moe_context_params *out) {
  *out = default_context_params();
  if (!in) return true;
  size_t fields = 0;
  if (in->struct_size == MOE_CONTEXT_PARAMS_SIZE_V1) fields = kContextParamsV1Fields;
  else if (in->struct_size == MOE_CONTEXT_PARAMS_SIZE_V2) fields = MOE_CONTEXT_PARAMS_SIZE_V2;
  else return false;
  std::memcpy(static_cast<void *>(out), in, fields);
  out->struct_size = sizeof *out;
  return true;
}

// Bridges the engine's bool(*)(void*) abort hook to the host's int(*)(void*).
bool c_abort_bridge(void *p) {
  auto *c = static_cast<moe_context *>(p);
  return c->user_abort && c->user_abort(c->user_abort_data) != 0;
}

moe_status check_batch(const moe_context *ctx, const moe_batch *batch, const char *fn) {
  if (!batch) return fail(MOE_STATUS_INVALID_ARGUMENT, "%s: batch is NULL", fn);
  if (batch->tokens.empty()) return fail(MOE_STATUS_INVALID_ARGUMENT, "%s: batch is empty", fn);
  const uint32_t n_batch = ctx->ctx->params().n_batch;
  if (batch->tokens.size() > n_batch)
    return fail(MOE_STATUS_INVALID_ARGUMENT, "%s: batch of %zu tokens exceeds n_batch %u", fn, batch->tokens.size(),
                n_batch);
  return MOE_STATUS_OK;
}

}  // namespace

namespace moe_c {

moe_status ContextUse::enter(const moe_context *ctx, const char *fn, bool check_usable) noexcept {
  if (!ctx) return fail(MOE_STATUS_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
  if (!ctx->async->try_lease()) {
    const moe::AsyncDecoder::State st = ctx->async->state();
    return fail(MOE_STATUS_BUSY, "%s: the context is in use by %s", fn,
                st == moe::AsyncDecoder::State::Running ? "a decode in flight"
                : st == moe::AsyncDecoder::State::Done  ? "an asynchronous decode whose result was not collected (moe_decode_wait)"
                                                        : "a decode or another call on another thread");
  }
  ctx_ = ctx;
  if (check_usable && ctx->ctx->unusable(nullptr)) {
    try {
      std::string why;
      ctx->ctx->unusable(&why);
      return fail(MOE_STATUS_CONTEXT_UNUSABLE, "%s: context unusable: %s", fn, why.c_str());
    } catch (...) {
      return fail(MOE_STATUS_CONTEXT_UNUSABLE, "%s: context unusable", fn);
    }
  }
  return MOE_STATUS_OK;
}

}  // namespace moe_c

extern "C" {

MOE_API moe_context_params moe_context_default_params_v2(void) { return default_context_params(); }

MOE_API moe_status moe_context_create(moe_model *model, const moe_context_params *params, moe_context **out_ctx) {
  return guard([&] {
    MOE_CHECK_ARG(out_ctx, "moe_context_create: out_ctx is NULL");
    *out_ctx = nullptr;
    MOE_CHECK_ARG(model, "moe_context_create: model is NULL");
    moe_context_params p;
    MOE_CHECK_ARG(read_context_params(params, &p),
                  "moe_context_create: params->struct_size %zu invalid (expected %zu or %zu)",
                  params ? params->struct_size : 0, MOE_CONTEXT_PARAMS_SIZE_V2, MOE_CONTEXT_PARAMS_SIZE_V1);
    MOE_CHECK_ARG(p.kv_type >= MOE_KV_TYPE_F32 && p.kv_type <= MOE_KV_TYPE_Q8_0, "moe_context_create: kv_type %d unknown",
                  p.kv_type);
    MOE_CHECK_ARG(p.n_threads >= 0 && p.n_threads <= 1024, "moe_context_create: n_threads %d out of range [0,1024]",
                  p.n_threads);
    MOE_CHECK_ARG(p.n_seq_max <= 64, "moe_context_create: n_seq_max %u exceeds 64", p.n_seq_max);
    moe::ContextParams cp;
    cp.n_ctx = p.n_ctx;
    if (p.n_batch) cp.n_batch = p.n_batch;
    if (p.n_ubatch) cp.n_ubatch = p.n_ubatch;
    if (p.n_seq_max) cp.n_seq_max = p.n_seq_max;
    cp.kv_type = static_cast<moe::KvType>(p.kv_type);
    cp.n_threads = p.n_threads;
    if (p.device) cp.device = p.device;
    cp.flash_attn = p.flash_attn != 0;
    cp.cpu_float_order = p.cpu_float_order != 0;
    auto h = std::make_unique<moe_context>();
    h->model = model->model;
    h->ctx = moe::Context::create(*model->model, cp);
    h->async = std::make_unique<moe::AsyncDecoder>(*h->ctx);
    h->async->set_user_abort(&c_abort_bridge, h.get());
    *out_ctx = h.release();
    return MOE_STATUS_OK;
  });
}

MOE_API void moe_context_free(moe_context *ctx) {
  if (!ctx) return;
  try {
    ctx->async.reset();  // cancel + join the worker before the engine context goes away
    delete ctx;
  } catch (...) {
    // Destructors of ours do not throw; nothing may escape the ABI regardless.
  }
}

MOE_API uint32_t moe_context_n_ctx(const moe_context *ctx) { return ctx ? ctx->ctx->params().n_ctx : 0; }
MOE_API uint32_t moe_context_n_batch(const moe_context *ctx) { return ctx ? ctx->ctx->params().n_batch : 0; }
MOE_API uint32_t moe_context_n_ubatch(const moe_context *ctx) { return ctx ? ctx->ctx->params().n_ubatch : 0; }
MOE_API int32_t moe_context_n_vocab(const moe_context *ctx) { return ctx ? ctx->ctx->n_vocab() : 0; }
MOE_API int32_t moe_context_cpu_float_order(const moe_context *ctx) {
  return ctx && ctx->ctx->params().cpu_float_order ? 1 : 0;
}

MOE_API moe_status moe_context_set_abort_callback(moe_context *ctx, moe_abort_callback callback, void *user_data) {
  return guard([&] {
    ContextUse use;
    const moe_status s = use.enter(ctx, "moe_context_set_abort_callback", false);
    if (s != MOE_STATUS_OK) return s;
    ctx->user_abort = callback;
    ctx->user_abort_data = user_data;
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_context_set_gpu_graphs(moe_context *ctx, int32_t enabled) {
  return guard([&] {
    ContextUse use;
    const moe_status s = use.enter(ctx, "moe_context_set_gpu_graphs", false);
    if (s != MOE_STATUS_OK) return s;
    ctx->ctx->set_gpu_graphs(enabled != 0);
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_context_check(const moe_context *ctx) {
  return guard([&] {
    ContextUse use;
    const moe_status s = use.enter(ctx, "moe_context_check", false);
    if (s != MOE_STATUS_OK) return s;
    std::string why;
    if (ctx->ctx->unusable(&why)) return fail(MOE_STATUS_CONTEXT_UNUSABLE, "context unusable: %s", why.c_str());
    return MOE_STATUS_OK;
  });
}

// ---- batch

MOE_API moe_status moe_batch_create(size_t capacity, moe_batch **out_batch) {
  return guard([&] {
    MOE_CHECK_ARG(out_batch, "moe_batch_create: out_batch is NULL");
    *out_batch = nullptr;
    MOE_CHECK_ARG(capacity >= 1 && capacity <= kMaxBatchCapacity, "moe_batch_create: capacity %zu out of range [1,%zu]",
                  capacity, kMaxBatchCapacity);
    auto b = std::make_unique<moe_batch>();
    b->tokens.reserve(capacity);
    b->capacity = capacity;
    *out_batch = b.release();
    return MOE_STATUS_OK;
  });
}

MOE_API void moe_batch_free(moe_batch *batch) { delete batch; }

MOE_API moe_status moe_batch_clear(moe_batch *batch) {
  return guard([&] {
    MOE_CHECK_ARG(batch, "moe_batch_clear: batch is NULL");
    batch->tokens.clear();
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_batch_add(moe_batch *batch, int32_t token, int32_t pos, int32_t seq_id, int32_t want_logits) {
  return guard([&] {
    MOE_CHECK_ARG(batch, "moe_batch_add: batch is NULL");
    MOE_CHECK_ARG(batch->tokens.size() < batch->capacity, "moe_batch_add: batch is full (capacity %zu)", batch->capacity);
    MOE_CHECK_ARG(token >= 0 && pos >= 0 && seq_id >= 0, "moe_batch_add: negative token %d / pos %d / seq_id %d", token,
                  pos, seq_id);
    // Capacity was reserved at creation, so this push_back never allocates.
    batch->tokens.push_back(moe::BatchToken{token, pos, seq_id, want_logits != 0});
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_batch_add_sequence(moe_batch *batch, const int32_t *tokens, size_t n, int32_t pos0,
                                          int32_t seq_id, int32_t logits_last) {
  return guard([&] {
    MOE_CHECK_ARG(batch, "moe_batch_add_sequence: batch is NULL");
    MOE_CHECK_ARG(tokens || n == 0, "moe_batch_add_sequence: tokens is NULL");
    MOE_CHECK_ARG(n <= batch->capacity - batch->tokens.size(), "moe_batch_add_sequence: %zu tokens do not fit (%zu free)", n,
                  batch->capacity - batch->tokens.size());
    MOE_CHECK_ARG(pos0 >= 0 && seq_id >= 0, "moe_batch_add_sequence: negative pos0 %d / seq_id %d", pos0, seq_id);
    MOE_CHECK_ARG(static_cast<int64_t>(pos0) + static_cast<int64_t>(n) <= INT32_MAX, "moe_batch_add_sequence: position overflow");
    for (size_t i = 0; i < n; ++i)
      MOE_CHECK_ARG(tokens[i] >= 0, "moe_batch_add_sequence: tokens[%zu] = %d is negative", i, tokens[i]);
    for (size_t i = 0; i < n; ++i)
      batch->tokens.push_back(
          moe::BatchToken{tokens[i], pos0 + static_cast<int32_t>(i), seq_id, logits_last != 0 && i + 1 == n});
    return MOE_STATUS_OK;
  });
}

MOE_API size_t moe_batch_size(const moe_batch *batch) { return batch ? batch->tokens.size() : 0; }

// ---- decode

MOE_API moe_status moe_decode(moe_context *ctx, const moe_batch *batch) {
  return guard([&] {
    ContextUse use;
    moe_status s = use.enter(ctx, "moe_decode");
    if (s != MOE_STATUS_OK) return s;
    if ((s = check_batch(ctx, batch, "moe_decode")) != MOE_STATUS_OK) {
      ctx->ctx->invalidate_logits(moe_c::last_error());  // a failed decode: no logits until one succeeds
      return s;
    }
    ctx->async->decode(batch->tokens.data(), batch->tokens.size());
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_decode_submit(moe_context *ctx, const moe_batch *batch) {
  return guard([&] {
    ContextUse use;
    moe_status s = use.enter(ctx, "moe_decode_submit");
    if (s != MOE_STATUS_OK) return s;
    if ((s = check_batch(ctx, batch, "moe_decode_submit")) != MOE_STATUS_OK) {
      ctx->ctx->invalidate_logits(moe_c::last_error());
      return s;
    }
    ctx->async->submit(batch->tokens);
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_decode_poll(const moe_context *ctx, int32_t *out_state) {
  return guard([&] {
    MOE_CHECK_ARG(ctx, "moe_decode_poll: ctx is NULL");
    MOE_CHECK_ARG(out_state, "moe_decode_poll: out_state is NULL");
    *out_state = static_cast<int32_t>(ctx->async->state());
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_decode_wait(moe_context *ctx, int64_t timeout_ms) {
  return guard([&] {
    MOE_CHECK_ARG(ctx, "moe_decode_wait: ctx is NULL");
    moe::AsyncResult r;
    if (!ctx->async->wait(timeout_ms, &r))
      return fail(MOE_STATUS_TIMEOUT, "moe_decode_wait: decode still running after %lld ms",
                  static_cast<long long>(timeout_ms));
    if (r.status != moe::Status::Ok) set_last_error(r.message.c_str());
    return to_c(r.status);
  });
}

MOE_API moe_status moe_decode_cancel(moe_context *ctx) {
  return guard([&] {
    MOE_CHECK_ARG(ctx, "moe_decode_cancel: ctx is NULL");
    ctx->async->cancel();
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_get_logits(moe_context *ctx, int32_t i, const float **out_logits, int32_t *out_n_vocab) {
  return guard([&] {
    MOE_CHECK_ARG(out_logits, "moe_get_logits: out_logits is NULL");
    *out_logits = nullptr;
    ContextUse use;
    moe_status s = use.enter(ctx, "moe_get_logits");
    if (s != MOE_STATUS_OK) return s;
    *out_logits = ctx->ctx->logits(i);
    if (out_n_vocab) *out_n_vocab = ctx->ctx->n_vocab();
    return MOE_STATUS_OK;
  });
}

// ---- KV cache

MOE_API moe_status moe_kv_clear(moe_context *ctx) {
  return guard([&] {
    ContextUse use;
    moe_status s = use.enter(ctx, "moe_kv_clear");
    if (s != MOE_STATUS_OK) return s;
    ctx->ctx->kv_clear();
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_kv_seq_rm(moe_context *ctx, int32_t seq, int32_t p0, int32_t p1) {
  return guard([&] {
    ContextUse use;
    moe_status s = use.enter(ctx, "moe_kv_seq_rm");
    if (s != MOE_STATUS_OK) return s;
    MOE_CHECK_ARG(seq < static_cast<int32_t>(ctx->ctx->params().n_seq_max), "moe_kv_seq_rm: seq %d >= n_seq_max %u", seq,
                  ctx->ctx->params().n_seq_max);
    if (!ctx->ctx->kv_seq_rm(seq, p0, p1))
      return fail(MOE_STATUS_INVALID_ARGUMENT, "moe_kv_seq_rm: range [%d,%d) of seq %d cannot be removed", p0, p1, seq);
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_kv_seq_cp(moe_context *ctx, int32_t seq_src, int32_t seq_dst, int32_t p0, int32_t p1) {
  return guard([&] {
    ContextUse use;
    moe_status s = use.enter(ctx, "moe_kv_seq_cp");
    if (s != MOE_STATUS_OK) return s;
    const int32_t n = static_cast<int32_t>(ctx->ctx->params().n_seq_max);
    MOE_CHECK_ARG(seq_src >= 0 && seq_src < n && seq_dst >= 0 && seq_dst < n,
                  "moe_kv_seq_cp: seq %d -> %d out of range [0,%d)", seq_src, seq_dst, n);
    ctx->ctx->kv_seq_cp(seq_src, seq_dst, p0, p1);
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_kv_seq_keep(moe_context *ctx, int32_t seq) {
  return guard([&] {
    ContextUse use;
    moe_status s = use.enter(ctx, "moe_kv_seq_keep");
    if (s != MOE_STATUS_OK) return s;
    const int32_t n = static_cast<int32_t>(ctx->ctx->params().n_seq_max);
    MOE_CHECK_ARG(seq >= 0 && seq < n, "moe_kv_seq_keep: seq %d out of range [0,%d)", seq, n);
    ctx->ctx->kv_seq_keep(seq);
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_kv_seq_pos_max(moe_context *ctx, int32_t seq, int32_t *out_pos) {
  return guard([&] {
    MOE_CHECK_ARG(out_pos, "moe_kv_seq_pos_max: out_pos is NULL");
    ContextUse use;
    moe_status s = use.enter(ctx, "moe_kv_seq_pos_max");
    if (s != MOE_STATUS_OK) return s;
    const int32_t n = static_cast<int32_t>(ctx->ctx->params().n_seq_max);
    MOE_CHECK_ARG(seq >= 0 && seq < n, "moe_kv_seq_pos_max: seq %d out of range [0,%d)", seq, n);
    *out_pos = ctx->ctx->kv_seq_pos_max(seq);
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_kv_used_cells(moe_context *ctx, uint32_t *out_cells) {
  return guard([&] {
    MOE_CHECK_ARG(out_cells, "moe_kv_used_cells: out_cells is NULL");
    ContextUse use;
    moe_status s = use.enter(ctx, "moe_kv_used_cells");
    if (s != MOE_STATUS_OK) return s;
    *out_cells = ctx->ctx->kv_used_cells();
    return MOE_STATUS_OK;
  });
}

}  // extern "C"

// Binaries built against the first header call moe_context_default_params and receive the
// struct in memory they reserved for the first layout: the unversioned symbol keeps
// returning exactly that layout (the header maps the name to moe_context_default_params_v2).
struct moe_context_params_v1 {
  size_t struct_size;
  uint32_t n_ctx;
  uint32_t n_batch;
  uint32_t n_ubatch;
  uint32_t n_seq_max;
  int32_t kv_type;
  int32_t n_threads;
  const char *device;
  int32_t flash_attn;
};
static_assert(sizeof(moe_context_params_v1) == MOE_CONTEXT_PARAMS_SIZE_V1, "the first layout's size");
static_assert(offsetof(moe_context_params_v1, flash_attn) == offsetof(moe_context_params, flash_attn), "v1 prefix");

#undef moe_context_default_params
extern "C" MOE_API moe_context_params_v1 moe_context_default_params(void);
extern "C" MOE_API moe_context_params_v1 moe_context_default_params(void) {
  const moe_context_params full = default_context_params();
  moe_context_params_v1 v1;
  std::memset(static_cast<void *>(&v1), 0, sizeof v1);
  std::memcpy(static_cast<void *>(&v1), &full, kContextParamsV1Fields);
  v1.struct_size = sizeof v1;
  return v1;
}
