// JSON Schema -> grammar: generation constrained by each schema on models with random
// weights (through the C API, as an application uses it) must end by itself and produce
// JSON that parses and validates against the schema. The validator below is written from
// JSON Schema's meaning and shares nothing with the converter.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "moeinfer/moeinfer.h"
#include "sampler/grammar.h"
#include "sampler/json_schema.h"
#include "support/tiny_model.h"

using nlohmann::json;

namespace {

size_t utf8_length(const std::string &s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Validates v against schema (the keywords the converter covers); root resolves $ref.
bool valid(const json &v, const json &schema, const json &root, std::string &why) {
  if (schema.is_boolean()) return schema.get<bool>() || (why = "schema false", false);
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    const size_t slash = ref.rfind('/');
    const std::string section = ref.substr(2, slash - 2), name = ref.substr(slash + 1);
    return valid(v, root[section][name], root, why);
  }
  if (schema.contains("const") && v != schema["const"]) return why = "const " + v.dump(), false;
  if (schema.contains("enum")) {
    bool found = false;
    for (const auto &e : schema["enum"]) found |= e == v;
    if (!found) return why = "enum " + v.dump(), false;
  }
  for (const char *kw : {"anyOf", "oneOf"})
    if (schema.contains(kw)) {
      int matches = 0;
      std::string ignored;
      for (const auto &s : schema[kw]) matches += valid(v, s, root, ignored);
      if (matches == 0 || (std::string(kw) == "oneOf" && matches != 1)) return why = std::string(kw) + " " + v.dump(), false;
    }
  if (schema.contains("type")) {
    std::vector<std::string> types;
    if (schema["type"].is_array())
      for (const auto &t : schema["type"]) types.push_back(t);
    else
      types.push_back(schema["type"]);
    bool ok = false;
    for (const auto &t : types) {
      ok |= (t == "string" && v.is_string()) || (t == "number" && v.is_number()) ||
            (t == "integer" && (v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))) ||
            (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()) || (t == "object" && v.is_object()) ||
            (t == "array" && v.is_array());
    }
    if (!ok) return why = "type of " + v.dump(), false;
  }
  if (v.is_string()) {
    const size_t n = utf8_length(v.get<std::string>());
    if (schema.contains("minLength") && n < schema["minLength"].get<size_t>()) return why = "minLength", false;
    if (schema.contains("maxLength") && n > schema["maxLength"].get<size_t>()) return why = "maxLength", false;
  }
  if (v.is_array()) {
    if (schema.contains("minItems") && v.size() < schema["minItems"].get<size_t>()) return why = "minItems", false;
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) return why = "maxItems", false;
    if (schema.contains("items"))
      for (const auto &item : v)
        if (!valid(item, schema["items"], root, why)) return false;
  }
  if (v.is_object() && (schema.contains("properties") || schema.contains("additionalProperties"))) {
    const json props = schema.value("properties", json::object());
    for (const auto &r : schema.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return why = "missing " + r.get<std::string>(), false;
    // additionalProperties absent counts as false here, as the converter documents.
    const json extra = schema.value("additionalProperties", json(false));
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        if (!valid(it.value(), props[it.key()], root, why)) return false;
      } else if (extra.is_boolean() ? !extra.get<bool>() : !valid(it.value(), extra, root, why)) {
        return why = "extra member " + it.key(), false;
      }
    }
  }
  return true;
}

// Schemas covering every construct the converter supports (strings bounded where a
// random model could otherwise write for a long time).
const std::vector<std::string> &schemas() {
  static const std::vector<std::string> s = {
      R"({"type":"boolean"})",
      R"({"type":"integer"})",
      R"({"type":"number"})",
      R"({"type":"null"})",
      R"({"type":"string","maxLength":12})",
      R"({"type":"string","minLength":3,"maxLength":5})",
      R"({"enum":["red","green","blue",42,null,true]})",
      R"({"const":{"kind":"fixed","v":[1,2]}})",
      R"({"type":["integer","null"]})",
      R"({"type":"array","items":{"type":"integer"},"maxItems":6})",
      R"({"type":"array","items":{"type":"boolean"},"minItems":2,"maxItems":4})",
      R"({"type":"array","items":{"type":"string","maxLength":4},"minItems":1,"maxItems":3})",
      R"({"type":"array","maxItems":0})",
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer"}},"required":["name","age"]})",
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"},"c":{"type":"null"}}})",
      R"({"type":"object","properties":{"id":{"type":"integer"},"tag":{"type":"string","maxLength":5},"on":{"type":"boolean"}},"required":["on"]})",
      R"({"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["y"],"additionalProperties":false})",
      R"({"type":"object","properties":{"pos":{"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},"required":["x","y"]},"label":{"enum":["a","b"]}},"required":["pos"]})",
      R"({"type":"object","properties":{"action":{"enum":["move","attack","wait"]},"target":{"type":["string","null"],"maxLength":6},"steps":{"type":"array","items":{"type":"integer"},"maxItems":3}},"required":["action","steps"]})",
      R"({"anyOf":[{"type":"integer"},{"type":"object","properties":{"err":{"type":"string","maxLength":6}},"required":["err"]}]})",
      R"({"oneOf":[{"type":"boolean"},{"type":"array","items":{"type":"null"},"maxItems":2}]})",
      R"({"type":"object","properties":{"k":{"const":"v"}},"required":["k"],"additionalProperties":{"type":"integer"}})",
      R"({"$defs":{"pt":{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}},"type":"array","items":{"$ref":"#/$defs/pt"},"maxItems":3})",
      R"({"type":"object","properties":{"rows":{"type":"array","items":{"type":"array","items":{"type":"integer"},"maxItems":2},"maxItems":2},"ok":{"type":"boolean"}},"required":["rows","ok"]})",
      R"({"type":"object","properties":{"title":{"type":"string","maxLength":10,"description":"annotations are ignored"},"n":{"type":"integer"}},"required":["title"]})",
  };
  return s;
}

struct Generated {
  std::string text;
  bool ended = false;
};

Generated generate(moe_model *m, moe_context *c, const std::string &schema, uint64_t seed, int max_tokens) {
  Generated g;
  moe_sampler_params sp = moe_sampler_default_params();
  sp.seed = seed;
  moe_sampler *s = nullptr;
  REQUIRE(moe_sampler_create(&sp, &s) == MOE_STATUS_OK);
  REQUIRE(moe_sampler_add_json_schema(s, m, schema.c_str()) == MOE_STATUS_OK);
  REQUIRE(moe_sampler_add_dist(s) == MOE_STATUS_OK);
  moe_batch *b = nullptr;
  REQUIRE(moe_batch_create(1, &b) == MOE_STATUS_OK);
  REQUIRE(moe_kv_clear(c) == MOE_STATUS_OK);
  int32_t tok = moe_token_bos(m);
  for (int32_t pos = 0; pos < max_tokens; ++pos) {
    moe_batch_clear(b);
    moe_batch_add(b, tok, pos, 0, 1);
    REQUIRE(moe_decode(c, b) == MOE_STATUS_OK);
    REQUIRE(moe_sampler_sample_context(s, c, -1, &tok) == MOE_STATUS_OK);
    if (moe_token_is_eog(m, tok)) {
      g.ended = true;
      break;
    }
    char piece[256];
    size_t n = 0;
    REQUIRE(moe_token_to_piece(m, tok, piece, sizeof piece, &n, 0) == MOE_STATUS_OK);
    g.text.append(piece, n);
  }
  moe_batch_free(b);
  moe_sampler_free(s);
  return g;
}

// open_keys: include schemas whose additional member names are unbounded strings (a random
// model over a large vocabulary may never close such a key).
void check_schemas_on(const std::string &model_path, int seeds, bool open_keys) {
  moe_model *m = nullptr;
  REQUIRE(moe_model_load(model_path.c_str(), nullptr, &m) == MOE_STATUS_OK);
  moe_context_params cp = moe_context_default_params();
  cp.n_ctx = 1024;
  cp.n_threads = 2;
  cp.device = "cpu";
  moe_context *c = nullptr;
  REQUIRE(moe_context_create(m, &cp, &c) == MOE_STATUS_OK);
  for (const std::string &schema : schemas()) {
    const json sj = json::parse(schema);
    if (!open_keys && sj.contains("additionalProperties") && sj["additionalProperties"] != json(false)) continue;
    for (int seed = 1; seed <= seeds; ++seed) {
      const Generated g = generate(m, c, schema, uint64_t(seed), 1000);
      INFO("schema " << schema << " seed " << seed << " -> " << g.text);
      REQUIRE(g.ended);
      json v;
      REQUIRE_NOTHROW(v = json::parse(g.text));
      std::string why;
      const bool ok = valid(v, sj, sj, why);
      INFO(why);
      CHECK(ok);
    }
  }
  moe_context_free(c);
  moe_model_free(m);
}

}  // namespace

TEST_CASE("json schema: constrained generation on the tiny model is valid JSON for every schema", "[grammar][json_schema]") {
  REQUIRE(schemas().size() >= 20);
  check_schemas_on(moe_test::tiny_model(), 2, true);
}

TEST_CASE("json schema: constrained generation with the 151k Qwen3 vocabulary", "[grammar][json_schema][slow]") {
  const std::string path = std::string(MOEINFER_CONFORMANCE_DIR) + "/models/qwen3moe-f16.gguf";
  if (access(path.c_str(), R_OK) != 0) {
    WARN("SKIPPED: " << path << " not found");
    return;
  }
  check_schemas_on(path, 1, false);
}

TEST_CASE("json schema: grammars of the converter match what the schema means", "[grammar][json_schema]") {
  auto matches = [](const std::string &schema, const std::string &text) {
    moe::GrammarMatcher m(moe::parse_gbnf(moe::json_schema_to_gbnf(schema)));
    return m.accept_bytes(text) && m.is_complete();
  };
  const std::string obj =
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["b"]})";
  CHECK(matches(obj, R"({"a": 1, "b": "x"})"));
  CHECK(matches(obj, R"({"b": "x"})"));
  CHECK_FALSE(matches(obj, R"({"a": 1})"));            // b required
  CHECK_FALSE(matches(obj, R"({"b": "x", "c": 1})"));  // no additional members by default
  CHECK_FALSE(matches(obj, R"({"a": "1", "b": "x"})"));
  CHECK(matches(R"({"type":"number"})", "-0.5e+3"));
  CHECK_FALSE(matches(R"({"type":"number"})", "01"));
  CHECK_FALSE(matches(R"({"type":"integer"})", "1.5"));
  CHECK(matches(R"({"type":"string"})", R"("a\"b\\c\u00e9")"));
  CHECK_FALSE(matches(R"({"type":"string"})", "\"a\nb\""));  // raw control characters are not JSON
  CHECK(matches(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":2})", "[1, 2]"));
  CHECK_FALSE(matches(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":2})", "[]"));
  CHECK_FALSE(matches(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":2})", "[1,2,3]"));
  CHECK(matches(R"({"enum":["a\"q",1.5]})", R"("a\"q")"));
  CHECK(matches(R"({"enum":["a\"q",1.5]})", "1.5"));
  CHECK(matches(R"({"type":"string","minLength":2,"maxLength":2})", "\"\xC3\xA9\xC3\xA9\""));  // characters, not bytes
}

TEST_CASE("json schema: unsupported and malformed schemas are clear errors", "[grammar][json_schema]") {
  auto status = [](const std::string &schema, std::string *msg = nullptr) {
    try {
      moe::json_schema_to_gbnf(schema);
    } catch (const moe::Error &e) {
      if (msg) *msg = e.what();
      return e.code();
    }
    return moe::Status::Ok;
  };
  std::string msg;
  CHECK(status(R"({"type":"string","pattern":"^a+$"})", &msg) == moe::Status::Unsupported);
  CHECK(msg.find("pattern") != std::string::npos);
  CHECK(status(R"({"type":"integer","minimum":3})") == moe::Status::Unsupported);
  CHECK(status(R"({"allOf":[{"type":"integer"}]})") == moe::Status::Unsupported);
  CHECK(status(R"({"type":"strin"})") == moe::Status::InvalidArgument);
  CHECK(status(R"({"type":"object","properties":{},"required":["x"]})") == moe::Status::InvalidArgument);
  CHECK(status(R"({"type":)") == moe::Status::InvalidArgument);
  CHECK(status(R"({"$ref":"http://example.com/s.json"})") == moe::Status::Unsupported);

  // Through the C API: a status and a message, the sampler unchanged.
  moe_sampler *s = nullptr;
  REQUIRE(moe_sampler_create(nullptr, &s) == MOE_STATUS_OK);
  CHECK(moe_sampler_add_json_schema(s, nullptr, "{}") == MOE_STATUS_INVALID_ARGUMENT);
  moe_model *m = nullptr;
  REQUIRE(moe_model_load(moe_test::tiny_model().c_str(), nullptr, &m) == MOE_STATUS_OK);
  CHECK(moe_sampler_add_json_schema(s, m, R"({"format":"date"})") == MOE_STATUS_UNSUPPORTED);
  CHECK(std::string(moe_last_error()).find("format") != std::string::npos);
  CHECK(moe_sampler_add_grammar(s, m, "root ::= undefined-rule", nullptr) == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("undefined-rule") != std::string::npos);
  size_t len = 0;
  CHECK(moe_json_schema_to_grammar(R"({"type":"boolean"})", nullptr, 0, &len) == MOE_STATUS_BUFFER_TOO_SMALL);
  CHECK(len > 0);
  moe_model_free(m);
  moe_sampler_free(s);
}
