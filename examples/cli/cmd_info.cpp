// moeinfer-cli info: architecture, hyperparameters, tensor type counts and memory plan;
// with --fit, the placement fit's plan per device instead (no weights loaded, no context).
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/placement_args.h"
#include "core/status.h"
#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "memory/memory_report.h"
#include "model/hparams.h"
#include "placement/fit.h"

using namespace moe;

namespace {

void usage() {
  std::printf(
      "usage: moeinfer-cli info -m MODEL [--json] [options]\n"
      "  -c, --ctx N         context size of the memory plan (default 4096; also --ctx-size)\n"
      "  -ub N               tokens per graph run of the memory plan and the fit (default 512)\n"
      "  --kv-type TYPE      f32 | f16 | q8_0 (default f16)\n"
      "  --device DEV        device of the memory plan's context (default cpu; auto with placement flags)\n"
      "  --override-kv K=T:V metadata override (repeatable)\n"
      "  --json              one JSON object\n"
      "  --fit               print the placement fit's plan per device (weights, KV cache, activations,\n"
      "                      workspace, total, budget) and the values it chose; reads the file's\n"
      "                      metadata only: no weights are loaded and no context is created\n");
  std::fputs(cli::placement_help(), stdout);
}

std::string mib(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", double(bytes) / double(1u << 20));
  return b;
}

// info --fit: fit_model's plan for the file, as text (MiB) or JSON (bytes).
int print_fit(const std::string &path, const ModelLoadParams &mp, bool json) {
  const FitPlan plan = fit_model(path, mp);
  const PlacementParams &pl = mp.placement;
  const char *kv = kv_type_name(static_cast<KvType>(pl.fit_kv_type));
  if (json) {
    nlohmann::ordered_json j;
    j["model"] = path;
    j["n_ctx"] = plan.n_ctx;
    j["n_ubatch"] = pl.fit_n_ubatch;
    j["n_seq_max"] = pl.fit_n_seq_max;
    j["kv_type"] = kv;
    j["n_cpu_moe"] = plan.n_cpu_moe;
    j["n_gpu_layers"] = plan.n_gpu_layers;
    j["cpu_moe"] = plan.cpu_moe;
    j["fitted"] = plan.fitted;
    j["chosen"] = plan.chosen;
    nlohmann::ordered_json devs = nlohmann::ordered_json::array();
    for (const DevicePlan &d : plan.devices)
      devs.push_back({{"device", d.device}, {"weights", d.weights}, {"kv_cache", d.kv_cache},
                      {"activations", d.activations}, {"workspace", d.workspace}, {"total", d.total()},
                      {"budget", d.budget}});
    j["devices"] = devs;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("fit plan     : %s\n", path.c_str());
  std::printf("context      : n_ctx %u%s, n_ubatch %u, %u sequence(s), KV %s\n", plan.n_ctx,
              plan.n_ctx < pl.fit_n_ctx ? " (shrunk to fit)" : "", pl.fit_n_ubatch, pl.fit_n_seq_max, kv);
  std::printf("placement    : n_cpu_moe %d, n_gpu_layers %d, cpu_moe %s%s\n", plan.n_cpu_moe, plan.n_gpu_layers,
              plan.cpu_moe ? "on" : "off", plan.fitted ? " (fitted)" : "");
  std::string chosen;
  for (const std::string &c : plan.chosen) chosen += (chosen.empty() ? "" : ", ") + c;
  std::printf("chosen       : %s\n", chosen.empty() ? "-" : chosen.c_str());
  std::printf("%-12s %10s %10s %12s %10s %10s %10s  (MiB)\n", "device", "weights", "kv", "activations", "workspace",
              "total", "budget");
  for (const DevicePlan &d : plan.devices)
    std::printf("%-12s %10s %10s %12s %10s %10s %10s\n", d.device.c_str(), mib(d.weights).c_str(),
                mib(d.kv_cache).c_str(), mib(d.activations).c_str(), mib(d.workspace).c_str(), mib(d.total()).c_str(),
                d.budget ? mib(d.budget).c_str() : "-");
  return 0;
}

}  // namespace

int cmd_info(int argc, char **argv) {
  std::string path, device = "cpu";
  bool json = false, device_set = false;
  long long ctx = 4096, n_ubatch = 512;
  KvType kv = KvType::F16;
  std::vector<std::string> overrides;
  cli::PlacementArgs placement;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (const int r = placement.take(argc, argv, i)) { if (r < 0) return placement.fail("info"); }
    else if (a == "-m" || a == "--model") path = cli::value(argc, argv, i);
    else if (a == "--json") json = true;
    else if (a == "--ctx" || a == "-c" || a == "--ctx-size") ctx = cli::to_int(cli::value(argc, argv, i), "--ctx", 1, kMaxContextCells);
    else if (a == "-ub" || a == "--ubatch-size") n_ubatch = cli::to_int(cli::value(argc, argv, i), "-ub", 1, kMaxUbatchTokens);
    else if (a == "--device") { device = cli::device_name(cli::value(argc, argv, i)); device_set = true; }
    else if (a == "--override-kv") overrides.push_back(cli::value(argc, argv, i));
    else if (a == "--kv-type") {
      const char *v = cli::value(argc, argv, i);
      if (!kv_type_from_name(v, &kv)) return cli::report(2, std::string("option --kv-type: '") + v + "' is not f32, f16 or q8_0");
    } else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else return cli::report(2, "unknown option '" + a + "' (see moeinfer-cli info --help)");
  }
  if (path.empty()) return cli::report(2, "-m MODEL is required (the GGUF file to describe)");
  try {
    ModelLoadParams mp;
    mp.kv_overrides = overrides;
    placement.set_fit_context(static_cast<uint32_t>(ctx), static_cast<uint32_t>(n_ubatch), kv);
    mp.placement = placement.params;
    if (mp.placement.fit) return print_fit(path, mp, json);
    // The memory plan of a placed model is its own placement's, not one device's.
    if (placement.given && !device_set) device = "auto";
    auto model = Model::load(path, mp);
    const Hparams &h = model->hparams();
    std::map<std::string, int> types;
    for (const auto &t : model->gguf().tensors()) types[dtype_name(t.type)]++;
    ContextParams cp;
    cp.n_ctx = static_cast<uint32_t>(ctx);
    cp.n_ubatch = static_cast<uint32_t>(n_ubatch);
    cp.n_batch = std::max(cp.n_batch, cp.n_ubatch);
    cp.kv_type = kv;
    cp.device = device;
    auto c = Context::create(*model, cp);
    const MemoryReport &mr = c->memory_report();
    nlohmann::ordered_json j;
    j["architecture"] = h.arch;
    j["name"] = model->gguf().get_str("general.name", "");
    j["n_params"] = model->n_params();
    j["weight_bytes"] = model->weight_bytes();
    j["hparams"] = {{"n_vocab", h.n_vocab}, {"n_ctx_train", h.n_ctx_train}, {"n_embd", h.n_embd}, {"n_layer", h.n_layer},
                    {"n_head", h.n_head}, {"n_head_kv", h.n_head_kv}, {"head_dim_k", h.head_dim_k}, {"head_dim_v", h.head_dim_v},
                    {"n_expert", h.n_expert}, {"n_expert_used", h.n_expert_used}, {"n_ff_exp", h.n_ff_exp},
                    {"n_ff", h.n_ff}, {"rope_theta", h.rope_theta}, {"rms_eps", h.rms_eps}, {"tied_output", h.tied_output}};
    j["tensor_types"] = types;
    const GgufFile &g = model->gguf();
    std::vector<size_t> part_tensors(g.n_parts(), 0);
    for (const auto &t : g.tensors()) part_tensors[t.part]++;
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    for (size_t i = 0; i < g.n_parts(); ++i)
      files.push_back({{"path", g.part_path(i)}, {"bytes", g.part(i).file_size()}, {"tensors", part_tensors[i]}});
    j["files"] = files;
    nlohmann::ordered_json mem = nlohmann::ordered_json::array();
    for (const auto &d : mr.devices)
      mem.push_back({{"device", d.device}, {"weights", d.weights}, {"kv_cache", d.kv_cache}, {"activations", d.activations}, {"other", d.other}});
    j["memory"] = {{"n_ctx", c->params().n_ctx}, {"kv_type", kv_type_name(c->params().kv_type)}, {"devices", mem}};
    if (json) {
      std::printf("%s\n", j.dump().c_str());
      return 0;
    }
    std::printf("architecture : %s (%s)\n", h.arch.c_str(), j["name"].get<std::string>().c_str());
    std::printf("parameters   : %.3f B, %.2f MiB as stored\n", model->n_params() / 1e9, model->weight_bytes() / 1048576.0);
    std::printf("hparams      : %s\n", j["hparams"].dump().c_str());
    std::printf("files        : %zu%s\n", g.n_parts(), g.n_parts() > 1 ? " parts (split model)" : "");
    for (size_t i = 0; i < g.n_parts(); ++i)
      std::printf("  %s: %zu tensors, %s MiB\n", g.part_path(i).c_str(), part_tensors[i], mib(g.part(i).file_size()).c_str());
    std::printf("tensor types :");
    for (auto &t : types) std::printf(" %s x%d", t.first.c_str(), t.second);
    std::printf("\nmemory plan  : n_ctx %u, KV %s\n%s", c->params().n_ctx, kv_type_name(c->params().kv_type), mr.to_text().c_str());
    return 0;
  } catch (const Error &e) {
    return cli::report(1, std::string(e.what()) + " [" + status_name(e.code()) + "]");
  }
}
