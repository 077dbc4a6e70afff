// Argument parsing shared by every subcommand: strict numbers with ranges and one error style.
//
// Every usage error reads "moeinfer-cli COMMAND: MESSAGE" on stderr and exits with status 2;
// runtime failures (a model that does not load, a full context) use the same prefix and
// status 1. The parse_* functions return false instead of exiting, so header-only parsers
// (placement_args.h) and tests can use them too.
#pragma once
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace cli {

// "moeinfer-cli generate": the prefix of every message; main() sets the command part.
inline std::string &program() {
  static std::string name = "moeinfer-cli";
  return name;
}

// Prints "PROGRAM: MESSAGE" and returns `status` (for `return cli::report(...)`).
inline int report(int status, const std::string &msg) {
  std::fprintf(stderr, "%s: %s\n", program().c_str(), msg.c_str());
  return status;
}

// A usage error: the message, then exit status 2.
[[noreturn]] inline void usage_error(const std::string &msg) {
  report(2, msg);
  std::exit(2);
}

// Strict base-10 integer: an optional '-', digits only (no spaces, no suffix, no wrap),
// within [lo, hi].
inline bool parse_int(const char *s, long long lo, long long hi, long long *out) {
  if (!s || !*s || !(std::isdigit(static_cast<unsigned char>(*s)) || (*s == '-' && s[1]))) return false;
  errno = 0;
  char *end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (errno == ERANGE || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Strict finite decimal number within [lo, hi] (no "nan", "inf", hex or trailing text).
inline bool parse_float(const char *s, double lo, double hi, double *out) {
  if (!s || !*s || std::strpbrk(s, "xXnNiI ")) return false;
  errno = 0;
  char *end = nullptr;
  const double v = std::strtod(s, &end);
  if (errno == ERANGE || *end || !std::isfinite(v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// "in 0..100", ">= 1": the range named in messages.
inline std::string range_text(long long lo, long long hi) {
  if (hi >= LLONG_MAX / 2) return ">= " + std::to_string(lo);
  return "in " + std::to_string(lo) + ".." + std::to_string(hi);
}

inline std::string int_error(const std::string &opt, const char *s, long long lo, long long hi) {
  return "option " + opt + ": '" + std::string(s ? s : "") + "' is not an integer " + range_text(lo, hi);
}

// Returns the value after argv[i] (advancing i) or exits with a usage error.
inline const char *value(int argc, char **argv, int &i) {
  if (i + 1 >= argc) usage_error(std::string("option ") + argv[i] + " needs a value");
  return argv[++i];
}

// The integer value of option `opt` within [lo, hi], or a usage error naming the range.
inline long long to_int(const char *s, const char *opt, long long lo = LONG_MIN, long long hi = LONG_MAX) {
  long long v = 0;
  if (!parse_int(s, lo, hi, &v)) usage_error(int_error(opt, s, lo, hi));
  return v;
}

// The number value of option `opt` within [lo, hi], or a usage error naming the range.
inline double to_float(const char *s, const char *opt, double lo, double hi) {
  double v = 0;
  if (!parse_float(s, lo, hi, &v)) {
    char range[64];
    std::snprintf(range, sizeof range, "%g..%g", lo, hi);
    usage_error(std::string("option ") + opt + ": '" + s + "' is not a number in " + range);
  }
  return v;
}

// A comma-separated list of integers within [lo, hi] ("1,2,3"); empty items are errors.
inline std::vector<long long> to_int_list(const char *s, const char *opt, long long lo, long long hi) {
  std::vector<long long> out;
  const std::string list = s;
  size_t p = 0;
  while (p <= list.size()) {
    const size_t q = std::min(list.find(',', p), list.size());
    const std::string item = list.substr(p, q - p);
    long long v = 0;
    if (!parse_int(item.c_str(), lo, hi, &v))
      usage_error("option " + std::string(opt) + ": '" + item + "' in '" + list + "' is not an integer " +
                  range_text(lo, hi));
    out.push_back(v);
    p = q + 1;
  }
  return out;
}

}  // namespace cli
