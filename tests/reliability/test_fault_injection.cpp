// Fault injection (issue 19): every allocation a model load, a context creation and a first
// decode make fails in turn (n = 0, 1, 2, ... until the call succeeds without reaching the
// failure). Each failing call must return MOE_STATUS_OUT_OF_MEMORY with a message and change
// nothing (no model or context handed out, KV cache as before, no logits), and the retry
// must give the same result as a run without faults.
//
// Two hooks: this binary replaces the global operator new/delete with a counting version
// (every C++ allocation of the library: GGUF metadata, vocabulary, tensors' tables, plans,
// graphs), and moe::test_fail_allocation_after covers the host buffers the library takes
// from posix_memalign (arenas, KV cache, weights read without mmap). The replacement lives
// in its own executable (moeinfer-fault-tests) so the rest of the suite keeps the
// sanitizers' own operator new.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "core/alloc_test_hook.h"
#include "reliability/reliability_support.h"

namespace {
// < 0: off. Otherwise the allocation that finds it at 0 fails. Per thread, so only the
// calling thread's allocations count (the test thread runs load, create and decode).
thread_local int64_t t_countdown = -1;
thread_local int64_t t_seen = 0;

void *counted_alloc(size_t n, size_t align) {
  if (t_countdown >= 0) {
    ++t_seen;
    if (t_countdown-- == 0) return nullptr;
  }
  if (n == 0) n = 1;
  if (align <= alignof(std::max_align_t)) return std::malloc(n);
  void *p = nullptr;
  return posix_memalign(&p, align, n) == 0 ? p : nullptr;
}
void *counted_new(size_t n, size_t align) {
  void *p = counted_alloc(n, align);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

void *operator new(size_t n) { return counted_new(n, 0); }
void *operator new[](size_t n) { return counted_new(n, 0); }
void *operator new(size_t n, std::align_val_t a) { return counted_new(n, static_cast<size_t>(a)); }
void *operator new[](size_t n, std::align_val_t a) { return counted_new(n, static_cast<size_t>(a)); }
void *operator new(size_t n, const std::nothrow_t &) noexcept { return counted_alloc(n, 0); }
void *operator new[](size_t n, const std::nothrow_t &) noexcept { return counted_alloc(n, 0); }
void *operator new(size_t n, std::align_val_t a, const std::nothrow_t &) noexcept { return counted_alloc(n, static_cast<size_t>(a)); }
void *operator new[](size_t n, std::align_val_t a, const std::nothrow_t &) noexcept { return counted_alloc(n, static_cast<size_t>(a)); }
void operator delete(void *p) noexcept { std::free(p); }
void operator delete[](void *p) noexcept { std::free(p); }
void operator delete(void *p, size_t) noexcept { std::free(p); }
void operator delete[](void *p, size_t) noexcept { std::free(p); }
void operator delete(void *p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void *p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void *p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void *p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { std::free(p); }

namespace {

enum class Hook { New, HostBuffer };

struct Armed {
  Armed(Hook h, int64_t n) : hook(h) {
    if (h == Hook::New) {
      t_seen = 0;
      t_countdown = n;
    } else {
      moe::test_fail_allocation_after(n);
    }
  }
  ~Armed() {
    t_countdown = -1;
    moe::test_fail_allocation_after(-1);
  }
  Hook hook;
};

const char *hook_name(Hook h) { return h == Hook::New ? "operator new" : "host buffer"; }

// Runs `call` with allocation n failing, for n = 0, 1, ... until it succeeds without
// reaching the failure; `failed` checks the state after each failure. A call may also
// succeed in spite of the failure (an allocation it can do without, such as a log
// message): `survived` then checks that the result is complete and undoes it. Returns how
// many failures were injected. Under a sanitizer every 3rd point is tried (time).
template <class Call, class Failed, class Survived>
int sweep(Hook hook, Call call, Failed failed, Survived survived) {
  const int64_t step = moe_rel::kSanitized ? 3 : 1;
  int failures = 0;
  for (int64_t n = 0;; n += step) {
    INFO(hook_name(hook) << " allocation " << n);
    moe_clear_last_error();
    moe_status st;
    {
      Armed a(hook, n);
      st = call();
      if (st == MOE_STATUS_OK) {
        // A call may survive a failed allocation it could do without; it must then be
        // complete. Stop once the countdown was not reached at all.
        if (hook == Hook::New ? t_countdown >= 0 : moe::test_allocation_points() <= n) break;
        t_countdown = -1;
        moe::test_fail_allocation_after(-1);
        survived();
        continue;
      }
    }
    REQUIRE(st == MOE_STATUS_OUT_OF_MEMORY);
    CHECK(std::strlen(moe_last_error()) > 0);
    failed(st);
    ++failures;
    REQUIRE(n < 2000000);
  }
  return failures;
}

moe_context_params ctx_params() {
  moe_context_params cp = moe_context_default_params_v2();
  cp.n_ctx = 64;
  cp.n_batch = 32;
  cp.n_ubatch = 32;
  cp.n_threads = 2;
  cp.kv_type = MOE_KV_TYPE_F32;
  cp.device = "cpu";
  return cp;
}

std::vector<float> logits_after(moe_context *c, moe_batch *b) {
  REQUIRE(moe_decode(c, b) == MOE_STATUS_OK);
  const float *lg = nullptr;
  int32_t nv = 0;
  REQUIRE(moe_get_logits(c, -1, &lg, &nv) == MOE_STATUS_OK);
  return std::vector<float>(lg, lg + nv);
}

void fill(moe_batch *b) {
  moe_batch_clear(b);
  for (int i = 0; i < 20; ++i) moe_batch_add(b, (3 + 37 * i) % 500, i, 0, i == 19);
}

}  // namespace

TEST_CASE("reliability: every allocation of a model load may fail; the load fails cleanly and a retry works",
          "[reliability][fault]") {
  const std::string path = moe_test::tiny_model("f32");
  for (const int use_mmap : {1, 0}) {
    moe_model_params mp = moe_model_default_params_v2();
    mp.use_mmap = use_mmap;
    for (const Hook hook : {Hook::New, Hook::HostBuffer}) {
      INFO("use_mmap " << use_mmap);
      moe_model *m = nullptr;
      auto complete = [&] {
        REQUIRE(m != nullptr);
        moe_model_info info{};
        info.struct_size = sizeof info;
        CHECK(moe_model_get_info(m, &info) == MOE_STATUS_OK);
        CHECK(info.n_vocab == 512);
        int32_t toks[8];
        size_t n = 0;
        CHECK(moe_tokenize(m, "hello", 5, toks, 8, &n, 0) == MOE_STATUS_OK);
      };
      const int failures = sweep(hook, [&] { return moe_model_load(path.c_str(), &mp, &m); },
                                 [&](moe_status) { CHECK(m == nullptr); },
                                 [&] { complete(); moe_model_free(m); m = nullptr; });
      std::printf("model load (use_mmap %d), %s: %d failing allocations survived\n", use_mmap, hook_name(hook), failures);
      if (hook == Hook::New) CHECK(failures > 100);  // GGUF metadata, vocabulary, tensor tables
      // The file's mapping, or its copy (a huge-page buffer).
      if (hook == Hook::HostBuffer) CHECK(failures >= 1);
      complete();
      moe_model_free(m);
    }
  }
}

namespace {

bool has_discrete_gpu() {
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

// Context creation, then the first decode, on `device`: every allocation fails in turn.
void sweep_context_and_decode(const char *device) {
  moe_rel::CModel ref(moe_test::tiny_model("f32"), 64, 32, 32);
  moe_context_params cp = ctx_params();
  cp.device = device;
  std::vector<float> want;
  {
    moe_context *rc = nullptr;  // the reference: the same device without faults
    REQUIRE(moe_context_create(ref.m, &cp, &rc) == MOE_STATUS_OK);
    fill(ref.b);
    want = logits_after(rc, ref.b);
    moe_context_free(rc);
  }
  for (const Hook hook : {Hook::New, Hook::HostBuffer}) {
    INFO(device << ", " << hook_name(hook));
    moe_context *c = nullptr;
    const int created = sweep(hook, [&] { return moe_context_create(ref.m, &cp, &c); },
                              [&](moe_status) { CHECK(c == nullptr); },
                              [&] { CHECK(moe_context_check(c) == MOE_STATUS_OK); moe_context_free(c); c = nullptr; });
    REQUIRE(c != nullptr);
    moe_batch *b = nullptr;
    REQUIRE(moe_batch_create(32, &b) == MOE_STATUS_OK);
    fill(b);
    auto same_logits = [&] {
      const float *lg = nullptr;
      REQUIRE(moe_get_logits(c, -1, &lg, nullptr) == MOE_STATUS_OK);
      int diff = 0;
      for (size_t v = 0; v < want.size(); ++v) diff += lg[v] != want[v];
      CHECK(diff == 0);
    };
    const int decoded = sweep(hook, [&] { return moe_decode(c, b); },
                              [&](moe_status) {
                                uint32_t used = 1;
                                CHECK(moe_kv_used_cells(c, &used) == MOE_STATUS_OK);
                                CHECK(used == 0);
                                const float *lg = nullptr;
                                CHECK(moe_get_logits(c, -1, &lg, nullptr) == MOE_STATUS_INVALID_ARGUMENT);
                              },
                              [&] { same_logits(); REQUIRE(moe_kv_clear(c) == MOE_STATUS_OK); });
    std::printf("%s, %s: %d failing allocations in context creation, %d in the first decode\n", device, hook_name(hook),
                created, decoded);
    CHECK(created > 0);
    if (hook == Hook::New) CHECK(decoded > 0);  // the plan of a new batch shape
    // On a GPU the host-buffer hook covers every cudaMalloc / cudaHostAlloc: weights, KV
    // cache, arenas, staging, and the executor's first-decode tables.
    if (hook == Hook::HostBuffer && std::strcmp(device, "cpu") != 0) CHECK(decoded > 0);
    same_logits();
    moe_batch_free(b);
    moe_context_free(c);
  }
}

}  // namespace

TEST_CASE("reliability: every allocation of a context creation and a first decode may fail; nothing changes and the retry "
          "gives the reference logits",
          "[reliability][fault]") {
  sweep_context_and_decode("cpu");
}

TEST_CASE("reliability: every CUDA allocation of a context creation and a first decode may fail; nothing changes and the "
          "retry gives the reference logits",
          "[reliability][fault][cuda]") {
  if (!has_discrete_gpu()) {
    WARN("no discrete GPU: skipped");
    return;
  }
  sweep_context_and_decode("cuda");
}
