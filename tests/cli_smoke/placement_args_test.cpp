// The placement flags of moeinfer-cli (examples/cli/placement_args.h) parsed into
// moe::PlacementParams: spellings, list and rule syntax, sizes, errors. No model needed.
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "cli/placement_args.h"

static int g_fail = 0;
// One line per failed expectation; the exit status says whether any failed.
static void expect(bool ok, const char *what, int line) {
  if (ok) return;
  std::fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, line, what);
  g_fail = 1;
}
#define CHECK(cond) expect(static_cast<bool>(cond), #cond, __LINE__)

namespace {

// Feeds a whole command line to PlacementArgs::take; returns the first non-1 result (0 for a
// flag it does not know, -1 for an error) or 1 when it took everything.
int parse(cli::PlacementArgs &pa, std::initializer_list<const char *> args) {
  std::vector<std::string> store = {"cmd"};
  for (const char *a : args) store.emplace_back(a);
  std::vector<char *> argv;
  for (std::string &s : store) argv.push_back(&s[0]);
  const int argc = static_cast<int>(argv.size());
  for (int i = 1; i < argc; ++i) {
    const int r = pa.take(argc, argv.data(), i);
    if (r != 1) return r;
  }
  return 1;
}

}  // namespace

int main() {
  {
    cli::PlacementArgs pa;
    CHECK(parse(pa, {"--cpu-moe", "-ncmoe", "3", "-ngl", "99", "--allow-fallback", "--zero-copy"}) == 1);
    CHECK(pa.given && pa.params.cpu_moe && pa.params.n_cpu_moe == 3 && pa.params.n_gpu_layers == 99);
    CHECK(pa.params.allow_fallback && pa.params.zero_copy == 1);
    CHECK(parse(pa, {"-cmoe", "--n-cpu-moe", "0", "--gpu-layers", "-1", "--no-zero-copy"}) == 1);
    CHECK(pa.params.n_cpu_moe == 0 && pa.params.n_gpu_layers == -1 && pa.params.zero_copy == 0);
    CHECK(parse(pa, {"--n-gpu-layers", "7"}) == 1 && pa.params.n_gpu_layers == 7);
  }
  {
    // Defaults untouched by flags that were not given; not-mine leaves i alone.
    cli::PlacementArgs pa;
    CHECK(parse(pa, {"-m", "x.gguf"}) == 0);
    CHECK(!pa.given && !pa.params.cpu_moe && pa.params.n_cpu_moe == -1 && pa.params.n_gpu_layers == -1);
    CHECK(pa.params.tensor_split.empty() && pa.params.overrides.empty() && !pa.params.fit);
  }
  {
    // -ts: comma or slash separated shares.
    cli::PlacementArgs pa;
    CHECK(parse(pa, {"-ts", "3/1"}) == 1);
    CHECK(pa.params.tensor_split == std::vector<float>({3.0f, 1.0f}));
    CHECK(parse(pa, {"--tensor-split", "0.5,0.25,0.25"}) == 1);
    CHECK(pa.params.tensor_split == std::vector<float>({0.5f, 0.25f, 0.25f}));
    for (const char *bad : {"3,,1", "3,", "-1,1", "a/b", ""}) {
      cli::PlacementArgs e;
      CHECK(parse(e, {"-ts", bad}) == -1 && e.error.find("-ts") != std::string::npos);
    }
  }
  {
    // -ot: repeatable, several rules per value, commas inside a regex, device names lowered.
    cli::PlacementArgs pa;
    CHECK(parse(pa, {"-ot", "blk\\.[0-9]{1,2}\\.ffn_.*_exps=CPU,output=CUDA0", "--override-tensor", "token_embd=cpu"}) == 1);
    CHECK(pa.params.overrides.size() == 3);
    if (pa.params.overrides.size() == 3) {
      CHECK(pa.params.overrides[0] == "blk\\.[0-9]{1,2}\\.ffn_.*_exps=cpu");
      CHECK(pa.params.overrides[1] == "output=cuda0");
      CHECK(pa.params.overrides[2] == "token_embd=cpu");
    }
    for (const char *bad : {"blk\\.0\\.", "=cpu", "ffn=", "a=cpu,b", ""}) {
      cli::PlacementArgs e;
      CHECK(parse(e, {"-ot", bad}) == -1 && e.error.find("-ot") != std::string::npos);
    }
  }
  {
    // -mg: a name, or a bare index meaning cudaN.
    cli::PlacementArgs pa;
    CHECK(parse(pa, {"-mg", "1"}) == 1 && pa.params.main_device == "cuda1");
    CHECK(parse(pa, {"--main-device", "CPU"}) == 1 && pa.params.main_device == "cpu");
  }
  {
    // --fit alone, -fit on/off (the reference's spelling), budgets and margins.
    cli::PlacementArgs pa;
    CHECK(parse(pa, {"--fit", "--fit-shrink-ctx"}) == 1 && pa.params.fit && pa.params.fit_shrink_ctx);
    CHECK(parse(pa, {"-fit", "off"}) == 1 && !pa.params.fit);
    CHECK(parse(pa, {"-fit", "on"}) == 1 && pa.params.fit);
    CHECK(parse(pa, {"--fit-budget", "CUDA0=10G", "--fit-budget", "cpu=1.5GiB"}) == 1);
    CHECK(pa.params.budgets == std::vector<std::string>({"cuda0=10737418240", "cpu=1610612736"}));
    CHECK(parse(pa, {"--fit-margin", "512M"}) == 1 && pa.params.fit_margin == (512ull << 20));
    CHECK(parse(pa, {"-fitt", "256"}) == 1 && pa.params.fit_margin == (256ull << 20));
    for (const char *bad : {"cuda0", "=1G", "cuda0=", "cuda0=ten", "cuda0=1X"}) {
      cli::PlacementArgs e;
      CHECK(parse(e, {"--fit-budget", bad}) == -1 && e.error.find("DEVICE=BYTES") != std::string::npos);
    }
  }
  {
    // Sizes.
    uint64_t b = 0;
    CHECK(cli::parse_bytes("4096", &b) && b == 4096);
    CHECK(cli::parse_bytes("1k", &b) && b == 1024);
    CHECK(cli::parse_bytes("2KiB", &b) && b == 2048);
    CHECK(cli::parse_bytes("1.5G", &b) && b == (3ull << 29));
    CHECK(cli::parse_bytes("1T", &b) && b == (1ull << 40));
    for (const char *bad : {"", "G", "-1", "1Q", "1GG", "1e30T"}) CHECK(!cli::parse_bytes(bad, &b));
  }
  {
    // Errors: a missing or bad value says which option.
    cli::PlacementArgs pa;
    CHECK(parse(pa, {"-ngl"}) == -1 && pa.error == "option -ngl needs a value");
    CHECK(parse(pa, {"-ncmoe", "x"}) == -1 && pa.error.find("-ncmoe") != std::string::npos);
    CHECK(parse(pa, {"-ncmoe", "-1"}) == -1);
    CHECK(parse(pa, {"-ngl", "-2"}) == -1);
    CHECK(parse(pa, {"--fit-margin", "lots"}) == -1 && pa.error.find("--fit-margin") != std::string::npos);
  }
  {
    // The hidden test flag, and the fit's context from the subcommand's settings.
    cli::PlacementArgs pa;
    CHECK(parse(pa, {"--twin-device", "CPU"}) == 1 && pa.params.twin_device == "cpu" && !pa.given);
    pa.set_fit_context(0, 0, moe::KvType::Q8_0);
    CHECK(pa.params.fit_n_ctx == 4096 && pa.params.fit_n_ubatch == 512 && pa.params.fit_kv_type == 2);
    pa.set_fit_context(1024, 256, moe::KvType::F32);
    CHECK(pa.params.fit_n_ctx == 1024 && pa.params.fit_n_ubatch == 256 && pa.params.fit_kv_type == 0);
  }
  std::printf("%s\n", g_fail ? "FAILED" : "all passed");
  return g_fail;
}
