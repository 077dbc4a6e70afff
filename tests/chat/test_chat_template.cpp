// Chat templates: the Jinja interpreter's features against hand-derived expectations, its
// refusals (unsupported features, template errors) and moe_chat_apply_template's contract.
// The real templates are compared with an independent renderer in compare_reference.sh.
#include <sys/stat.h>

#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "chat/chat_template.h"
#include "core/status.h"
#include "moeinfer/moeinfer.h"
#include "moeinfer/moeinfer.hpp"

namespace {

// Renders `tmpl` through the C ABI with the given messages; returns the status and fills out.
moe_status render_c(const std::string &tmpl, const std::vector<moe_chat_message> &msgs, std::string &out,
                    moe_chat_params p = moe_chat_default_params()) {
  p.template_text = tmpl.c_str();
  size_t len = 0;
  moe_status st = moe_chat_apply_template(nullptr, msgs.data(), msgs.size(), &p, nullptr, 0, &len);
  if (st != MOE_STATUS_BUFFER_TOO_SMALL) return st;
  out.assign(len + 1, '\0');
  st = moe_chat_apply_template(nullptr, msgs.data(), msgs.size(), &p, &out[0], out.size(), &len);
  out.resize(len);
  return st;
}

std::string render(const std::string &tmpl, const std::string &extra = "{}") {
  moe_chat_params p = moe_chat_default_params();
  p.extra_context = extra.c_str();
  std::string out;
  const moe_status st = render_c(tmpl, {{"user", "hi", nullptr, nullptr, nullptr, nullptr}}, out, p);
  INFO(moe_last_error());
  REQUIRE(st == MOE_STATUS_OK);
  return out;
}

moe_status render_status(const std::string &tmpl) {
  std::string out;
  return render_c(tmpl, {{"user", "hi", nullptr, nullptr, nullptr, nullptr}}, out);
}

bool file_exists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("chat template whitespace control follows trim_blocks and lstrip_blocks", "[chat]") {
  CHECK(render("a  {{- 'b' -}}  c") == "abc");
  CHECK(render("a\n  {% if true %}\nb\n  {% endif %}\nc") == "a\nb\nc");  // tags on their own lines vanish
  CHECK(render("x {% if true %}y{% endif %} z") == "x y z");              // mid-line tags keep spaces
  CHECK(render("{# note #}\nA{#- gone -#}  B") == "AB");
  CHECK(render("line\n") == "line");  // one trailing newline is dropped
  CHECK(render("a{%+ if true %}b{% endif %}") == "ab");
}

TEST_CASE("chat template loops, conditions and loop variables", "[chat]") {
  CHECK(render("{% for x in [1, 2, 3] %}{{ loop.index }}{{ x }}{% if loop.first %}F{% elif loop.last %}L"
               "{% else %}-{% endif %}{% endfor %}") == "11F22-33L");
  CHECK(render("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}") == "empty");
  CHECK(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}") == "2242");
  CHECK(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}") == "a=1;b=2;");
  CHECK(render("{% for x in 'ab' %}[{{ loop.revindex0 }}{{ loop.previtem is defined }}]{% endfor %}") ==
        "[1False][0True]");
}

TEST_CASE("chat template set scoping and namespace", "[chat]") {
  // A plain set inside a loop is local to the iteration; a namespace carries values out.
  CHECK(render("{% set x = 1 %}{% for i in [5] %}{% set x = i %}{% endfor %}{{ x }}") == "1");
  CHECK(render("{% set ns = namespace(x=1) %}{% for i in [5, 6] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}") ==
        "12");
  CHECK(render("{% if true %}{% set y = 'in' %}{% endif %}{{ y }}") == "in");
  CHECK(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}") == "21");
}

TEST_CASE("chat template macros with defaults and keyword arguments", "[chat]") {
  CHECK(render("{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c is none }}{% endmacro %}{{ m(1) }}|{{ m(1, c=2) }}") ==
        "1BTrue|1BFalse");
  CHECK(render("{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}") == "321");
}

TEST_CASE("chat template expressions, filters, tests and methods", "[chat]") {
  CHECK(render("{{ [1, 2, 3][::-1] }}{{ 'hello'[1:3] }}{{ [1, 2, 3][-1] }}") == "[3, 2, 1]el3");
  CHECK(render("{{ 'a' ~ 1 ~ none }}{{ 7 // 2 }}{{ 7 % 3 }}{{ 1 + 2 * 3 }}{{ 7 / 2 }}{{ -7 // 2 }}{{ -7 % 3 }}{{ 2 ** 10 }}") == "a1None3173.5-421024");
  CHECK(render("{{ 'ab' in 'xaby' }}{{ 3 not in [1, 2] }}{{ 'k' in {'k': 1} }}") == "TrueTrueTrue");
  CHECK(render("{{ x is defined }}{{ none is none }}{{ 's' is string }}{{ {} is mapping }}{{ [] is iterable }}") ==
        "FalseTrueTrueTrueTrue");
  CHECK(render("{{ '  pad \\n' | trim }}|{{ 'héllo' | length }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}") ==
        "pad|5|ABab");
  CHECK(render("{{ 'a-b-c' | replace('-', '+') }}{{ ['x', 'y'] | join(', ') }}{{ u | default('d') }}") == "a+b+cx, yd");
  CHECK(render("{{ {'b': [1, 'q\"'], 'a': none, 'c': true} | tojson }}") == "{\"b\": [1, \"q\\\"\"], \"a\": null, \"c\": true}");
  CHECK(render("{{ {'a': [1]} | tojson(indent=2) }}") == "{\n  \"a\": [\n    1\n  ]\n}");
  CHECK(render("{{ 'é\\t' | tojson }}") == "\"é\\t\"");
  CHECK(render("{{ [{'n': 'a', 'k': 1}, {'n': 'b'}] | selectattr('k', 'defined') | map(attribute='n') | join }}") == "a");
  CHECK(render("{{ 'a</think>b'.split('</think>')[-1] }}{{ '\\n\\nx\\n'.lstrip('\\n') }}{{ 'abc'.startswith('ab') }}") ==
        "bx\nTrue");
  CHECK(render("{{ ' a  b '.split() | length }}{{ 'x'.endswith(('y', 'x')) }}{{ {'a': 1}.get('z', 5) }}") == "2True5");
  CHECK(render("{{ 1 if false }}|{{ 'y' if true else 'n' }}|{{ 0 or 'alt' }}|{{ 1 and 2 }}") == "|y|alt|2");
  CHECK(render("{{ strftime_now('%Y-%m-%d') }}", "{}").size() == 10);
}

TEST_CASE("chat template strftime_now uses the given time", "[chat]") {
  moe_chat_params p = moe_chat_default_params();
  p.now_unix = 86400 * 365;  // 1971-01-01
  std::string out;
  REQUIRE(render_c("{{ strftime_now('%d %B %Y') }}", {{"user", "", nullptr, nullptr, nullptr, nullptr}}, out, p) ==
          MOE_STATUS_OK);
  CHECK(out == "01 January 1971");
}

TEST_CASE("chat template refuses unsupported features by name and place", "[chat]") {
  CHECK(render_status("ok\n{% include 'other.jinja' %}") == MOE_STATUS_UNSUPPORTED);
  CHECK(std::string(moe_last_error()).find("include") != std::string::npos);
  CHECK(std::string(moe_last_error()).find("line 2") != std::string::npos);
  CHECK(render_status("{{ 'x' | wordwrap(3) }}") == MOE_STATUS_UNSUPPORTED);
  CHECK(std::string(moe_last_error()).find("filter 'wordwrap' at line 1, column 10") != std::string::npos);
  CHECK(render_status("{{ 'x' is divisibleby(3) }}") == MOE_STATUS_UNSUPPORTED);
  CHECK(render_status("{{ 'x'.zfill(3) }}") == MOE_STATUS_UNSUPPORTED);
  CHECK(std::string(moe_last_error()).find("zfill") != std::string::npos);
  CHECK(render_status("{% for x in y recursive %}{% endfor %}") == MOE_STATUS_UNSUPPORTED);
  CHECK(render_status("{% set x %}body{% endset %}") == MOE_STATUS_UNSUPPORTED);
  CHECK(render_status("{{ cycler() }}") == MOE_STATUS_UNSUPPORTED);
  CHECK(render_status("{{ {'a': 1} | tojson(sort_keys=true) }}") == MOE_STATUS_UNSUPPORTED);
}

TEST_CASE("chat template errors are statuses with the template's words", "[chat]") {
  CHECK(render_status("{{ raise_exception('Only user and assistant roles are supported!') }}") ==
        MOE_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("Only user and assistant roles are supported!") != std::string::npos);
  CHECK(render_status("{{ 'unterminated }}") == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(render_status("{% if true %}no end") == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("endif") != std::string::npos);
  CHECK(render_status("{{ 'a' + 1 }}") == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(render_status("{{ 9223372036854775807 + 1 }}") == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("overflow") != std::string::npos);
  CHECK(render_status("{{ 1 // 0 }}") == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(render_status("{{ undefined_thing.attr }}") == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(render_status("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}") == MOE_STATUS_INVALID_ARGUMENT);
  // Untrusted templates cannot exhaust the stack.
  CHECK(render_status("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}") == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("nested") != std::string::npos);
  CHECK(render_status("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}") == MOE_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("moe_chat_apply_template passes messages, tools and flags to the template", "[chat]") {
  const std::string tmpl =
      "{% for m in messages %}[{{ m.role }}|{{ m.content }}|{{ m.reasoning_content }}|{{ m.thinking }}|"
      "{{ m.tool_calls[0].function.arguments.city if m.tool_calls }}|{{ m.tool_call_id }}|{{ m.name }}]{% endfor %}"
      "{{ tools[0].function.name if tools }}|{{ add_generation_prompt }}|{{ enable_thinking is defined }}|"
      "{{ bos_token }}{{ eos_token }}|{{ effort }}";
  std::vector<moe_chat_message> msgs = {
      {"user", "q", nullptr, nullptr, nullptr, nullptr},
      {"assistant", nullptr, "why", R"([{"type":"function","function":{"name":"w","arguments":{"city":"Oslo"}}}])",
       nullptr, nullptr},
      {"tool", "sunny", nullptr, nullptr, "c1", "w"}};
  moe_chat_params p = moe_chat_default_params();
  p.tools = R"([{"type":"function","function":{"name":"get_weather"}}])";
  p.extra_context = R"({"effort":"high"})";
  p.bos_token = "<s>";
  p.eos_token = "</s>";
  p.add_generation_prompt = 0;
  std::string out;
  REQUIRE(render_c(tmpl, msgs, out, p) == MOE_STATUS_OK);
  CHECK(out == "[user|q|||||][assistant|None|why|why|Oslo||][tool|sunny||||c1|w]get_weather|False|False|<s></s>|high");
  p.enable_thinking = 0;
  REQUIRE(render_c("{{ enable_thinking }}", msgs, out, p) == MOE_STATUS_OK);
  CHECK(out == "False");
}

TEST_CASE("moe_chat_apply_template buffer protocol and argument checks", "[chat]") {
  const moe_chat_message msg = {"user", "hello", nullptr, nullptr, nullptr, nullptr};
  moe_chat_params p = moe_chat_default_params();
  CHECK(p.struct_size == sizeof(moe_chat_params));
  CHECK(p.add_generation_prompt == 1);
  CHECK(p.enable_thinking == -1);
  p.template_text = "{{ messages[0].content }}!";
  size_t len = 0;
  CHECK(moe_chat_apply_template(nullptr, &msg, 1, &p, nullptr, 0, &len) == MOE_STATUS_BUFFER_TOO_SMALL);
  CHECK(len == 6);
  char small[6];
  CHECK(moe_chat_apply_template(nullptr, &msg, 1, &p, small, sizeof small, &len) == MOE_STATUS_BUFFER_TOO_SMALL);
  char buf[7];
  REQUIRE(moe_chat_apply_template(nullptr, &msg, 1, &p, buf, sizeof buf, &len) == MOE_STATUS_OK);
  CHECK(std::string(buf) == "hello!");

  const moe_chat_message no_role = {nullptr, "x", nullptr, nullptr, nullptr, nullptr};
  CHECK(moe_chat_apply_template(nullptr, &no_role, 1, &p, buf, sizeof buf, &len) == MOE_STATUS_INVALID_ARGUMENT);
  const moe_chat_message bad_calls = {"assistant", "x", nullptr, "[{]", nullptr, nullptr};
  CHECK(moe_chat_apply_template(nullptr, &bad_calls, 1, &p, buf, sizeof buf, &len) == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("messages[0].tool_calls") != std::string::npos);
  CHECK(moe_chat_apply_template(nullptr, &msg, 1, nullptr, buf, sizeof buf, &len) == MOE_STATUS_INVALID_ARGUMENT);
  moe_chat_params bad = p;
  bad.struct_size = 8;
  CHECK(moe_chat_apply_template(nullptr, &msg, 1, &bad, buf, sizeof buf, &len) == MOE_STATUS_INVALID_ARGUMENT);
  bad = p;
  bad.enable_thinking = 2;
  CHECK(moe_chat_apply_template(nullptr, &msg, 1, &bad, buf, sizeof buf, &len) == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(moe_chat_apply_template(nullptr, &msg, 1, &p, buf, sizeof buf, nullptr) == MOE_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("moe_chat_apply_template reads the template and special tokens from the GGUF", "[chat]") {
  const std::string path = std::string(MOEINFER_CONFORMANCE_DIR) + "/models/qwen3moe-f16.gguf";
  if (!file_exists(path)) {
    WARN("conformance model missing: " << path);
    return;
  }
  moe_model_params mp = moe_model_default_params();
  mp.vocab_only = 1;
  moe_model *model = nullptr;
  REQUIRE(moe_model_load(path.c_str(), &mp, &model) == MOE_STATUS_OK);
  const moe_chat_message msgs[] = {{"system", "Be brief.", nullptr, nullptr, nullptr, nullptr},
                                   {"user", "Hi", nullptr, nullptr, nullptr, nullptr}};
  moe_chat_params p = moe_chat_default_params();
  p.enable_thinking = 0;
  char buf[512];
  size_t len = 0;
  REQUIRE(moe_chat_apply_template(model, msgs, 2, &p, buf, sizeof buf, &len) == MOE_STATUS_OK);
  // Qwen3's published format, written out by hand.
  CHECK(std::string(buf) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  p.template_text = "{{ bos_token }}|{{ eos_token }}";
  REQUIRE(moe_chat_apply_template(model, msgs, 2, &p, buf, sizeof buf, &len) == MOE_STATUS_OK);
  CHECK(std::string(buf) == "<|endoftext|>|<|im_end|>");
  p.template_text = nullptr;
  p.template_name = "tool_use";  // this file has no named variant
  CHECK(moe_chat_apply_template(model, msgs, 2, &p, buf, sizeof buf, &len) == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("tokenizer.chat_template.tool_use") != std::string::npos);
  moe_model_free(model);

  // A named variant (added here as a metadata override) is chosen by template_name.
  const char *overrides[] = {"tokenizer.chat_template.tool_use=str:TOOLS {{ messages[1].content }}"};
  mp.kv_overrides = overrides;
  mp.n_kv_overrides = 1;
  REQUIRE(moe_model_load(path.c_str(), &mp, &model) == MOE_STATUS_OK);
  REQUIRE(moe_chat_apply_template(model, msgs, 2, &p, buf, sizeof buf, &len) == MOE_STATUS_OK);
  CHECK(std::string(buf) == "TOOLS Hi");
  p.template_name = nullptr;
  REQUIRE(moe_chat_apply_template(model, msgs, 2, &p, buf, sizeof buf, &len) == MOE_STATUS_OK);
  CHECK(std::string(buf).rfind("<|im_start|>system\nBe brief.", 0) == 0);
  moe_model_free(model);
}

TEST_CASE("the ChatML fallback template renders the documented format", "[chat]") {
  moe::chat::Options opt;
  const std::string out = moe::chat::apply_template(moe::chat::chatml_template(),
                                                    {{"system", std::string("S")}, {"user", std::string("U")}}, opt);
  CHECK(out == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("the C++ wrapper renders owned messages", "[chat]") {
  moe_chat_params p = moe_chat_default_params();
  p.template_text = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ add_generation_prompt }}";
  const std::string out =
      moeinfer::apply_chat_template(nullptr, {{"user", std::string("a")}, {"assistant", std::nullopt}}, p);
  CHECK(out == "user:a;assistant:None;True");
  p.template_text = "{{ raise_exception('nope') }}";
  CHECK_THROWS_WITH(moeinfer::apply_chat_template(nullptr, {{"user", std::string("a")}}, p),
                    Catch::Contains("nope"));
}
