// Sequence state save/restore through the C API: a run interrupted at position P and
// continued from the saved state (in a new context, in another sequence, after freeing and
// reloading the model, through a file) yields the same tokens as the uninterrupted run; corrupt,
// truncated and mismatched states are clear statuses that change nothing.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "moeinfer/moeinfer.h"
#include "support/temp_files.h"
#include "support/tiny_model.h"

namespace {

constexpr int kPrompt = 8;   // P: the state is saved after the prompt and the first sampled token
constexpr int kGen = 12;

struct Ctx {
  moe_context *c = nullptr;
  Ctx(moe_model *m, uint32_t n_ctx = 64, uint32_t n_seq = 2, int32_t kv = MOE_KV_TYPE_F16, const char *device = "cpu") {
    moe_context_params cp = moe_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_seq_max = n_seq;
    cp.kv_type = kv;
    cp.n_threads = 2;
    cp.device = device;
    REQUIRE(moe_context_create(m, &cp, &c) == MOE_STATUS_OK);
  }
  ~Ctx() { moe_context_free(c); }
};

// Decodes token at pos of seq and returns the greedy next token.
int32_t step(moe_context *c, int32_t token, int32_t pos, int32_t seq) {
  moe_batch *b = nullptr;
  REQUIRE(moe_batch_create(1, &b) == MOE_STATUS_OK);
  moe_batch_add(b, token, pos, seq, 1);
  REQUIRE(moe_decode(c, b) == MOE_STATUS_OK);
  moe_batch_free(b);
  const float *logits = nullptr;
  int32_t n_vocab = 0;
  REQUIRE(moe_get_logits(c, -1, &logits, &n_vocab) == MOE_STATUS_OK);
  int32_t best = 0;
  for (int32_t i = 1; i < n_vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

// The prompt of seq, then the first token sampled from it.
int32_t prefill(moe_context *c, int32_t seq) {
  int32_t next = 0;
  for (int32_t p = 0; p < kPrompt; ++p) next = step(c, 3 + 17 * p, p, seq);
  return next;
}

// Generates kGen tokens starting with first at position kPrompt.
std::vector<int32_t> continue_from(moe_context *c, int32_t first, int32_t seq) {
  std::vector<int32_t> out{first};
  for (int32_t i = 0; i + 1 < kGen; ++i) out.push_back(step(c, out.back(), kPrompt + i, seq));
  return out;
}

std::vector<uint8_t> save(moe_context *c, int32_t seq) {
  size_t n = 0;
  REQUIRE(moe_state_seq_save(c, seq, nullptr, 0, &n) == MOE_STATUS_BUFFER_TOO_SMALL);
  std::vector<uint8_t> blob(n);
  REQUIRE(moe_state_seq_save(c, seq, blob.data(), blob.size(), &n) == MOE_STATUS_OK);
  return blob;
}

bool has_gpu() {
  size_t n = 0;
  REQUIRE(moe_device_count(&n) == MOE_STATUS_OK);
  for (size_t i = 0; i < n; ++i) {
    moe_device_info info{};
    info.struct_size = sizeof info;
    REQUIRE(moe_device_get_info(i, &info) == MOE_STATUS_OK);
    if (info.kind == MOE_DEVICE_KIND_GPU && !info.integrated) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("state io: restored sequences continue exactly like the uninterrupted run", "[state_io]") {
  const std::string path = moe_test::tiny_model();
  moe_model *m = nullptr;
  REQUIRE(moe_model_load(path.c_str(), nullptr, &m) == MOE_STATUS_OK);

  std::vector<int32_t> reference;
  std::vector<uint8_t> blob;
  int32_t first = 0;
  {
    Ctx a(m);
    first = prefill(a.c, 0);
    blob = save(a.c, 0);
    reference = continue_from(a.c, first, 0);
  }
  // A state of P cells: header + positions + rows, at least the K/V bytes of P tokens.
  CHECK(blob.size() > size_t(kPrompt) * 64);

  SECTION("new context, same sequence") {
    Ctx b(m);
    REQUIRE(moe_state_seq_load(b.c, 0, blob.data(), blob.size()) == MOE_STATUS_OK);
    int32_t pos = -1;
    REQUIRE(moe_kv_seq_pos_max(b.c, 0, &pos) == MOE_STATUS_OK);
    CHECK(pos == kPrompt - 1);
    const float *logits = nullptr;
    CHECK(moe_get_logits(b.c, -1, &logits, nullptr) == MOE_STATUS_INVALID_ARGUMENT);  // no logits in a state
    CHECK(continue_from(b.c, first, 0) == reference);
  }
  SECTION("another sequence of a context that holds other tokens") {
    Ctx b(m);
    prefill(b.c, 0);  // sequence 0 is busy with its own prompt (the same cells' contents)
    REQUIRE(moe_kv_seq_rm(b.c, 0, 4, -1) == MOE_STATUS_OK);
    REQUIRE(moe_state_seq_load(b.c, 1, blob.data(), blob.size()) == MOE_STATUS_OK);
    CHECK(continue_from(b.c, first, 1) == reference);
  }
  SECTION("through a file, after freeing and reloading the model") {
    const std::string file = moe_test::temp_name("seq-state.bin");
    {
      Ctx a(m);
      prefill(a.c, 0);
      REQUIRE(moe_state_seq_save_file(a.c, 0, file.c_str()) == MOE_STATUS_OK);
    }
    moe_model_free(m);
    m = nullptr;
    REQUIRE(moe_model_load(path.c_str(), nullptr, &m) == MOE_STATUS_OK);
    Ctx b(m);
    REQUIRE(moe_state_seq_load_file(b.c, 0, file.c_str()) == MOE_STATUS_OK);
    CHECK(continue_from(b.c, first, 0) == reference);
    unlink(file.c_str());
    CHECK(moe_state_seq_load_file(b.c, 0, file.c_str()) == MOE_STATUS_IO_ERROR);
  }
  moe_model_free(m);
}

TEST_CASE("state io: corrupt or mismatched states are refused and change nothing", "[state_io]") {
  moe_model *m = nullptr;
  REQUIRE(moe_model_load(moe_test::tiny_model().c_str(), nullptr, &m) == MOE_STATUS_OK);
  std::vector<uint8_t> blob;
  {
    Ctx a(m);
    prefill(a.c, 0);
    blob = save(a.c, 0);
  }
  Ctx b(m);
  step(b.c, 5, 0, 0);
  step(b.c, 6, 1, 0);
  uint32_t used_before = 0;
  REQUIRE(moe_kv_used_cells(b.c, &used_before) == MOE_STATUS_OK);
  auto unchanged = [&] {
    uint32_t used = 0;
    int32_t pos = -1;
    REQUIRE(moe_kv_used_cells(b.c, &used) == MOE_STATUS_OK);
    REQUIRE(moe_kv_seq_pos_max(b.c, 0, &pos) == MOE_STATUS_OK);
    return used == used_before && pos == 1;
  };
  auto refused = [&](const std::vector<uint8_t> &s, moe_status want, const char *why) {
    const moe_status got = moe_state_seq_load(b.c, 0, s.data(), s.size());
    INFO(why << ": " << moe_last_error());
    CHECK(got == want);
    CHECK(std::string(moe_last_error()).find(why) != std::string::npos);
    CHECK(unchanged());
  };

  std::vector<uint8_t> bad = blob;
  bad[bad.size() / 2] ^= 0x40;
  refused(bad, MOE_STATUS_INVALID_ARGUMENT, "checksum");
  refused(std::vector<uint8_t>(blob.begin(), blob.begin() + long(blob.size() - 100)), MOE_STATUS_INVALID_ARGUMENT,
          "checksum");
  bad = blob;
  bad[0] = 'X';
  refused(bad, MOE_STATUS_INVALID_ARGUMENT, "magic");
  bad = blob;
  bad[8] = 99;  // format version
  refused(bad, MOE_STATUS_UNSUPPORTED, "version");
  refused(std::vector<uint8_t>(blob.begin(), blob.begin() + 10), MOE_STATUS_INVALID_ARGUMENT, "magic");

  // Another model (the same shapes in other tensor types) and another cache type.
  moe_model *other = nullptr;
  REQUIRE(moe_model_load(moe_test::tiny_model("f16").c_str(), nullptr, &other) == MOE_STATUS_OK);
  {
    Ctx o(other);
    prefill(o.c, 0);
    refused(save(o.c, 0), MOE_STATUS_INVALID_ARGUMENT, "another model");
  }
  moe_model_free(other);
  {
    Ctx f32(m, 64, 2, MOE_KV_TYPE_F32);
    CHECK(moe_state_seq_load(f32.c, 0, blob.data(), blob.size()) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(moe_last_error()).find("KV rows") != std::string::npos);
  }
  // No room: a context of 4 cells cannot hold the 8 saved ones.
  {
    Ctx small(m, 4, 1);
    CHECK(moe_state_seq_load(small.c, 0, blob.data(), blob.size()) == MOE_STATUS_CONTEXT_FULL);
  }
  CHECK(moe_state_seq_load(b.c, 2, blob.data(), blob.size()) == MOE_STATUS_INVALID_ARGUMENT);  // n_seq_max 2
  CHECK(moe_state_seq_load(b.c, 0, nullptr, 5) == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(moe_state_seq_load(nullptr, 0, blob.data(), blob.size()) == MOE_STATUS_INVALID_ARGUMENT);
  CHECK(unchanged());
  moe_model_free(m);
}

// A KV cache in GPU memory: its rows are copied through the device (one span per layer on
// save, one run of adjacent cells on restore). The blob does not depend on the device: a GPU
// state restored on the CPU and saved again is the same bytes, and the reverse.
TEST_CASE("state io: a GPU context's state round-trips and moves between devices", "[state_io][cuda]") {
  if (!has_gpu()) {
    WARN("no discrete GPU: skipped");
    return;
  }
  const std::string path = moe_test::tiny_model();
  moe_model *m = nullptr;
  REQUIRE(moe_model_load(path.c_str(), nullptr, &m) == MOE_STATUS_OK);
  for (int32_t kv : {MOE_KV_TYPE_F16, MOE_KV_TYPE_Q8_0}) {
    CAPTURE(kv);
    std::vector<int32_t> reference;
    std::vector<uint8_t> gpu_blob, cpu_blob;
    int32_t first = 0;
    {
      Ctx a(m, 64, 2, kv, "cuda");
      first = prefill(a.c, 0);
      gpu_blob = save(a.c, 0);
      reference = continue_from(a.c, first, 0);
    }
    {
      Ctx b(m, 64, 2, kv, "cuda");  // another sequence, behind other tokens: cells 4.. of the cache
      prefill(b.c, 0);
      REQUIRE(moe_kv_seq_rm(b.c, 0, 4, -1) == MOE_STATUS_OK);
      REQUIRE(moe_state_seq_load(b.c, 1, gpu_blob.data(), gpu_blob.size()) == MOE_STATUS_OK);
      CHECK(save(b.c, 1) == gpu_blob);
      CHECK(continue_from(b.c, first, 1) == reference);
    }
    {
      Ctx c(m, 64, 2, kv, "cpu");  // GPU -> CPU -> same bytes
      REQUIRE(moe_state_seq_load(c.c, 0, gpu_blob.data(), gpu_blob.size()) == MOE_STATUS_OK);
      CHECK(save(c.c, 0) == gpu_blob);
      prefill(c.c, 1);
      cpu_blob = save(c.c, 1);
    }
    {
      Ctx d(m, 64, 2, kv, "cuda");  // CPU -> GPU -> same bytes
      REQUIRE(moe_state_seq_load(d.c, 0, cpu_blob.data(), cpu_blob.size()) == MOE_STATUS_OK);
      CHECK(save(d.c, 0) == cpu_blob);
    }
  }
  moe_model_free(m);
}
