// moeinfer-cli generate: greedy or sampled continuation of a prompt.
// --json prints, for every position whose logits were computed, one line
//   {"n_past": P, "id": SAMPLED_ID, "top": [[id, logit], ...]}
// (first the last prompt position, then one per generated token). This format is a contract.
// Generation ends after -n tokens, at an end-of-generation token (unless --ignore-eos) or
// when the context is full, whichever comes first.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/chat_prompt.h"
#include "cli/commands.h"
#include "cli/demo_model.h"
#include "cli/placement_args.h"
#include "core/status.h"
#include "engine/engine.h"
#include "memory/memory_report.h"
#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/vocab.h"

using namespace moe;

namespace {

void usage() {
  std::printf(
      "usage: moeinfer-cli generate [-m MODEL] (-p TEXT | --prompt-ids 1,2,3) [-n N] [options]\n"
      "  -m MODEL            GGUF file (default: a built-in demo model with random weights)\n"
      "  -p TEXT             prompt text (tokenized with the model's vocabulary, special tokens parsed)\n"
      "  --prompt-ids LIST   prompt as comma-separated token ids (instead of -p)\n"
      "  --chat              -p is one user turn in the model's chat template (--system TEXT: a system turn)\n"
      "  --feed-ids LIST     tokens decoded one at a time after the prompt batch, before generating\n"
      "                      (--json: the first line is the last fed token's; n_past counts them)\n"
      "  -n N                most tokens to generate, 0.." "2147483647 (default 32)\n"
      "  --ignore-eos        keep generating after an end-of-generation token\n"
      "  --temp T            temperature 0..100; 0 = greedy (default 0)\n"
      "  --seed S            sampling seed 0..4294967295 (default 1)\n"
      "  --top-logits K      with --json: logits listed per step, >= 1 (default 20)\n"
      "  --json              one JSON object per computed position (see README)\n"
      "  -t, --threads T     CPU threads 0..1024; 0 = physical cores (default)\n"
      "  -c, --ctx N         context size in tokens; 0 = the model's, at most 4096 (default; also --ctx-size)\n"
      "  --kv-type TYPE      f32 | f16 | q8_0 (default f16)\n"
      "  --device DEV        cpu | cuda | cuda0 | auto (default auto: a GPU when one is usable)\n"
      "  --cpu-order         GPU: batches of 2..128 tokens in the CPU's float order (bit-reproducible\n"
      "                      against --device cpu; slower prompts)\n"
      "  --override-kv K=T:V metadata override (repeatable)\n"
      "  --no-mmap           read weights into memory instead of mapping the file\n"
      "  --no-weight-copy    CPU: read the mapped file pages in place (default: one copy in huge pages)\n");
  std::fputs(cli::placement_help(), stdout);
}

struct Options {
  std::string model_path, prompt, device = "auto";
  std::vector<int32_t> prompt_ids, feed_ids;
  bool has_prompt = false, has_prompt_ids = false, has_top_logits = false;
  int n_gen = 32, top_k = 20, threads = 0;
  uint32_t ctx = 0;
  double temp = 0.0;
  uint32_t seed = 1;
  bool chat = false;
  std::string system;
  bool json = false, mmap = true, weight_copy = true, cpu_order = false, ignore_eos = false;
  KvType kv = KvType::F16;
  std::vector<std::string> overrides;
  cli::PlacementArgs placement;
};

std::vector<int32_t> id_list(const char *s, const char *opt) {
  std::vector<int32_t> out;
  for (long long v : cli::to_int_list(s, opt, 0, INT32_MAX)) out.push_back(static_cast<int32_t>(v));
  return out;
}

// Parses argv into `o`; returns -1 to go on, else the exit status (help, usage error).
int parse(int argc, char **argv, Options &o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() { return cli::value(argc, argv, i); };
    if (const int r = o.placement.take(argc, argv, i)) { if (r < 0) return o.placement.fail("generate"); }
    else if (a == "-m" || a == "--model") o.model_path = val();
    else if (a == "-p" || a == "--prompt") { o.prompt = val(); o.has_prompt = true; }
    else if (a == "--prompt-ids") { o.prompt_ids = id_list(val(), "--prompt-ids"); o.has_prompt_ids = true; }
    else if (a == "--chat") o.chat = true;
    else if (a == "--system") o.system = val();
    else if (a == "--feed-ids") o.feed_ids = id_list(val(), "--feed-ids");
    else if (a == "-n" || a == "--n-predict") o.n_gen = static_cast<int>(cli::to_int(val(), "-n", 0, INT32_MAX));
    else if (a == "--ignore-eos") o.ignore_eos = true;
    else if (a == "--temp") o.temp = cli::to_float(val(), "--temp", 0.0, 100.0);
    else if (a == "--seed") o.seed = static_cast<uint32_t>(cli::to_int(val(), "--seed", 0, UINT32_MAX));
    else if (a == "--top-logits") { o.top_k = static_cast<int>(cli::to_int(val(), "--top-logits", 1, INT32_MAX)); o.has_top_logits = true; }
    else if (a == "--json") o.json = true;
    else if (a == "--threads" || a == "-t") o.threads = static_cast<int>(cli::to_int(val(), "--threads", 0, kMaxThreads));
    else if (a == "--ctx" || a == "-c" || a == "--ctx-size") o.ctx = static_cast<uint32_t>(cli::to_int(val(), "--ctx", 0, kMaxContextCells));
    else if (a == "--device") o.device = cli::device_name(val());
    else if (a == "--override-kv") o.overrides.push_back(val());
    else if (a == "--no-mmap") o.mmap = false;
    else if (a == "--no-weight-copy") o.weight_copy = false;
    else if (a == "--cpu-order") o.cpu_order = true;
    else if (a == "--kv-type") {
      const char *v = val();
      if (!kv_type_from_name(v, &o.kv)) return cli::report(2, std::string("option --kv-type: '") + v + "' is not f32, f16 or q8_0");
    } else if (a == "-h" || a == "--help") { usage(); return 0; }
    else return cli::report(2, "unknown option '" + a + "' (see moeinfer-cli generate --help)");
  }
  if (o.chat && o.has_prompt_ids) return cli::report(2, "--chat templates -p TEXT: it does not apply to --prompt-ids");
  if (o.has_prompt && o.has_prompt_ids) return cli::report(2, "-p and --prompt-ids both give the prompt: use one of them");
  if (o.has_top_logits && !o.json) return cli::report(2, "--top-logits applies to --json output only: add --json or drop it");
  return -1;
}

// Greedy (ties -> lowest id) or sampled at temperature `temp`.
int32_t pick(const float *lg, int32_t n_vocab, double temp, std::mt19937 &rng) {
  int32_t next = 0;
  if (temp <= 0.0) {
    for (int32_t v = 1; v < n_vocab; ++v)
      if (lg[v] > lg[next]) next = v;
    return next;
  }
  double mx = lg[0];
  for (int32_t v = 1; v < n_vocab; ++v) mx = std::max<double>(mx, lg[v]);
  std::vector<double> pr(static_cast<size_t>(n_vocab));
  for (int32_t v = 0; v < n_vocab; ++v) pr[static_cast<size_t>(v)] = std::exp((lg[v] - mx) / temp);
  std::discrete_distribution<int32_t> d(pr.begin(), pr.end());
  return d(rng);
}

void print_json_step(const float *lg, int32_t n_vocab, int top_k, int32_t n_past, int32_t next) {
  std::vector<int32_t> order(static_cast<size_t>(n_vocab));
  for (int32_t v = 0; v < n_vocab; ++v) order[static_cast<size_t>(v)] = v;
  const int k = std::min(top_k, n_vocab);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return lg[a] > lg[b] || (lg[a] == lg[b] && a < b); });
  std::printf("{\"n_past\": %d, \"id\": %d, \"top\": [", n_past, next);
  for (int j = 0; j < k; ++j)
    std::printf("%s[%d, %.6g]", j ? ", " : "", order[static_cast<size_t>(j)], lg[order[static_cast<size_t>(j)]]);
  std::printf("]}\n");
}

// Text for a terminal: control bytes other than newline and tab (random or byte-level
// tokens can carry them) become U+FFFD so they cannot move the cursor or change colours.
void print_text(const std::string &s) {
  std::string out;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7f) out += "\xEF\xBF\xBD";
    else out += c;
  }
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
}

// Decodes `ids` from position `pos0` in slices of the context's n_batch; logits for the last.
void decode_prompt(Context &ctx, const std::vector<int32_t> &ids, int32_t pos0) {
  const size_t n_batch = ctx.params().n_batch;
  std::vector<BatchToken> batch;
  for (size_t at = 0; at < ids.size(); at += n_batch) {
    batch.clear();
    const size_t end = std::min(ids.size(), at + n_batch);
    for (size_t i = at; i < end; ++i) batch.push_back({ids[i], pos0 + static_cast<int32_t>(i), 0, i + 1 == ids.size()});
    ctx.decode(batch.data(), batch.size());
  }
}

int run(Options &o) {
  ModelLoadParams mp;
  mp.use_mmap = o.mmap;
  mp.cpu_weight_copy = o.weight_copy;
  mp.kv_overrides = o.overrides;
  o.placement.set_fit_context(o.ctx, 512, o.kv);
  mp.placement = o.placement.params;
  auto model = Model::load(o.model_path, mp);
  if (o.chat) o.prompt = cli::one_shot_chat_prompt(*model, o.system, o.prompt);
  std::vector<int32_t> ids = o.prompt_ids;
  if (!o.has_prompt_ids) {
    if (!model->vocab()) return cli::report(2, "the model has no tokenizer: give the prompt with --prompt-ids");
    ids = model->vocab()->encode(o.prompt, true, true);
  }
  if (ids.empty()) return cli::report(2, "the prompt is empty: give -p TEXT or --prompt-ids LIST");
  const int32_t n_vocab = model->n_vocab();
  for (const auto *list : {&ids, &o.feed_ids})
    for (int32_t id : *list)
      if (id >= n_vocab)
        return cli::report(2, "token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                  std::to_string(n_vocab - 1) + ")");
  ContextParams cp;
  cp.n_ctx = o.ctx;
  cp.kv_type = o.kv;
  cp.n_threads = o.threads;
  cp.device = o.device;
  cp.n_batch = 512;
  cp.n_ubatch = 512;
  cp.cpu_float_order = o.cpu_order;
  auto ctx = Context::create(*model, cp);
  const uint32_t n_ctx = ctx->params().n_ctx;
  const size_t n_in = ids.size() + o.feed_ids.size();
  if (n_in > n_ctx)
    return cli::report(2, "the prompt is " + std::to_string(n_in) + " tokens but the context holds " +
                              std::to_string(n_ctx) + ": raise --ctx to at least " + std::to_string(n_in + 1) +
                              " or shorten the prompt");

  std::mt19937 rng(o.seed);
  std::unique_ptr<StreamDetokenizer> detok;
  if (!o.json && model->vocab()) {
    detok = std::make_unique<StreamDetokenizer>(*model->vocab(), false);
    if (o.has_prompt) print_text(o.prompt);
  }
  decode_prompt(*ctx, ids, 0);
  int32_t n_past = static_cast<int32_t>(ids.size());
  // One decode per fed token, as interactive use (and the reference's records) do:
  // single-token products can round differently from the same tokens inside a batch.
  for (int32_t id : o.feed_ids) {
    BatchToken t{id, n_past++, 0, true};
    ctx->decode(&t, 1);
  }
  const Vocab *vocab = model->vocab();
  bool context_full = false;
  for (int step = 0; step < o.n_gen; ++step) {
    const float *lg = ctx->logits(-1);
    const int32_t next = pick(lg, n_vocab, o.temp, rng);
    const bool eog = !o.ignore_eos && vocab && vocab->is_eog(next);
    if (o.json) print_json_step(lg, n_vocab, o.top_k, n_past, next);
    else if (detok && !eog) print_text(detok->push(next));
    else if (!detok) std::printf("%d ", next);
    if (eog || step + 1 == o.n_gen) break;
    if (static_cast<uint32_t>(n_past) >= n_ctx) { context_full = true; break; }
    BatchToken t{next, n_past++, 0, true};
    ctx->decode(&t, 1);
  }
  if (detok) print_text(detok->flush());
  if (!o.json) std::printf("\n");
  std::fflush(stdout);  // the text ends before the note on stderr
  if (context_full)
    cli::report(0, "stopped: the context of " + std::to_string(n_ctx) + " tokens is full (raise --ctx for longer output)");
  return 0;
}

}  // namespace

int cmd_generate(int argc, char **argv) {
  Options o;
  if (const int rc = parse(argc, argv, o); rc >= 0) return rc;
  try {
    if (o.model_path.empty()) {
      o.model_path = demo_model_path();
      if (!o.has_prompt && !o.has_prompt_ids) { o.prompt = "Once upon a time"; o.has_prompt = true; }
      std::fprintf(stderr,
                   "No -m MODEL given: running a built-in demo model with RANDOM weights, so the text below is\n"
                   "gibberish by design. For real text pass -m FILE.gguf (README.md, \"Run a real model\").\n");
    }
    return run(o);
  } catch (const Error &e) {
    std::string hint;
    if (e.code() == Status::IoError) hint = " (check -m: it must be a readable .gguf file)";
    return cli::report(1, std::string(e.what()) + " [" + status_name(e.code()) + "]" + hint);
  }
}
