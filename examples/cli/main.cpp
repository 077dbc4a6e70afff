// moeinfer-cli: command-line front end of the library (see --help).
#include <cstdio>
#include <cstring>

#include "cli/args.h"
#include "cli/commands.h"

namespace {
struct Command {
  const char *name;
  int (*fn)(int, char **);
  const char *summary;
};
const Command kCommands[] = {
    {"chat", cmd_chat, "interactive chat with the model's chat template (stdin: one message per line)"},
    {"generate", cmd_generate, "run a model on a prompt and print the continuation (--json: per-step logits)"},
    {"tokenize", cmd_tokenize, "tokenize stdin: plain text or JSON lines ({\"text\",\"add_special\",\"parse_special\"})"},
    {"info", cmd_info, "print architecture, hyperparameters, tensor types and the memory plan (--fit: the placement fit)"},
    {"bench", cmd_bench, "measure prompt (pp) and generation (tg) tokens/s, llama-bench style"},
    {"mkmodel", cmd_mkmodel, "write a GGUF with random weights and the shapes of a real model"},
};

void usage(FILE *out) {
  std::fprintf(out, "usage: moeinfer-cli COMMAND [options]   (COMMAND --help for its options)\n\ncommands:\n");
  for (const auto &c : kCommands) std::fprintf(out, "  %-9s %s\n", c.name, c.summary);
  std::fprintf(out, "\nWith no command, runs `generate` on a built-in demo model (random weights).\n");
}
}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) return cmd_generate(argc, argv);  // demo: generation on the built-in model
  if (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) { usage(stdout); return 0; }
  for (const auto &c : kCommands)
    if (!std::strcmp(argv[1], c.name)) {
      cli::program() = std::string("moeinfer-cli ") + c.name;  // the prefix of its messages
      return c.fn(argc - 1, argv + 1);
    }
  std::fprintf(stderr, "moeinfer-cli: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
