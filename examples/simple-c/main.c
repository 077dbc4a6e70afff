/* simple-c: a complete greedy generation loop in plain C over the moeinfer C ABI.
 *   moeinfer-simple-c MODEL.gguf ["prompt"] [n_predict]
 * Loads the model, tokenizes the prompt, decodes it, then samples greedily one token at
 * a time, printing each token's text as soon as it is complete (streaming detokenizer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeinfer/moeinfer.h"

/* Print the failing call with the library's message and leave. */
#define CHECK(call)                                                             \
  do {                                                                          \
    moe_status st_ = (call);                                                    \
    if (st_ != MOE_STATUS_OK) {                                                 \
      fprintf(stderr, "error: %s -> %s: %s\n", #call, moe_status_string(st_),   \
              moe_last_error());                                                \
      goto done;                                                                \
    }                                                                           \
  } while (0)

static void on_log(int level, const char *msg, void *user) {
  (void)user;
  if (level >= MOE_LOG_LEVEL_WARN) fprintf(stderr, "[moeinfer] %s\n", msg);
}

int main(int argc, char **argv) {
  const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
  int n_predict = argc > 3 ? atoi(argv[3]) : 32;
  moe_model *model = NULL;
  moe_context *ctx = NULL;
  moe_batch *batch = NULL;
  moe_sampler *sampler = NULL;
  moe_detokenizer *detok = NULL;
  const char *text = NULL;
  int32_t *tokens = NULL;
  size_t n_tokens = 0, len = 0, cap = 0;
  int32_t pos = 0, tok = 0;
  int i, rc = 1;
  moe_context_params cparams;

  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf [prompt] [n_predict]\n", argv[0]);
    return 2;
  }
  moe_set_log_callback(on_log, NULL);
  printf("moeinfer %s (ABI %u)\n", moe_version_string(), (unsigned)moe_abi_version());

  CHECK(moe_model_load(argv[1], NULL, &model));

  /* Tokenize: first ask for the size, then fill a buffer of exactly that size. */
  if (moe_tokenize(model, prompt, strlen(prompt), NULL, 0, &n_tokens, MOE_TOKENIZE_ADD_SPECIAL) !=
      MOE_STATUS_BUFFER_TOO_SMALL) {
    fprintf(stderr, "error: tokenize: %s\n", moe_last_error());
    goto done;
  }
  tokens = (int32_t *)malloc(n_tokens * sizeof *tokens);
  if (!tokens) goto done;
  CHECK(moe_tokenize(model, prompt, strlen(prompt), tokens, n_tokens, &n_tokens, MOE_TOKENIZE_ADD_SPECIAL));

  cparams = moe_context_default_params();
  cparams.n_ctx = (uint32_t)(n_tokens + (size_t)n_predict + 8);
  CHECK(moe_context_create(model, &cparams, &ctx));

  cap = n_tokens > 1 ? n_tokens : 1;
  CHECK(moe_batch_create(cap, &batch));
  CHECK(moe_batch_add_sequence(batch, tokens, n_tokens, 0, 0, 1));
  pos = (int32_t)n_tokens;

  CHECK(moe_sampler_create(NULL, &sampler));
  CHECK(moe_sampler_add_greedy(sampler));
  CHECK(moe_detokenizer_create(model, 0, &detok));

  printf("%s", prompt);
  for (i = 0; i < n_predict; ++i) {
    moe_status st = moe_decode(ctx, batch);
    if (st == MOE_STATUS_CONTEXT_FULL) {
      printf("\n[context full]\n");
      break;
    }
    CHECK(st);
    CHECK(moe_sampler_sample_context(sampler, ctx, -1, &tok));
    if (moe_token_is_eog(model, tok)) break;
    /* Stream: print what this token completes (a character split across tokens waits). */
    CHECK(moe_detokenizer_push(detok, tok, &text, &len));
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    CHECK(moe_batch_clear(batch));
    CHECK(moe_batch_add(batch, tok, pos++, 0, 1));
  }
  CHECK(moe_detokenizer_flush(detok, &text, &len));
  fwrite(text, 1, len, stdout);
  printf("\n");
  rc = 0;

done:
  moe_detokenizer_free(detok);
  moe_sampler_free(sampler);
  moe_batch_free(batch);
  moe_context_free(ctx);
  moe_model_free(model);
  free(tokens);
  return rc;
}
