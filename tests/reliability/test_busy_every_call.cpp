// The thread rule (issue 19, finding 8): while a decode runs on a context (synchronous on
// another thread, or asynchronous until collected), every other call on that context
// returns MOE_STATUS_BUSY and changes nothing. The list of calls comes from the header:
// a context function added later without a case here fails the test.
#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "reliability/reliability_support.h"

using moe_rel::CModel;

namespace {

// Names of the MOE_API functions in moeinfer.h that take a context.
std::set<std::string> context_functions_in_header() {
  std::ifstream f(std::string(MOEINFER_SOURCE_DIR) + "/include/moeinfer/moeinfer.h");
  REQUIRE(f.good());
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::set<std::string> names;
  const std::regex decl(R"(MOE_API[^;(]*\b(moe_\w+)\s*\([^;)]*\bmoe_context\s*\*)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), decl); it != std::sregex_iterator(); ++it)
    names.insert((*it)[1].str());
  return names;
}

// Calls that need no lease by design: the async pair and cancel (any thread), sizes fixed at
// creation (read-only), create and free (nothing else can hold the context yet / any more).
const std::set<std::string> kLeaseFree = {"moe_decode_poll",  "moe_decode_wait",     "moe_decode_cancel",
                                          "moe_context_n_ctx", "moe_context_n_batch", "moe_context_n_ubatch",
                                          "moe_context_n_vocab", "moe_context_cpu_float_order", "moe_context_free",
                                          "moe_context_create"};

int never_abort(void *) { return 0; }

// One call per context function that would change or read the context, each expected BUSY.
struct BusyCalls {
  moe_context *c;
  moe_batch *other;
  moe_sampler *smp;
  std::map<std::string, std::function<moe_status()>> calls() {
    return {
        {"moe_decode", [this] { return moe_decode(c, other); }},
        {"moe_decode_submit", [this] { return moe_decode_submit(c, other); }},
        {"moe_get_logits", [this] { const float *l = nullptr; return moe_get_logits(c, -1, &l, nullptr); }},
        {"moe_kv_clear", [this] { return moe_kv_clear(c); }},
        {"moe_kv_seq_rm", [this] { return moe_kv_seq_rm(c, 0, -1, -1); }},
        {"moe_kv_seq_cp", [this] { return moe_kv_seq_cp(c, 0, 0, -1, -1); }},
        {"moe_kv_seq_keep", [this] { return moe_kv_seq_keep(c, 0); }},
        {"moe_kv_seq_pos_max", [this] { int32_t p = 0; return moe_kv_seq_pos_max(c, 0, &p); }},
        {"moe_kv_used_cells", [this] { uint32_t n = 0; return moe_kv_used_cells(c, &n); }},
        {"moe_context_set_abort_callback", [this] { return moe_context_set_abort_callback(c, never_abort, nullptr); }},
        {"moe_context_set_gpu_graphs", [this] { return moe_context_set_gpu_graphs(c, 0); }},
        {"moe_context_check", [this] { return moe_context_check(c); }},
        {"moe_sampler_sample_context", [this] { int32_t t = 0; return moe_sampler_sample_context(smp, c, -1, &t); }},
        {"moe_state_seq_save", [this] { size_t n = 0; return moe_state_seq_save(c, 0, nullptr, 0, &n); }},
        {"moe_state_seq_load", [this] { const char junk[16] = {}; return moe_state_seq_load(c, 0, junk, sizeof junk); }},
        {"moe_state_seq_save_file", [this] { return moe_state_seq_save_file(c, 0, "/nonexistent/dir/state"); }},
        {"moe_state_seq_load_file", [this] { return moe_state_seq_load_file(c, 0, "/nonexistent/dir/state"); }},
    };
  }
};

// Every call BUSY, `rounds` times over, with a message naming the call.
int check_all_busy(BusyCalls &bc, int rounds) {
  int checked = 0;
  for (int r = 0; r < rounds; ++r)
    for (auto &kv : bc.calls()) {
      INFO(kv.first);
      CHECK(kv.second() == MOE_STATUS_BUSY);
      CHECK(moe_last_error()[0] != '\0');
      ++checked;
    }
  return checked;
}

// Blocks the decode inside its first abort poll until released.
using moe_rel::Gate;
using moe_rel::gate_abort;

}  // namespace

TEST_CASE("reliability: every context function of the header has a BUSY case or is documented lease-free",
          "[reliability][threads][busy]") {
  CModel cm(moe_test::tiny_model("f32"));
  BusyCalls bc{cm.c, nullptr, nullptr};
  const auto calls = bc.calls();
  const std::set<std::string> in_header = context_functions_in_header();
  CHECK(in_header.size() >= calls.size() + 5);  // the regex found the declarations
  for (const std::string &fn : in_header) {
    INFO(fn << " takes a context: add a BUSY case to BusyCalls or list it in kLeaseFree (and in moeinfer.h)");
    CHECK((calls.count(fn) == 1 || kLeaseFree.count(fn) == 1));
  }
  for (auto &kv : calls) {
    INFO(kv.first << " is not a context function of the header");
    CHECK(in_header.count(kv.first) == 1);
  }
}

TEST_CASE("reliability: every context call is BUSY during a synchronous decode and during an uncollected async decode",
          "[reliability][threads][busy]") {
  CModel cm(moe_test::tiny_model("f32"));
  moe_batch *other = nullptr;
  REQUIRE(moe_batch_create(4, &other) == MOE_STATUS_OK);
  REQUIRE(moe_batch_add(other, 1, 100, 0, 1) == MOE_STATUS_OK);
  moe_sampler *smp = nullptr;
  REQUIRE(moe_sampler_create(nullptr, &smp) == MOE_STATUS_OK);
  REQUIRE(moe_sampler_add_greedy(smp) == MOE_STATUS_OK);
  BusyCalls bc{cm.c, other, smp};
  Gate gate;
  REQUIRE(moe_context_set_abort_callback(cm.c, gate_abort, &gate) == MOE_STATUS_OK);
  cm.fill(16, 0, true);

  SECTION("synchronous decode on another thread") {
    moe_status decoded = MOE_STATUS_INTERNAL;
    std::thread t([&] { decoded = moe_decode(cm.c, cm.b); });
    while (gate.entered.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(check_all_busy(bc, 3) == 3 * static_cast<int>(bc.calls().size()));
    gate.go = true;
    t.join();
    CHECK(decoded == MOE_STATUS_OK);
  }
  SECTION("asynchronous decode, running and then finished but not collected") {
    REQUIRE(moe_decode_submit(cm.c, cm.b) == MOE_STATUS_OK);
    while (gate.entered.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    check_all_busy(bc, 2);
    gate.go = true;
    int32_t st = MOE_ASYNC_RUNNING;
    while (st == MOE_ASYNC_RUNNING) REQUIRE(moe_decode_poll(cm.c, &st) == MOE_STATUS_OK);
    CHECK(st == MOE_ASYNC_DONE);
    check_all_busy(bc, 1);
    CHECK(moe_decode_wait(cm.c, 0) == MOE_STATUS_OK);
  }
  // Nothing the refused calls asked for happened.
  CHECK(cm.used() == 16);
  int32_t pos = -2;
  CHECK(moe_kv_seq_pos_max(cm.c, 0, &pos) == MOE_STATUS_OK);
  CHECK(pos == 15);
  const float *lg = nullptr;
  CHECK(moe_get_logits(cm.c, -1, &lg, nullptr) == MOE_STATUS_OK);
  moe_sampler_free(smp);
  moe_batch_free(other);
}

TEST_CASE("reliability: context calls hammered from another thread during decodes never race",
          "[reliability][threads][busy]") {
  // No gate: the calls land at random moments, between and inside decodes. Each one is
  // either BUSY or a correct answer; TSan checks there is no race underneath.
  CModel cm(moe_test::tiny_model("f32"), 256, 64, 64);
  std::atomic<bool> done{false};
  std::atomic<int> busy{0}, ok{0}, bad{0};
  std::thread hammer([&] {
    while (!done.load()) {
      uint32_t cells = 0;
      int32_t pos = 0;
      const moe_status a = moe_kv_used_cells(cm.c, &cells);
      const moe_status b = moe_kv_seq_pos_max(cm.c, 0, &pos);
      for (moe_status s : {a, b}) (s == MOE_STATUS_BUSY ? busy : s == MOE_STATUS_OK ? ok : bad).fetch_add(1);
      // A successful answer is a state between two decodes: cells = pos + 1, a multiple of 8.
      if (a == MOE_STATUS_OK && (cells % 8 != 0)) bad.fetch_add(1);
    }
  });
  for (int step = 0; step < 24; ++step) {
    cm.fill(8, 8 * step, false);
    moe_status st;
    while ((st = moe_decode(cm.c, cm.b)) == MOE_STATUS_BUSY) std::this_thread::yield();  // the other thread's call
    REQUIRE(st == MOE_STATUS_OK);
  }
  done = true;
  hammer.join();
  CHECK(bad.load() == 0);
  CHECK(busy.load() + ok.load() > 0);
  uint32_t used = 0;
  while (moe_kv_used_cells(cm.c, &used) == MOE_STATUS_BUSY) std::this_thread::yield();
  CHECK(used == 192);
}
