#include "chat/chat_template.h"

#include "chat/jinja_eval.h"
#include "chat/jinja_lexer.h"
#include "chat/jinja_parser.h"
#include "core/status.h"

namespace moe::chat {

using jinja::Value;

Value build_context(const std::vector<Message> &messages, const Options &opt) {
  Value list = Value::array();
  for (size_t k = 0; k < messages.size(); ++k) {
    const Message &m = messages[k];
    Value msg = Value::object();
    msg.set("role", Value(m.role));
    msg.set("content", m.content ? Value(*m.content) : Value::none());
    if (m.reasoning_content) {
      msg.set("reasoning_content", Value(*m.reasoning_content));
      msg.set("thinking", Value(*m.reasoning_content));
    }
    if (m.tool_calls_json) {
      const std::string what = strfmt("messages[%zu].tool_calls", k);
      Value calls = jinja::parse_json(*m.tool_calls_json, what.c_str());
      if (!calls.is_array()) throw Error(Status::InvalidArgument, what + ": expected a JSON array");
      msg.set("tool_calls", calls);
    }
    if (m.tool_call_id) msg.set("tool_call_id", Value(*m.tool_call_id));
    if (m.name) msg.set("name", Value(*m.name));
    list.push(msg);
  }
  Value ctx = Value::object();
  ctx.set("messages", list);
  if (opt.tools_json) {
    Value tools = jinja::parse_json(*opt.tools_json, "tools");
    if (!tools.is_array()) throw Error(Status::InvalidArgument, "tools: expected a JSON array");
    ctx.set("tools", tools);
  }
  ctx.set("add_generation_prompt", Value(opt.add_generation_prompt));
  ctx.set("bos_token", Value(opt.bos_token));
  ctx.set("eos_token", Value(opt.eos_token));
  if (opt.enable_thinking >= 0) ctx.set("enable_thinking", Value(opt.enable_thinking != 0));
  if (opt.extra_json) {
    const Value extra = jinja::parse_json(*opt.extra_json, "extra context");
    if (!extra.is_object()) throw Error(Status::InvalidArgument, "extra context: expected a JSON object");
    for (const auto &kv : extra.obj->items) ctx.set(kv.first, kv.second);
  }
  return ctx;
}

std::string apply_template(const std::string &template_text, const std::vector<Message> &messages,
                           const Options &opt) {
  const jinja::Body program = jinja::parse(jinja::tokenize(template_text));
  jinja::RenderOptions ro;
  ro.now_unix = opt.now_unix;
  return jinja::render(program, build_context(messages, opt), ro);
}

const char *chatml_template() {
  return "{%- for message in messages %}"
         "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
}

}  // namespace moe::chat
