#include "placement/fit.h"
#include "placement/placed_compile.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "backends/backend.h"
#include "core/status.h"
#include "graph/compiler.h"
#include "backends/cpu/thread_pool.h"
#include "engine/context_impl.h"
#include "kv/kv_cache.h"
#include "model/arch/arch.h"
#include "model/model_impl.h"

namespace moe {

void parse_budget(const std::string &s, std::string *device, uint64_t *bytes) {
  const size_t eq = s.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size()) fail(Status::InvalidArgument, "fit budget '%s' is not DEVICE=BYTES", s.c_str());
  const std::string v = s.substr(eq + 1);
  char *end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  std::string suf(end);
  for (char &c : suf) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suf.size() > 1 && suf.back() == 'B') suf.pop_back();
  if (suf.size() > 1 && suf.back() == 'I') suf.pop_back();
  double mul = 1;
  if (suf == "K") mul = 1024.0;
  else if (suf == "M") mul = 1024.0 * 1024;
  else if (suf == "G") mul = 1024.0 * 1024 * 1024;
  else if (suf == "T") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (!suf.empty()) fail(Status::InvalidArgument, "fit budget '%s': unknown size suffix '%s'", s.c_str(), end);
  if (end == v.c_str() || !(x >= 0)) fail(Status::InvalidArgument, "fit budget '%s': '%s' is not a size", s.c_str(), v.c_str());
  *device = s.substr(0, eq);
  *bytes = static_cast<uint64_t>(x * mul);
}

namespace {

double gib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

// The first device over its budget, or nullptr.
const DevicePlan *over_budget(const std::vector<DevicePlan> &v) {
  for (const DevicePlan &d : v)
    if (d.budget && d.total() > d.budget) return &d;
  return nullptr;
}

}  // namespace

FitPlan choose_fit(const PlacementParams &user, int n_layer, const PlanEvaluator &evaluate) {
  const bool free_moe = !user.cpu_moe && user.n_cpu_moe < 0;
  const bool free_ngl = user.n_gpu_layers < 0;
  PlacementParams p = user;
  if (free_moe) p.n_cpu_moe = 0;  // n_gpu_layers stays unset (all layers on the GPUs, if any) until it must move
  uint32_t n_ctx = user.fit_n_ctx;
  std::vector<DevicePlan> plan = evaluate(p, n_ctx);
  auto fits_with = [&](PlacementParams q, uint32_t c) {
    std::vector<DevicePlan> v = evaluate(q, c);
    const bool ok = !over_budget(v);
    if (ok) { p = q; n_ctx = c; plan = std::move(v); }
    return ok;
  };
  bool ok = !over_budget(plan);
  // Routed experts to the CPU, from the first layer: the smallest count that fits.
  if (!ok && free_moe && n_layer > 0) {
    PlacementParams q = p;
    q.n_cpu_moe = n_layer;
    if (fits_with(q, n_ctx)) {
      int lo = 1, hi = n_layer;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        q.n_cpu_moe = mid;
        if (!over_budget(evaluate(q, n_ctx))) hi = mid;
        else lo = mid + 1;
      }
      q.n_cpu_moe = lo;
      ok = fits_with(q, n_ctx);
    } else {
      p = q;  // every layer's experts are out; layers follow
      plan = evaluate(p, n_ctx);
    }
  }
  // Whole layers to the CPU: the most GPU layers that fit.
  if (!ok && free_ngl && n_layer > 0) {
    PlacementParams q = p;
    q.n_gpu_layers = 0;
    if (fits_with(q, n_ctx)) {
      int lo = 0, hi = n_layer - 1;  // the largest that fits; 0 does
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        q.n_gpu_layers = mid;
        if (!over_budget(evaluate(q, n_ctx))) lo = mid;
        else hi = mid - 1;
      }
      q.n_gpu_layers = lo;
      ok = fits_with(q, n_ctx);
    }
  }
  // Only when the user allowed it: a smaller context, halved down to 256 cells.
  for (uint32_t c = n_ctx / 2; !ok && user.fit_shrink_ctx && c >= 256; c /= 2) ok = fits_with(p, c);
  if (!ok) {
    const std::vector<DevicePlan> v = evaluate(p, n_ctx);
    const DevicePlan *d = over_budget(v);
    fail(Status::OutOfMemory,
         "no placement fits the budgets: %s needs %.2f GiB, %.2f GiB (%llu bytes) more than its budget of %.2f GiB, even with "
         "n_cpu_moe=%d%s, n_gpu_layers=%d%s and n_ctx=%u%s",
         d->device.c_str(), gib(d->total()), gib(d->total() - d->budget), static_cast<unsigned long long>(d->total() - d->budget), gib(d->budget),
         p.cpu_moe ? n_layer : p.n_cpu_moe, free_moe ? "" : " (set by the user)", p.n_gpu_layers < 0 ? n_layer : p.n_gpu_layers,
         free_ngl ? "" : " (set by the user)", n_ctx,
         user.fit_shrink_ctx ? "" : " (shrinking the context is not allowed)");
  }
  FitPlan out;
  out.cpu_moe = p.cpu_moe;
  out.n_cpu_moe = p.cpu_moe ? n_layer : p.n_cpu_moe;
  out.n_gpu_layers = p.n_gpu_layers < 0 ? n_layer : p.n_gpu_layers;
  out.chose_n_cpu_moe = free_moe;
  out.chose_n_gpu_layers = free_ngl && p.n_gpu_layers >= 0;
  out.n_ctx = n_ctx;
  out.devices = plan;
  out.fitted = (free_moe && p.n_cpu_moe > 0) || out.chose_n_gpu_layers || n_ctx != user.fit_n_ctx;
  out.chosen.push_back(strfmt("n_cpu_moe=%d (%s)", out.n_cpu_moe, free_moe ? "fit" : "user"));
  out.chosen.push_back(strfmt("n_gpu_layers=%d (%s)", out.n_gpu_layers, free_ngl ? "fit" : "user"));
  out.chosen.push_back(strfmt("n_ctx=%u (%s)", n_ctx, n_ctx != user.fit_n_ctx ? "fit" : "user"));
  return out;
}

void apply_fit(const FitPlan &plan, PlacementParams &p) {
  if (plan.chose_n_cpu_moe && !p.cpu_moe && p.n_cpu_moe < 0) p.n_cpu_moe = plan.n_cpu_moe;
  if (plan.chose_n_gpu_layers && p.n_gpu_layers < 0) p.n_gpu_layers = plan.n_gpu_layers;
  p.fit_n_ctx = plan.n_ctx;
}

// The memory plan of one placement of a loaded (not uploaded) model: weights from the
// placement, KV from the layout, activations and scratch from compiling the two graphs every
// context compiles up front (n_ubatch tokens and one token).
static std::vector<DevicePlan> evaluate_plan(const Model::Impl &m, const PlacementParams &pp, uint32_t n_ctx,
                                             const std::vector<std::pair<std::string, uint64_t>> &budgets) {
  std::vector<DeviceInfo> avail;
  for (size_t i = 0; i < m.registry->size(); ++i) avail.push_back(m.registry->at(i)->info());
  const Placement pl = resolve_placement(*m.gguf, m.hp, pp, avail, m.devices);
  std::vector<DevicePlan> out(pl.devices.size());
  const std::vector<uint64_t> wb = pl.weight_bytes();
  PlacedCompile pc;
  pc.placement = &pl;
  for (size_t d = 0; d < pl.devices.size(); ++d) {
    out[d].device = pl.devices[d];
    out[d].weights = wb[d];
    Backend *b = m.registry->find(pl.devices[d]);
    pc.devices.push_back(b);
    uint64_t budget = 0;
    bool set = false;
    for (const auto &bd : budgets)
      if (bd.first == pl.devices[d]) { budget = bd.second; set = true; }
    if (!set && pl.is_gpu[d]) {
      const uint64_t fr = b->info().free_memory;
      budget = fr > pp.fit_margin ? fr - pp.fit_margin : 1;
    }
    out[d].budget = budget;
  }
  const DType kt = kv_dtype(static_cast<KvType>(pp.fit_kv_type));
  const std::vector<KvLayerDims> layout = m.arch->kv_layout(m.hp);
  for (size_t l = 0; l < layout.size(); ++l) {
    const int d = l < pl.kv_device.size() ? pl.kv_device[l] : pl.output_device;
    out[static_cast<size_t>(d)].kv_cache += (row_size(kt, layout[l].k_row) + row_size(kt, layout[l].v_row)) * n_ctx;
    // Recurrent layers: two F32 copies of every sequence's state on the same device (KvCache).
    const uint64_t n_seq = std::max<uint32_t>(1, std::min<uint32_t>(pp.fit_n_seq_max, 64));
    out[static_cast<size_t>(d)].kv_cache += 2 * n_seq * static_cast<uint64_t>(layout[l].recurrent()) * sizeof(float);
  }
  pc.n_threads = physical_core_count();
  pc.gpu_tuning = pp.fit_gpu_tuning;
  pc.allow_fallback = pp.allow_fallback;
  std::vector<uint64_t> arena(pl.devices.size(), 0), work(pl.devices.size(), 0);
  for (size_t d = 0; d < pl.devices.size() && pc.stream_fallback_gpu < 0; ++d)
    if (pl.is_gpu[d] && !pc.devices[d]->host_memory()) pc.stream_fallback_gpu = static_cast<int>(d);
  for (uint32_t nt : {std::max<uint32_t>(1, std::min(pp.fit_n_ubatch, n_ctx)), 1u}) {
    // A context streams host weights to a GPU for big ubatches (ContextParams::stream_min_tokens):
    // their copies take GPU arena space, so the plan counts them.
    pc.stream = static_cast<int>(nt) >= kStreamMinTokensAuto;
    const CompileOptions co = placed_compile_options(pc);
    GraphBuildParams gp;
    gp.n_tokens = nt;
    gp.n_outputs = 1;
    gp.n_cells = n_ctx;
    gp.kv_type = static_cast<KvType>(pp.fit_kv_type);
    Graph g;
    g.cpu_float_order = false;
    m.arch->build(m, gp, g);
    auto plan = compile_graph(std::move(g), co);
    for (size_t d = 0; d < pl.devices.size(); ++d) {
      arena[d] = std::max<uint64_t>(arena[d], plan->arena_bytes[d]);
      work[d] = std::max<uint64_t>(work[d], plan->work_bytes[d]);
    }
  }
  for (size_t d = 0; d < pl.devices.size(); ++d) {
    out[d].workspace = std::min(work[d], arena[d]);
    out[d].activations = arena[d] - out[d].workspace;
  }
  return out;
}

FitPlan fit_loaded_model(Model::Impl &m, const ModelLoadParams &params) {
  if (!m.registry) m.registry = std::make_unique<BackendRegistry>(params.placement.twin_device);
  std::vector<std::pair<std::string, uint64_t>> budgets;
  for (const std::string &b : params.placement.budgets) {
    std::string dev;
    uint64_t bytes = 0;
    parse_budget(b, &dev, &bytes);
    if (!m.registry->find(dev)) fail(Status::InvalidArgument, "fit budget '%s': no device '%s'", b.c_str(), dev.c_str());
    budgets.emplace_back(dev, bytes);
  }
  const PlacementParams &u = params.placement;
  if (u.fit_kv_type < 0 || u.fit_kv_type > 2) fail(Status::InvalidArgument, "fit_kv_type %d is not a KV type (0 f32, 1 f16, 2 q8_0)", u.fit_kv_type);
  if (u.fit_n_ctx == 0) fail(Status::InvalidArgument, "fit_n_ctx is 0");
  const int L = static_cast<int>(m.hp.n_layer);
  auto eval = [&](const PlacementParams &p, uint32_t n_ctx) { return evaluate_plan(m, p, n_ctx, budgets); };
  if (u.fit) return choose_fit(u, L, eval);
  // No fit: the plan of the settings as given.
  FitPlan out;
  out.cpu_moe = u.cpu_moe;
  out.n_cpu_moe = u.cpu_moe ? L : std::max(u.n_cpu_moe, 0);
  out.n_gpu_layers = u.n_gpu_layers < 0 ? L : std::min(u.n_gpu_layers, L);
  out.n_ctx = u.fit_n_ctx;
  out.devices = eval(u, u.fit_n_ctx);
  return out;
}

FitPlan fit_model(const std::string &path, const ModelLoadParams &params) {
  auto model = Model::load_metadata(path, params);
  return fit_loaded_model(model->impl(), params);
}

}  // namespace moe
