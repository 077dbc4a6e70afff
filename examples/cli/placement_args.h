// Placement flags of generate, bench and info: the reference engine's spellings mapped onto
// moe::PlacementParams (src/engine/engine.h). Parsed here once for every subcommand:
//
//   cli::PlacementArgs pl;
//   for (int i = 1; i < argc; ++i) {
//     if (const int r = pl.take(argc, argv, i)) { if (r < 0) return pl.fail("generate"); }
//     else if (...)                                   // the subcommand's own flags
//   }
//   pl.set_fit_context(n_ctx, n_ubatch, kv);          // the context the fit leaves room for
//   mp.placement = pl.params;
//
// Header-only (no exits, errors come back as text in args.h's style) so tests/cli_smoke can check the parsing
// without a model.
#pragma once
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/args.h"
#include "engine/engine.h"

namespace cli {

// The flags' help lines (the hidden test flag --twin-device is not listed).
inline const char *placement_help() {
  return "placement (where the weights live; the reference engine's flags):\n"
         "  -cmoe, --cpu-moe        routed experts of every layer on the CPU\n"
         "  -ncmoe, --n-cpu-moe N   routed experts of the first N layers on the CPU\n"
         "  -ngl, --n-gpu-layers N  the last N layers on GPUs, the rest on the CPU (default: all)\n"
         "  -ts, --tensor-split L   layer share per GPU, comma or slash separated (3,1 or 3/1)\n"
         "  -ot, --override-tensor REGEX=DEV[,REGEX=DEV..]\n"
         "                          tensors whose name matches REGEX on DEV; first match wins (repeatable)\n"
         "  -mg, --main-device DEV  device of the output head (a number N means cudaN)\n"
         "  --allow-fallback        an op a device cannot run may run on the CPU instead of failing\n"
         "  --zero-copy, --no-zero-copy\n"
         "                          GPU weights read in place from host memory (default: integrated GPUs only)\n"
         "  -fit, --fit [on|off]    choose the unset values above so every device fits its budget\n"
         "  --fit-budget DEV=BYTES  budget of DEV, suffix K/M/G/T (repeatable; default: free memory - margin)\n"
         "  --fit-margin BYTES      kept free per GPU whose budget is its free memory (default 1G)\n"
         "  -fitt, --fit-target MIB the same in MiB (the reference engine's spelling)\n"
         "  --fit-shrink-ctx        the fit may lower the context size when nothing else fits\n"
         "  device names as in --device (cpu, cuda0), any case (CUDA0 works)\n";
}

// "10G", "512M", "1.5GiB", "4096" -> bytes (binary multiples). False when not a size.
inline bool parse_bytes(const std::string &s, uint64_t *out) {
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.')) return false;
  errno = 0;
  char *end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno || end == s.c_str()) return false;
  std::string unit(end);
  for (char &c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  double mult = 1.0;
  if (unit == "" || unit == "B") mult = 1.0;
  else if (unit == "K") mult = 1024.0;
  else if (unit == "M") mult = 1024.0 * 1024.0;
  else if (unit == "G") mult = 1024.0 * 1024.0 * 1024.0;
  else if (unit == "T") mult = 1024.0 * 1024.0 * 1024.0 * 1024.0;
  else return false;
  const double bytes = std::floor(v * mult);
  if (!std::isfinite(bytes) || bytes < 0.0 || bytes >= 18446744073709551616.0) return false;
  *out = static_cast<uint64_t>(bytes);
  return true;
}

// Device names as the library spells them: lower case; a bare index N means cudaN (-mg 1).
inline std::string device_name(std::string s) {
  for (char &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) s = "cuda" + s;
  return s;
}

struct PlacementArgs {
  moe::PlacementParams params;
  bool given = false;  // any placement flag seen (twin device excluded)
  std::string error;   // why take() returned -1

  // When argv[i] is a placement flag: consumes it and its value (advancing i) and returns 1,
  // or -1 with `error` set for a bad or missing value. 0: not a placement flag.
  int take(int argc, char **argv, int &i) {
    const std::string a = argv[i];
    const char *v = nullptr;
    auto need = [&]() {
      if (i + 1 >= argc) {
        error = "option " + a + " needs a value";
        return false;
      }
      v = argv[++i];
      return true;
    };
    auto integer = [&](long long lo, long long *out) {
      constexpr long long kMax = 1000000;  // layers, MiB: far above any real model
      if (!need()) return false;
      if (!parse_int(v, lo, kMax, out)) {
        error = int_error(a, v, lo, kMax);
        return false;
      }
      return true;
    };
    long long n = 0;
    if (a == "--twin-device") {  // tests: a second instance of one device (hidden)
      if (!need()) return -1;
      params.twin_device = device_name(v);
      return 1;
    }
    given = true;
    if (a == "-cmoe" || a == "--cpu-moe") {
      params.cpu_moe = true;
    } else if (a == "-ncmoe" || a == "--n-cpu-moe") {
      if (!integer(0, &n)) return -1;
      params.n_cpu_moe = static_cast<int>(n);
    } else if (a == "-ngl" || a == "--n-gpu-layers" || a == "--gpu-layers") {
      if (!integer(-1, &n)) return -1;
      params.n_gpu_layers = static_cast<int>(n);
    } else if (a == "-ts" || a == "--tensor-split") {
      if (!need() || !split_list(v)) return -1;
    } else if (a == "-ot" || a == "--override-tensor") {
      if (!need() || !override_rules(v)) return -1;
    } else if (a == "-mg" || a == "--main-device") {
      if (!need()) return -1;
      params.main_device = device_name(v);
    } else if (a == "--allow-fallback") {
      params.allow_fallback = true;
    } else if (a == "--zero-copy") {
      params.zero_copy = 1;
    } else if (a == "--no-zero-copy") {
      params.zero_copy = 0;
    } else if (a == "-fit" || a == "--fit") {
      params.fit = true;  // an "on" / "off" after it is its value (the reference's -fit on)
      if (i + 1 < argc && (!std::strcmp(argv[i + 1], "on") || !std::strcmp(argv[i + 1], "off")))
        params.fit = !std::strcmp(argv[++i], "on");
    } else if (a == "--fit-budget") {
      if (!need()) return -1;
      const std::string s = v;
      const size_t eq = s.rfind('=');
      uint64_t bytes = 0;
      if (eq == std::string::npos || eq == 0 || !parse_bytes(s.substr(eq + 1), &bytes)) {
        error = "option --fit-budget: '" + s + "' is not DEVICE=BYTES (e.g. cuda0=10G)";
        return -1;
      }
      params.budgets.push_back(device_name(s.substr(0, eq)) + "=" + std::to_string(bytes));
    } else if (a == "--fit-margin") {
      if (!need()) return -1;
      if (!parse_bytes(v, &params.fit_margin)) {
        error = "option --fit-margin: '" + std::string(v) + "' is not a size (e.g. 512M)";
        return -1;
      }
    } else if (a == "-fitt" || a == "--fit-target") {
      if (!integer(0, &n)) return -1;
      params.fit_margin = static_cast<uint64_t>(n) << 20;
    } else if (a == "--fit-shrink-ctx") {
      params.fit_shrink_ctx = true;
    } else {
      given = false;
      return 0;
    }
    return 1;
  }

  // The context the fit must leave room for: the subcommand's own settings (0 keeps the
  // default of PlacementParams).
  void set_fit_context(uint32_t n_ctx, uint32_t n_ubatch, moe::KvType kv) {
    if (n_ctx) params.fit_n_ctx = n_ctx;
    if (n_ubatch) params.fit_n_ubatch = n_ubatch;
    params.fit_kv_type = static_cast<int>(kv);
  }

  // Prints the error in the common style (args.h) and returns the usage-error exit code.
  int fail(const char * /*cmd: named by cli::program()*/) const { return report(2, error); }

private:
  // "3,1" or "3/1": one non-negative share per GPU.
  bool split_list(const std::string &s) {
    std::vector<float> out;
    size_t p = 0;
    while (p <= s.size()) {
      const size_t q = std::min(s.find_first_of(",/", p), s.size());
      const std::string item = s.substr(p, q - p);
      double x = 0.0;
      if (!parse_float(item.c_str(), 0.0, 1e6, &x)) {
        error = "option -ts: '" + s + "' is not a list of shares >= 0 (e.g. 3,1)";
        return false;
      }
      out.push_back(static_cast<float>(x));
      p = q + 1;
    }
    params.tensor_split = out;
    return true;
  }

  // One or more REGEX=DEVICE rules separated by commas, as the reference splits them; a
  // piece without '=' was a comma inside the regex ("blk\.[0-9]{1,2}\.ffn=cpu") and joins
  // the next one. The device is what follows the last '='.
  bool override_rules(const std::string &s) {
    std::vector<std::string> rules;
    std::string pending;
    size_t p = 0;
    while (p <= s.size()) {
      const size_t q = std::min(s.find(',', p), s.size());
      pending += s.substr(p, q - p);
      if (pending.find('=') != std::string::npos) {
        rules.push_back(pending);
        pending.clear();
      } else if (q < s.size()) {
        pending += ',';
      }
      p = q + 1;
    }
    if (!pending.empty() || rules.empty()) {
      error = "option -ot: '" + s + "' is not REGEX=DEVICE[,REGEX=DEVICE...]";
      return false;
    }
    for (const std::string &r : rules) {
      const size_t eq = r.rfind('=');
      if (eq == 0 || eq + 1 == r.size()) {
        error = "option -ot: rule '" + r + "' needs a regex and a device (REGEX=DEVICE)";
        return false;
      }
      params.overrides.push_back(r.substr(0, eq + 1) + device_name(r.substr(eq + 1)));
    }
    return true;
  }
};

}  // namespace cli
