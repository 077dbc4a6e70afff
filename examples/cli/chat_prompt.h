// Chat templating for moeinfer-cli (`chat`, `generate --chat`): the model's own
// tokenizer.chat_template, or ChatML for models without one (the demo model).
#pragma once
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "engine/engine.h"

namespace cli {

struct ChatTemplate {
  std::string text;
  bool fallback = false;  // the model has none: ChatML
};

// The whole file; throws Error(IoError) naming `what` and the path.
std::string read_text_file(const std::string &path, const char *what);

// template_file non-empty: that file's text; else the model's template; else ChatML.
ChatTemplate chat_template_for(const moe::Model &model, const std::string &template_file);

// Renders the conversation (add_generation_prompt on) with the model's BOS/EOS texts.
// enable_thinking: -1 leaves the template's default.
std::string render_chat(const moe::Model &model, const ChatTemplate &tmpl,
                        const std::vector<moe::chat::Message> &messages, int enable_thinking);

// One system (optional) + one user turn, for `generate --chat` (which tokenizes with the
// vocabulary's BOS: a leading BOS text from the template is left out so it is not doubled).
std::string one_shot_chat_prompt(const moe::Model &model, const std::string &system, const std::string &user);

}  // namespace cli
