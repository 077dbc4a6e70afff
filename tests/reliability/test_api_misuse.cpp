// API misuse over every exported function (issue 19): NULL handles, NULL out-pointers,
// wrong struct_size, out-of-range ids, positions and sizes, and calls in the wrong order.
// Each must return its documented status with a non-empty moe_last_error() and change
// nothing; none may crash. The exported names are read from abi/moeinfer.symbols and from
// the MOE_API declarations of moeinfer.h: a function without a case here fails the test.
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "reliability/reliability_support.h"

// The first layouts' defaults, exported under the names binaries built against the first
// header call (moeinfer.h maps these names to the _v2 functions).
#undef moe_model_default_params
#undef moe_context_default_params
extern "C" moe_model_params moe_model_default_params(void);
extern "C" moe_context_params moe_context_default_params(void);

namespace {

std::string read_text(const std::string &rel) {
  std::ifstream f(std::string(MOEINFER_SOURCE_DIR) + "/" + rel);
  REQUIRE(f.good());
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::set<std::string> exported_names() {
  std::set<std::string> names;
  const std::string syms = read_text("abi/moeinfer.symbols");
  const std::regex word(R"(\bmoe_\w+)");
  for (auto it = std::sregex_iterator(syms.begin(), syms.end(), word); it != std::sregex_iterator(); ++it)
    names.insert(it->str());
  const std::string hdr = read_text("include/moeinfer/moeinfer.h");
  const std::regex decl(R"(MOE_API[^;(]*\b(moe_\w+)\s*\()");
  for (auto it = std::sregex_iterator(hdr.begin(), hdr.end(), decl); it != std::sregex_iterator(); ++it)
    names.insert((*it)[1].str());
  return names;
}

// A failure with the given status and a message.
#define EXPECT_FAIL(call, status)                                  \
  do {                                                             \
    moe_clear_last_error();                                        \
    const moe_status st_ = (call);                                 \
    INFO(#call << " -> " << moe_status_string(st_));               \
    CHECK(st_ == (status));                                        \
    CHECK(std::strlen(moe_last_error()) > 0);                      \
  } while (0)

struct Fixture {
  moe_model *m = nullptr;
  moe_context *c = nullptr;
  moe_batch *b = nullptr;
  moe_sampler *s = nullptr;
  moe_detokenizer *d = nullptr;
  std::string path = moe_test::tiny_model("f32");
  Fixture() {
    REQUIRE(moe_model_load(path.c_str(), nullptr, &m) == MOE_STATUS_OK);
    moe_context_params cp = moe_context_default_params_v2();
    cp.n_ctx = 32;
    cp.n_batch = 8;
    cp.n_threads = 1;
    cp.device = "cpu";
    cp.kv_type = MOE_KV_TYPE_F32;
    REQUIRE(moe_context_create(m, &cp, &c) == MOE_STATUS_OK);
    REQUIRE(moe_batch_create(16, &b) == MOE_STATUS_OK);
    REQUIRE(moe_sampler_create(nullptr, &s) == MOE_STATUS_OK);
    REQUIRE(moe_detokenizer_create(m, 0, &d) == MOE_STATUS_OK);
  }
  ~Fixture() {
    moe_detokenizer_free(d);
    moe_sampler_free(s);
    moe_batch_free(b);
    moe_context_free(c);
    moe_model_free(m);
  }
  int32_t n_vocab() const { return moe_context_n_vocab(c); }
};

// A context on which nothing was decoded yet (wrong-order cases).
struct FreshContext {
  moe_context *c = nullptr;
  explicit FreshContext(moe_model *m) {
    moe_context_params cp = moe_context_default_params_v2();
    cp.n_ctx = 16;
    cp.n_threads = 1;
    cp.device = "cpu";
    REQUIRE(moe_context_create(m, &cp, &c) == MOE_STATUS_OK);
  }
  ~FreshContext() { moe_context_free(c); }
};

using Case = std::function<void(Fixture &)>;

std::map<std::string, Case> misuse_cases() {
  std::map<std::string, Case> k;
  // ---- errors, version, logging: no handle to get wrong; out-of-range values stay safe.
  k["moe_status_string"] = [](Fixture &) {
    CHECK(moe_status_string(static_cast<moe_status>(-1)) != nullptr);
    CHECK(moe_status_string(static_cast<moe_status>(12345)) != nullptr);
  };
  k["moe_last_error"] = [](Fixture &) {
    EXPECT_FAIL(moe_batch_create(0, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    CHECK(moe_last_error() != nullptr);
  };
  k["moe_clear_last_error"] = [](Fixture &) {
    moe_batch_create(0, nullptr);
    moe_clear_last_error();
    CHECK(std::strlen(moe_last_error()) == 0);
  };
  k["moe_version_string"] = [](Fixture &) { CHECK(std::strlen(moe_version_string()) > 0); };
  k["moe_abi_version"] = [](Fixture &) { CHECK(moe_abi_version() >= 1); };
  k["moe_set_log_callback"] = [](Fixture &) {
    moe_set_log_callback(nullptr, nullptr);  // removing a callback that is not there
    moe_set_log_callback(nullptr, reinterpret_cast<void *>(1));
  };
  // ---- devices
  k["moe_device_count"] = [](Fixture &) { EXPECT_FAIL(moe_device_count(nullptr), MOE_STATUS_INVALID_ARGUMENT); };
  k["moe_device_get_info"] = [](Fixture &) {
    moe_device_info info{};
    EXPECT_FAIL(moe_device_get_info(0, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    info.struct_size = 3;
    EXPECT_FAIL(moe_device_get_info(0, &info), MOE_STATUS_INVALID_ARGUMENT);
    info.struct_size = sizeof info;
    EXPECT_FAIL(moe_device_get_info(1u << 20, &info), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_device_get_info(static_cast<size_t>(-1), &info), MOE_STATUS_INVALID_ARGUMENT);
  };
  // ---- model
  k["moe_model_default_params"] = [](Fixture &) { CHECK(moe_model_default_params().struct_size == MOE_MODEL_PARAMS_SIZE_V1); };
  k["moe_model_default_params_v2"] = [](Fixture &) { CHECK(moe_model_default_params_v2().struct_size == sizeof(moe_model_params)); };
  k["moe_model_load"] = [](Fixture &f) {
    moe_model *m = reinterpret_cast<moe_model *>(1);
    EXPECT_FAIL(moe_model_load(f.path.c_str(), nullptr, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_model_load(nullptr, nullptr, &m), MOE_STATUS_INVALID_ARGUMENT);
    CHECK(m == nullptr);
    EXPECT_FAIL(moe_model_load("", nullptr, &m), MOE_STATUS_IO_ERROR);
    EXPECT_FAIL(moe_model_load("/nonexistent/model.gguf", nullptr, &m), MOE_STATUS_IO_ERROR);
    moe_model_params p = moe_model_default_params_v2();
    for (size_t bad : {size_t{0}, size_t{7}, sizeof p + 8}) {
      p.struct_size = bad;
      EXPECT_FAIL(moe_model_load(f.path.c_str(), &p, &m), MOE_STATUS_INVALID_ARGUMENT);
    }
    p = moe_model_default_params_v2();
    p.n_devices = 3;  // entries promised, array NULL
    EXPECT_FAIL(moe_model_load(f.path.c_str(), &p, &m), MOE_STATUS_INVALID_ARGUMENT);
    p = moe_model_default_params_v2();
    p.n_kv_overrides = 2;
    EXPECT_FAIL(moe_model_load(f.path.c_str(), &p, &m), MOE_STATUS_INVALID_ARGUMENT);
    p = moe_model_default_params_v2();
    const char *nodev[] = {"no-such-device"};
    p.devices = nodev;
    p.n_devices = 1;
    CHECK(moe_model_load(f.path.c_str(), &p, &m) != MOE_STATUS_OK);
    CHECK(m == nullptr);
  };
  k["moe_model_fit"] = [](Fixture &f) {
    moe_fit_plan plan{};
    plan.struct_size = sizeof plan;
    EXPECT_FAIL(moe_model_fit(f.path.c_str(), nullptr, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_model_fit(nullptr, nullptr, &plan), MOE_STATUS_INVALID_ARGUMENT);
    plan.struct_size = 1;
    EXPECT_FAIL(moe_model_fit(f.path.c_str(), nullptr, &plan), MOE_STATUS_INVALID_ARGUMENT);
    plan.struct_size = sizeof plan;
    EXPECT_FAIL(moe_model_fit("/nonexistent/model.gguf", nullptr, &plan), MOE_STATUS_IO_ERROR);
  };
  k["moe_model_free"] = [](Fixture &) { moe_model_free(nullptr); };
  k["moe_model_set_cpu_weight_copy"] = [](Fixture &f) {
    EXPECT_FAIL(moe_model_set_cpu_weight_copy(nullptr, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_model_set_cpu_weight_copy(f.m, 0), MOE_STATUS_BUSY);  // after the first CPU context
  };
  k["moe_model_get_info"] = [](Fixture &f) {
    moe_model_info info{};
    info.struct_size = sizeof info;
    EXPECT_FAIL(moe_model_get_info(nullptr, &info), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_model_get_info(f.m, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    info.struct_size = 5;
    EXPECT_FAIL(moe_model_get_info(f.m, &info), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_model_meta_count"] = [](Fixture &f) {
    size_t n = 0;
    EXPECT_FAIL(moe_model_meta_count(nullptr, &n), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_model_meta_count(f.m, nullptr), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_model_meta_key"] = [](Fixture &f) {
    char buf[8];
    size_t len = 0, n = 0;
    REQUIRE(moe_model_meta_count(f.m, &n) == MOE_STATUS_OK);
    EXPECT_FAIL(moe_model_meta_key(nullptr, 0, buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_model_meta_key(f.m, n, buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_model_meta_key(f.m, static_cast<size_t>(-1), buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_model_meta_key(f.m, 0, nullptr, 0, &len), MOE_STATUS_BUFFER_TOO_SMALL);
    CHECK(len > 0);
    EXPECT_FAIL(moe_model_meta_key(f.m, 0, buf, 1, &len), MOE_STATUS_BUFFER_TOO_SMALL);
  };
  k["moe_model_meta_value"] = [](Fixture &f) {
    char buf[4];
    size_t len = 0;
    EXPECT_FAIL(moe_model_meta_value(nullptr, "general.architecture", buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_model_meta_value(f.m, nullptr, buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_model_meta_value(f.m, "no.such.key", buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_model_meta_value(f.m, "general.architecture", buf, sizeof buf, &len), MOE_STATUS_BUFFER_TOO_SMALL);
    CHECK(len == std::strlen("qwen3moe"));
  };
  // ---- vocabulary
  k["moe_token_bos"] = [](Fixture &) { CHECK(moe_token_bos(nullptr) == -1); };
  k["moe_token_eos"] = [](Fixture &) { CHECK(moe_token_eos(nullptr) == -1); };
  k["moe_token_eot"] = [](Fixture &) { CHECK(moe_token_eot(nullptr) == -1); };
  k["moe_token_is_eog"] = [](Fixture &f) {
    CHECK(moe_token_is_eog(nullptr, 0) == 0);
    CHECK(moe_token_is_eog(f.m, -1) == 0);
    CHECK(moe_token_is_eog(f.m, f.n_vocab()) == 0);
    CHECK(moe_token_is_eog(f.m, INT32_MAX) == 0);
  };
  k["moe_tokenize"] = [](Fixture &f) {
    int32_t toks[2];
    size_t n = 0;
    EXPECT_FAIL(moe_tokenize(nullptr, "hi", 2, toks, 2, &n, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_tokenize(f.m, nullptr, 2, toks, 2, &n, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_tokenize(f.m, "hi", 2, toks, 2, nullptr, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_tokenize(f.m, "hi", 2, nullptr, 2, &n, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_tokenize(f.m, "hello world again", 17, toks, 1, &n, 0), MOE_STATUS_BUFFER_TOO_SMALL);
    CHECK(n > 1);
  };
  k["moe_token_to_piece"] = [](Fixture &f) {
    char buf[1];
    size_t len = 0;
    EXPECT_FAIL(moe_token_to_piece(nullptr, 3, buf, sizeof buf, &len, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_token_to_piece(f.m, -1, buf, sizeof buf, &len, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_token_to_piece(f.m, f.n_vocab(), buf, sizeof buf, &len, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_token_to_piece(f.m, 300, buf, sizeof buf, &len, 0), MOE_STATUS_BUFFER_TOO_SMALL);
  };
  k["moe_detokenize"] = [](Fixture &f) {
    const int32_t bad[] = {3, -5};
    const int32_t good[] = {300, 301};
    char buf[1];
    size_t len = 0;
    EXPECT_FAIL(moe_detokenize(nullptr, good, 2, buf, sizeof buf, &len, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_detokenize(f.m, nullptr, 2, buf, sizeof buf, &len, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_detokenize(f.m, bad, 2, buf, sizeof buf, &len, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_detokenize(f.m, good, 2, buf, sizeof buf, &len, 0), MOE_STATUS_BUFFER_TOO_SMALL);
  };
  k["moe_detokenizer_create"] = [](Fixture &f) {
    moe_detokenizer *d = nullptr;
    EXPECT_FAIL(moe_detokenizer_create(nullptr, 0, &d), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_detokenizer_create(f.m, 0, nullptr), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_detokenizer_free"] = [](Fixture &) { moe_detokenizer_free(nullptr); };
  k["moe_detokenizer_push"] = [](Fixture &f) {
    const char *t = nullptr;
    size_t len = 0;
    EXPECT_FAIL(moe_detokenizer_push(nullptr, 3, &t, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_detokenizer_push(f.d, -1, &t, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_detokenizer_push(f.d, f.n_vocab(), &t, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_detokenizer_push(f.d, 3, nullptr, &len), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_detokenizer_flush"] = [](Fixture &f) {
    const char *t = nullptr;
    size_t len = 0;
    EXPECT_FAIL(moe_detokenizer_flush(nullptr, &t, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_detokenizer_flush(f.d, nullptr, &len), MOE_STATUS_INVALID_ARGUMENT);
  };
  // ---- context
  k["moe_context_default_params_v2"] = [](Fixture &) {
    CHECK(moe_context_default_params_v2().struct_size == sizeof(moe_context_params));
  };
  k["moe_context_default_params"] = [](Fixture &) { CHECK(moe_context_default_params().struct_size == MOE_CONTEXT_PARAMS_SIZE_V1); };
  k["moe_context_create"] = [](Fixture &f) {
    moe_context *c = reinterpret_cast<moe_context *>(1);
    moe_context_params p = moe_context_default_params_v2();
    p.device = "cpu";
    EXPECT_FAIL(moe_context_create(f.m, &p, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_context_create(nullptr, &p, &c), MOE_STATUS_INVALID_ARGUMENT);
    CHECK(c == nullptr);
    for (size_t bad : {size_t{0}, size_t{9}, sizeof p + 8}) {
      p.struct_size = bad;
      EXPECT_FAIL(moe_context_create(f.m, &p, &c), MOE_STATUS_INVALID_ARGUMENT);
    }
    p = moe_context_default_params_v2();
    p.device = "no-such-device";
    CHECK(moe_context_create(f.m, &p, &c) != MOE_STATUS_OK);
    p = moe_context_default_params_v2();
    p.device = "cpu";
    p.kv_type = 77;
    EXPECT_FAIL(moe_context_create(f.m, &p, &c), MOE_STATUS_INVALID_ARGUMENT);
    p.kv_type = MOE_KV_TYPE_F32;
    p.n_threads = -3;
    EXPECT_FAIL(moe_context_create(f.m, &p, &c), MOE_STATUS_INVALID_ARGUMENT);
    p.n_threads = 1;
    p.n_ctx = UINT32_MAX;
    EXPECT_FAIL(moe_context_create(f.m, &p, &c), MOE_STATUS_INVALID_ARGUMENT);
    CHECK(c == nullptr);
  };
  k["moe_context_free"] = [](Fixture &) { moe_context_free(nullptr); };
  k["moe_context_n_ctx"] = [](Fixture &) { CHECK(moe_context_n_ctx(nullptr) == 0); };
  k["moe_context_n_batch"] = [](Fixture &) { CHECK(moe_context_n_batch(nullptr) == 0); };
  k["moe_context_n_ubatch"] = [](Fixture &) { CHECK(moe_context_n_ubatch(nullptr) == 0); };
  k["moe_context_n_vocab"] = [](Fixture &) { CHECK(moe_context_n_vocab(nullptr) == 0); };
  k["moe_context_cpu_float_order"] = [](Fixture &) { CHECK(moe_context_cpu_float_order(nullptr) == 0); };
  k["moe_context_set_abort_callback"] = [](Fixture &) {
    EXPECT_FAIL(moe_context_set_abort_callback(nullptr, nullptr, nullptr), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_context_set_gpu_graphs"] = [](Fixture &) {
    EXPECT_FAIL(moe_context_set_gpu_graphs(nullptr, 1), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_context_check"] = [](Fixture &) { EXPECT_FAIL(moe_context_check(nullptr), MOE_STATUS_INVALID_ARGUMENT); };
  // ---- batch
  k["moe_batch_create"] = [](Fixture &) {
    moe_batch *b = nullptr;
    EXPECT_FAIL(moe_batch_create(4, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_batch_create(0, &b), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_batch_create((size_t{1} << 24) + 1, &b), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_batch_create(static_cast<size_t>(-1), &b), MOE_STATUS_INVALID_ARGUMENT);
    CHECK(b == nullptr);
  };
  k["moe_batch_free"] = [](Fixture &) { moe_batch_free(nullptr); };
  k["moe_batch_clear"] = [](Fixture &) { EXPECT_FAIL(moe_batch_clear(nullptr), MOE_STATUS_INVALID_ARGUMENT); };
  k["moe_batch_add"] = [](Fixture &f) {
    moe_batch_clear(f.b);
    EXPECT_FAIL(moe_batch_add(nullptr, 1, 0, 0, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_batch_add(f.b, -1, 0, 0, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_batch_add(f.b, 1, -1, 0, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_batch_add(f.b, 1, 0, -1, 1), MOE_STATUS_INVALID_ARGUMENT);
    for (int i = 0; i < 16; ++i) REQUIRE(moe_batch_add(f.b, 1, i, 0, 0) == MOE_STATUS_OK);
    EXPECT_FAIL(moe_batch_add(f.b, 1, 16, 0, 1), MOE_STATUS_INVALID_ARGUMENT);  // full
    CHECK(moe_batch_size(f.b) == 16);
    moe_batch_clear(f.b);
  };
  k["moe_batch_add_sequence"] = [](Fixture &f) {
    const int32_t toks[20] = {1, 2, 3};
    moe_batch_clear(f.b);
    EXPECT_FAIL(moe_batch_add_sequence(nullptr, toks, 3, 0, 0, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_batch_add_sequence(f.b, nullptr, 3, 0, 0, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_batch_add_sequence(f.b, toks, 20, 0, 0, 1), MOE_STATUS_INVALID_ARGUMENT);  // over capacity
    EXPECT_FAIL(moe_batch_add_sequence(f.b, toks, 3, -1, 0, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_batch_add_sequence(f.b, toks, 3, INT32_MAX - 1, 0, 1), MOE_STATUS_INVALID_ARGUMENT);  // positions overflow
    EXPECT_FAIL(moe_batch_add_sequence(f.b, toks, 3, 0, -2, 1), MOE_STATUS_INVALID_ARGUMENT);
    CHECK(moe_batch_size(f.b) == 0);  // nothing appended on failure
  };
  k["moe_batch_size"] = [](Fixture &) { CHECK(moe_batch_size(nullptr) == 0); };
  // ---- decode
  k["moe_decode"] = [](Fixture &f) {
    REQUIRE(moe_kv_clear(f.c) == MOE_STATUS_OK);
    moe_batch_clear(f.b);
    EXPECT_FAIL(moe_decode(nullptr, f.b), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_decode(f.c, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_decode(f.c, f.b), MOE_STATUS_INVALID_ARGUMENT);  // empty
    for (int i = 0; i < 9; ++i) moe_batch_add(f.b, 1, i, 0, 0);
    EXPECT_FAIL(moe_decode(f.c, f.b), MOE_STATUS_INVALID_ARGUMENT);  // over n_batch 8
    moe_batch_clear(f.b);
    moe_batch_add(f.b, f.n_vocab(), 0, 0, 1);
    EXPECT_FAIL(moe_decode(f.c, f.b), MOE_STATUS_INVALID_ARGUMENT);  // token out of the vocabulary
    moe_batch_clear(f.b);
    moe_batch_add(f.b, 1, 0, 5, 1);
    EXPECT_FAIL(moe_decode(f.c, f.b), MOE_STATUS_INVALID_ARGUMENT);  // sequence >= n_seq_max
    moe_batch_clear(f.b);
    uint32_t cells = 1;
    CHECK(moe_kv_used_cells(f.c, &cells) == MOE_STATUS_OK);
    CHECK(cells == 0);
  };
  k["moe_decode_submit"] = [](Fixture &f) {
    moe_batch_clear(f.b);
    EXPECT_FAIL(moe_decode_submit(nullptr, f.b), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_decode_submit(f.c, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_decode_submit(f.c, f.b), MOE_STATUS_INVALID_ARGUMENT);
    // Wrong order: a second submit before the first was collected.
    moe_batch_add(f.b, 1, 0, 0, 1);
    REQUIRE(moe_decode_submit(f.c, f.b) == MOE_STATUS_OK);
    EXPECT_FAIL(moe_decode_submit(f.c, f.b), MOE_STATUS_BUSY);
    CHECK(moe_decode_wait(f.c, -1) == MOE_STATUS_OK);
    REQUIRE(moe_kv_clear(f.c) == MOE_STATUS_OK);
    moe_batch_clear(f.b);
  };
  k["moe_decode_poll"] = [](Fixture &f) {
    int32_t st = -1;
    EXPECT_FAIL(moe_decode_poll(nullptr, &st), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_decode_poll(f.c, nullptr), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_decode_wait"] = [](Fixture &f) {
    EXPECT_FAIL(moe_decode_wait(nullptr, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_decode_wait(f.c, 0), MOE_STATUS_INVALID_ARGUMENT);  // nothing submitted
    EXPECT_FAIL(moe_decode_wait(f.c, -1), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_decode_cancel"] = [](Fixture &f) {
    EXPECT_FAIL(moe_decode_cancel(nullptr), MOE_STATUS_INVALID_ARGUMENT);
    CHECK(moe_decode_cancel(f.c) == MOE_STATUS_OK);  // idle: a no-op
  };
  k["moe_get_logits"] = [](Fixture &f) {
    const float *l = nullptr;
    EXPECT_FAIL(moe_get_logits(nullptr, 0, &l, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_get_logits(f.c, 0, nullptr, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_get_logits(FreshContext(f.m).c, -1, &l, nullptr), MOE_STATUS_INVALID_ARGUMENT);  // before any decode
    moe_batch_clear(f.b);
    moe_batch_add(f.b, 1, 0, 0, 0);
    moe_batch_add(f.b, 2, 1, 0, 1);
    REQUIRE(moe_decode(f.c, f.b) == MOE_STATUS_OK);
    EXPECT_FAIL(moe_get_logits(f.c, 0, &l, nullptr), MOE_STATUS_INVALID_ARGUMENT);  // entry 0 asked for none
    EXPECT_FAIL(moe_get_logits(f.c, 2, &l, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_get_logits(f.c, -2, &l, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_get_logits(f.c, INT32_MIN, &l, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    CHECK(l == nullptr);
    REQUIRE(moe_kv_clear(f.c) == MOE_STATUS_OK);
    moe_batch_clear(f.b);
  };
  // ---- KV cache
  k["moe_kv_clear"] = [](Fixture &) { EXPECT_FAIL(moe_kv_clear(nullptr), MOE_STATUS_INVALID_ARGUMENT); };
  k["moe_kv_seq_rm"] = [](Fixture &f) {
    EXPECT_FAIL(moe_kv_seq_rm(nullptr, 0, -1, -1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_kv_seq_rm(f.c, 1000, -1, -1), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_kv_seq_cp"] = [](Fixture &f) {
    EXPECT_FAIL(moe_kv_seq_cp(nullptr, 0, 0, -1, -1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_kv_seq_cp(f.c, 0, 1000, -1, -1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_kv_seq_cp(f.c, -1, 0, -1, -1), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_kv_seq_keep"] = [](Fixture &f) {
    EXPECT_FAIL(moe_kv_seq_keep(nullptr, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_kv_seq_keep(f.c, 1000), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_kv_seq_keep(f.c, -1), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_kv_seq_pos_max"] = [](Fixture &f) {
    int32_t p = 0;
    EXPECT_FAIL(moe_kv_seq_pos_max(nullptr, 0, &p), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_kv_seq_pos_max(f.c, 0, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_kv_seq_pos_max(f.c, 1000, &p), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_kv_used_cells"] = [](Fixture &f) {
    uint32_t n = 0;
    EXPECT_FAIL(moe_kv_used_cells(nullptr, &n), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_kv_used_cells(f.c, nullptr), MOE_STATUS_INVALID_ARGUMENT);
  };
  // ---- sequence state
  k["moe_state_seq_save"] = [](Fixture &f) {
    size_t n = 0;
    char small[4];
    EXPECT_FAIL(moe_state_seq_save(nullptr, 0, nullptr, 0, &n), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_state_seq_save(f.c, 0, nullptr, 0, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_state_seq_save(f.c, 1000, nullptr, 0, &n), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_state_seq_save(f.c, 0, small, sizeof small, &n), MOE_STATUS_BUFFER_TOO_SMALL);
    CHECK(n > sizeof small);
  };
  k["moe_state_seq_load"] = [](Fixture &f) {
    const char junk[64] = {1, 2, 3};
    EXPECT_FAIL(moe_state_seq_load(nullptr, 0, junk, sizeof junk), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_state_seq_load(f.c, 0, nullptr, 16), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_state_seq_load(f.c, 0, junk, sizeof junk), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_state_seq_load(f.c, 0, junk, 3), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_state_seq_load(f.c, -7, junk, sizeof junk), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_state_seq_save_file"] = [](Fixture &f) {
    EXPECT_FAIL(moe_state_seq_save_file(nullptr, 0, "/tmp/x"), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_state_seq_save_file(f.c, 0, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_state_seq_save_file(f.c, 0, "/nonexistent/dir/state"), MOE_STATUS_IO_ERROR);
  };
  k["moe_state_seq_load_file"] = [](Fixture &f) {
    EXPECT_FAIL(moe_state_seq_load_file(nullptr, 0, "/tmp/x"), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_state_seq_load_file(f.c, 0, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_state_seq_load_file(f.c, 0, "/nonexistent/dir/state"), MOE_STATUS_IO_ERROR);
  };
  // ---- sampling
  k["moe_sampler_default_params"] = [](Fixture &) { CHECK(moe_sampler_default_params().struct_size == sizeof(moe_sampler_params)); };
  k["moe_sampler_create"] = [](Fixture &) {
    moe_sampler *s = nullptr;
    moe_sampler_params p = moe_sampler_default_params();
    EXPECT_FAIL(moe_sampler_create(&p, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    p.struct_size = 3;
    EXPECT_FAIL(moe_sampler_create(&p, &s), MOE_STATUS_INVALID_ARGUMENT);
    CHECK(s == nullptr);
  };
  k["moe_sampler_free"] = [](Fixture &) { moe_sampler_free(nullptr); };
  k["moe_sampler_add_greedy"] = [](Fixture &) { EXPECT_FAIL(moe_sampler_add_greedy(nullptr), MOE_STATUS_INVALID_ARGUMENT); };
  k["moe_sampler_add_dist"] = [](Fixture &) { EXPECT_FAIL(moe_sampler_add_dist(nullptr), MOE_STATUS_INVALID_ARGUMENT); };
  k["moe_sampler_add_temperature"] = [](Fixture &f) {
    EXPECT_FAIL(moe_sampler_add_temperature(nullptr, 1.0f), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_temperature(f.s, NAN), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_sampler_add_top_k"] = [](Fixture &) { EXPECT_FAIL(moe_sampler_add_top_k(nullptr, 4), MOE_STATUS_INVALID_ARGUMENT); };
  k["moe_sampler_add_top_p"] = [](Fixture &f) {
    EXPECT_FAIL(moe_sampler_add_top_p(nullptr, 0.9f, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_top_p(f.s, NAN, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_top_p(f.s, 0.0f, 1), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_sampler_add_min_p"] = [](Fixture &f) {
    EXPECT_FAIL(moe_sampler_add_min_p(nullptr, 0.1f, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_min_p(f.s, NAN, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_min_p(f.s, -0.5f, 1), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_sampler_add_typical"] = [](Fixture &f) {
    EXPECT_FAIL(moe_sampler_add_typical(nullptr, 0.9f, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_typical(f.s, NAN, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_typical(f.s, 0.0f, 1), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_sampler_add_penalties"] = [](Fixture &f) {
    EXPECT_FAIL(moe_sampler_add_penalties(nullptr, 64, 1.1f, 0, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_penalties(f.s, 64, 0.0f, 0, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_penalties(f.s, 64, NAN, 0, 0), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_penalties(f.s, -2, 1.1f, 0, 0), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_sampler_add_logit_bias"] = [](Fixture &f) {
    const moe_logit_bias nan_bias[] = {{1, NAN}};
    const moe_logit_bias neg_token[] = {{-1, 1.0f}};
    EXPECT_FAIL(moe_sampler_add_logit_bias(nullptr, nan_bias, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_logit_bias(f.s, nullptr, 2), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_logit_bias(f.s, nan_bias, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_logit_bias(f.s, neg_token, 1), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_sampler_sample"] = [](Fixture &f) {
    const float logits[4] = {0, 1, 2, 3};
    int32_t t = 0;
    EXPECT_FAIL(moe_sampler_sample(nullptr, logits, 4, &t), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_sample(f.s, nullptr, 4, &t), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_sample(f.s, logits, 0, &t), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_sample(f.s, logits, -4, &t), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_sample(f.s, logits, 4, nullptr), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_sampler_sample_context"] = [](Fixture &f) {
    int32_t t = 0;
    EXPECT_FAIL(moe_sampler_sample_context(nullptr, f.c, -1, &t), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_sample_context(f.s, nullptr, -1, &t), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_sample_context(f.s, f.c, -1, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_sample_context(f.s, FreshContext(f.m).c, -1, &t), MOE_STATUS_INVALID_ARGUMENT);  // no decode yet
  };
  k["moe_sampler_accept"] = [](Fixture &f) {
    EXPECT_FAIL(moe_sampler_accept(nullptr, 1), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_accept(f.s, -1), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_sampler_reset"] = [](Fixture &) { EXPECT_FAIL(moe_sampler_reset(nullptr), MOE_STATUS_INVALID_ARGUMENT); };
  k["moe_sampler_set_seed"] = [](Fixture &) { EXPECT_FAIL(moe_sampler_set_seed(nullptr, 1), MOE_STATUS_INVALID_ARGUMENT); };
  // ---- grammar and JSON schema
  k["moe_sampler_add_grammar"] = [](Fixture &f) {
    EXPECT_FAIL(moe_sampler_add_grammar(nullptr, f.m, "root ::= \"a\"", nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_grammar(f.s, f.m, nullptr, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_grammar(f.s, nullptr, "root ::= \"a\"", nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_grammar(f.s, f.m, "root ::= (", nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_grammar(f.s, f.m, "root ::= \"a\"", "no_such_rule"), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_sampler_add_json_schema"] = [](Fixture &f) {
    EXPECT_FAIL(moe_sampler_add_json_schema(nullptr, f.m, "{}"), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_json_schema(f.s, f.m, nullptr), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_json_schema(f.s, nullptr, "{}"), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_sampler_add_json_schema(f.s, f.m, "{not json"), MOE_STATUS_INVALID_ARGUMENT);
  };
  k["moe_json_schema_to_grammar"] = [](Fixture &) {
    char buf[4];
    size_t len = 0;
    EXPECT_FAIL(moe_json_schema_to_grammar(nullptr, buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_json_schema_to_grammar("{\"type\": 7", buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_json_schema_to_grammar("{\"type\": \"string\"}", buf, sizeof buf, &len), MOE_STATUS_BUFFER_TOO_SMALL);
    CHECK(len > sizeof buf);
  };
  // ---- chat templates
  k["moe_chat_default_params"] = [](Fixture &) { CHECK(moe_chat_default_params().struct_size == sizeof(moe_chat_params)); };
  k["moe_chat_apply_template"] = [](Fixture &f) {
    const moe_chat_message good[] = {{"user", "hi", nullptr, nullptr, nullptr, nullptr}};
    const moe_chat_message no_role[] = {{nullptr, "hi", nullptr, nullptr, nullptr, nullptr}};
    const moe_chat_message bad_json[] = {{"assistant", nullptr, nullptr, "[{", nullptr, nullptr}};
    char buf[2];
    size_t len = 0;
    moe_chat_params p = moe_chat_default_params();
    p.template_text = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
    EXPECT_FAIL(moe_chat_apply_template(nullptr, good, 1, nullptr, buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_chat_apply_template(f.m, nullptr, 1, &p, buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_chat_apply_template(f.m, no_role, 1, &p, buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_chat_apply_template(f.m, bad_json, 1, &p, buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_FAIL(moe_chat_apply_template(f.m, good, 1, &p, buf, sizeof buf, &len), MOE_STATUS_BUFFER_TOO_SMALL);
    CHECK(len > sizeof buf);
    p.template_text = "{% for m in messages %";
    EXPECT_FAIL(moe_chat_apply_template(f.m, good, 1, &p, buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
    p = moe_chat_default_params();
    p.struct_size = 3;
    EXPECT_FAIL(moe_chat_apply_template(f.m, good, 1, &p, buf, sizeof buf, &len), MOE_STATUS_INVALID_ARGUMENT);
  };
  return k;
}

}  // namespace

TEST_CASE("reliability: every exported function has a misuse case", "[reliability][api]") {
  const auto cases = misuse_cases();
  const std::set<std::string> names = exported_names();
  CHECK(names.size() >= 70);
  for (const std::string &fn : names) {
    INFO(fn << " is exported but has no case in misuse_cases()");
    CHECK(cases.count(fn) == 1);
  }
}

TEST_CASE("reliability: misuse of every exported function is a status with a message, never a crash",
          "[reliability][api]") {
  Fixture f;
  for (auto &kv : misuse_cases()) {
    INFO(kv.first);
    kv.second(f);
  }
  // The handles still work after all of it.
  moe_batch_clear(f.b);
  REQUIRE(moe_kv_clear(f.c) == MOE_STATUS_OK);
  REQUIRE(moe_batch_add(f.b, 3, 0, 0, 1) == MOE_STATUS_OK);
  CHECK(moe_decode(f.c, f.b) == MOE_STATUS_OK);
  REQUIRE(moe_sampler_add_greedy(f.s) == MOE_STATUS_OK);
  int32_t tok = -1;
  CHECK(moe_sampler_sample_context(f.s, f.c, -1, &tok) == MOE_STATUS_OK);
  CHECK(tok >= 0);
}
