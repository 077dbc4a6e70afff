// TEMPORARY placeholder until the owning work lands.
#include <cstdio>
#include "cli/commands.h"
int cmd_info(int, char **) { std::fprintf(stderr, "moeinfer-cli info: not built yet\n"); return 2; }
