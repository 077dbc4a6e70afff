// The small JSON parser the synthetic-model generator uses for tokenizer.json.
#include <catch2/catch.hpp>

#include "core/status.h"
#include "model/synth/mini_json.h"

using namespace moe;

TEST_CASE("synth json: values, escapes and surrogate pairs", "[synth][json]") {
  JsonValue v = parse_json(R"( {"a": [1, -2.5e3, true, false, null], "s": "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "o": {}} )");
  REQUIRE(v.is(JsonValue::Kind::Object));
  const JsonValue *a = v.get("a");
  REQUIRE(a);
  REQUIRE(a->items.size() == 5);
  CHECK(a->items[0].num == 1);
  CHECK(a->items[1].num == -2500);
  CHECK(a->items[2].b);
  CHECK((a->items[3].is(JsonValue::Kind::Bool) && !a->items[3].b));
  CHECK(a->items[4].is(JsonValue::Kind::Null));
  CHECK(v.get("s")->str == "x\"\\/\b\f\n\r\t\xC3\xA9\xF0\x9F\x98\x80");
  CHECK(v.get("o")->members.empty());
  CHECK(v.get("missing") == nullptr);
  CHECK(a->get("x") == nullptr);  // not an object
  // Member order is kept (merges and vocab are read in file order).
  JsonValue o = parse_json(R"({"z": 1, "a": 2, "m": 3})");
  REQUIRE(o.members.size() == 3);
  CHECK(o.members[0].first == "z");
  CHECK(o.members[2].first == "m");
}

TEST_CASE("synth json: malformed input throws with the byte offset", "[synth][json]") {
  for (const char *bad : {"", "{", "[1,", "{\"a\" 1}", "{\"a\": 1,}", "[1 2]", "\"abc", "\"\\x\"", "\"\\u12\"", "tru",
                          "{} x", "-", "{1: 2}"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_json(bad), Error);
  }
  std::string deep(300, '[');
  CHECK_THROWS_AS(parse_json(deep), Error);
  try {
    parse_json("[1, ?]");
    FAIL("no throw");
  } catch (const Error &e) {
    CHECK(e.code() == Status::InvalidArgument);
    CHECK(std::string(e.what()).find("byte 4") != std::string::npos);
  }
}
