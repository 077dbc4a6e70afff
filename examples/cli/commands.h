// moeinfer-cli subcommands: each lives in cmd_<name>.cpp and returns the process exit code.
#pragma once

int cmd_info(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
