// Renders every case of cases.json with moe_chat_apply_template into OUT_DIR/<id>.txt
// (or <id>.error with moe_last_error) for compare_reference.sh.
// usage: moeinfer-chat-cases CASES_JSON TEMPLATE_DIR OUT_DIR
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "chat/jinja_value.h"
#include "core/status.h"
#include "moeinfer/moeinfer.h"

using moe::jinja::Value;

static std::string read_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

static void write_file(const std::string &path, const std::string &text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The case's JSON fields as C strings that live as long as the case.
struct CaseStrings {
  std::vector<std::string> keep;
  const char *opt(const Value &v) {
    if (v.is_undefined()) return nullptr;
    if (v.is_none()) return nullptr;
    keep.push_back(v.is_string() ? v.s : moe::jinja::to_json(v, -1));
    return keep.back().c_str();
  }
};

static int render_case(const Value &c, const std::string &template_dir, const std::string &out_dir) {
  CaseStrings strs;
  strs.keep.reserve(256);
  const Value msgs = c.get("messages");
  std::vector<moe_chat_message> messages;
  for (const auto &m : *msgs.arr) {
    moe_chat_message cm{};
    cm.role = strs.opt(m.get("role"));
    cm.content = strs.opt(m.get("content"));
    cm.reasoning_content = strs.opt(m.get("reasoning_content"));
    cm.tool_calls = strs.opt(m.get("tool_calls"));
    cm.tool_call_id = strs.opt(m.get("tool_call_id"));
    cm.name = strs.opt(m.get("name"));
    messages.push_back(cm);
  }
  const std::string text = read_file(template_dir + "/" + c.get("template").s);
  moe_chat_params p = moe_chat_default_params();
  p.template_text = text.c_str();
  p.add_generation_prompt = moe::jinja::truthy(c.get("add_generation_prompt"));
  p.enable_thinking = static_cast<int32_t>(c.get("enable_thinking").i);
  p.tools = strs.opt(c.get("tools"));
  p.extra_context = strs.opt(c.get("extra"));
  p.bos_token = strs.opt(c.get("bos_token"));
  p.eos_token = strs.opt(c.get("eos_token"));
  p.now_unix = c.get("now_unix").i;
  size_t len = 0;
  const std::string id = c.get("id").s;
  moe_status st = moe_chat_apply_template(nullptr, messages.data(), messages.size(), &p, nullptr, 0, &len);
  if (st == MOE_STATUS_BUFFER_TOO_SMALL) {
    std::string out(len + 1, '\0');
    st = moe_chat_apply_template(nullptr, messages.data(), messages.size(), &p, &out[0], out.size(), &len);
    if (st == MOE_STATUS_OK) {
      out.resize(len);
      write_file(out_dir + "/" + id + ".txt", out);
      return 0;
    }
  }
  write_file(out_dir + "/" + id + ".error", std::string(moe_status_string(st)) + ": " + moe_last_error() + "\n");
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s CASES_JSON TEMPLATE_DIR OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    const Value cases = moe::jinja::parse_json(read_file(argv[1]), argv[1]);
    for (const auto &c : *cases.arr) render_case(c, argv[2], argv[3]);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
