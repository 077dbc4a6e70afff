// TEMPORARY placeholder until the owning work lands.
#include <cstdio>
#include "cli/commands.h"
int cmd_generate(int, char **) { std::fprintf(stderr, "moeinfer-cli generate: not built yet\n"); return 2; }
