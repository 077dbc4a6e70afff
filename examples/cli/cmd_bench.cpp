// moeinfer-cli bench: prompt processing (pp) and generation (tg) throughput, reported with
// llama-bench's test names ("pp512", "tg128", "pp512 @ d4096") and markdown columns so the two
// tools' results can be laid side by side. Each test: warm-up runs (>= 1, >= 0.3 s), then -r timed runs,
// each starting from an empty KV cache (refilled with DEPTH tokens first, untimed).
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/placement_args.h"
#include "core/step_profile.h"
#include "core/status.h"
#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "memory/memory_report.h"

using namespace moe;

namespace {

void usage(FILE *out) {
  std::fprintf(out,
               "usage: moeinfer-cli bench -m FILE [options]\n"
               "  -m, --model FILE     GGUF model\n"
               "  -p N[,N..]           prompt tokens per pp test, 0..1048576 (default 512; 0 = no pp test)\n"
               "  -n N[,N..]           generated tokens per tg test, 0..1048576 (default 128; 0 = no tg test)\n"
               "  -d N[,N..]           depth: tokens already in the KV cache before the test (default 0)\n"
               "  -np, --parallel B[,B..]  aggregate decode of B sequences at once: each gets its own prompt of\n"
               "                       -p tokens, then -n steps decode one token of every sequence (t/s: all of them)\n"
               "  -b N                 tokens per decode() call (default 2048)\n"
               "  -ub N                tokens per graph run (default 512)\n"
               "  -r N                 timed repetitions after >= 0.3 s of warm-up runs, >= 1 (default 5)\n"
               "  --device DEV         cpu | cuda | cuda0 | auto (default auto)\n"
               "  -t, --threads N      CPU threads 0..1024; 0 = physical cores (default)\n"
               "  --kv-type TYPE       f32 | f16 | q8_0 (default f16)\n"
               "  -fa 0|1              flash attention (default 1)\n"
               "  --no-mmap            read weights into memory instead of mapping the file\n"
               "  --no-gpu-graphs      run GPU steps eagerly instead of replaying a captured CUDA graph\n"
               "  --cpu-order          GPU: batches of 2..128 tokens in the CPU's float order (slower prompts)\n"
               "  --no-weight-copy     CPU: read the mapped file pages in place (default: one copy in huge pages)\n"
               "  --override-kv K=T:V  metadata override, e.g. tokenizer.ggml.pre=str:gpt2 (repeatable)\n"
               "  --seed S             seed of the random prompt tokens (default 1)\n"
               "  -o md|json           output format (default md)\n"
               "  --help-dev           GPU tuning switches for kernel development\n");
  std::fputs(cli::placement_help(), out);
}

// Switches that select alternative GPU kernels or launch settings, for measuring them.
void usage_dev(FILE *out) {
  std::fprintf(out,
               "GPU tuning switches of moeinfer-cli bench (defaults are the fastest measured settings):\n"
               "  --stream-min-tokens N  CPU-resident weights + a GPU: ubatches of >= N tokens copy them to the GPU and\n"
               "                       multiply there (default -1 = auto, 0 = never)\n"
               "  --direct-expert-slots N  experts on the CPU + a GPU: N of each token's routed experts run on the GPU,\n"
               "                       read over the bus, in one-token steps (default 0 = off)\n"
               "  --no-pdl             kernels wait for the previous one to finish before they start\n"
               "                       (no programmatic dependent launch)\n"
               "  --no-fusion          every graph node in its own kernel (no fused groups)\n"
               "  --cpu-order-head     the LM head in the CPU's float order\n"
               "  --no-lean-groups     one-token mat-vec groups in 16-warp blocks\n"
               "  --no-lean-rows       a lone one-token mat-vec (o-proj) of 2..3 blocks per SM in 16-warp blocks\n"
               "  --no-mcol-tc         few-column Q4_K products (2..15 sequences) on the dp4a kernel, not the tensor cores\n"
               "  --no-mcol-tc-q6k     few-column Q6_K products on the dp4a kernel, not the tensor cores\n"
               "  --no-mcol-swiglu     a few tokens' MoE gate, up and SwiGLU in three launches, not one\n"
               "  --no-mcol-shared-rounding  a few columns' q / k / v with an activation rounding launch each\n"
               "  --no-mcol-add        a few columns' product + residual add (attention output) in two launches, not one\n"
               "  --no-combine-add     the MoE combine of 2+ tokens and the residual add in two launches, not one\n"
               "  --no-seqs-decode-attn  several sequences' one-token steps: attention without per-sequence cell lists\n"
               "  --mcol-max-entries N Q4_K MoE products of < N routed entries on the few-column tensor-core kernel\n"
               "                       instead of the GEMM (default 0: 8 per expert)\n"
               "  --no-delta-norm      the gated DeltaNet's output norm in its own launch, not in the DeltaNet kernel\n"
               "  --skip-launches P[|P..]  timing what-if (wrong results): launches whose profile label contains a\n"
               "                       pattern (or equals one written =LABEL) are left out, e.g. '=fused:rms_norm+mul|attention T=1'\n"
               "  --decode-split R,C   decode attention: at most R cell ranges of >= C cells (default 32,64)\n"
               "  --mla-split-cells N  MLA attention: at least N cells per split (default 64; one split: no merge)\n"
               "  --tc-decode-attn     decode attention on the tensor cores (F16 cache, head size 128 / 256; default off)\n"
               "  --prefill-attn-blocks N  prefill attention: split cells until ~N blocks per SM (default 2)\n"
               "  --blas-min-tokens N  dense quantized products of >= N tokens on cuBLAS over f16 weights (default 128,\n"
               "                       0: no cuBLAS at all, routers included)\n");
}

// "512,1024": every item an integer in [lo, hi].
std::vector<int> int_list(const char *s, const char *opt, long long lo, long long hi) {
  std::vector<int> v;
  for (long long x : cli::to_int_list(s, opt, lo, hi)) v.push_back(static_cast<int>(x));
  return v;
}

// Peak resident set of this process (VmHWM), bytes; 0 where /proc is unavailable.
uint64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.compare(0, 6, "VmHWM:") == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024ull;
  return 0;
}

// The decode roofline: tokens/s if every weight byte a token reads came at the measured read
// rate of the device holding most of the weights (the GPU when one is used).
struct Roofline {
  std::string device;
  double bytes_per_token = 0, bandwidth = 0;  // bytes, bytes/s (0: not measured)
  double tokens_per_s() const { return bytes_per_token > 0 && bandwidth > 0 ? bandwidth / bytes_per_token : 0; }
};

Roofline decode_roofline(const Model &model, const MemoryReport &mem) {
  Roofline r;
  r.bytes_per_token = double(model.decode_read_bytes());
  uint64_t most = 0;
  for (const auto &d : mem.devices)
    if (d.weights > most) { most = d.weights; r.device = d.device; }
  for (const auto &d : mem.devices)  // a GPU context keeps a CPU copy too: the GPU reads the weights
    if (d.device.compare(0, 4, "cuda") == 0 && d.weights > 0) { r.device = d.device; break; }
  BackendRegistry reg;
  if (Backend *b = reg.find(r.device)) r.bandwidth = b->read_bandwidth();
  return r;
}

const char *ftype_name(uint32_t ft) {
  switch (ft) {
    case 0: return "all F32";
    case 1: return "F16";
    case 2: return "Q4_0";
    case 7: return "Q8_0";
    case 15: return "Q4_K - Medium";
    case 17: return "Q5_K - Medium";
    case 18: return "Q6_K";
    case 32: return "BF16";
    case 38: return "MXFP4 MoE";
    default: return "?";
  }
}

struct Test {
  int n_prompt = 0, n_gen = 0, depth = 0;
  int n_seq = 0;  // --parallel: sequences decoding together (each a prompt of depth tokens first)
  std::string name() const {
    std::string s = n_prompt ? "pp" + std::to_string(n_prompt) : "tg" + std::to_string(n_gen);
    if (n_seq) s += " x" + std::to_string(n_seq);
    if (depth) s += " @ d" + std::to_string(depth);
    return s;
  }
  // Tokens a timed run produces: every sequence's, for the aggregate rate.
  int tokens() const { return (n_prompt ? n_prompt : n_gen) * (n_seq ? n_seq : 1); }
  std::vector<double> samples_ns;
  double mean_ts = 0, sd_ts = 0, mean_ns = 0, sd_ns = 0;
};

struct Runner {
  Context &ctx;
  std::mt19937 rng;
  int32_t n_vocab;
  uint32_t n_batch;
  int32_t random_token() { return static_cast<int32_t>(rng() % uint32_t(n_vocab)); }

  // n tokens from position pos0 in decode() calls of n_batch; logits for the last token of
  // each call (what llama-bench's llama_batch_get_one asks for).
  void prompt(int32_t pos0, int n, int32_t seq = 0) {
    std::vector<BatchToken> batch;
    for (int done = 0; done < n;) {
      int k = std::min<int>(int(n_batch), n - done);
      batch.clear();
      for (int j = 0; j < k; ++j)
        batch.push_back({random_token(), pos0 + done + j, seq, j == k - 1});
      ctx.decode(batch.data(), batch.size());
      done += k;
    }
  }
  void generate(int32_t pos0, int n) {
    for (int j = 0; j < n; ++j) {
      BatchToken t{random_token(), pos0 + j, 0, true};
      ctx.decode(&t, 1);
    }
  }
  // n_seq sequences, each its own random prompt of depth tokens (not timed), then n_gen
  // steps of one batch holding a token of every sequence (timed): the aggregate decode rate
  // of many users, as the reference's batched bench measures it.
  double run_parallel(const Test &t) {
    ctx.kv_clear();
    for (int s = 0; s < t.n_seq; ++s) prompt(0, t.depth, s);
    std::vector<BatchToken> batch(static_cast<size_t>(t.n_seq));
    auto t0 = std::chrono::steady_clock::now();
    for (int j = 0; j < t.n_gen; ++j) {
      for (int s = 0; s < t.n_seq; ++s) batch[static_cast<size_t>(s)] = {random_token(), t.depth + j, s, true};
      ctx.decode(batch.data(), batch.size());
    }
    (void)ctx.logits(-1);
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
  // One run of a test; returns the timed nanoseconds (depth fill excluded).
  double run(const Test &t) {
    if (t.n_seq) return run_parallel(t);
    ctx.kv_clear();
    if (t.depth) prompt(0, t.depth);
    auto t0 = std::chrono::steady_clock::now();
    if (t.n_prompt) prompt(t.depth, t.n_prompt);
    else generate(t.depth, t.n_gen);
    (void)ctx.logits(-1);  // results are ready when decode returns; touch them anyway
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
};

void stats(Test &t) {
  const int n_tok = t.tokens();
  std::vector<double> ts;
  for (double ns : t.samples_ns) ts.push_back(1e9 * n_tok / ns);
  auto mean_sd = [](const std::vector<double> &v, double &mean, double &sd) {
    mean = 0;
    for (double x : v) mean += x / double(v.size());
    sd = 0;
    if (v.size() > 1) {
      for (double x : v) sd += (x - mean) * (x - mean);
      sd = std::sqrt(sd / double(v.size() - 1));
    }
  };
  mean_sd(ts, t.mean_ts, t.sd_ts);
  mean_sd(t.samples_ns, t.mean_ns, t.sd_ns);
}

}  // namespace

int cmd_bench(int argc, char **argv) {
  constexpr long long kMaxTokens = 1 << 20;  // prompt, generation and depth lengths
  constexpr double kMinWarmupNs = 300e6;  // warm-up wall time before the timed runs
  constexpr int kMaxWarmupRuns = 20;
  std::string model_path, device = "auto", format = "md";
  std::vector<int> ps = {512}, ns = {128}, ds = {0}, parallel;
  int n_batch = 2048, n_ubatch = 512, reps = 5, threads = 0;
  unsigned seed = 1;
  bool fa = true, mmap = true, gpu_graphs = true, weight_copy = true, cpu_order = false;
  int stream_min = -1;
  int direct_slots = 0;
  GpuTuning tuning;  // --help-dev switches: this context's (and its fit's) GPU options
  KvType kv = KvType::F16;
  std::vector<std::string> overrides;
  cli::PlacementArgs placement;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() { return cli::value(argc, argv, i); };
    if (const int r = placement.take(argc, argv, i)) { if (r < 0) return placement.fail("bench"); }
    else if (a == "-m" || a == "--model") model_path = val();
    else if (a == "-p" || a == "--n-prompt") ps = int_list(val(), "-p", 0, kMaxTokens);
    else if (a == "-n" || a == "--n-gen") ns = int_list(val(), "-n", 0, kMaxTokens);
    else if (a == "-d" || a == "--n-depth") ds = int_list(val(), "-d", 0, kMaxTokens);
    else if (a == "-np" || a == "--parallel") parallel = int_list(val(), "--parallel", 1, kMaxSequences);
    else if (a == "-b" || a == "--batch-size") n_batch = int(cli::to_int(val(), "-b", 1, kMaxBatchTokens));
    else if (a == "-ub" || a == "--ubatch-size") n_ubatch = int(cli::to_int(val(), "-ub", 1, kMaxUbatchTokens));
    else if (a == "-r" || a == "--repetitions") reps = int(cli::to_int(val(), "-r", 1, 1000000));
    else if (a == "--device") device = cli::device_name(val());
    else if (a == "-t" || a == "--threads") threads = int(cli::to_int(val(), "--threads", 0, kMaxThreads));
    else if (a == "-fa" || a == "--flash-attn") fa = cli::to_int(val(), "-fa", 0, 1) != 0;
    else if (a == "--no-mmap") mmap = false;
    else if (a == "--no-gpu-graphs") gpu_graphs = false;
    else if (a == "--cpu-order") cpu_order = true;
    else if (a == "--stream-min-tokens") stream_min = int(cli::to_int(val(), "--stream-min-tokens", -1, kMaxTokens));
    else if (a == "--direct-expert-slots") direct_slots = int(cli::to_int(val(), "--direct-expert-slots", 0, 64));
    else if (a == "--no-pdl") tuning.dependent_launch = false;
    else if (a == "--no-fusion") tuning.fusion = false;
    else if (a == "--no-delta-norm") tuning.delta_norm = false;
    else if (a == "--cpu-order-head") tuning.own_order_head = false;
    else if (a == "--no-lean-groups") tuning.lean_groups = false;
    else if (a == "--no-lean-rows") tuning.lean_rows = false;
    else if (a == "--no-mcol-tc") tuning.mcol_tensor_cores = false;
    else if (a == "--no-mcol-tc-q6k") tuning.mcol_tensor_cores_q6k = false;
    else if (a == "--no-mcol-swiglu") tuning.mcol_swiglu = false;
    else if (a == "--no-mcol-shared-rounding") tuning.mcol_shared_rounding = false;
    else if (a == "--no-mcol-add") tuning.mcol_add = false;
    else if (a == "--no-combine-add") tuning.combine_add = false;
    else if (a == "--no-seqs-decode-attn") tuning.seqs_decode_attention = false;
    else if (a == "--mcol-max-entries") tuning.mcol_max_entries = static_cast<int>(cli::to_int(val(), "--mcol-max-entries", 0, 1 << 20));
    else if (a == "--skip-launches") tuning.skip_launches = val();
    else if (a == "--tc-decode-attn") tuning.tc_decode_attention = true;
    else if (a == "--mla-split-cells") tuning.mla_split_cells = int(cli::to_int(val(), "--mla-split-cells", 1, kMaxTokens));
    else if (a == "--decode-split") {
      const std::vector<int> v = int_list(val(), "--decode-split", 1, kMaxTokens);
      tuning.decode_max_ranges = v.at(0);
      tuning.decode_min_chunk = v.size() > 1 ? v[1] : GpuTuning{}.decode_min_chunk;
    }
    else if (a == "--prefill-attn-blocks")
      tuning.prefill_attn_blocks = int(cli::to_int(val(), "--prefill-attn-blocks", 1, 1024));
    else if (a == "--blas-min-tokens")
      tuning.blas_min_tokens = int(cli::to_int(val(), "--blas-min-tokens", 0, kMaxTokens));
    else if (a == "--no-weight-copy") weight_copy = false;
    else if (a == "--override-kv") overrides.push_back(cli::value(argc, argv, i));
    else if (a == "--seed") seed = unsigned(cli::to_int(val(), "--seed", 0, UINT32_MAX));
    else if (a == "-o" || a == "--output") format = val();
    else if (a == "--kv-type") {
      const char *v = cli::value(argc, argv, i);
      if (!kv_type_from_name(v, &kv)) return cli::report(2, std::string("option --kv-type: '") + v + "' is not f32, f16 or q8_0");
    } else if (a == "-h" || a == "--help") { usage(stdout); return 0; }
    else if (a == "--help-dev") { usage_dev(stdout); return 0; }
    else return cli::report(2, "unknown option '" + a + "' (see moeinfer-cli bench --help)");
  }
  if (model_path.empty()) return cli::report(2, "-m MODEL is required (the GGUF file to measure)");
  if (format != "md" && format != "json") return cli::report(2, "option -o: '" + format + "' is not md or json");

  std::vector<Test> tests;
  if (!parallel.empty()) {  // each sequence: a prompt of p tokens, then n generated
    for (int b : parallel)
      for (int p : ps)
        for (int n : ns) if (n > 0) { Test t; t.n_gen = n; t.depth = p; t.n_seq = b; tests.push_back(t); }
  } else {
    for (int d : ds) {
      for (int p : ps) if (p > 0) { Test t; t.n_prompt = p; t.depth = d; tests.push_back(t); }
      for (int n : ns) if (n > 0) { Test t; t.n_gen = n; t.depth = d; tests.push_back(t); }
    }
  }
  if (tests.empty()) return cli::report(2, "no test selected: -p and -n are all 0");

  try {
    ModelLoadParams mp;
    mp.use_mmap = mmap;
    mp.cpu_weight_copy = weight_copy;
    mp.kv_overrides = overrides;
    uint32_t need = 0, n_seq = 1;
    for (const auto &t : tests) {
      need = std::max<uint32_t>(need, uint32_t(t.depth + t.n_prompt + t.n_gen) * uint32_t(t.n_seq ? t.n_seq : 1));
      n_seq = std::max<uint32_t>(n_seq, uint32_t(t.n_seq));
    }
    placement.set_fit_context(need, uint32_t(std::min(n_ubatch, n_batch)), kv);
    mp.placement = placement.params;
    mp.placement.fit_gpu_tuning = tuning;  // the fit plans the scratch these options need
    auto t0 = std::chrono::steady_clock::now();
    auto model = Model::load(model_path, mp);
    const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    ContextParams cp;
    cp.n_ctx = need;
    cp.n_seq_max = n_seq;
    cp.n_batch = uint32_t(n_batch);
    cp.n_ubatch = uint32_t(std::min(n_ubatch, n_batch));
    cp.n_threads = threads;
    cp.device = device;
    cp.kv_type = kv;
    cp.flash_attn = fa;
    cp.gpu_graphs = gpu_graphs;
    cp.cpu_float_order = cpu_order;
    cp.stream_min_tokens = stream_min;
    cp.direct_expert_slots = direct_slots;
    cp.gpu_tuning = tuning;
    t0 = std::chrono::steady_clock::now();
    auto ctx = Context::create(*model, cp);
    const double ctx_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    Runner r{*ctx, std::mt19937(seed), ctx->n_vocab(), ctx->params().n_batch};
    for (auto &t : tests) {
      std::fprintf(stderr, "%s: %s ...\n", cli::program().c_str(), t.name().c_str());
      Test warm = t;  // llama-bench warms up with the same shape (tg: one token)
      if (warm.n_gen) warm.n_gen = 1;
      if (warm.n_seq) warm.depth = 1;
      // Warm-up runs until kMinWarmupNs have passed: one 30 ms pp512 left the H200 at idle
      // clocks, and the first timed sample ran at half speed (9,186 then 17,046 t/s).
      const auto w0 = std::chrono::steady_clock::now();
      for (int k = 0; k < kMaxWarmupRuns; ++k) {
        r.run(warm);
        if (std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - w0).count() >= kMinWarmupNs) break;
      }
      for (int k = 0; k < reps; ++k) t.samples_ns.push_back(r.run(t));
      stats(t);
    }

    const MemoryReport &mem = ctx->memory_report();
    std::string backend = "CPU";
    for (const auto &d : mem.devices)
      if (d.device.compare(0, 4, "cuda") == 0) backend = "CUDA";
    const GgufFile &g = model->gguf();
    const uint32_t ftype = g.get_u32("general.file_type", 0xFFFFFFFFu);
    char model_type[160];
    const double np = double(model->n_params());
    if (np >= 1e9) std::snprintf(model_type, sizeof model_type, "%s %.1fB %s", model->arch_name().c_str(), np / 1e9, ftype_name(ftype));
    else std::snprintf(model_type, sizeof model_type, "%s %.1fM %s", model->arch_name().c_str(), np / 1e6, ftype_name(ftype));
    const uint64_t size = model->weight_bytes(), params = model->n_params(), rss = peak_rss_bytes();
    const int n_threads = ctx->params().n_threads;
    const bool has_tg = std::any_of(tests.begin(), tests.end(), [](const Test &t) { return t.n_prompt == 0 && t.n_gen > 0; });
    const Roofline roof = has_tg ? decode_roofline(*model, mem) : Roofline{};

    if (format == "json") {
      nlohmann::json out = nlohmann::json::array();
      for (const auto &t : tests) {
        nlohmann::json j;
        j["model_filename"] = model_path;
        j["model_type"] = model_type;
        j["model_size"] = size;
        j["model_n_params"] = params;
        j["backend"] = backend;
        j["n_threads"] = n_threads;
        j["n_batch"] = ctx->params().n_batch;
        j["n_ubatch"] = ctx->params().n_ubatch;
        j["type_k"] = kv_type_name(kv);
        j["type_v"] = kv_type_name(kv);
        j["flash_attn"] = fa;
        j["test"] = t.name();
        j["n_prompt"] = t.n_prompt;
        j["n_gen"] = t.n_gen;
        j["n_depth"] = t.depth;
        j["n_seq"] = t.n_seq ? t.n_seq : 1;
        j["avg_ns"] = t.mean_ns;
        j["stddev_ns"] = t.sd_ns;
        j["avg_ts"] = t.mean_ts;
        j["stddev_ts"] = t.sd_ts;
        j["samples_ns"] = t.samples_ns;
        std::vector<double> samples_ts;
        for (double ns : t.samples_ns) samples_ts.push_back(1e9 * t.tokens() / ns);
        j["samples_ts"] = samples_ts;
        j["load_ms"] = load_ms;
        j["context_ms"] = ctx_ms;
        j["peak_rss_bytes"] = rss;
        nlohmann::json devs = nlohmann::json::array();
        for (const auto &d : mem.devices)
          devs.push_back({{"device", d.device}, {"weights", d.weights}, {"kv_cache", d.kv_cache},
                          {"activations", d.activations}, {"other", d.other}, {"total", d.total()}});
        j["memory"] = devs;
        if (t.n_prompt == 0 && !t.n_seq && roof.tokens_per_s() > 0) {
          j["decode_read_bytes"] = roof.bytes_per_token;
          j["read_bandwidth"] = roof.bandwidth;
          j["roofline_ts"] = roof.tokens_per_s();
          j["roofline_fraction"] = t.mean_ts / roof.tokens_per_s();
        }
        out.push_back(j);
      }
      std::printf("%s\n", out.dump(2).c_str());
      return 0;
    }

    std::printf("| model | size | params | backend | threads | test | t/s |\n");
    std::printf("| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |\n");
    for (const auto &t : tests) {
      char sz[32], pr[32], ts[64];
      if (size >= (1ull << 30)) std::snprintf(sz, sizeof sz, "%.2f GiB", double(size) / double(1ull << 30));
      else std::snprintf(sz, sizeof sz, "%.2f MiB", double(size) / double(1ull << 20));
      if (params >= 1000000000ull) std::snprintf(pr, sizeof pr, "%.2f B", double(params) / 1e9);
      else std::snprintf(pr, sizeof pr, "%.2f M", double(params) / 1e6);
      std::snprintf(ts, sizeof ts, "%.2f ± %.2f", t.mean_ts, t.sd_ts);
      std::printf("| %-30s | %10s | %10s | %-10s | %7d | %15s | %20s |\n", model_type, sz, pr, backend.c_str(), n_threads,
                  t.name().c_str(), ts);
    }
    // Medians and every sample: one slow repetition (a clock ramp, a busy host) moves the mean.
    std::printf("\n");
    for (const auto &t : tests) {
      std::vector<double> ts;
      for (double ns : t.samples_ns) ts.push_back(1e9 * t.tokens() / ns);
      std::string list;
      for (double v : ts) list += (list.empty() ? "" : ", ") + std::to_string(static_cast<long long>(std::llround(v)));
      std::sort(ts.begin(), ts.end());
      const size_t n = ts.size();
      const double med = n == 0 ? 0.0 : n % 2 ? ts[n / 2] : 0.5 * (ts[n / 2 - 1] + ts[n / 2]);
      std::printf("  %-15s median %.2f t/s (samples: %s)\n", t.name().c_str(), med, list.c_str());
    }
    if (roof.tokens_per_s() > 0) {
      std::printf("\ndecode roofline: %.1f MB of weights read per token, %s reads %.0f GB/s (measured) -> %.0f t/s\n",
                  roof.bytes_per_token / 1e6, roof.device.c_str(), roof.bandwidth / 1e9, roof.tokens_per_s());
      for (const auto &t : tests)
        if (t.n_prompt == 0 && t.n_gen > 0 && !t.n_seq)  // (sequences decoding together share the weight reads)
          std::printf("  %-15s %.2f t/s = %.1f%% of the roofline\n", t.name().c_str(), t.mean_ts, 100.0 * t.mean_ts / roof.tokens_per_s());
    }
#ifdef MOEINFER_STEP_PROFILE
    std::fputs(moe::step_profile::report().c_str(), stderr);  // diagnostic builds (docs/perf/placement.md)
#endif
    std::printf("\nload %.0f ms, context %.0f ms; peak host RSS %.1f MiB (VmHWM)\n", load_ms, ctx_ms,
                double(rss) / double(1 << 20));
    for (const auto &d : mem.devices)
      std::printf("  %-8s weights %.1f MiB, kv %.1f MiB, activations %.1f MiB, other %.1f MiB\n", d.device.c_str(),
                  double(d.weights) / (1 << 20), double(d.kv_cache) / (1 << 20), double(d.activations) / (1 << 20),
                  double(d.other) / (1 << 20));
  } catch (const Error &e) {
    return cli::report(1, std::string(e.what()) + " [" + status_name(e.code()) + "]");
  }
  return 0;
}
