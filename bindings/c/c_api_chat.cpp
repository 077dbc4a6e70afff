// C entry points of chat templates (moeinfer.h "chat templates"): messages and flags are
// copied into chat::Message / chat::Options and rendered by src/chat.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "c_api_internal.h"
#include "chat/chat_template.h"
#include "gguf/gguf_reader.h"
#include "tokenizer/vocab.h"

using namespace moe_c;

// The message layout is frozen (the header promises it): pin every field.
static_assert(sizeof(moe_chat_message) == 6 * sizeof(void *), "moe_chat_message layout is frozen");
static_assert(offsetof(moe_chat_message, role) == 0 * sizeof(void *), "moe_chat_message.role moved");
static_assert(offsetof(moe_chat_message, content) == 1 * sizeof(void *), "moe_chat_message.content moved");
static_assert(offsetof(moe_chat_message, reasoning_content) == 2 * sizeof(void *), "reasoning_content moved");
static_assert(offsetof(moe_chat_message, tool_calls) == 3 * sizeof(void *), "tool_calls moved");
static_assert(offsetof(moe_chat_message, tool_call_id) == 4 * sizeof(void *), "tool_call_id moved");
static_assert(offsetof(moe_chat_message, name) == 5 * sizeof(void *), "name moved");
#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
static_assert(offsetof(moe_chat_params, template_text) == 8, "moe_chat_params layout changed");
static_assert(offsetof(moe_chat_params, template_name) == 16, "moe_chat_params layout changed");
static_assert(offsetof(moe_chat_params, add_generation_prompt) == 24, "moe_chat_params layout changed");
static_assert(offsetof(moe_chat_params, enable_thinking) == 28, "moe_chat_params layout changed");
static_assert(offsetof(moe_chat_params, tools) == 32, "moe_chat_params layout changed");
static_assert(offsetof(moe_chat_params, extra_context) == 40, "moe_chat_params layout changed");
static_assert(offsetof(moe_chat_params, bos_token) == 48, "moe_chat_params layout changed");
static_assert(offsetof(moe_chat_params, eos_token) == 56, "moe_chat_params layout changed");
static_assert(offsetof(moe_chat_params, now_unix) == 64, "moe_chat_params layout changed");
static_assert(MOE_CHAT_PARAMS_SIZE_V1 == 72 && sizeof(moe_chat_params) == 72, "moe_chat_params first layout is 72 bytes");
#endif

namespace {

std::optional<std::string> opt_str(const char *s) {
  return s ? std::optional<std::string>(s) : std::nullopt;
}

// The text of a special token for bos_token / eos_token ("" when the model has none).
std::string token_text(const moe_model *model, int32_t id) {
  if (!model || !model->model->vocab() || id < 0 || id >= model->model->n_vocab()) return "";
  return model->model->vocab()->token_text(id);
}

std::string model_template(const moe_model *model, const char *name) {
  const std::string key = name ? std::string("tokenizer.chat_template.") + name : "tokenizer.chat_template";
  const moe::GgufValue *v = model->model->gguf().find(key);
  if (!v || v->type != moe::GgufType::STRING)
    throw moe::Error(moe::Status::InvalidArgument,
                     "moe_chat_apply_template: the model has no chat template '" + key +
                         "' (pass params.template_text, e.g. a ChatML template)");
  return v->str;
}

}  // namespace

extern "C" {

MOE_API moe_chat_params moe_chat_default_params(void) {
  moe_chat_params p{};
  p.struct_size = sizeof(moe_chat_params);
  p.add_generation_prompt = 1;
  p.enable_thinking = -1;
  return p;
}

MOE_API moe_status moe_chat_apply_template(const moe_model *model, const moe_chat_message *messages,
                                           size_t n_messages, const moe_chat_params *params, char *buf,
                                           size_t buf_size, size_t *out_len) {
  return guard([&] {
    MOE_CHECK_ARG(out_len, "moe_chat_apply_template: out_len is NULL");
    MOE_CHECK_ARG(messages || n_messages == 0, "moe_chat_apply_template: messages is NULL");
    moe_chat_params p{};
    MOE_CHECK_ARG(read_params(params, moe_chat_default_params(), MOE_CHAT_PARAMS_SIZE_V1, &p),
                  "moe_chat_apply_template: params->struct_size %zu is not a known layout (%zu .. %zu)",
                  params ? params->struct_size : size_t{0}, size_t{MOE_CHAT_PARAMS_SIZE_V1}, sizeof(moe_chat_params));
    MOE_CHECK_ARG(model || p.template_text,
                  "moe_chat_apply_template: model is NULL and params->template_text is not set");
    MOE_CHECK_ARG(p.enable_thinking >= -1 && p.enable_thinking <= 1,
                  "moe_chat_apply_template: enable_thinking %d is not -1, 0 or 1", p.enable_thinking);
    std::vector<moe::chat::Message> msgs(n_messages);
    for (size_t k = 0; k < n_messages; ++k) {
      const moe_chat_message &m = messages[k];
      MOE_CHECK_ARG(m.role, "moe_chat_apply_template: messages[%zu].role is NULL", k);
      msgs[k].role = m.role;
      msgs[k].content = opt_str(m.content);
      msgs[k].reasoning_content = opt_str(m.reasoning_content);
      msgs[k].tool_calls_json = opt_str(m.tool_calls);
      msgs[k].tool_call_id = opt_str(m.tool_call_id);
      msgs[k].name = opt_str(m.name);
    }
    moe::chat::Options opt;
    opt.add_generation_prompt = p.add_generation_prompt != 0;
    opt.enable_thinking = p.enable_thinking;
    opt.tools_json = opt_str(p.tools);
    opt.extra_json = opt_str(p.extra_context);
    opt.bos_token = p.bos_token ? p.bos_token : token_text(model, model ? moe_token_bos(model) : -1);
    opt.eos_token = p.eos_token ? p.eos_token : token_text(model, model ? moe_token_eos(model) : -1);
    opt.now_unix = p.now_unix;
    const std::string text = p.template_text ? std::string(p.template_text) : model_template(model, p.template_name);
    return copy_string(moe::chat::apply_template(text, msgs, opt), buf, buf_size, out_len);
  });
}

}  // extern "C"
