// moeinfer-cli generate: greedy or sampled continuation of a prompt.
// --json prints, for every position whose logits were computed, one line
//   {"n_past": P, "id": SAMPLED_ID, "top": [[id, logit], ...]}
// (first the last prompt position, then one per generated token). This format is a contract.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/demo_model.h"
#include "cli/placement_args.h"
#include "core/status.h"
#include "engine/engine.h"
#include "memory/memory_report.h"
#include "tokenizer/vocab.h"

using namespace moe;

static void usage() {
  std::printf(
      "usage: moeinfer-cli generate [-m MODEL] (--prompt-ids 1,2,3 | -p TEXT) [-n N] [options]\n"
      "  -m MODEL            GGUF file (default: a built-in demo model)\n"
      "  -p TEXT             prompt text (tokenized with the model's vocabulary, special tokens parsed)\n"
      "  --prompt-ids LIST   prompt as comma-separated token ids\n"
      "  --feed-ids LIST     tokens decoded one at a time after the prompt batch, before generating\n"
      "                      (--json: the first line is the last fed token's; n_past counts them)\n"
      "  -n N                tokens to generate (default 32)\n"
      "  --temp T            temperature; 0 = greedy (default 0)\n"
      "  --seed S            sampling seed (default 1)\n"
      "  --top-logits K      with --json: logits listed per step (default 20)\n"
      "  --json              one JSON object per computed position (see docs)\n"
      "  --threads T         CPU threads (default: physical cores)\n"
      "  -c, --ctx N         context size in tokens (default 4096 or the model's; also --ctx-size)\n"
      "  --kv-type TYPE      f32 | f16 | q8_0 (default f16)\n"
      "  --device DEV        cpu | cuda | cuda0 | auto (default auto)\n"
      "  --cpu-order         GPU: batches of 2..128 tokens in the CPU's float order (bit-reproducible\n"
      "                      against --device cpu; slower prompts)\n"
      "  --override-kv K=T:V metadata override (repeatable)\n"
      "  --no-mmap           read weights into memory instead of mapping the file\n"
      "  --no-weight-copy    CPU: read the mapped file pages in place (default: one copy in huge pages)\n");
  std::fputs(cli::placement_help(), stdout);
}

int cmd_generate(int argc, char **argv) {
  std::string model_path, prompt, prompt_ids, feed_ids, device = "auto";
  int n_gen = 32, top_k = 20, threads = 0;
  long ctx = 0;
  double temp = 0.0;
  unsigned seed = 1;
  bool json = false, mmap = true, weight_copy = true, cpu_order = false;
  KvType kv = KvType::F16;
  std::vector<std::string> overrides;
  cli::PlacementArgs placement;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (const int r = placement.take(argc, argv, i)) { if (r < 0) return placement.fail("generate"); }
    else if (a == "-m" || a == "--model") model_path = cli::value(argc, argv, i);
    else if (a == "-p" || a == "--prompt") prompt = cli::value(argc, argv, i);
    else if (a == "--prompt-ids") prompt_ids = cli::value(argc, argv, i);
    else if (a == "--feed-ids") feed_ids = cli::value(argc, argv, i);
    else if (a == "-n") n_gen = static_cast<int>(cli::to_int(cli::value(argc, argv, i), "-n"));
    else if (a == "--temp") temp = cli::to_float(cli::value(argc, argv, i), "--temp");
    else if (a == "--seed") seed = static_cast<unsigned>(cli::to_int(cli::value(argc, argv, i), "--seed"));
    else if (a == "--top-logits") top_k = static_cast<int>(cli::to_int(cli::value(argc, argv, i), "--top-logits"));
    else if (a == "--json") json = true;
    else if (a == "--threads" || a == "-t") threads = static_cast<int>(cli::to_int(cli::value(argc, argv, i), "--threads"));
    else if (a == "--ctx" || a == "-c" || a == "--ctx-size") ctx = cli::to_int(cli::value(argc, argv, i), "--ctx");
    else if (a == "--device") device = cli::value(argc, argv, i);
    else if (a == "--override-kv") overrides.push_back(cli::value(argc, argv, i));
    else if (a == "--no-mmap") mmap = false;
    else if (a == "--no-weight-copy") weight_copy = false;
    else if (a == "--cpu-order") cpu_order = true;
    else if (a == "--kv-type") {
      const char *v = cli::value(argc, argv, i);
      if (!kv_type_from_name(v, &kv)) { std::fprintf(stderr, "--kv-type: '%s' is not f32, f16 or q8_0\n", v); return 2; }
    } else if (a == "-h" || a == "--help") { usage(); return 0; }
    else { std::fprintf(stderr, "generate: unknown option '%s'\n", a.c_str()); return 2; }
  }
  try {
    if (model_path.empty()) {
      model_path = demo_model_path();
      if (prompt.empty() && prompt_ids.empty()) prompt = "Once upon a time";
      std::fprintf(stderr, "no -m given: using the built-in demo model (%s)\n", model_path.c_str());
    }
    ModelLoadParams mp;
    mp.use_mmap = mmap;
    mp.cpu_weight_copy = weight_copy;
    mp.kv_overrides = overrides;
    placement.set_fit_context(static_cast<uint32_t>(ctx), 512, kv);
    mp.placement = placement.params;
    auto model = Model::load(model_path, mp);
    auto parse_ids = [](const std::string &list, const char *opt) {
      std::vector<int32_t> out;
      size_t p = 0;
      while (p < list.size()) {
        size_t q = list.find(',', p);
        if (q == std::string::npos) q = list.size();
        out.push_back(static_cast<int32_t>(cli::to_int(list.substr(p, q - p).c_str(), opt)));
        p = q + 1;
      }
      return out;
    };
    std::vector<int32_t> ids;
    const std::vector<int32_t> fed = parse_ids(feed_ids, "--feed-ids");
    if (!prompt_ids.empty()) {
      ids = parse_ids(prompt_ids, "--prompt-ids");
    } else {
      if (!model->vocab()) { std::fprintf(stderr, "generate: the model has no tokenizer; use --prompt-ids\n"); return 1; }
      ids = model->vocab()->encode(prompt, true, true);
    }
    if (ids.empty()) { std::fprintf(stderr, "generate: empty prompt\n"); return 2; }
    ContextParams cp;
    cp.n_ctx = static_cast<uint32_t>(ctx);
    cp.kv_type = kv;
    cp.n_threads = threads;
    cp.device = device;
    cp.n_batch = std::max<uint32_t>(512, static_cast<uint32_t>(ids.size()));
    cp.n_ubatch = 512;
    cp.cpu_float_order = cpu_order;
    auto ctxp = Context::create(*model, cp);
    const int32_t n_vocab = model->n_vocab();
    std::mt19937 rng(seed);
    std::unique_ptr<StreamDetokenizer> detok;
    if (!json && model->vocab()) {
      detok = std::make_unique<StreamDetokenizer>(*model->vocab(), false);
      if (!prompt.empty()) std::fputs(prompt.c_str(), stdout);
    }
    std::vector<BatchToken> batch;
    for (size_t i = 0; i < ids.size(); ++i) batch.push_back({ids[i], static_cast<int32_t>(i), 0, i + 1 == ids.size()});
    int32_t n_past = static_cast<int32_t>(ids.size());
    ctxp->decode(batch.data(), batch.size());
    // One decode per fed token, as an interactive session (and the reference's records) do:
    // single-token products can round differently from the same tokens inside a batch.
    for (int32_t id : fed) {
      BatchToken t{id, n_past, 0, true};
      ctxp->decode(&t, 1);
      ++n_past;
    }
    std::vector<int32_t> order(static_cast<size_t>(n_vocab));
    for (int step = 0; step < n_gen; ++step) {
      const float *lg = ctxp->logits(-1);
      int32_t next = 0;
      if (temp <= 0.0) {
        for (int32_t v = 1; v < n_vocab; ++v)
          if (lg[v] > lg[next]) next = v;  // ties -> lowest id
      } else {
        double mx = lg[0];
        for (int32_t v = 1; v < n_vocab; ++v) mx = std::max<double>(mx, lg[v]);
        std::vector<double> pr(static_cast<size_t>(n_vocab));
        for (int32_t v = 0; v < n_vocab; ++v) pr[static_cast<size_t>(v)] = std::exp((lg[v] - mx) / temp);
        std::discrete_distribution<int32_t> d(pr.begin(), pr.end());
        next = d(rng);
      }
      if (json) {
        for (int32_t v = 0; v < n_vocab; ++v) order[static_cast<size_t>(v)] = v;
        const int k = std::min(top_k, n_vocab);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
          return lg[a] > lg[b] || (lg[a] == lg[b] && a < b);
        });
        std::printf("{\"n_past\": %d, \"id\": %d, \"top\": [", n_past, next);
        for (int j = 0; j < k; ++j) std::printf("%s[%d, %.6g]", j ? ", " : "", order[static_cast<size_t>(j)], lg[order[static_cast<size_t>(j)]]);
        std::printf("]}\n");
      } else if (detok) {
        std::fputs(detok->push(next).c_str(), stdout);
        std::fflush(stdout);
      } else {
        std::printf("%d ", next);
      }
      if (step + 1 == n_gen) break;
      BatchToken t{next, n_past, 0, true};
      ctxp->decode(&t, 1);
      ++n_past;
    }
    if (detok) std::fputs(detok->flush().c_str(), stdout);
    if (!json) std::printf("\n");
    return 0;
  } catch (const Error &e) {
    std::fprintf(stderr, "generate: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
}
