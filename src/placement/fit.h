// Fit: the placement and the memory plan per device for a model file, devices, budgets and
// context settings, computed without loading weights (the file's metadata and tensor table
// only), with the unset placement values chosen so every device fits its budget.
//
//   ModelLoadParams mp;  mp.placement.fit = true;  mp.placement.budgets = {"cuda0=10G"};
//   FitPlan plan = fit_model("model.gguf", mp);      // throws OutOfMemory when no placement fits
//   plan.n_cpu_moe;  plan.devices[0].total();
//
// Model::load with placement.fit set runs the same fit, then loads with its choice.
// Search (choose_fit): everything on the GPUs first; then routed experts to the CPU layer by
// layer from the first (the smallest n_cpu_moe that fits, when unset); then whole layers to
// the CPU (the largest n_gpu_layers that fits, when unset); then, only with fit_shrink_ctx, a
// smaller context. A value the user set is never changed.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace moe {

struct DevicePlan {
  std::string device;        // "cpu", "cuda0"
  uint64_t weights = 0;      // weight bytes resident there
  uint64_t kv_cache = 0;     // KV cache of the layers whose attention runs there
  uint64_t activations = 0;  // activation arena (largest compiled plan), scratch excluded
  uint64_t workspace = 0;    // kernels' scratch inside the arena (quantized activations, routing)
  uint64_t budget = 0;       // bytes allowed (0: no budget, e.g. the CPU)
  uint64_t total() const { return weights + kv_cache + activations + workspace; }
};

struct FitPlan {
  int n_cpu_moe = 0;          // layers whose routed experts are on the CPU (first layers)
  int n_gpu_layers = 0;       // layers on GPUs (the last ones)
  bool cpu_moe = false;       // every layer's experts on the CPU
  uint32_t n_ctx = 0;         // context the plan reserves KV for (lower than asked only with fit_shrink_ctx)
  bool fitted = false;        // the fit chose at least one value
  bool chose_n_cpu_moe = false, chose_n_gpu_layers = false;  // values the fit set (apply_fit writes only these)
  std::vector<DevicePlan> devices;
  std::vector<std::string> chosen;  // "n_cpu_moe=12 (fit)", "n_gpu_layers=48 (user)", ... for reports
};

// The plan of a model file (dry run: nothing is uploaded). With placement.fit the unset
// values are chosen; otherwise the plan of the settings as given.
FitPlan fit_model(const std::string &path, const ModelLoadParams &params);

// "DEVICE=BYTES" with an optional binary K/M/G/T suffix (B, iB accepted): InvalidArgument otherwise.
void parse_budget(const std::string &s, std::string *device, uint64_t *bytes);

// The search alone, over a plan evaluator (unit-testable without devices). evaluate(p, n_ctx)
// returns the per-device plan of placement p with a context of n_ctx cells; budgets are in
// the DevicePlan::budget fields it returns (0 = none). n_layer: the model's layers.
// Throws OutOfMemory naming the device and the bytes missing when nothing fits.
using PlanEvaluator = std::function<std::vector<DevicePlan>(const PlacementParams &p, uint32_t n_ctx)>;
FitPlan choose_fit(const PlacementParams &user, int n_layer, const PlanEvaluator &evaluate);

// The fit's choice written into p (only the values it chose).
void apply_fit(const FitPlan &plan, PlacementParams &p);

// fit_model over a model already opened (Model::load runs this when placement.fit is set).
FitPlan fit_loaded_model(Model::Impl &m, const ModelLoadParams &params);

}  // namespace moe
