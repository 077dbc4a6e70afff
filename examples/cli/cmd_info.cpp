// moeinfer-cli info: architecture, hyperparameters, tensor type counts and memory plan.
#include <cstdio>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/status.h"
#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "memory/memory_report.h"
#include "model/hparams.h"

using namespace moe;

int cmd_info(int argc, char **argv) {
  std::string path, device = "cpu";
  bool json = false;
  long ctx = 4096;
  KvType kv = KvType::F16;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-m" || a == "--model") path = cli::value(argc, argv, i);
    else if (a == "--json") json = true;
    else if (a == "--ctx" || a == "-c") ctx = cli::to_int(cli::value(argc, argv, i), "--ctx");
    else if (a == "--device") device = cli::value(argc, argv, i);
    else if (a == "--override-kv") overrides.push_back(cli::value(argc, argv, i));
    else if (a == "--kv-type") {
      const char *v = cli::value(argc, argv, i);
      if (!kv_type_from_name(v, &kv)) { std::fprintf(stderr, "--kv-type: '%s' is not f32, f16 or q8_0\n", v); return 2; }
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: moeinfer-cli info -m MODEL [--json] [--ctx N] [--kv-type f32|f16|q8_0] [--device DEV] [--override-kv K=T:V]\n");
      return 0;
    } else { std::fprintf(stderr, "info: unknown option '%s'\n", a.c_str()); return 2; }
  }
  if (path.empty()) { std::fprintf(stderr, "info: -m MODEL is required\n"); return 2; }
  try {
    ModelLoadParams mp;
    mp.kv_overrides = overrides;
    auto model = Model::load(path, mp);
    const Hparams &h = model->hparams();
    std::map<std::string, int> types;
    for (const auto &t : model->gguf().tensors()) types[dtype_name(t.type)]++;
    ContextParams cp;
    cp.n_ctx = static_cast<uint32_t>(ctx);
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
    std::printf("tensor types :");
    for (auto &t : types) std::printf(" %s x%d", t.first.c_str(), t.second);
    std::printf("\nmemory plan  : n_ctx %u, KV %s\n%s", c->params().n_ctx, kv_type_name(c->params().kv_type), mr.to_text().c_str());
    return 0;
  } catch (const Error &e) {
    std::fprintf(stderr, "info: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
}
