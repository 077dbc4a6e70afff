// C ABI: model load, info, metadata, vocabulary.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

#include "c_api_internal.h"
#include "gguf/gguf_reader.h"
#include "model/hparams.h"
#include "placement/fit.h"

#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/vocab.h"

// Holds the model (and so its vocabulary) alive for as long as the stream exists.
struct moe_detokenizer {
  std::shared_ptr<moe::Model> model;
  moe::StreamDetokenizer stream;
  std::string out;  // text returned by the last push/flush (borrowed by the caller)
  moe_detokenizer(std::shared_ptr<moe::Model> m, const moe::Vocab &v, bool render_special)
      : model(std::move(m)), stream(v, render_special) {}
};

using namespace moe_c;

namespace {

// Layouts callers may pass in struct_size: the first moe_model_params ended at vocab_only
// (the placement fields came after it).
constexpr size_t kModelParamsV1 = offsetof(moe_model_params, cpu_moe);
constexpr size_t kModelInfoV1 = sizeof(moe_model_info);
constexpr size_t kFitPlanV1 = sizeof(moe_fit_plan);
constexpr size_t kMaxSeqMax = 64;  // as moe_context_params.n_seq_max

moe_model_params default_model_params() {
  moe_model_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.use_mmap = 1;
  p.vocab_only = 0;
  // Placement defaults are the engine's own, so the two cannot drift apart (the C contract
  // test pins the values).
  const moe::PlacementParams d;
  p.cpu_moe = d.cpu_moe ? 1 : 0;
  p.n_cpu_moe = d.n_cpu_moe;
  p.n_gpu_layers = d.n_gpu_layers;
  p.tensor_split = nullptr;
  p.n_tensor_split = 0;
  p.tensor_overrides = nullptr;
  p.n_tensor_overrides = 0;
  p.main_device = nullptr;
  p.allow_fallback = d.allow_fallback ? 1 : 0;
  p.zero_copy = d.zero_copy;
  p.fit = d.fit ? 1 : 0;
  p.fit_budgets = nullptr;
  p.n_fit_budgets = 0;
  p.fit_margin = d.fit_margin;
  p.fit_n_ctx = d.fit_n_ctx;
  p.fit_n_ubatch = d.fit_n_ubatch;
  p.fit_n_seq_max = d.fit_n_seq_max;
  p.fit_kv_type = d.fit_kv_type;
  p.fit_shrink_ctx = d.fit_shrink_ctx ? 1 : 0;
  return p;
}

// Appends strs[0..n) to *out; a NULL array with n > 0 or a NULL entry is an argument error.
moe_status copy_strings(const char *const *strs, size_t n, const char *fn, const char *what,
                        std::vector<std::string> *out) {
  MOE_CHECK_ARG(n == 0 || strs, "%s: n_%s %zu but %s is NULL", fn, what, n, what);
  for (size_t i = 0; i < n; ++i) {
    MOE_CHECK_ARG(strs[i], "%s: %s[%zu] is NULL", fn, what, i);
    out->emplace_back(strs[i]);
  }
  return MOE_STATUS_OK;
}

// Reads a caller's params (NULL: defaults; the first layout's struct_size: defaults for the
// fields after it), checks and converts them; fn names the entry point in messages.
moe_status read_load_params(const moe_model_params *params, const char *fn, moe::ModelLoadParams *mp) {
  moe_model_params p;
  MOE_CHECK_ARG(read_params(params, default_model_params(), kModelParamsV1, &p),
                "%s: params->struct_size %zu invalid (expected %zu, or %zu for the first layout)", fn,
                params ? params->struct_size : 0, sizeof(moe_model_params), kModelParamsV1);
  moe_status s = MOE_STATUS_OK;
  mp->use_mmap = p.use_mmap != 0;
  mp->vocab_only = p.vocab_only != 0;
  if ((s = copy_strings(p.devices, p.n_devices, fn, "devices", &mp->devices)) != MOE_STATUS_OK) return s;
  if ((s = copy_strings(p.kv_overrides, p.n_kv_overrides, fn, "kv_overrides", &mp->kv_overrides)) != MOE_STATUS_OK)
    return s;
  if (p.progress) {
    moe_progress_callback cb = p.progress;
    void *ud = p.progress_user_data;
    mp->progress = [cb, ud](float f) { return cb(f, ud) != 0; };
  }

  moe::PlacementParams &pl = mp->placement;
  MOE_CHECK_ARG(p.n_cpu_moe >= -1, "%s: n_cpu_moe %d out of range (-1 = unset, or >= 0)", fn, p.n_cpu_moe);
  MOE_CHECK_ARG(p.n_gpu_layers >= -1, "%s: n_gpu_layers %d out of range (-1 = unset, or >= 0)", fn, p.n_gpu_layers);
  MOE_CHECK_ARG(p.n_tensor_split == 0 || p.tensor_split, "%s: n_tensor_split %zu but tensor_split is NULL", fn,
                p.n_tensor_split);
  for (size_t i = 0; i < p.n_tensor_split; ++i) {
    const float v = p.tensor_split[i];
    MOE_CHECK_ARG(std::isfinite(v) && v >= 0.0f, "%s: tensor_split[%zu] = %g (want a finite share >= 0)", fn, i,
                  static_cast<double>(v));
    pl.tensor_split.push_back(v);
  }
  if ((s = copy_strings(p.tensor_overrides, p.n_tensor_overrides, fn, "tensor_overrides", &pl.overrides)) !=
      MOE_STATUS_OK)
    return s;
  MOE_CHECK_ARG(p.zero_copy >= -1 && p.zero_copy <= 1, "%s: zero_copy %d (want -1 auto, 0 or 1)", fn, p.zero_copy);
  if ((s = copy_strings(p.fit_budgets, p.n_fit_budgets, fn, "fit_budgets", &pl.budgets)) != MOE_STATUS_OK) return s;
  MOE_CHECK_ARG(p.fit_kv_type >= MOE_KV_TYPE_F32 && p.fit_kv_type <= MOE_KV_TYPE_Q8_0, "%s: fit_kv_type %d unknown",
                fn, p.fit_kv_type);
  MOE_CHECK_ARG(p.fit_n_seq_max <= kMaxSeqMax, "%s: fit_n_seq_max %u exceeds %zu", fn, p.fit_n_seq_max, kMaxSeqMax);
  pl.cpu_moe = p.cpu_moe != 0;
  pl.n_cpu_moe = p.n_cpu_moe;
  pl.n_gpu_layers = p.n_gpu_layers;
  if (p.main_device) pl.main_device = p.main_device;
  pl.allow_fallback = p.allow_fallback != 0;
  pl.zero_copy = p.zero_copy;
  pl.fit = p.fit != 0;
  pl.fit_margin = p.fit_margin;
  if (p.fit_n_ctx) pl.fit_n_ctx = p.fit_n_ctx;
  if (p.fit_n_ubatch) pl.fit_n_ubatch = p.fit_n_ubatch;
  if (p.fit_n_seq_max) pl.fit_n_seq_max = p.fit_n_seq_max;
  pl.fit_kv_type = p.fit_kv_type;
  pl.fit_shrink_ctx = p.fit_shrink_ctx != 0;
  return MOE_STATUS_OK;
}

std::string scalar_text(const moe::GgufValue &v) {
  using moe::GgufType;
  switch (v.type) {
    case GgufType::F32:
    case GgufType::F64: return moe::strfmt("%.9g", v.f);
    case GgufType::BOOL: return v.u ? "true" : "false";
    case GgufType::STRING: return v.str;
    case GgufType::U8: case GgufType::U16: case GgufType::U32: case GgufType::U64:
      return moe::strfmt("%" PRIu64, v.u);
    default: return moe::strfmt("%" PRId64, v.i);
  }
}

// Text form of a metadata value; arrays show their first 16 elements.
std::string value_text(const moe::GgufValue &v) {
  using moe::GgufType;
  if (!v.is_array()) return scalar_text(v);
  constexpr uint64_t kShow = 16;
  std::string s = "[";
  const uint64_t n = v.count;
  for (uint64_t k = 0; k < n && k < kShow; ++k) {
    if (k) s += ", ";
    if (v.elem_type == GgufType::STRING) {
      s += k < v.strs.size() ? v.strs[k] : std::string();
    } else if (v.elem_type == GgufType::ARRAY) {
      s += k < v.arrays.size() ? value_text(v.arrays[k]) : std::string();
    } else if (v.elem_type == GgufType::F32 || v.elem_type == GgufType::F64) {
      s += moe::strfmt("%.9g", v.elem_f64(k));
    } else {
      s += moe::strfmt("%" PRId64, v.elem_i64(k));
    }
  }
  if (n > kShow) s += moe::strfmt(", ... (%" PRIu64 " total)", n);
  s += "]";
  return s;
}

const moe::Vocab &need_vocab(const moe_model *m) {
  const moe::Vocab *v = m->model->vocab();
  if (!v) throw moe::Error(moe::Status::InvalidVocab, "model has no tokenizer");
  return *v;
}

}  // namespace

extern "C" {

MOE_API moe_model_params moe_model_default_params_v2(void) { return default_model_params(); }

MOE_API moe_status moe_model_load(const char *path, const moe_model_params *params, moe_model **out_model) {
  return guard([&] {
    MOE_CHECK_ARG(out_model, "moe_model_load: out_model is NULL");
    *out_model = nullptr;
    MOE_CHECK_ARG(path, "moe_model_load: path is NULL");
    moe::ModelLoadParams mp;
    const moe_status s = read_load_params(params, "moe_model_load", &mp);
    if (s != MOE_STATUS_OK) return s;
    std::unique_ptr<moe::Model> m = moe::Model::load(path, mp);
    auto h = std::make_unique<moe_model>();
    h->model = std::shared_ptr<moe::Model>(std::move(m));
    *out_model = h.release();
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_model_fit(const char *path, const moe_model_params *params, moe_fit_plan *out) {
  return guard([&] {
    MOE_CHECK_ARG(out, "moe_model_fit: out is NULL");
    MOE_CHECK_ARG(out->struct_size >= kFitPlanV1 && out->struct_size <= sizeof(moe_fit_plan),
                  "moe_model_fit: out->struct_size %zu, expected %zu", out->struct_size, sizeof(moe_fit_plan));
    MOE_CHECK_ARG(path, "moe_model_fit: path is NULL");
    moe::ModelLoadParams mp;
    const moe_status s = read_load_params(params, "moe_model_fit", &mp);
    if (s != MOE_STATUS_OK) return s;
    const moe::FitPlan plan = moe::fit_model(path, mp);
    moe_fit_plan r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.n_cpu_moe = plan.n_cpu_moe;
    r.n_gpu_layers = plan.n_gpu_layers;
    r.cpu_moe = plan.cpu_moe ? 1 : 0;
    r.n_ctx = plan.n_ctx;
    r.fitted = plan.fitted ? 1 : 0;
    r.n_devices = std::min(plan.devices.size(), sizeof r.devices / sizeof r.devices[0]);
    for (size_t i = 0; i < r.n_devices; ++i) {
      const moe::DevicePlan &d = plan.devices[i];
      moe_device_plan &o = r.devices[i];
      std::snprintf(o.id, sizeof o.id, "%s", d.device.c_str());
      o.weights = d.weights;
      o.kv_cache = d.kv_cache;
      o.activations = d.activations;
      o.workspace = d.workspace;
      o.total = d.total();
      o.budget = d.budget;
    }
    write_result(r, out);
    return MOE_STATUS_OK;
  });
}

MOE_API void moe_model_free(moe_model *model) { delete model; }

MOE_API moe_status moe_model_set_cpu_weight_copy(moe_model *model, int32_t enabled) {
  return guard([&] {
    MOE_CHECK_ARG(model, "moe_model_set_cpu_weight_copy: model is NULL");
    if (!model->model->set_cpu_weight_copy(enabled != 0))
      return fail(MOE_STATUS_BUSY, "moe_model_set_cpu_weight_copy: a CPU context already copied the weights");
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_model_get_info(const moe_model *model, moe_model_info *out) {
  return guard([&] {
    MOE_CHECK_ARG(model, "moe_model_get_info: model is NULL");
    MOE_CHECK_ARG(out, "moe_model_get_info: out is NULL");
    MOE_CHECK_ARG(out->struct_size >= kModelInfoV1 && out->struct_size <= sizeof(moe_model_info),
                  "moe_model_get_info: struct_size %zu, expected %zu", out->struct_size, sizeof(moe_model_info));
    const moe::Model &m = *model->model;
    const moe::Hparams &hp = m.hparams();
    moe_model_info r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.n_vocab = m.n_vocab();
    r.n_ctx_train = static_cast<int32_t>(hp.n_ctx_train);
    r.n_embd = static_cast<int32_t>(hp.n_embd);
    r.n_layer = static_cast<int32_t>(hp.n_layer);
    r.n_head = static_cast<int32_t>(hp.n_head);
    r.n_head_kv = static_cast<int32_t>(hp.n_head_kv);
    r.n_expert = static_cast<int32_t>(hp.n_expert);
    r.n_expert_used = static_cast<int32_t>(hp.n_expert_used);
    r.n_params = m.n_params();
    r.weight_bytes = m.weight_bytes();
    std::snprintf(r.arch, sizeof r.arch, "%s", m.arch_name().c_str());
    write_result(r, out);
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_model_meta_count(const moe_model *model, size_t *out_count) {
  return guard([&] {
    MOE_CHECK_ARG(model, "moe_model_meta_count: model is NULL");
    MOE_CHECK_ARG(out_count, "moe_model_meta_count: out_count is NULL");
    *out_count = model->model->gguf().metadata().size();
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_model_meta_key(const moe_model *model, size_t index, char *buf, size_t buf_size,
                                      size_t *out_len) {
  return guard([&] {
    MOE_CHECK_ARG(model, "moe_model_meta_key: model is NULL");
    MOE_CHECK_ARG(out_len, "moe_model_meta_key: out_len is NULL");
    const auto &md = model->model->gguf().metadata();
    MOE_CHECK_ARG(index < md.size(), "moe_model_meta_key: index %zu out of range (%zu entries)", index, md.size());
    return copy_string(md[index].first, buf, buf_size, out_len);
  });
}

MOE_API moe_status moe_model_meta_value(const moe_model *model, const char *key, char *buf, size_t buf_size,
                                        size_t *out_len) {
  return guard([&] {
    MOE_CHECK_ARG(model, "moe_model_meta_value: model is NULL");
    MOE_CHECK_ARG(key, "moe_model_meta_value: key is NULL");
    MOE_CHECK_ARG(out_len, "moe_model_meta_value: out_len is NULL");
    const moe::GgufValue *v = model->model->gguf().find(key);
    MOE_CHECK_ARG(v, "moe_model_meta_value: no metadata key '%s'", key);
    return copy_string(value_text(*v), buf, buf_size, out_len);
  });
}

// Plain queries: no allocation, but vocab() may be absent; never throw out.
MOE_API int32_t moe_token_bos(const moe_model *model) {
  if (!model || !model->model->vocab()) return -1;
  try {
    return model->model->vocab()->bos();
  } catch (...) {
    return -1;
  }
}
MOE_API int32_t moe_token_eos(const moe_model *model) {
  if (!model || !model->model->vocab()) return -1;
  try {
    return model->model->vocab()->eos();
  } catch (...) {
    return -1;
  }
}
MOE_API int32_t moe_token_eot(const moe_model *model) {
  if (!model || !model->model->vocab()) return -1;
  try {
    return model->model->vocab()->eot();
  } catch (...) {
    return -1;
  }
}
MOE_API int32_t moe_token_is_eog(const moe_model *model, int32_t token) {
  if (!model || !model->model->vocab()) return 0;
  if (token < 0 || token >= model->model->n_vocab()) return 0;
  try {
    return model->model->vocab()->is_eog(token) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

MOE_API moe_status moe_tokenize(const moe_model *model, const char *text, size_t text_len, int32_t *tokens,
                                size_t max_tokens, size_t *out_n_tokens, uint32_t flags) {
  return guard([&] {
    MOE_CHECK_ARG(model, "moe_tokenize: model is NULL");
    MOE_CHECK_ARG(out_n_tokens, "moe_tokenize: out_n_tokens is NULL");
    *out_n_tokens = 0;
    MOE_CHECK_ARG(text || text_len == 0, "moe_tokenize: text is NULL");
    MOE_CHECK_ARG(tokens || max_tokens == 0, "moe_tokenize: tokens is NULL but max_tokens is %zu", max_tokens);
    MOE_CHECK_ARG((flags & ~uint32_t(MOE_TOKENIZE_ADD_SPECIAL | MOE_TOKENIZE_PARSE_SPECIAL)) == 0,
                  "moe_tokenize: unknown flags 0x%x", flags);
    const moe::Vocab &v = need_vocab(model);
    std::vector<int32_t> ids = v.encode(std::string_view(text ? text : "", text_len),
                                        (flags & MOE_TOKENIZE_ADD_SPECIAL) != 0,
                                        (flags & MOE_TOKENIZE_PARSE_SPECIAL) != 0);
    *out_n_tokens = ids.size();
    if (ids.size() > max_tokens)
      return fail(MOE_STATUS_BUFFER_TOO_SMALL, "moe_tokenize: %zu tokens needed, buffer holds %zu", ids.size(),
                  max_tokens);
    if (!ids.empty()) std::memcpy(tokens, ids.data(), ids.size() * sizeof(int32_t));
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_token_to_piece(const moe_model *model, int32_t token, char *buf, size_t buf_size,
                                      size_t *out_len, uint32_t flags) {
  return guard([&] {
    MOE_CHECK_ARG(model, "moe_token_to_piece: model is NULL");
    MOE_CHECK_ARG(out_len, "moe_token_to_piece: out_len is NULL");
    *out_len = 0;
    MOE_CHECK_ARG(token >= 0 && token < model->model->n_vocab(), "moe_token_to_piece: token %d out of range [0,%d)",
                  token, model->model->n_vocab());
    MOE_CHECK_ARG((flags & ~uint32_t(MOE_DETOKENIZE_RENDER_SPECIAL)) == 0, "moe_token_to_piece: unknown flags 0x%x",
                  flags);
    const moe::Vocab &v = need_vocab(model);
    return copy_string(v.token_to_piece(token, (flags & MOE_DETOKENIZE_RENDER_SPECIAL) != 0), buf, buf_size,
                       out_len);
  });
}

MOE_API moe_status moe_detokenize(const moe_model *model, const int32_t *tokens, size_t n_tokens, char *buf,
                                  size_t buf_size, size_t *out_len, uint32_t flags) {
  return guard([&] {
    MOE_CHECK_ARG(model, "moe_detokenize: model is NULL");
    MOE_CHECK_ARG(out_len, "moe_detokenize: out_len is NULL");
    *out_len = 0;
    MOE_CHECK_ARG(tokens || n_tokens == 0, "moe_detokenize: tokens is NULL");
    MOE_CHECK_ARG((flags & ~uint32_t(MOE_DETOKENIZE_RENDER_SPECIAL)) == 0, "moe_detokenize: unknown flags 0x%x",
                  flags);
    const moe::Vocab &v = need_vocab(model);
    const int32_t nv = model->model->n_vocab();
    std::string text;
    for (size_t i = 0; i < n_tokens; ++i) {
      MOE_CHECK_ARG(tokens[i] >= 0 && tokens[i] < nv, "moe_detokenize: tokens[%zu] = %d out of range [0,%d)", i,
                    tokens[i], nv);
      text += v.token_to_piece(tokens[i], (flags & MOE_DETOKENIZE_RENDER_SPECIAL) != 0);
    }
    return copy_string(text, buf, buf_size, out_len);
  });
}

MOE_API moe_status moe_detokenizer_create(const moe_model *model, uint32_t flags, moe_detokenizer **out_detok) {
  return guard([&] {
    MOE_CHECK_ARG(out_detok, "moe_detokenizer_create: out_detok is NULL");
    *out_detok = nullptr;
    MOE_CHECK_ARG(model, "moe_detokenizer_create: model is NULL");
    MOE_CHECK_ARG((flags & ~uint32_t(MOE_DETOKENIZE_RENDER_SPECIAL)) == 0,
                  "moe_detokenizer_create: unknown flags 0x%x", flags);
    const moe::Vocab &v = need_vocab(model);
    *out_detok = new moe_detokenizer(model->model, v, (flags & MOE_DETOKENIZE_RENDER_SPECIAL) != 0);
    return MOE_STATUS_OK;
  });
}

MOE_API void moe_detokenizer_free(moe_detokenizer *detok) { delete detok; }

MOE_API moe_status moe_detokenizer_push(moe_detokenizer *detok, int32_t token, const char **out_text,
                                        size_t *out_len) {
  return guard([&] {
    MOE_CHECK_ARG(out_text && out_len, "moe_detokenizer_push: out_text / out_len is NULL");
    *out_text = "";
    *out_len = 0;
    MOE_CHECK_ARG(detok, "moe_detokenizer_push: detok is NULL");
    const int32_t nv = detok->model->n_vocab();
    MOE_CHECK_ARG(token >= 0 && token < nv, "moe_detokenizer_push: token %d out of range [0,%d)", token, nv);
    detok->out = detok->stream.push(token);
    *out_text = detok->out.c_str();
    *out_len = detok->out.size();
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_detokenizer_flush(moe_detokenizer *detok, const char **out_text, size_t *out_len) {
  return guard([&] {
    MOE_CHECK_ARG(out_text && out_len, "moe_detokenizer_flush: out_text / out_len is NULL");
    *out_text = "";
    *out_len = 0;
    MOE_CHECK_ARG(detok, "moe_detokenizer_flush: detok is NULL");
    detok->out = detok->stream.flush();
    detok->stream.reset();
    *out_text = detok->out.c_str();
    *out_len = detok->out.size();
    return MOE_STATUS_OK;
  });
}

}  // extern "C"

// Binaries built against the first header call moe_model_default_params and receive the
// struct in memory they reserved for 64 bytes: the unversioned symbol keeps returning
// exactly that layout (the header maps the name to moe_model_default_params_v2).
struct moe_model_params_v1 {
  size_t struct_size;
  const char *const *devices;
  size_t n_devices;
  const char *const *kv_overrides;
  size_t n_kv_overrides;
  moe_progress_callback progress;
  void *progress_user_data;
  int32_t use_mmap;
  int32_t vocab_only;
};
static_assert(sizeof(moe_model_params_v1) == kModelParamsV1, "the first layout is the prefix of moe_model_params");
static_assert(offsetof(moe_model_params_v1, vocab_only) == offsetof(moe_model_params, vocab_only), "v1 prefix");

#undef moe_model_default_params
extern "C" MOE_API moe_model_params_v1 moe_model_default_params(void);
extern "C" MOE_API moe_model_params_v1 moe_model_default_params(void) {
  const moe_model_params full = default_model_params();
  moe_model_params_v1 v1;
  std::memcpy(static_cast<void *>(&v1), &full, sizeof v1);
  v1.struct_size = sizeof v1;
  return v1;
}
