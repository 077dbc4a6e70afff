// TEMPORARY placeholder until the owning work lands.
#include <cstdio>
#include "cli/commands.h"
int cmd_tokenize(int, char **) { std::fprintf(stderr, "moeinfer-cli tokenize: not built yet\n"); return 2; }
