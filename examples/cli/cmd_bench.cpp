// TEMPORARY placeholder until the owning work lands.
#include <cstdio>
#include "cli/commands.h"
int cmd_bench(int, char **) { std::fprintf(stderr, "moeinfer-cli bench: not built yet\n"); return 2; }
