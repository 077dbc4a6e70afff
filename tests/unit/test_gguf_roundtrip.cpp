#include <catch2/catch.hpp>

#include <cstring>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"

using namespace moe;

TEST_CASE("gguf: writer output reads back with every metadata type", "[gguf]") {
  GgufWriter w;
  w.set("general.architecture", GgufValue::make_str("qwen3moe"));
  w.set("a.u32", GgufValue::make_u32(7));
  w.set("a.i32", GgufValue::make_i32(-3));
  w.set("a.u64", GgufValue::make_u64(1ull << 40));
  w.set("a.f32", GgufValue::make_f32(0.5f));
  w.set("a.bool", GgufValue::make_bool(true));
  w.set("a.strs", GgufValue::make_str_array({"x", "yy", ""}));
  w.set("a.i32s", GgufValue::make_i32_array({1, -2, 3}));
  GgufValue nested;
  nested.type = GgufType::ARRAY;
  nested.elem_type = GgufType::ARRAY;
  nested.arrays = {GgufValue::make_i32_array({1, 2}), GgufValue::make_i32_array({3})};
  nested.count = 2;
  w.set("a.nested", nested);
  std::vector<float> t(64);
  for (int i = 0; i < 64; ++i) t[i] = float(i);
  w.add_tensor("t", DType::F32, {16, 4}, t.data(), t.size() * 4);
  auto bytes = w.write_memory();
  REQUIRE(bytes.size() == w.total_bytes());
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  CHECK(f->version() == 3);
  CHECK(f->get_str("general.architecture") == "qwen3moe");
  CHECK(f->get_u32("a.u32") == 7);
  CHECK(f->get_i64("a.i32") == -3);
  CHECK(f->get_i64("a.u64") == (1ll << 40));
  CHECK(f->get_f32("a.f32") == 0.5f);
  CHECK(f->get_bool("a.bool", false));
  CHECK(f->find("a.strs")->strs == std::vector<std::string>{"x", "yy", ""});
  CHECK(f->find("a.i32s")->elem_i64(1) == -2);
  REQUIRE(f->find("a.nested")->arrays.size() == 2);
  CHECK(f->find("a.nested")->arrays[0].elem_i64(1) == 2);
  const GgufTensorInfo *ti = f->tensor("t");
  REQUIRE(ti);
  CHECK(ti->ne[0] == 16);
  CHECK(ti->ne[1] == 4);
  CHECK(std::memcmp(ti->data, t.data(), 256) == 0);
}
