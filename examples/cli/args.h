// Minimal argument parsing shared by the subcommands.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace cli {

// Returns the value after argv[i] (advancing i) or exits with a usage error.
inline const char *value(int argc, char **argv, int &i) {
  if (i + 1 >= argc) {
    std::fprintf(stderr, "option %s needs a value\n", argv[i]);
    std::exit(2);
  }
  return argv[++i];
}

inline long to_int(const char *s, const char *opt) {
  char *end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!*s || *end) {
    std::fprintf(stderr, "option %s: '%s' is not an integer\n", opt, s);
    std::exit(2);
  }
  return v;
}

inline double to_float(const char *s, const char *opt) {
  char *end = nullptr;
  double v = std::strtod(s, &end);
  if (!*s || *end) {
    std::fprintf(stderr, "option %s: '%s' is not a number\n", opt, s);
    std::exit(2);
  }
  return v;
}

}  // namespace cli
