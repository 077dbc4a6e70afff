/* C ABI contract test (plain C99, linked against the shared library):
 * every public function gets NULL handles, wrong struct sizes and out-of-range arguments
 * and must return the documented status without crashing. With a model path argument it
 * also checks range errors on a live model/context, context-full, and that a wait with
 * timeout on a long asynchronous decode returns in time with the context still usable. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "moeinfer/moeinfer.h"

static int g_fail = 0;
static int g_checks = 0;

#define EXPECT(expr, want)                                                              \
  do {                                                                                  \
    moe_status got_ = (expr);                                                           \
    ++g_checks;                                                                         \
    if (got_ != (want)) {                                                               \
      fprintf(stderr, "%s:%d: %s -> %s (%d), want %s (%d); last error: %s\n", __FILE__, \
              __LINE__, #expr, moe_status_string(got_), (int)got_,                      \
              moe_status_string(want), (int)(want), moe_last_error());                  \
      g_fail = 1;                                                                       \
    }                                                                                   \
  } while (0)

#define TRUE_(cond)                                                          \
  do {                                                                       \
    ++g_checks;                                                              \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);    \
      g_fail = 1;                                                            \
    }                                                                        \
  } while (0)

/* EXPECT, and the last error names what was wrong (needle). */
#define EXPECT_MSG(expr, want, needle)                                                          \
  do {                                                                                          \
    EXPECT(expr, want);                                                                         \
    ++g_checks;                                                                                 \
    if (!strstr(moe_last_error(), (needle))) {                                                  \
      fprintf(stderr, "%s:%d: %s: last error \"%s\" does not mention \"%s\"\n", __FILE__, __LINE__, \
              #expr, moe_last_error(), (needle));                                               \
      g_fail = 1;                                                                               \
    }                                                                                           \
  } while (0)

#define BAD MOE_STATUS_INVALID_ARGUMENT

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int slow_abort(void *user) {
  /* Makes every graph segment take >= 20 ms so a decode is reliably "long". */
  struct timespec ts = {0, 20 * 1000 * 1000};
  int *calls = (int *)user;
  ++*calls;
  nanosleep(&ts, NULL);
  return 0;
}

static int cancel_load(float p, void *user) {
  (void)p;
  (void)user;
  return 0;
}

/* How often needle occurs in hay. */
static int count_of(const char *hay, const char *needle) {
  int n = 0;
  const size_t len = strlen(needle);
  while ((hay = strstr(hay, needle)) != NULL) {
    ++n;
    hay += len;
  }
  return n;
}

/* The placement fields of moe_model_params and moe_model_fit's argument checks; none of
 * these needs a model (every check comes before the file is opened). */
static void placement_params(void) {
  const float split_ok[2] = {3.0f, 1.0f};
  float split_bad[2] = {1.0f, -1.0f};
  const char *rules_null[2] = {"ffn_.*_exps=cpu", NULL};
  const char *budgets_null[1] = {NULL};
  moe_model *m = NULL;
  moe_fit_plan plan;
  moe_model_params mp = moe_model_default_params();

  /* defaults: the engine's PlacementParams */
  TRUE_(mp.struct_size == sizeof(moe_model_params));
  TRUE_(mp.cpu_moe == 0 && mp.n_cpu_moe == -1 && mp.n_gpu_layers == -1);
  TRUE_(mp.tensor_split == NULL && mp.n_tensor_split == 0);
  TRUE_(mp.tensor_overrides == NULL && mp.n_tensor_overrides == 0);
  TRUE_(mp.main_device == NULL && mp.allow_fallback == 0 && mp.zero_copy == -1);
  TRUE_(mp.fit == 0 && mp.fit_budgets == NULL && mp.n_fit_budgets == 0);
  TRUE_(mp.fit_margin == ((uint64_t)1 << 30));
  TRUE_(mp.fit_n_ctx == 4096 && mp.fit_n_ubatch == 512 && mp.fit_n_seq_max == 1);
  TRUE_(mp.fit_kv_type == MOE_KV_TYPE_F16 && mp.fit_shrink_ctx == 0);
#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
  /* The placement fields come after the first layout; nothing moved. */
  TRUE_(offsetof(moe_model_params, cpu_moe) == 64);
  TRUE_(sizeof(moe_model_params) == 184 && sizeof(moe_fit_plan) == 680);
#endif

  /* Bad placement arguments fail before the file is opened, naming the field. */
  mp.n_tensor_split = 2;
  EXPECT_MSG(moe_model_load("x.gguf", &mp, &m), BAD, "tensor_split is NULL");
  TRUE_(m == NULL);
  mp.tensor_split = split_bad;
  EXPECT_MSG(moe_model_load("x.gguf", &mp, &m), BAD, "tensor_split[1]");
  split_bad[1] = (float)NAN;
  EXPECT_MSG(moe_model_load("x.gguf", &mp, &m), BAD, "tensor_split[1]");
  mp.tensor_split = split_ok;
  mp.n_tensor_overrides = 1;
  EXPECT_MSG(moe_model_load("x.gguf", &mp, &m), BAD, "tensor_overrides is NULL");
  mp.tensor_overrides = rules_null;
  mp.n_tensor_overrides = 2;
  EXPECT_MSG(moe_model_load("x.gguf", &mp, &m), BAD, "tensor_overrides[1] is NULL");
  mp.n_tensor_overrides = 1;
  mp.n_fit_budgets = 1;
  EXPECT_MSG(moe_model_load("x.gguf", &mp, &m), BAD, "fit_budgets is NULL");
  mp.fit_budgets = budgets_null;
  EXPECT_MSG(moe_model_load("x.gguf", &mp, &m), BAD, "fit_budgets[0] is NULL");
  mp.n_fit_budgets = 0;
  mp.n_cpu_moe = -2;
  EXPECT_MSG(moe_model_load("x.gguf", &mp, &m), BAD, "n_cpu_moe -2");
  mp.n_cpu_moe = -1;
  mp.n_gpu_layers = -7;
  EXPECT_MSG(moe_model_load("x.gguf", &mp, &m), BAD, "n_gpu_layers -7");
  mp.n_gpu_layers = -1;
  mp.zero_copy = 2;
  EXPECT_MSG(moe_model_load("x.gguf", &mp, &m), BAD, "zero_copy 2");
  mp.zero_copy = -1;
  mp.fit_kv_type = 9;
  EXPECT_MSG(moe_model_load("x.gguf", &mp, &m), BAD, "fit_kv_type 9");
  mp.fit_kv_type = MOE_KV_TYPE_Q8_0;
  mp.fit_n_seq_max = 65;
  EXPECT_MSG(moe_model_load("x.gguf", &mp, &m), BAD, "fit_n_seq_max 65");
  mp.fit_n_seq_max = 0; /* 0 = default */
  /* The valid settings above pass the checks: the load gets as far as the file. */
  EXPECT(moe_model_load("/nonexistent/dir/x.gguf", &mp, &m), MOE_STATUS_IO_ERROR);
  TRUE_(m == NULL);

  /* A caller of the first layout (struct_size 64): whatever follows is never read. */
  mp.struct_size = offsetof(moe_model_params, cpu_moe);
  mp.n_tensor_split = 3;
  mp.tensor_split = NULL;
  mp.zero_copy = 9;
  mp.cpu_moe = 1;
  mp.n_cpu_moe = 2;
  EXPECT(moe_model_load("/nonexistent/dir/x.gguf", &mp, &m), MOE_STATUS_IO_ERROR);
  mp.struct_size = offsetof(moe_model_params, cpu_moe) - 4;
  EXPECT_MSG(moe_model_load("/nonexistent/dir/x.gguf", &mp, &m), BAD, "struct_size");

  /* moe_model_fit: out, path and params are checked like moe_model_load's */
  mp = moe_model_default_params();
  memset(&plan, 0, sizeof plan);
  EXPECT_MSG(moe_model_fit("x.gguf", &mp, NULL), BAD, "out is NULL");
  EXPECT_MSG(moe_model_fit("x.gguf", &mp, &plan), BAD, "struct_size 0"); /* out->struct_size unset */
  plan.struct_size = sizeof plan + 8;
  EXPECT(moe_model_fit("x.gguf", &mp, &plan), BAD);
  plan.struct_size = sizeof plan;
  EXPECT_MSG(moe_model_fit(NULL, &mp, &plan), BAD, "path is NULL");
  mp.struct_size = 0;
  EXPECT_MSG(moe_model_fit("x.gguf", &mp, &plan), BAD, "struct_size");
  mp.struct_size = sizeof mp;
  mp.n_tensor_split = 1;
  EXPECT_MSG(moe_model_fit("x.gguf", &mp, &plan), BAD, "moe_model_fit: n_tensor_split 1 but tensor_split is NULL");
  mp.n_tensor_split = 0;
  mp.tensor_overrides = rules_null + 1;
  mp.n_tensor_overrides = 1;
  EXPECT_MSG(moe_model_fit("x.gguf", &mp, &plan), BAD, "moe_model_fit: tensor_overrides[0] is NULL");
  mp.n_tensor_overrides = 0;
  /* Checks pass: the failure is now about the file (never OK, never a crash). */
  TRUE_(moe_model_fit("/nonexistent/dir/x.gguf", NULL, &plan) != MOE_STATUS_OK && moe_last_error()[0] != '\0');
}

/* Placement on a real model: results the engine decides (contradictions, the fit plan). */
static void placement_with_model(const char *path) {
  moe_model *m = NULL;
  moe_fit_plan plan;
  moe_model_params mp = moe_model_default_params();
  size_t k;

  /* Contradicting settings: an error that names both, no model. */
  mp.cpu_moe = 1;
  mp.n_cpu_moe = 2;
  EXPECT(moe_model_load(path, &mp, &m), BAD);
  TRUE_(m == NULL);
  moe_model_free(m);
  m = NULL;
  ++g_checks;
  if (count_of(moe_last_error(), "cpu_moe") + count_of(moe_last_error(), "cpu-moe") < 2) {
    fprintf(stderr, "%s:%d: conflict message \"%s\" does not name both cpu_moe and n_cpu_moe\n", __FILE__, __LINE__,
            moe_last_error());
    g_fail = 1;
  }
  /* cpu_moe alone: the experts on the CPU, which a CPU-only build has anyway. */
  mp.n_cpu_moe = -1;
  EXPECT(moe_model_load(path, &mp, &m), MOE_STATUS_OK);
  moe_model_free(m);
  m = NULL;

  /* The dry run. */
  memset(&plan, 0, sizeof plan);
  plan.struct_size = sizeof plan;
  EXPECT(moe_model_fit("/nonexistent/dir/x.gguf", NULL, &plan), MOE_STATUS_IO_ERROR);
  mp = moe_model_default_params();
  mp.fit = 1;
  EXPECT(moe_model_fit(path, &mp, &plan), MOE_STATUS_OK);
  TRUE_(plan.struct_size == sizeof plan);
  TRUE_(plan.n_devices >= 1 && plan.n_devices <= 8);
  TRUE_(plan.n_ctx > 0 && plan.n_ctx <= 4096);
  {
    uint64_t weights = 0;
    for (k = 0; k < plan.n_devices; ++k) {
      const moe_device_plan *d = &plan.devices[k];
      TRUE_(d->id[0] != '\0' && memchr(d->id, '\0', sizeof d->id) != NULL);
      TRUE_(d->total == d->weights + d->kv_cache + d->activations + d->workspace);
      TRUE_(d->budget == 0 || d->total <= d->budget);
      weights += d->weights;
    }
    TRUE_(weights > 0);
  }
}

static void null_handles(void) {
  char buf[16];
  size_t n = 7;
  int32_t tok = 0, st = 0;
  uint32_t cells = 0;
  const float *lg = NULL;
  moe_model *m = (moe_model *)&n; /* poison: must be overwritten with NULL on failure */
  moe_context *c = (moe_context *)&n;
  moe_batch *b = (moe_batch *)&n;
  moe_sampler *s = (moe_sampler *)&n;
  moe_model_info mi;
  moe_device_info di;
  moe_logit_bias lb = {0, 1.0f};
  float logits[4] = {0, 1, 2, 3};
  int32_t toks[2] = {1, 2};

  /* errors / version */
  TRUE_(strcmp(moe_status_string(MOE_STATUS_OK), "ok") == 0);
  TRUE_(strcmp(moe_status_string((moe_status)999), "unknown status") == 0);
  TRUE_(strcmp(moe_status_string((moe_status)-1), "unknown status") == 0);
  TRUE_(moe_abi_version() >= 1 && moe_abi_version() == MOE_ABI_VERSION);
  TRUE_(moe_version_string() != NULL && moe_version_string()[0] != '\0');
  moe_clear_last_error();
  TRUE_(moe_last_error() != NULL && moe_last_error()[0] == '\0');
  moe_set_log_callback(NULL, NULL);

  /* devices */
  EXPECT(moe_device_count(NULL), BAD);
  EXPECT(moe_device_count(&n), MOE_STATUS_OK);
  TRUE_(n >= 1);
  TRUE_(moe_last_error()[0] == '\0'); /* success leaves no message behind */
  EXPECT(moe_device_get_info(0, NULL), BAD);
  TRUE_(moe_last_error()[0] != '\0');
  memset(&di, 0, sizeof di);
  EXPECT(moe_device_get_info(0, &di), BAD); /* struct_size 0 */
  di.struct_size = sizeof di + 8;
  EXPECT(moe_device_get_info(0, &di), BAD);
  di.struct_size = sizeof di;
  EXPECT(moe_device_get_info(n, &di), BAD);
  EXPECT(moe_device_get_info((size_t)-1, &di), BAD);
  EXPECT(moe_device_get_info(0, &di), MOE_STATUS_OK);
  TRUE_(strcmp(di.id, "cpu") == 0 && di.kind == MOE_DEVICE_KIND_CPU && di.integrated == 1);

  /* model */
  {
    moe_model_params mp = moe_model_default_params();
    TRUE_(mp.struct_size == sizeof mp && mp.use_mmap == 1 && mp.vocab_only == 0);
    EXPECT(moe_model_load("x.gguf", NULL, NULL), BAD);
    EXPECT(moe_model_load(NULL, NULL, &m), BAD);
    TRUE_(m == NULL);
    mp.struct_size = 0;
    EXPECT(moe_model_load("x.gguf", &mp, &m), BAD);
    mp.struct_size = sizeof mp + 1;
    EXPECT(moe_model_load("x.gguf", &mp, &m), BAD);
    mp.struct_size = sizeof mp;
    mp.n_devices = 2; /* devices NULL */
    EXPECT(moe_model_load("x.gguf", &mp, &m), BAD);
    mp.n_devices = 0;
    mp.n_kv_overrides = 1;
    EXPECT(moe_model_load("x.gguf", &mp, &m), BAD);
    mp.n_kv_overrides = 0;
    EXPECT(moe_model_load("/nonexistent/dir/x.gguf", &mp, &m), MOE_STATUS_IO_ERROR);
    TRUE_(m == NULL);
  }
  moe_model_free(NULL);
  mi.struct_size = sizeof mi;
  EXPECT(moe_model_get_info(NULL, &mi), BAD);
  EXPECT(moe_model_meta_count(NULL, &n), BAD);
  EXPECT(moe_model_meta_key(NULL, 0, buf, sizeof buf, &n), BAD);
  EXPECT(moe_model_meta_value(NULL, "general.architecture", buf, sizeof buf, &n), BAD);
  TRUE_(moe_token_bos(NULL) == -1 && moe_token_eos(NULL) == -1 && moe_token_eot(NULL) == -1);
  TRUE_(moe_token_is_eog(NULL, 0) == 0);
  EXPECT(moe_tokenize(NULL, "a", 1, toks, 2, &n, 0), BAD);
  EXPECT(moe_token_to_piece(NULL, 0, buf, sizeof buf, &n, 0), BAD);
  EXPECT(moe_detokenize(NULL, toks, 2, buf, sizeof buf, &n, 0), BAD);
  {
    moe_detokenizer *d = (moe_detokenizer *)&n;
    const char *txt = NULL;
    EXPECT(moe_detokenizer_create(NULL, 0, &d), BAD);
    TRUE_(d == NULL);
    EXPECT(moe_detokenizer_create(NULL, 0, NULL), BAD);
    EXPECT(moe_detokenizer_push(NULL, 0, &txt, &n), BAD);
    TRUE_(txt != NULL && n == 0);
    EXPECT(moe_detokenizer_flush(NULL, &txt, &n), BAD);
    moe_detokenizer_free(NULL);
  }

  EXPECT(moe_model_set_cpu_weight_copy(NULL, 0), BAD);
  EXPECT(moe_context_set_gpu_graphs(NULL, 0), BAD);

  /* context */
  {
    moe_context_params cp = moe_context_default_params();
    TRUE_(cp.struct_size == sizeof cp && cp.n_batch == 512 && cp.n_seq_max == 1 && cp.kv_type == MOE_KV_TYPE_F16);
    TRUE_(cp.cpu_float_order == 0); /* GPU batches take the tensor cores unless asked */
    EXPECT(moe_context_create(NULL, &cp, &c), BAD);
    TRUE_(c == NULL);
    EXPECT(moe_context_create(NULL, &cp, NULL), BAD);
  }
  moe_context_free(NULL);
  TRUE_(moe_context_n_ctx(NULL) == 0 && moe_context_n_batch(NULL) == 0 && moe_context_n_ubatch(NULL) == 0 &&
        moe_context_n_vocab(NULL) == 0);
  EXPECT(moe_context_set_abort_callback(NULL, NULL, NULL), BAD);
  EXPECT(moe_context_check(NULL), BAD);

  /* batch */
  EXPECT(moe_batch_create(4, NULL), BAD);
  EXPECT(moe_batch_create(0, &b), BAD);
  TRUE_(b == NULL);
  EXPECT(moe_batch_create((size_t)1 << 40, &b), BAD);
  moe_batch_free(NULL);
  EXPECT(moe_batch_clear(NULL), BAD);
  EXPECT(moe_batch_add(NULL, 1, 0, 0, 1), BAD);
  EXPECT(moe_batch_add_sequence(NULL, toks, 2, 0, 0, 1), BAD);
  TRUE_(moe_batch_size(NULL) == 0);
  EXPECT(moe_batch_create(2, &b), MOE_STATUS_OK);
  EXPECT(moe_batch_add(b, -1, 0, 0, 1), BAD);
  EXPECT(moe_batch_add(b, 1, -1, 0, 1), BAD);
  EXPECT(moe_batch_add(b, 1, 0, -1, 1), BAD);
  EXPECT(moe_batch_add_sequence(b, NULL, 2, 0, 0, 1), BAD);
  EXPECT(moe_batch_add_sequence(b, toks, 3, 0, 0, 1), BAD); /* does not fit */
  EXPECT(moe_batch_add_sequence(b, toks, 2, 0x7fffffff, 0, 1), BAD);
  TRUE_(moe_batch_size(b) == 0);
  EXPECT(moe_batch_add_sequence(b, toks, 2, 0, 0, 1), MOE_STATUS_OK);
  EXPECT(moe_batch_add(b, 3, 2, 0, 1), BAD); /* full */
  TRUE_(moe_batch_size(b) == 2);
  EXPECT(moe_batch_clear(b), MOE_STATUS_OK);
  TRUE_(moe_batch_size(b) == 0);

  /* decode / async / logits / kv */
  EXPECT(moe_decode(NULL, b), BAD);
  EXPECT(moe_decode_submit(NULL, b), BAD);
  EXPECT(moe_decode_poll(NULL, &st), BAD);
  EXPECT(moe_decode_wait(NULL, 0), BAD);
  EXPECT(moe_decode_cancel(NULL), BAD);
  EXPECT(moe_get_logits(NULL, 0, &lg, NULL), BAD);
  EXPECT(moe_get_logits(NULL, 0, NULL, NULL), BAD);
  EXPECT(moe_kv_clear(NULL), BAD);
  EXPECT(moe_kv_seq_rm(NULL, 0, 0, -1), BAD);
  EXPECT(moe_kv_seq_cp(NULL, 0, 1, 0, -1), BAD);
  EXPECT(moe_kv_seq_keep(NULL, 0), BAD);
  EXPECT(moe_kv_seq_pos_max(NULL, 0, &tok), BAD);
  EXPECT(moe_kv_used_cells(NULL, &cells), BAD);

  /* sampler */
  {
    moe_sampler_params sp = moe_sampler_default_params();
    TRUE_(sp.struct_size == sizeof sp);
    EXPECT(moe_sampler_create(&sp, NULL), BAD);
    sp.struct_size = 3;
    EXPECT(moe_sampler_create(&sp, &s), BAD);
    TRUE_(s == NULL);
    sp.struct_size = sizeof sp + 16;
    EXPECT(moe_sampler_create(&sp, &s), BAD);
  }
  moe_sampler_free(NULL);
  EXPECT(moe_sampler_add_greedy(NULL), BAD);
  EXPECT(moe_sampler_add_dist(NULL), BAD);
  EXPECT(moe_sampler_add_temperature(NULL, 1.0f), BAD);
  EXPECT(moe_sampler_add_top_k(NULL, 4), BAD);
  EXPECT(moe_sampler_add_top_p(NULL, 0.9f, 1), BAD);
  EXPECT(moe_sampler_add_min_p(NULL, 0.1f, 1), BAD);
  EXPECT(moe_sampler_add_typical(NULL, 0.9f, 1), BAD);
  EXPECT(moe_sampler_add_penalties(NULL, 64, 1.1f, 0.0f, 0.0f), BAD);
  EXPECT(moe_sampler_add_logit_bias(NULL, &lb, 1), BAD);
  EXPECT(moe_sampler_sample(NULL, logits, 4, &tok), BAD);
  EXPECT(moe_sampler_sample_context(NULL, NULL, 0, &tok), BAD);
  EXPECT(moe_sampler_accept(NULL, 1), BAD);
  EXPECT(moe_sampler_reset(NULL), BAD);
  EXPECT(moe_sampler_set_seed(NULL, 1), BAD);

  EXPECT(moe_sampler_create(NULL, &s), MOE_STATUS_OK);
  EXPECT(moe_sampler_add_top_p(s, 0.0f, 1), BAD);
  EXPECT(moe_sampler_add_top_p(s, -1.0f, 1), BAD);
  EXPECT(moe_sampler_add_min_p(s, 1.5f, 1), BAD);
  EXPECT(moe_sampler_add_typical(s, 0.0f, 1), BAD);
  EXPECT(moe_sampler_add_penalties(s, -2, 1.1f, 0.0f, 0.0f), BAD);
  EXPECT(moe_sampler_add_penalties(s, 64, 0.0f, 0.0f, 0.0f), BAD);
  lb.token = -3;
  EXPECT(moe_sampler_add_logit_bias(s, &lb, 1), BAD);
  EXPECT(moe_sampler_add_logit_bias(s, NULL, 1), BAD);
  EXPECT(moe_sampler_add_greedy(s), MOE_STATUS_OK);
  EXPECT(moe_sampler_sample(s, NULL, 4, &tok), BAD);
  EXPECT(moe_sampler_sample(s, logits, 0, &tok), BAD);
  EXPECT(moe_sampler_sample(s, logits, -5, &tok), BAD);
  EXPECT(moe_sampler_sample(s, logits, 4, NULL), BAD);
  EXPECT(moe_sampler_sample(s, logits, 4, &tok), MOE_STATUS_OK);
  TRUE_(tok == 3);
  EXPECT(moe_sampler_sample_context(s, NULL, 0, &tok), BAD);
  EXPECT(moe_sampler_accept(s, -1), BAD);
  moe_sampler_free(s);
  moe_batch_free(b);
}

/* What a binary built against the first header declares (48 bytes on 64-bit targets). */
typedef struct old_context_params {
  size_t struct_size;
  uint32_t n_ctx;
  uint32_t n_batch;
  uint32_t n_ubatch;
  uint32_t n_seq_max;
  int32_t kv_type;
  int32_t n_threads;
  const char *device;
  int32_t flash_attn;
} old_context_params;

static void with_model(const char *path) {
  moe_model *m = NULL;
  moe_context *c = NULL;
  moe_batch *b = NULL;
  moe_model_info mi;
  moe_model_params mp = moe_model_default_params();
  moe_context_params cp = moe_context_default_params();
  char buf[256];
  size_t n = 0;
  int32_t toks[64], st = 0, pos = 0;
  const float *lg = NULL;
  int32_t nv = 0;
  int calls = 0;
  double t0, dt;
  int i;

  mp.progress = cancel_load;
  EXPECT(moe_model_load(path, &mp, &m), MOE_STATUS_ABORTED);
  TRUE_(m == NULL);
  mp.progress = NULL;
  {
    /* metadata overrides are applied before anything reads the metadata */
    const char *ov[1] = {"general.name=str:overridden"};
    const char *bad_ov[1] = {"general.name"};
    mp.kv_overrides = bad_ov;
    mp.n_kv_overrides = 1;
    EXPECT(moe_model_load(path, &mp, &m), MOE_STATUS_INVALID_GGUF);
    TRUE_(m == NULL);
    mp.kv_overrides = ov;
    EXPECT(moe_model_load(path, &mp, &m), MOE_STATUS_OK);
    EXPECT(moe_model_meta_value(m, "general.name", buf, sizeof buf, &n), MOE_STATUS_OK);
    TRUE_(strcmp(buf, "overridden") == 0);
    moe_model_free(m);
    m = NULL;
    mp.kv_overrides = NULL;
    mp.n_kv_overrides = 0;
  }
  {
    /* A caller of the first layout (struct_size 64) loads as before: the placement fields
     * after it (here contradicting, to be sure) are never read. */
    moe_model_params v1 = mp;
    v1.struct_size = offsetof(moe_model_params, cpu_moe);
    v1.cpu_moe = 1;
    v1.n_cpu_moe = 2;
    v1.n_tensor_split = 4;
    EXPECT(moe_model_load(path, &v1, &m), MOE_STATUS_OK);
    moe_model_free(m);
    m = NULL;
  }
  EXPECT(moe_model_load(path, &mp, &m), MOE_STATUS_OK);
  if (!m) return;

  memset(&mi, 0, sizeof mi);
  EXPECT(moe_model_get_info(m, &mi), BAD);
  mi.struct_size = sizeof mi;
  EXPECT(moe_model_get_info(m, &mi), MOE_STATUS_OK);
  TRUE_(mi.n_vocab > 0 && mi.n_layer > 0 && mi.arch[0] != '\0');
  EXPECT(moe_model_meta_count(m, NULL), BAD);
  EXPECT(moe_model_meta_count(m, &n), MOE_STATUS_OK);
  EXPECT(moe_model_meta_key(m, n, buf, sizeof buf, &n), BAD);
  EXPECT(moe_model_meta_value(m, "no.such.key", buf, sizeof buf, &n), BAD);
  EXPECT(moe_model_meta_value(m, "general.architecture", NULL, 0, &n), MOE_STATUS_BUFFER_TOO_SMALL);
  TRUE_(n == strlen(mi.arch));
  EXPECT(moe_model_meta_value(m, "general.architecture", buf, n, &n), MOE_STATUS_BUFFER_TOO_SMALL);
  EXPECT(moe_model_meta_value(m, "general.architecture", buf, n + 1, &n), MOE_STATUS_OK);
  TRUE_(strcmp(buf, mi.arch) == 0);

  /* tokenizer: size query, too small, exact */
  EXPECT(moe_tokenize(m, "hello world hello", 17, NULL, 0, &n, 0), MOE_STATUS_BUFFER_TOO_SMALL);
  TRUE_(n > 0);
  if (n > 1) EXPECT(moe_tokenize(m, "hello world hello", 17, toks, n - 1, &n, 0), MOE_STATUS_BUFFER_TOO_SMALL);
  EXPECT(moe_tokenize(m, "hello world hello", 17, toks, 64, &n, 0), MOE_STATUS_OK);
  EXPECT(moe_tokenize(m, "x", 1, toks, 64, &n, 0x80), BAD);
  EXPECT(moe_tokenize(m, NULL, 3, toks, 64, &n, 0), BAD);
  EXPECT(moe_token_to_piece(m, -1, buf, sizeof buf, &n, 0), BAD);
  EXPECT(moe_token_to_piece(m, mi.n_vocab, buf, sizeof buf, &n, 0), BAD);
  EXPECT(moe_detokenize(m, toks, 1, NULL, 0, &n, 0), MOE_STATUS_BUFFER_TOO_SMALL);
  {
    /* streaming detokenizer: same text as moe_detokenize, pieces concatenated */
    moe_detokenizer *d = NULL;
    const char *txt = NULL;
    char whole[256], streamed[256] = "";
    size_t nt = 0, k;
    EXPECT(moe_tokenize(m, "h\xc3\xa9llo w\xc3\xb6rld \xe2\x82\xac", 17, toks, 64, &nt, 0), MOE_STATUS_OK);
    EXPECT(moe_detokenize(m, toks, nt, whole, sizeof whole, &n, 0), MOE_STATUS_OK);
    EXPECT(moe_detokenizer_create(m, 0x10, &d), BAD);
    EXPECT(moe_detokenizer_create(m, 0, &d), MOE_STATUS_OK);
    EXPECT(moe_detokenizer_push(d, -1, &txt, &n), BAD);
    EXPECT(moe_detokenizer_push(d, mi.n_vocab, &txt, &n), BAD);
    EXPECT(moe_detokenizer_push(d, 0, NULL, &n), BAD);
    for (k = 0; k < nt; ++k) {
      EXPECT(moe_detokenizer_push(d, toks[k], &txt, &n), MOE_STATUS_OK);
      strncat(streamed, txt, n);
    }
    EXPECT(moe_detokenizer_flush(d, &txt, &n), MOE_STATUS_OK);
    strncat(streamed, txt, n);
    TRUE_(strcmp(streamed, whole) == 0);
    TRUE_(strcmp(whole, "h\xc3\xa9llo w\xc3\xb6rld \xe2\x82\xac") == 0);
    moe_detokenizer_free(d);
  }
  toks[0] = mi.n_vocab + 5;
  EXPECT(moe_detokenize(m, toks, 1, buf, sizeof buf, &n, 0), BAD);

  /* context params */
  cp.struct_size = 8;
  EXPECT(moe_context_create(m, &cp, &c), BAD);
  cp = moe_context_default_params();
  cp.kv_type = 9;
  EXPECT(moe_context_create(m, &cp, &c), BAD);
  cp.kv_type = MOE_KV_TYPE_F32;
  cp.n_seq_max = 65;
  EXPECT(moe_context_create(m, &cp, &c), BAD);
  cp.n_seq_max = 2;
  cp.n_threads = -3;
  EXPECT(moe_context_create(m, &cp, &c), BAD);
  cp.n_threads = 2;
  cp.n_ctx = 64;
  cp.n_batch = 32;
  cp.n_ubatch = 32;
  EXPECT(moe_model_set_cpu_weight_copy(m, 0), MOE_STATUS_OK); /* before the first CPU context */
  EXPECT(moe_model_set_cpu_weight_copy(m, 1), MOE_STATUS_OK);
  {
    /* A caller built against the first layout: its struct is 48 bytes, the last 4 tail
     * padding that may hold anything. The library must never read them as cpu_float_order. */
    old_context_params v1;
    moe_context_params v2 = cp;
    memset(&v1, 0xFF, sizeof v1);
    v1.struct_size = sizeof v1;
    v1.n_ctx = cp.n_ctx;
    v1.n_batch = cp.n_batch;
    v1.n_ubatch = cp.n_ubatch;
    v1.n_seq_max = cp.n_seq_max;
    v1.kv_type = cp.kv_type;
    v1.n_threads = cp.n_threads;
    v1.device = "cpu";
    v1.flash_attn = 1;
    TRUE_(sizeof v1 == MOE_CONTEXT_PARAMS_SIZE_V1);
    TRUE_(((const unsigned char *)&v1)[offsetof(moe_context_params, cpu_float_order)] == 0xFF);
    EXPECT(moe_context_create(m, (const moe_context_params *)&v1, &c), MOE_STATUS_OK);
    TRUE_(moe_context_cpu_float_order(c) == 0);
    moe_context_free(c);
    c = NULL;
    /* The second layout reads the flag. */
    v2.cpu_float_order = 1;
    EXPECT(moe_context_create(m, &v2, &c), MOE_STATUS_OK);
    TRUE_(moe_context_cpu_float_order(c) == 1);
    moe_context_free(c);
    c = NULL;
    /* A size between the layouts is no layout. */
    v2.struct_size = MOE_CONTEXT_PARAMS_SIZE_V1 + 4;
    EXPECT_MSG(moe_context_create(m, &v2, &c), BAD, "struct_size");
  }
  EXPECT(moe_context_create(m, &cp, &c), MOE_STATUS_OK);
  if (!c) {
    moe_model_free(m);
    return;
  }
  TRUE_(moe_context_n_ctx(c) == 64 && moe_context_n_batch(c) == 32);
  nv = moe_context_n_vocab(c);
  TRUE_(nv == mi.n_vocab);
  EXPECT(moe_context_check(c), MOE_STATUS_OK);
  EXPECT(moe_context_set_gpu_graphs(c, 0), MOE_STATUS_OK); /* no effect on a CPU context */
  EXPECT(moe_context_set_gpu_graphs(c, 1), MOE_STATUS_OK);

  EXPECT(moe_batch_create(64, &b), MOE_STATUS_OK);
  EXPECT(moe_decode(c, b), BAD); /* empty */
  EXPECT(moe_decode_submit(c, b), BAD);
  for (i = 0; i < 40; ++i) moe_batch_add(b, i % nv, i, 0, i == 39);
  EXPECT(moe_decode(c, b), BAD); /* 40 > n_batch 32 */
  moe_batch_clear(b);
  moe_batch_add(b, nv, 0, 0, 1); /* token out of range */
  EXPECT(moe_decode(c, b), BAD);
  moe_batch_clear(b);
  moe_batch_add(b, 1, 0, 5, 1); /* seq >= n_seq_max */
  EXPECT(moe_decode(c, b), BAD);
  EXPECT(moe_decode_wait(c, 0), BAD); /* nothing submitted */
  EXPECT(moe_decode_poll(c, NULL), BAD);
  EXPECT(moe_decode_poll(c, &st), MOE_STATUS_OK);
  TRUE_(st == MOE_ASYNC_IDLE);
  EXPECT(moe_decode_cancel(c), MOE_STATUS_OK); /* idle: no-op */

  /* fill the context: 2 x 32 = 64 cells, then one more must be CONTEXT_FULL */
  for (pos = 0; pos < 64; pos += 32) {
    moe_batch_clear(b);
    for (i = 0; i < 32; ++i) moe_batch_add(b, (pos + i) % nv, pos + i, 0, i == 31);
    EXPECT(moe_decode(c, b), MOE_STATUS_OK);
  }
  EXPECT(moe_get_logits(c, -1, &lg, &nv), MOE_STATUS_OK);
  TRUE_(lg != NULL);
  EXPECT(moe_get_logits(c, 5, &lg, NULL), BAD); /* entry 5 asked for no logits */
  moe_batch_clear(b);
  moe_batch_add(b, 1, 64, 0, 1);
  EXPECT(moe_decode(c, b), MOE_STATUS_CONTEXT_FULL);
  {
    uint32_t cells = 0;
    EXPECT(moe_kv_used_cells(c, &cells), MOE_STATUS_OK);
    TRUE_(cells == 64); /* nothing was evicted */
  }
  EXPECT(moe_kv_seq_pos_max(c, 0, &pos), MOE_STATUS_OK);
  TRUE_(pos == 63);
  EXPECT(moe_kv_seq_pos_max(c, 7, &pos), BAD);
  EXPECT(moe_kv_seq_cp(c, 0, 2, 0, -1), BAD);
  EXPECT(moe_kv_seq_keep(c, -1), BAD);
  EXPECT(moe_kv_seq_rm(c, 0, 32, -1), MOE_STATUS_OK);
  moe_kv_clear(c);

  /* async: a long decode (20 ms per graph segment) and a short wait */
  EXPECT(moe_context_set_abort_callback(c, slow_abort, &calls), MOE_STATUS_OK);
  moe_batch_clear(b);
  for (i = 0; i < 16; ++i) moe_batch_add(b, i % nv, i, 0, i == 15);
  EXPECT(moe_decode_submit(c, b), MOE_STATUS_OK);
  EXPECT(moe_decode_submit(c, b), MOE_STATUS_BUSY);
  EXPECT(moe_decode(c, b), MOE_STATUS_BUSY);
  EXPECT(moe_kv_clear(c), MOE_STATUS_BUSY);
  EXPECT(moe_get_logits(c, -1, &lg, NULL), MOE_STATUS_BUSY);
  EXPECT(moe_context_set_abort_callback(c, NULL, NULL), MOE_STATUS_BUSY);
  t0 = now_ms();
  EXPECT(moe_decode_wait(c, 5), MOE_STATUS_TIMEOUT);
  dt = now_ms() - t0;
  printf("wait(5 ms) on a long decode returned after %.2f ms\n", dt);
  TRUE_(dt < 5 + 45); /* returns in time: < one 20 ms segment + slack past the deadline */
  EXPECT(moe_decode_poll(c, &st), MOE_STATUS_OK);
  TRUE_(st == MOE_ASYNC_RUNNING);
  EXPECT(moe_decode_wait(c, -1), MOE_STATUS_OK);
  TRUE_(calls > 0);
  EXPECT(moe_get_logits(c, -1, &lg, NULL), MOE_STATUS_OK);
  EXPECT(moe_decode_poll(c, &st), MOE_STATUS_OK);
  TRUE_(st == MOE_ASYNC_IDLE);

  /* cancel: the decode stops at the next segment boundary and the cache is unchanged */
  moe_batch_clear(b);
  for (i = 0; i < 8; ++i) moe_batch_add(b, i % nv, 16 + i, 0, i == 7);
  EXPECT(moe_decode_submit(c, b), MOE_STATUS_OK);
  EXPECT(moe_decode_wait(c, 1), MOE_STATUS_TIMEOUT);
  EXPECT(moe_decode_cancel(c), MOE_STATUS_OK);
  t0 = now_ms();
  EXPECT(moe_decode_wait(c, 1000), MOE_STATUS_ABORTED);
  printf("cancel took effect after %.2f ms\n", now_ms() - t0);
  EXPECT(moe_kv_seq_pos_max(c, 0, &pos), MOE_STATUS_OK);
  TRUE_(pos == 15);
  EXPECT(moe_context_check(c), MOE_STATUS_OK);
  EXPECT(moe_context_set_abort_callback(c, NULL, NULL), MOE_STATUS_OK);
  EXPECT(moe_decode(c, b), MOE_STATUS_OK); /* still usable */
  EXPECT(moe_kv_seq_pos_max(c, 0, &pos), MOE_STATUS_OK);
  TRUE_(pos == 23);

  /* free with a decode in flight: cancelled and joined, no crash */
  EXPECT(moe_context_set_abort_callback(c, slow_abort, &calls), MOE_STATUS_OK);
  moe_batch_clear(b);
  moe_batch_add(b, 1, 24, 0, 1);
  EXPECT(moe_decode_submit(c, b), MOE_STATUS_OK);
  moe_model_free(m); /* the context keeps the model alive */
  moe_context_free(c);
  moe_batch_free(b);
}

/* What a binary built against the first header (64-byte moe_model_params) declares. */
typedef struct old_model_params {
  size_t struct_size;
  const char *const *devices;
  size_t n_devices;
  const char *const *kv_overrides;
  size_t n_kv_overrides;
  moe_progress_callback progress;
  void *progress_user_data;
  int32_t use_mmap;
  int32_t vocab_only;
} old_model_params;
/* Last in this file: from here on the name is the unversioned symbol such a binary calls. */
#undef moe_model_default_params
old_model_params moe_model_default_params(void);
#undef moe_context_default_params
old_context_params moe_context_default_params(void);

/* An old binary's moe_model_default_params: the 64-byte layout with the same defaults, and
 * nothing written past it. */
static void first_layout_defaults(void) {
  struct {
    old_model_params p;
    unsigned char canary[256];
  } box;
  size_t k;
  int intact = 1;
#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
  TRUE_(sizeof(old_model_params) == 64);
#endif
  TRUE_(sizeof(old_model_params) == offsetof(moe_model_params, cpu_moe));
  TRUE_(offsetof(moe_model_params, vocab_only) == offsetof(old_model_params, vocab_only));
  memset(box.canary, 0xA5, sizeof box.canary);
  box.p = moe_model_default_params();
  for (k = 0; k < sizeof box.canary; ++k) intact &= box.canary[k] == 0xA5;
  TRUE_(intact);
  TRUE_(box.p.struct_size == sizeof(old_model_params) && box.p.use_mmap == 1 && box.p.vocab_only == 0);
  TRUE_(box.p.devices == NULL && box.p.n_devices == 0 && box.p.progress == NULL);
  {
    struct {
      old_context_params p;
      unsigned char canary[256];
    } cbox;
    memset(cbox.canary, 0xA5, sizeof cbox.canary);
    cbox.p = moe_context_default_params();
    intact = 1;
    for (k = 0; k < sizeof cbox.canary; ++k) intact &= cbox.canary[k] == 0xA5;
    TRUE_(intact);
    TRUE_(cbox.p.struct_size == MOE_CONTEXT_PARAMS_SIZE_V1 && cbox.p.n_batch == 512 && cbox.p.n_seq_max == 1);
  }
}

int main(int argc, char **argv) {
  null_handles();
  placement_params();
  first_layout_defaults();
  if (argc > 2 && strcmp(argv[1], "--placement") == 0) placement_with_model(argv[2]);
  else if (argc > 1) with_model(argv[1]);
  printf("%d checks, %s\n", g_checks, g_fail ? "FAILED" : "all passed");
  return g_fail;
}
