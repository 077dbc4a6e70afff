// Malformed GGUF files, each built with our own writer (or from its output by patching
// bytes), must be rejected with their specific error code and a message naming the
// key/tensor; nothing may crash or read out of bounds (run under ASan in CI's asan preset).
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"

using namespace moe;

namespace {

template <typename T> void put(std::vector<uint8_t> &b, T v) {
  const size_t n = b.size();
  b.resize(n + sizeof v);  // resize + memcpy: GCC 12 misreads insert() of a pointer range here
  std::memcpy(b.data() + n, &v, sizeof v);
}

// Header + raw metadata/tensor-info bytes, written by hand where the writer would refuse.
std::vector<uint8_t> raw_file(uint32_t version, uint64_t n_tensors, uint64_t n_kv, const std::vector<uint8_t> &body) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, 0x46554747u);
  put<uint32_t>(b, version);
  put<uint64_t>(b, n_tensors);
  put<uint64_t>(b, n_kv);
  b.insert(b.end(), body.begin(), body.end());
  b.resize(b.size() + 256, 0);
  return b;
}

std::vector<uint8_t> tensor_info(const std::string &name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
  std::vector<uint8_t> b;
  gguf_append_string(b, name);
  put<uint32_t>(b, static_cast<uint32_t>(ne.size()));
  for (uint64_t d : ne) put<uint64_t>(b, d);
  put<uint32_t>(b, type);
  put<uint64_t>(b, offset);
  return b;
}

GgufErrc errc_of(const std::vector<uint8_t> &bytes, std::string *msg = nullptr, const GgufOpenOptions &o = {}) {
  try {
    GgufFile::from_memory(bytes.data(), bytes.size(), o);
  } catch (const GgufError &e) {
    if (msg) *msg = e.what();
    CHECK(e.code() == Status::InvalidGguf);
    return e.errc();
  }
  return GgufErrc::None;
}

std::vector<uint8_t> good_file() {
  GgufWriter w;
  w.set("general.architecture", GgufValue::make_str("qwen3moe"));
  w.set("n", GgufValue::make_u32(3));
  std::vector<float> d(64, 1.0f);
  w.add_tensor("a.weight", DType::F32, {32, 2}, d.data(), 256);
  return w.write_memory();
}

}  // namespace

TEST_CASE("gguf: malformed files are rejected with specific codes", "[gguf][malformed]") {
  std::string msg;
  SECTION("01 empty") { CHECK(errc_of({}) == GgufErrc::Truncated); }
  SECTION("02 bad magic") { auto b = good_file(); b[0] = 'X'; CHECK(errc_of(b) == GgufErrc::BadMagic); }
  SECTION("03 version 1") { CHECK(errc_of(raw_file(1, 0, 0, {})) == GgufErrc::BadVersion); }
  SECTION("04 version 4") { CHECK(errc_of(raw_file(4, 0, 0, {})) == GgufErrc::BadVersion); }
  SECTION("05 truncated header") { auto b = good_file(); b.resize(12); CHECK(errc_of(b) == GgufErrc::Truncated); }
  SECTION("06 huge kv count") { CHECK(errc_of(raw_file(3, 0, 1ull << 60, {})) == GgufErrc::Truncated); }
  SECTION("07 huge tensor count") { CHECK(errc_of(raw_file(3, 1ull << 60, 0, {})) == GgufErrc::TooManyTensors); }
  SECTION("08 string longer than file") {
    std::vector<uint8_t> body;
    put<uint64_t>(body, 1ull << 40);
    CHECK(errc_of(raw_file(3, 0, 1, body), &msg) == GgufErrc::Truncated);
  }
  SECTION("09 empty key") {
    std::vector<uint8_t> body;
    gguf_append_string(body, "");
    gguf_append_value(body, GgufValue::make_u32(1));
    CHECK(errc_of(raw_file(3, 0, 1, body)) == GgufErrc::BadKey);
  }
  SECTION("10 unknown value type") {
    std::vector<uint8_t> body;
    gguf_append_string(body, "k.weird");
    put<uint32_t>(body, 99);
    CHECK(errc_of(raw_file(3, 0, 1, body), &msg) == GgufErrc::BadValueType);
    CHECK(msg.find("k.weird") != std::string::npos);
  }
  SECTION("11 duplicate key") {
    std::vector<uint8_t> body;
    for (int i = 0; i < 2; ++i) { gguf_append_string(body, "dup.key"); gguf_append_value(body, GgufValue::make_u32(1)); }
    CHECK(errc_of(raw_file(3, 0, 2, body), &msg) == GgufErrc::DuplicateKey);
    CHECK(msg.find("dup.key") != std::string::npos);
  }
  SECTION("12 array larger than file") {
    std::vector<uint8_t> body;
    gguf_append_string(body, "big.array");
    put<uint32_t>(body, static_cast<uint32_t>(GgufType::ARRAY));
    put<uint32_t>(body, static_cast<uint32_t>(GgufType::U32));
    put<uint64_t>(body, 1ull << 50);
    CHECK(errc_of(raw_file(3, 0, 1, body)) == GgufErrc::ArrayTooLarge);
  }
  SECTION("13 bad array element type") {
    std::vector<uint8_t> body;
    gguf_append_string(body, "arr");
    put<uint32_t>(body, static_cast<uint32_t>(GgufType::ARRAY));
    put<uint32_t>(body, 77);
    put<uint64_t>(body, 1);
    CHECK(errc_of(raw_file(3, 0, 1, body)) == GgufErrc::BadValueType);
  }
  SECTION("14 bool neither 0 nor 1") {
    std::vector<uint8_t> body;
    gguf_append_string(body, "flag");
    put<uint32_t>(body, static_cast<uint32_t>(GgufType::BOOL));
    put<uint8_t>(body, 7);
    CHECK(errc_of(raw_file(3, 0, 1, body)) == GgufErrc::BadValueType);
  }
  SECTION("15 alignment not a power of two") {
    std::vector<uint8_t> body;
    gguf_append_string(body, "general.alignment");
    gguf_append_value(body, GgufValue::make_u32(48));
    CHECK(errc_of(raw_file(3, 0, 1, body)) == GgufErrc::BadAlignment);
  }
  SECTION("16 alignment of wrong type") {
    std::vector<uint8_t> body;
    gguf_append_string(body, "general.alignment");
    gguf_append_value(body, GgufValue::make_str("32"));
    CHECK(errc_of(raw_file(3, 0, 1, body)) == GgufErrc::BadAlignment);
  }
  SECTION("17 duplicate tensor") {
    auto body = tensor_info("t", {32}, 0, 0);
    auto b2 = tensor_info("t", {32}, 0, 128);
    body.insert(body.end(), b2.begin(), b2.end());
    CHECK(errc_of(raw_file(3, 2, 0, body), &msg) == GgufErrc::DuplicateTensor);
    CHECK(msg.find("'t'") != std::string::npos);
  }
  SECTION("18 rank 5") { CHECK(errc_of(raw_file(3, 1, 0, tensor_info("r5", {1, 1, 1, 1, 1}, 0, 0))) == GgufErrc::BadRank); }
  SECTION("19 rank 0") { CHECK(errc_of(raw_file(3, 1, 0, tensor_info("r0", {}, 0, 0))) == GgufErrc::BadRank); }
  SECTION("20 zero dimension") { CHECK(errc_of(raw_file(3, 1, 0, tensor_info("z", {32, 0}, 0, 0))) == GgufErrc::BadShape); }
  SECTION("21 element count overflow") {
    CHECK(errc_of(raw_file(3, 1, 0, tensor_info("ovf", {1ull << 32, 1ull << 32}, 0, 0)), &msg) == GgufErrc::ElementOverflow);
    CHECK(msg.find("ovf") != std::string::npos);
  }
  SECTION("22 byte size overflow") {
    CHECK(errc_of(raw_file(3, 1, 0, tensor_info("ovb", {1ull << 62}, 0, 0))) == GgufErrc::ElementOverflow);
  }
  SECTION("23 unknown tensor type") { CHECK(errc_of(raw_file(3, 1, 0, tensor_info("u", {32}, 5, 0))) == GgufErrc::UnknownTensorType); }
  SECTION("24 row not a multiple of the block") {
    CHECK(errc_of(raw_file(3, 1, 0, tensor_info("q", {100}, static_cast<uint32_t>(DType::Q4_K), 0)), &msg) == GgufErrc::BadBlockMultiple);
    CHECK(msg.find("'q'") != std::string::npos);
  }
  SECTION("25 misaligned offset") { CHECK(errc_of(raw_file(3, 1, 0, tensor_info("m", {32}, 0, 8))) == GgufErrc::MisalignedTensor); }
  SECTION("26 data past end of file") {
    CHECK(errc_of(raw_file(3, 1, 0, tensor_info("far", {32}, 0, 1ull << 20)), &msg) == GgufErrc::TensorOutOfBounds);
    CHECK(msg.find("far") != std::string::npos);
  }
  SECTION("27 file cut inside tensor data") {
    auto b = good_file();
    b.resize(b.size() - 100);
    CHECK(errc_of(b) == GgufErrc::TensorOutOfBounds);
  }
  SECTION("28 truncated inside tensor infos") {
    auto info = tensor_info("cut.tensor", {32, 4}, 0, 0);
    auto b = raw_file(3, 1, 0, info);
    b.resize(24 + info.size() - 6);  // ends inside the offset field
    CHECK(errc_of(b) == GgufErrc::Truncated);
  }
  SECTION("29 bad override syntax and values") {
    auto b = good_file();
    for (const char *spec : {"novalue", "n=int", "n=wat:1", "n=int:abc", "n=float:nan", "n=bool:maybe", "=int:1"}) {
      GgufOpenOptions o;
      o.overrides = {spec};
      INFO(spec);
      CHECK(errc_of(b, nullptr, o) == GgufErrc::BadOverride);
    }
  }
  SECTION("30 missing and mistyped keys") {
    auto b = good_file();
    auto f = GgufFile::from_memory(b.data(), b.size());
    try { f->get_u32("absent.key"); FAIL(); } catch (const GgufError &e) { CHECK(e.errc() == GgufErrc::MissingKey); CHECK(std::string(e.what()).find("absent.key") != std::string::npos); }
    try { f->get_u32("general.architecture"); FAIL(); } catch (const GgufError &e) { CHECK(e.errc() == GgufErrc::TypeMismatch); }
  }
}

TEST_CASE("gguf: overrides change metadata and keep the stored type", "[gguf]") {
  auto b = good_file();
  GgufOpenOptions o;
  o.overrides = {"n=int:7", "new.flag=bool:true", "general.architecture=str:deepseek2", "x.f=float:0.25"};
  auto f = GgufFile::from_memory(b.data(), b.size(), o);
  CHECK(f->get_u32("n") == 7);
  CHECK(f->find("n")->type == GgufType::U32);
  CHECK(f->get_bool("new.flag", false));
  CHECK(f->get_str("general.architecture") == "deepseek2");
  CHECK(f->get_f32("x.f") == 0.25f);
}

TEST_CASE("gguf: random byte corruption never crashes", "[gguf][malformed]") {
  auto good = good_file();
  uint32_t s = 12345;
  for (int trial = 0; trial < 2000; ++trial) {
    auto b = good;
    for (int k = 0; k < 3; ++k) {
      s = s * 1664525u + 1013904223u;
      b[(s >> 8) % b.size()] = static_cast<uint8_t>(s >> 24);
    }
    s = s * 1664525u + 1013904223u;
    if (trial % 5 == 0) b.resize((s >> 8) % b.size());
    try {
      auto f = GgufFile::from_memory(b.data(), b.size());
      for (const auto &t : f->tensors()) CHECK(f->data_offset() + t.offset + t.nbytes <= b.size());  // in bounds
    } catch (const Error &) {
    }
  }
}
