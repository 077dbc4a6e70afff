/* Consumer check: version queries, then (given a model) a short greedy generation. */
#include <stdio.h>
#include <string.h>

#include <moeinfer/moeinfer.h>

#define TRY(call)                                                                    \
  do {                                                                               \
    moe_status s_ = (call);                                                          \
    if (s_ != MOE_STATUS_OK) {                                                       \
      fprintf(stderr, "%s: %s (%s)\n", #call, moe_status_string(s_), moe_last_error()); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

int main(int argc, char **argv) {
  moe_model *model = NULL;
  moe_context *ctx = NULL;
  moe_batch *batch = NULL;
  moe_sampler *smp = NULL;
  int32_t toks[64];
  size_t n = 0;
  int32_t pos, tok, i;
  char piece[64];
  size_t len;

  printf("moeinfer %s, ABI %u\n", moe_version_string(), (unsigned)moe_abi_version());
  if (moe_abi_version() != MOE_ABI_VERSION) return 1;
  if (argc < 2) return 0;

  TRY(moe_model_load(argv[1], NULL, &model));
  TRY(moe_context_create(model, NULL, &ctx));
  TRY(moe_tokenize(model, "Hello", 5, toks, 64, &n, MOE_TOKENIZE_ADD_SPECIAL));
  TRY(moe_batch_create(64, &batch));
  TRY(moe_batch_add_sequence(batch, toks, n, 0, 0, 1));
  TRY(moe_sampler_create(NULL, &smp));
  TRY(moe_sampler_add_greedy(smp));
  pos = (int32_t)n;
  printf("generated:");
  for (i = 0; i < 8; ++i) {
    TRY(moe_decode(ctx, batch));
    TRY(moe_sampler_sample_context(smp, ctx, -1, &tok));
    TRY(moe_token_to_piece(model, tok, piece, sizeof piece, &len, 0));
    printf(" %d", tok);
    TRY(moe_batch_clear(batch));
    TRY(moe_batch_add(batch, tok, pos++, 0, 1));
  }
  printf("\n");
  moe_sampler_free(smp);
  moe_batch_free(batch);
  moe_context_free(ctx);
  moe_model_free(model);
  return 0;
}
