#include "placement/placement.h"

#include <algorithm>
#include <cstdlib>
#include <regex>

#include "core/status.h"
#include "gguf/gguf_reader.h"
#include "model/hparams.h"

namespace moe {

int tensor_layer(const std::string &name) {
  if (name.compare(0, 4, "blk.") != 0) return -1;
  char *end = nullptr;
  const long l = std::strtol(name.c_str() + 4, &end, 10);
  return end != name.c_str() + 4 && *end == '.' && l >= 0 ? static_cast<int>(l) : -1;
}

bool is_expert_tensor(const std::string &name) { return tensor_layer(name) >= 0 && name.find("_exps") != std::string::npos; }

int Placement::device_of(const GgufTensorInfo *t) const {
  auto it = tensor_device.find(t);
  if (it == tensor_device.end()) fail(Status::InvalidArgument, "tensor '%s' is not part of this model's placement", t ? t->name.c_str() : "(null)");
  return it->second;
}

int Placement::find(const std::string &name) const {
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i] == name) return static_cast<int>(i);
  return -1;
}

std::vector<uint64_t> Placement::weight_bytes() const {
  std::vector<uint64_t> b(devices.size(), 0);
  for (const auto &kv : tensor_device) b[static_cast<size_t>(kv.second)] += (kv.first->nbytes + 255) & ~uint64_t(255);
  return b;
}

bool Placement::all_on(int d) const {
  return std::all_of(tensor_device.begin(), tensor_device.end(), [d](const auto &kv) { return kv.second == d; });
}

namespace {

std::string join(const std::vector<std::string> &v) {
  std::string s;
  for (const auto &x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

struct Rule {
  std::string text;
  std::regex re;
  int device;
};

}  // namespace

Placement resolve_placement(const GgufFile &f, const Hparams &hp, const PlacementParams &p, const std::vector<DeviceInfo> &available,
                            const std::vector<std::string> &wanted) {
  Placement pl;
  // Devices: GPUs in the order asked (or found), then the CPU.
  std::vector<std::string> names;
  for (const auto &d : available) names.push_back(d.name);
  std::vector<const DeviceInfo *> use;
  if (wanted.empty()) {
    for (const auto &d : available) use.push_back(&d);
  } else {
    for (const auto &w : wanted) {
      auto it = std::find_if(available.begin(), available.end(), [&](const DeviceInfo &d) { return d.name == w; });
      if (it == available.end()) fail(Status::InvalidArgument, "devices: '%s' is not available (devices: %s)", w.c_str(), join(names).c_str());
      if (std::find(use.begin(), use.end(), &*it) != use.end()) fail(Status::InvalidArgument, "devices: '%s' is listed twice", w.c_str());
      use.push_back(&*it);
    }
  }
  std::vector<uint64_t> gpu_mem;
  for (const DeviceInfo *d : use)
    if (d->is_gpu) { pl.devices.push_back(d->name); pl.is_gpu.push_back(true); gpu_mem.push_back(d->total_memory ? d->total_memory : 1); }
  const int n_gpu = static_cast<int>(pl.devices.size());
  for (const DeviceInfo *d : use)
    if (!d->is_gpu) { pl.devices.push_back(d->name); pl.is_gpu.push_back(false); }
  const int cpu = pl.cpu();
  // The host device that takes experts and CPU layers: "cpu" when listed, else any host device.
  int host = cpu;
  for (int i = n_gpu; host < 0 && i < static_cast<int>(pl.devices.size()); ++i) host = i;
  const int L = static_cast<int>(hp.n_layer);
  const std::string devs = join(pl.devices);

  // Contradictions first, each naming both settings.
  if (p.cpu_moe && p.n_cpu_moe >= 0)
    fail(Status::InvalidArgument, "cpu_moe (experts of every layer on the CPU) and n_cpu_moe=%d are both set; set one", p.n_cpu_moe);
  if (p.n_cpu_moe < -1 || p.n_cpu_moe > L)
    fail(Status::InvalidArgument, "n_cpu_moe=%d is outside [0, %d] (the model has %d layers)", p.n_cpu_moe, L, L);
  if (p.n_gpu_layers < -1) fail(Status::InvalidArgument, "n_gpu_layers=%d is negative", p.n_gpu_layers);
  if ((p.cpu_moe || p.n_cpu_moe > 0) && host < 0)
    fail(Status::InvalidArgument, "%s puts experts on the CPU, but devices (%s) has no CPU", p.cpu_moe ? "cpu_moe" : "n_cpu_moe", devs.c_str());
  if (!p.tensor_split.empty()) {
    if (n_gpu == 0) fail(Status::InvalidArgument, "tensor_split is set, but devices (%s) has no GPU", devs.c_str());
    if (static_cast<int>(p.tensor_split.size()) > n_gpu)
      fail(Status::InvalidArgument, "tensor_split has %zu entries, but devices (%s) has %d GPU(s)", p.tensor_split.size(), devs.c_str(), n_gpu);
    float sum = 0;
    for (float x : p.tensor_split) {
      if (!(x >= 0)) fail(Status::InvalidArgument, "tensor_split: %g is not a share >= 0", static_cast<double>(x));
      sum += x;
    }
    if (sum <= 0) fail(Status::InvalidArgument, "tensor_split gives every GPU a share of 0");
    if (p.n_gpu_layers == 0) fail(Status::InvalidArgument, "tensor_split is set, but n_gpu_layers=0 puts every layer on the CPU");
  }
  if (p.n_gpu_layers > 0 && n_gpu == 0) fail(Status::InvalidArgument, "n_gpu_layers=%d, but devices (%s) has no GPU", p.n_gpu_layers, devs.c_str());
  if (p.n_gpu_layers >= 0 && p.n_gpu_layers < L && host < 0)
    fail(Status::InvalidArgument, "n_gpu_layers=%d leaves layers for the CPU, but devices (%s) has no CPU", p.n_gpu_layers, devs.c_str());
  if (p.zero_copy == 1 && n_gpu == 0) fail(Status::InvalidArgument, "zero_copy=1, but devices (%s) has no GPU", devs.c_str());
  int main = -1;
  if (!p.main_device.empty()) {
    main = pl.find(p.main_device);
    if (main < 0) fail(Status::InvalidArgument, "main_device '%s' is not among devices (%s)", p.main_device.c_str(), devs.c_str());
  }
  std::vector<Rule> rules;
  for (const std::string &r : p.overrides) {
    const size_t eq = r.rfind('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == r.size())
      fail(Status::InvalidArgument, "override_tensor '%s' is not REGEX=DEVICE", r.c_str());
    const std::string dev = r.substr(eq + 1);
    int d = pl.find(dev);
    if (d < 0 && (dev == "CPU" || dev == "cpu")) d = host;  // the reference engine spells it CPU
    if (d < 0) fail(Status::InvalidArgument, "override_tensor '%s': device '%s' is not among devices (%s)", r.c_str(), dev.c_str(), devs.c_str());
    try {
      rules.push_back({r, std::regex(r.substr(0, eq), std::regex::ECMAScript | std::regex::optimize), d});
    } catch (const std::regex_error &e) {
      fail(Status::InvalidArgument, "override_tensor '%s': bad regular expression (%s)", r.c_str(), e.what());
    }
  }

  // Layers: the first L - G on the host, the last G split over the GPUs.
  const int G = n_gpu == 0 ? 0 : (p.n_gpu_layers < 0 ? L : std::min(p.n_gpu_layers, L));
  std::vector<double> share(static_cast<size_t>(n_gpu), 0.0);
  double total = 0;
  for (int g = 0; g < n_gpu; ++g) {
    share[static_cast<size_t>(g)] = p.tensor_split.empty() ? static_cast<double>(gpu_mem[static_cast<size_t>(g)])
                                    : g < static_cast<int>(p.tensor_split.size()) ? p.tensor_split[static_cast<size_t>(g)] : 0.0;
    total += share[static_cast<size_t>(g)];
  }
  pl.layer_device.assign(static_cast<size_t>(L), host);
  for (int l = L - G; l < L; ++l) {
    // Layer i of the G goes to the first GPU whose cumulative share exceeds i / G.
    const double at = (static_cast<double>(l - (L - G)) + 0.5) / static_cast<double>(G);
    double cum = 0;
    int g = n_gpu - 1;
    for (int k = 0; k < n_gpu; ++k) {
      cum += share[static_cast<size_t>(k)] / total;
      if (at < cum) { g = k; break; }
    }
    pl.layer_device[static_cast<size_t>(l)] = g;
  }
  const int first_dev = L ? pl.layer_device.front() : (n_gpu ? 0 : host);
  const int last_dev = L ? pl.layer_device.back() : (n_gpu ? 0 : host);
  pl.output_device = main >= 0 ? main : last_dev;

  pl.kv_device = pl.layer_device;
  std::vector<bool> kv_set(static_cast<size_t>(L), false);
  for (const GgufTensorInfo &t : f.tensors()) {
    int d = -1;
    for (const Rule &r : rules)
      if (std::regex_search(t.name, r.re)) { d = r.device; break; }
    const int l = tensor_layer(t.name);
    if (d < 0) {
      if (l >= L) fail(Status::InvalidModel, "tensor '%s' names layer %d of a %d-layer model", t.name.c_str(), l, L);
      if (l >= 0 && is_expert_tensor(t.name) && (p.cpu_moe || l < p.n_cpu_moe)) d = host;
      else if (l >= 0) d = pl.layer_device[static_cast<size_t>(l)];
      else if (t.name.compare(0, 6, "output") == 0) d = pl.output_device;
      else if (t.name.compare(0, 10, "token_embd") == 0) d = first_dev;
      else d = last_dev;
    }
    if (d < 0) fail(Status::InvalidArgument, "tensor '%s' has no device (devices: %s)", t.name.c_str(), devs.c_str());
    pl.tensor_device[&t] = d;
    // The layer's attention (and KV cache) goes with its first attention projection.
    if (l >= 0 && l < L && !kv_set[static_cast<size_t>(l)] && t.name.find(".attn_") != std::string::npos &&
        t.name.find("norm") == std::string::npos) {
      pl.kv_device[static_cast<size_t>(l)] = d;
      kv_set[static_cast<size_t>(l)] = true;
    }
  }
  return pl;
}

}  // namespace moe
