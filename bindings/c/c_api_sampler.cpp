// C ABI: sampler chain.
#include <cmath>

#include "c_api_internal.h"
#include "sampler/grammar_sampler.h"
#include "sampler/json_schema.h"
#include "tokenizer/vocab.h"

using namespace moe_c;

namespace {

constexpr size_t kSamplerParamsV1 = sizeof(moe_sampler_params);

moe_sampler_params default_sampler_params() {
  moe_sampler_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.seed = 0x5EED;
  return p;
}

// Validates and appends a stage; all parameter checks happen before anything changes.
template <class Stage, class... Args>
moe_status add_stage(moe_sampler *s, const char *fn, Args &&...args) {
  if (!s) return fail(MOE_STATUS_INVALID_ARGUMENT, "%s: sampler is NULL", fn);
  s->chain->add(std::make_unique<Stage>(std::forward<Args>(args)...));
  return MOE_STATUS_OK;
}

bool finite(float x) { return std::isfinite(x); }

}  // namespace

extern "C" {

MOE_API moe_sampler_params moe_sampler_default_params(void) { return default_sampler_params(); }

MOE_API moe_status moe_sampler_create(const moe_sampler_params *params, moe_sampler **out_sampler) {
  return guard([&] {
    MOE_CHECK_ARG(out_sampler, "moe_sampler_create: out_sampler is NULL");
    *out_sampler = nullptr;
    moe_sampler_params p;
    MOE_CHECK_ARG(read_params(params, default_sampler_params(), kSamplerParamsV1, &p),
                  "moe_sampler_create: params->struct_size %zu invalid (expected %zu)",
                  params ? params->struct_size : 0, sizeof(moe_sampler_params));
    auto h = std::make_unique<moe_sampler>();
    h->seed = p.seed;
    h->chain = std::make_unique<moe::SamplerChain>(p.seed);
    *out_sampler = h.release();
    return MOE_STATUS_OK;
  });
}

MOE_API void moe_sampler_free(moe_sampler *sampler) { delete sampler; }

MOE_API moe_status moe_sampler_add_greedy(moe_sampler *sampler) {
  return guard([&] { return add_stage<moe::GreedyStage>(sampler, "moe_sampler_add_greedy"); });
}

MOE_API moe_status moe_sampler_add_dist(moe_sampler *sampler) {
  return guard([&] { return add_stage<moe::DistStage>(sampler, "moe_sampler_add_dist"); });
}

MOE_API moe_status moe_sampler_add_temperature(moe_sampler *sampler, float temperature) {
  return guard([&] {
    MOE_CHECK_ARG(!std::isnan(temperature), "moe_sampler_add_temperature: temperature is NaN");
    return add_stage<moe::TemperatureStage>(sampler, "moe_sampler_add_temperature", temperature);
  });
}

MOE_API moe_status moe_sampler_add_top_k(moe_sampler *sampler, int32_t k) {
  return guard([&] { return add_stage<moe::TopKStage>(sampler, "moe_sampler_add_top_k", k); });
}

MOE_API moe_status moe_sampler_add_top_p(moe_sampler *sampler, float p, size_t min_keep) {
  return guard([&] {
    MOE_CHECK_ARG(finite(p) && p > 0.0f, "moe_sampler_add_top_p: p %g must be in (0,1]", static_cast<double>(p));
    return add_stage<moe::TopPStage>(sampler, "moe_sampler_add_top_p", p, min_keep);
  });
}

MOE_API moe_status moe_sampler_add_min_p(moe_sampler *sampler, float p, size_t min_keep) {
  return guard([&] {
    MOE_CHECK_ARG(finite(p) && p >= 0.0f && p <= 1.0f, "moe_sampler_add_min_p: p %g must be in [0,1]",
                  static_cast<double>(p));
    return add_stage<moe::MinPStage>(sampler, "moe_sampler_add_min_p", p, min_keep);
  });
}

MOE_API moe_status moe_sampler_add_typical(moe_sampler *sampler, float p, size_t min_keep) {
  return guard([&] {
    MOE_CHECK_ARG(finite(p) && p > 0.0f, "moe_sampler_add_typical: p %g must be in (0,1]", static_cast<double>(p));
    return add_stage<moe::TypicalStage>(sampler, "moe_sampler_add_typical", p, min_keep);
  });
}

MOE_API moe_status moe_sampler_add_penalties(moe_sampler *sampler, int32_t last_n, float repeat, float frequency,
                                             float presence) {
  return guard([&] {
    MOE_CHECK_ARG(last_n >= -1, "moe_sampler_add_penalties: last_n %d must be >= -1", last_n);
    MOE_CHECK_ARG(finite(repeat) && repeat > 0.0f, "moe_sampler_add_penalties: repeat %g must be > 0",
                  static_cast<double>(repeat));
    MOE_CHECK_ARG(finite(frequency) && finite(presence), "moe_sampler_add_penalties: non-finite penalty");
    return add_stage<moe::PenaltiesStage>(sampler, "moe_sampler_add_penalties", last_n, repeat, frequency, presence);
  });
}

MOE_API moe_status moe_sampler_add_logit_bias(moe_sampler *sampler, const moe_logit_bias *biases, size_t n_biases) {
  return guard([&] {
    MOE_CHECK_ARG(biases || n_biases == 0, "moe_sampler_add_logit_bias: biases is NULL");
    std::vector<std::pair<int32_t, float>> v;
    v.reserve(n_biases);
    for (size_t i = 0; i < n_biases; ++i) {
      MOE_CHECK_ARG(biases[i].token >= 0, "moe_sampler_add_logit_bias: biases[%zu].token %d is negative", i,
                    biases[i].token);
      MOE_CHECK_ARG(!std::isnan(biases[i].bias), "moe_sampler_add_logit_bias: biases[%zu].bias is NaN", i);
      v.emplace_back(biases[i].token, biases[i].bias);
    }
    return add_stage<moe::LogitBiasStage>(sampler, "moe_sampler_add_logit_bias", std::move(v));
  });
}

MOE_API moe_status moe_sampler_sample(moe_sampler *sampler, const float *logits, int32_t n_vocab, int32_t *out_token) {
  return guard([&] {
    MOE_CHECK_ARG(out_token, "moe_sampler_sample: out_token is NULL");
    *out_token = -1;
    MOE_CHECK_ARG(sampler, "moe_sampler_sample: sampler is NULL");
    MOE_CHECK_ARG(logits, "moe_sampler_sample: logits is NULL");
    MOE_CHECK_ARG(n_vocab > 0, "moe_sampler_sample: n_vocab %d must be > 0", n_vocab);
    *out_token = sampler->chain->sample(logits, n_vocab);
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_sampler_sample_context(moe_sampler *sampler, moe_context *ctx, int32_t i, int32_t *out_token) {
  return guard([&] {
    MOE_CHECK_ARG(out_token, "moe_sampler_sample_context: out_token is NULL");
    *out_token = -1;
    MOE_CHECK_ARG(sampler, "moe_sampler_sample_context: sampler is NULL");
    // The context stays leased while the sampler reads its logits (a decode started on
    // another thread meanwhile is BUSY, never a race).
    ContextUse use;
    const moe_status s = use.enter(ctx, "moe_sampler_sample_context");
    if (s != MOE_STATUS_OK) return s;
    const float *logits = ctx->ctx->logits(i);
    *out_token = sampler->chain->sample(logits, ctx->ctx->n_vocab());
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_sampler_accept(moe_sampler *sampler, int32_t token) {
  return guard([&] {
    MOE_CHECK_ARG(sampler, "moe_sampler_accept: sampler is NULL");
    MOE_CHECK_ARG(token >= 0, "moe_sampler_accept: token %d is negative", token);
    sampler->chain->accept(token);
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_sampler_reset(moe_sampler *sampler) {
  return guard([&] {
    MOE_CHECK_ARG(sampler, "moe_sampler_reset: sampler is NULL");
    sampler->chain->reset();
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_sampler_set_seed(moe_sampler *sampler, uint64_t seed) {
  return guard([&] {
    MOE_CHECK_ARG(sampler, "moe_sampler_set_seed: sampler is NULL");
    sampler->seed = seed;
    sampler->chain->set_seed(seed);
    return MOE_STATUS_OK;
  });
}

}  // extern "C"

// ---- grammar-constrained sampling

namespace {

moe_status add_grammar_stage(moe_sampler *sampler, const moe_model *model, const std::string &gbnf,
                             const std::string &root, const char *fn) {
  MOE_CHECK_ARG(sampler, "%s: sampler is NULL", fn);
  MOE_CHECK_ARG(model, "%s: model is NULL", fn);
  const moe::Vocab *vocab = model->model->vocab();
  if (!vocab) return fail(MOE_STATUS_INVALID_VOCAB, "%s: the model has no tokenizer", fn);
  sampler->chain->add(std::make_unique<moe::GrammarStage>(moe::parse_gbnf(gbnf, root), *vocab));
  return MOE_STATUS_OK;
}

}  // namespace

extern "C" {

MOE_API moe_status moe_sampler_add_grammar(moe_sampler *sampler, const moe_model *model, const char *grammar,
                                           const char *root) {
  return guard([&] {
    MOE_CHECK_ARG(grammar, "moe_sampler_add_grammar: grammar is NULL");
    return add_grammar_stage(sampler, model, grammar, root ? root : "root", "moe_sampler_add_grammar");
  });
}

MOE_API moe_status moe_sampler_add_json_schema(moe_sampler *sampler, const moe_model *model, const char *schema) {
  return guard([&] {
    MOE_CHECK_ARG(schema, "moe_sampler_add_json_schema: schema is NULL");
    return add_grammar_stage(sampler, model, moe::json_schema_to_gbnf(schema), "root", "moe_sampler_add_json_schema");
  });
}

MOE_API moe_status moe_json_schema_to_grammar(const char *schema, char *buf, size_t buf_size, size_t *out_len) {
  return guard([&] {
    MOE_CHECK_ARG(schema, "moe_json_schema_to_grammar: schema is NULL");
    return copy_string(moe::json_schema_to_gbnf(schema), buf, buf_size, out_len);
  });
}

}  // extern "C"
