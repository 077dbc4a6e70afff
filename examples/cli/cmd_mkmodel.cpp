// TEMPORARY placeholder until the owning work lands.
#include <cstdio>
#include "cli/commands.h"
int cmd_mkmodel(int, char **) { std::fprintf(stderr, "moeinfer-cli mkmodel: not built yet\n"); return 2; }
