/* The library never writes to stdout/stderr on its own: run load/decode/sample/error paths
 * with fds 1 and 2 redirected to a file and check the file stays empty; then install a log
 * callback and check messages arrive there instead (with a valid level). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "moeinfer/moeinfer.h"

static int g_msgs = 0, g_bad_level = 0;
static void on_log(int level, const char *msg, void *user) {
  (void)msg;
  (void)user;
  ++g_msgs;
  if (level < MOE_LOG_LEVEL_DEBUG || level > MOE_LOG_LEVEL_ERROR) g_bad_level = 1;
}

static void work(const char *path) {
  moe_model *m = NULL;
  moe_context *c = NULL;
  moe_batch *b = NULL;
  moe_sampler *s = NULL;
  int32_t toks[32], tok;
  size_t n = 0;
  moe_model_load("/nonexistent.gguf", NULL, &m);
  moe_model_load(path, NULL, &m);
  moe_context_create(m, NULL, &c);
  moe_tokenize(m, "hello there", 11, toks, 32, &n, MOE_TOKENIZE_ADD_SPECIAL);
  moe_batch_create(32, &b);
  moe_batch_add_sequence(b, toks, n, 0, 0, 1);
  moe_decode(c, b);
  moe_decode(c, NULL);
  moe_sampler_create(NULL, &s);
  moe_sampler_add_dist(s);
  moe_sampler_sample_context(s, c, -1, &tok);
  moe_sampler_free(s);
  moe_batch_free(b);
  moe_context_free(c);
  moe_model_free(m);
}

int main(int argc, char **argv) {
  char tmpl[] = "/tmp/moeinfer-silence-XXXXXX";
  int fd, saved1, saved2;
  off_t size;
  if (argc < 2) return 2;
  fd = mkstemp(tmpl);
  if (fd < 0) return 2;
  fflush(stdout);
  fflush(stderr);
  saved1 = dup(1);
  saved2 = dup(2);
  dup2(fd, 1);
  dup2(fd, 2);
  moe_set_log_callback(NULL, NULL);
  work(argv[1]);
  fflush(stdout);
  fflush(stderr);
  dup2(saved1, 1);
  dup2(saved2, 2);
  size = lseek(fd, 0, SEEK_END);
  close(fd);
  unlink(tmpl);
  printf("bytes written to stdout/stderr by the library: %ld\n", (long)size);

  moe_set_log_callback(on_log, NULL);
  work(argv[1]);
  moe_set_log_callback(NULL, NULL);
  printf("log callback messages: %d\n", g_msgs);
  return size == 0 && !g_bad_level ? 0 : 1;
}
