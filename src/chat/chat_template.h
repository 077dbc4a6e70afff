// Chat templates: renders a conversation with a model's Jinja chat template
// (tokenizer.chat_template in GGUF) through our own interpreter (chat/jinja_*.h).
//
//   chat::Options opt;
//   opt.add_generation_prompt = true;
//   std::string prompt = chat::apply_template(text, {{"user", "Hi"}}, opt);
//
// The template sees the variables Hugging Face's apply_chat_template passes: messages,
// tools, add_generation_prompt, bos_token, eos_token, enable_thinking (when set), and any
// extra keys given as a JSON object (reasoning_effort, clear_thinking, ...).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace moe::chat {

struct Message {
  Message() = default;
  Message(std::string r, std::optional<std::string> c) : role(std::move(r)), content(std::move(c)) {}
  std::string role;
  std::optional<std::string> content;            // absent: none
  std::optional<std::string> reasoning_content;  // also exposed as `thinking` (gpt-oss reads that)
  std::optional<std::string> tool_calls_json;    // JSON array of {type, id, function: {name, arguments}}
  std::optional<std::string> tool_call_id;
  std::optional<std::string> name;
};

struct Options {
  bool add_generation_prompt = true;
  int enable_thinking = -1;           // -1: not passed (template default), 0: false, 1: true
  std::optional<std::string> tools_json;   // JSON array of tool definitions
  std::optional<std::string> extra_json;   // JSON object of further template variables
  std::string bos_token, eos_token;
  int64_t now_unix = 0;               // strftime_now() time; 0: current time
};

// The template's variables for these messages and options (what apply_template renders).
jinja::Value build_context(const std::vector<Message> &messages, const Options &opt);

// Throws moe::Error: InvalidArgument (bad JSON, template error, raise_exception),
// Unsupported (a Jinja feature the interpreter lacks), each naming what and where.
std::string apply_template(const std::string &template_text, const std::vector<Message> &messages,
                           const Options &opt);

// ChatML, the template used for models that carry none (documented in docs/chat.md).
const char *chatml_template();

}  // namespace moe::chat
