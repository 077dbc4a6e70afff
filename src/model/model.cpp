// Model loading: GGUF (mmap, overrides) -> hparams -> architecture checks -> vocabulary.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "core/mapped_read.h"
#include "engine/engine.h"
#include "model/arch/arch.h"
#include "model/model_impl.h"
#include "placement/fit.h"
#include "tokenizer/vocab.h"

namespace moe {

static std::string shape_str(const int64_t *ne, int n) {
  std::string s = "{";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

const GgufTensorInfo *Model::Impl::optional(const std::string &name, std::initializer_list<int64_t> shape) const {
  const GgufTensorInfo *t = gguf->tensor(name);
  if (!t) return nullptr;
  int64_t want[4] = {1, 1, 1, 1};
  int n = 0;
  for (int64_t d : shape) want[n++] = d;
  for (int d = 0; d < 4; ++d)
    if (t->ne[d] != want[d])
      fail(Status::InvalidModel, "tensor '%s' has shape %s, expected %s", name.c_str(), shape_str(t->ne, static_cast<int>(t->n_dims)).c_str(),
           shape_str(want, n).c_str());
  if (!type_traits(t->type).supported) fail(Status::Unsupported, "tensor '%s' has type %s, which is not supported", name.c_str(), dtype_name(t->type));
  return t;
}

const GgufTensorInfo *Model::Impl::require(const std::string &name, std::initializer_list<int64_t> shape) const {
  const GgufTensorInfo *t = optional(name, shape);
  if (!t) fail(Status::InvalidModel, "%s model: tensor '%s' is missing", hp.arch.c_str(), name.c_str());
  return t;
}

// Drop mapped file pages from this process once their bytes live elsewhere (the page cache
// keeps them, reclaimable): resident memory then holds each weight about once.
static void release_mapped(const uint8_t *p, size_t n) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p + n)) & ~(page - 1);
  if (e > a) madvise(reinterpret_cast<void *>(a), e - a, MADV_DONTNEED);
}

void Model::Impl::ensure_cpu_copy() const {
  std::lock_guard<std::mutex> lock(cpu_copy_mu);
  if (!cpu_weight_copy || vocab_only || !gguf->is_mmapped() || cpu_copy_base.load()) return;
  // The tensors placed on host devices (all of them when none is on a GPU).
  std::vector<const GgufTensorInfo *> ts;
  for (const GgufTensorInfo &t : gguf->tensors()) {
    auto it = placement.tensor_device.find(&t);
    if (it == placement.tensor_device.end() || !placement.is_gpu[static_cast<size_t>(it->second)]) ts.push_back(&t);
  }
  std::unordered_map<const GgufTensorInfo *, size_t> off;
  size_t bytes = 0;
  for (const GgufTensorInfo *t : ts) {
    off[t] = bytes;
    bytes += (t->nbytes + 63) & ~size_t(63);
  }
  if (bytes == 0) return;
  // Made also without THP (then in 4 KiB pages): once it exists no CPU kernel reads the file
  // mapping, so a model file truncated or rewritten on disk after load cannot fault a decode
  // (docs/reliability.md). The copy itself reads the mapping through copy_from_mapping: a file
  // that shrank since load is an IoError of this call, not a SIGBUS.
  HugePageBuffer b(bytes);
  // Copy in slices and drop each slice's mapped pages from this process once copied.
  constexpr size_t kSlice = size_t(64) << 20;
  for (const GgufTensorInfo *t : ts)
    for (size_t o = 0; o < t->nbytes; o += kSlice) {
      const size_t n = t->nbytes - o < kSlice ? t->nbytes - o : kSlice;
      if (!copy_from_mapping(b.data() + off[t] + o, t->data + o, n))
        fail(Status::IoError, "reading tensor '%s' from '%s' failed (SIGBUS): the file shrank or was replaced on disk after the model was loaded",
             t->name.c_str(), gguf->part_path(t->part).c_str());  // a split model's own part
      release_mapped(t->data + o, n);
    }
  cpu_copy = std::move(b);
  cpu_copy_off = std::move(off);
  cpu_copy_base.store(cpu_copy.data(), std::memory_order_release);
  MOE_LOG_INFO("copied %.2f MiB of weights (%zu tensors) into huge pages for the CPU", static_cast<double>(bytes) / 1048576.0, ts.size());
}

bool Model::Impl::pin_cpu_weights(Backend &gpu) const {
  std::lock_guard<std::mutex> lock(cpu_copy_mu);
  if (cpu_copy_pin) return true;
  if (!cpu_copy_base.load() || cpu_copy.size() == 0) return false;
  cpu_copy_pin = gpu.register_host(cpu_copy.data(), cpu_copy.size());
  if (cpu_copy_pin) MOE_LOG_INFO("page-locked %.2f MiB of CPU weights for %s", static_cast<double>(cpu_copy.size()) / 1048576.0, gpu.info().name.c_str());
  return cpu_copy_pin != nullptr;
}

// The registration goes before the memory it covers.
Model::Impl::~Impl() { cpu_copy_pin.reset(); }

void Model::Impl::resolve_and_upload(const std::function<void(float)> &progress, bool upload) {
  if (!registry) registry = std::make_unique<BackendRegistry>(placement_params.twin_device);
  std::vector<DeviceInfo> avail;
  for (size_t i = 0; i < registry->size(); ++i) avail.push_back(registry->at(i)->info());
  placement = resolve_placement(*gguf, hp, placement_params, avail, devices);
  dev_weights.clear();
  dev_weights.resize(placement.devices.size());
  if (!upload) return;
  const std::vector<uint64_t> per_dev = placement.weight_bytes();
  uint64_t total = 0, done = 0;
  for (size_t d = 0; d < placement.devices.size(); ++d)
    if (placement.is_gpu[d]) total += per_dev[d];
  for (size_t d = 0; d < placement.devices.size(); ++d) {
    if (!placement.is_gpu[d] || per_dev[d] == 0) continue;
    Backend *be = registry->find(placement.devices[d]);
    std::vector<const GgufTensorInfo *> ts;
    for (const GgufTensorInfo &t : gguf->tensors())
      if (placement.device_of(&t) == static_cast<int>(d)) ts.push_back(&t);
    const bool zero_copy = placement_params.zero_copy == 1 || (placement_params.zero_copy < 0 && be->info().integrated);
    const uint64_t base = done;
    auto prog = [&](float f) {
      progress(total ? static_cast<float>(static_cast<double>(base) + f * static_cast<double>(per_dev[d])) / static_cast<float>(total) : 1.0f);
      return true;
    };
    const bool mapped = gguf->is_mmapped();
    dev_weights[d] = DeviceWeights::upload(ts, *be, prog, zero_copy,
                                           mapped ? std::function<void(const uint8_t *, size_t)>(release_mapped) : nullptr);
    done += per_dev[d];
  }
}

Model::Model() : impl_(std::make_unique<Impl>()) {}
Model::~Model() = default;

std::unique_ptr<Model> open_model(const std::string &path, const ModelLoadParams &params, bool upload) {
  std::unique_ptr<Model> model = Model::create_empty();
  Model::Impl &m = model->impl();
  auto progress = [&](float f) {
    if (params.progress && !params.progress(f)) fail(Status::Aborted, "model load cancelled by the progress callback");
  };
  progress(0.0f);
  GgufOpenOptions o;
  o.use_mmap = params.use_mmap;
  o.overrides = params.kv_overrides;
  m.gguf = GgufFile::open(path, o);
  m.vocab = Vocab::from_gguf(*m.gguf);
  m.vocab_only = params.vocab_only;
  m.cpu_weight_copy = params.cpu_weight_copy;
  m.hp = Hparams::from_gguf(*m.gguf);
  m.arch = find_arch(m.hp.arch);
  if (!m.arch && !params.vocab_only)
    fail(Status::Unsupported, "architecture '%s' is not supported (supported: %s)", m.hp.arch.c_str(), supported_archs().c_str());
  m.placement_params = params.placement;
  m.devices = params.devices;
  if (!params.vocab_only) {
    m.arch->validate(m);
    const size_t n_t = m.gguf->tensors().size();
    size_t i = 0;
    for (const auto &t : m.gguf->tensors()) {
      m.n_params += static_cast<uint64_t>(t.n_elements());
      m.weight_bytes += t.nbytes;
      if (++i % 64 == 0) progress(0.1f * static_cast<float>(i) / static_cast<float>(n_t));
    }
  }
  if (!params.vocab_only) {
    if (upload && m.placement_params.fit) {
      const FitPlan plan = fit_loaded_model(m, params);
      apply_fit(plan, m.placement_params);
    }
    m.resolve_and_upload([&](float f) { progress(0.1f + 0.9f * f); }, upload);
    m.metadata_only = !upload;
  }
  progress(1.0f);
  MOE_LOG_INFO("loaded %s (%s): %zu tensors in %zu file(s), %.2f MiB", path.c_str(), m.hp.arch.c_str(), m.gguf->tensors().size(),
               m.gguf->n_parts(), static_cast<double>(m.weight_bytes) / 1048576.0);
  return model;
}

std::unique_ptr<Model> Model::load(const std::string &path, const ModelLoadParams &params) { return open_model(path, params, true); }
std::unique_ptr<Model> Model::load_metadata(const std::string &path, const ModelLoadParams &params) { return open_model(path, params, false); }
std::unique_ptr<Model> Model::create_empty() { return std::unique_ptr<Model>(new Model()); }

const GgufFile &Model::gguf() const { return *impl_->gguf; }
const Hparams &Model::hparams() const { return impl_->hp; }

bool Model::set_cpu_weight_copy(bool on) {
  std::lock_guard<std::mutex> lock(impl_->cpu_copy_mu);  // ensure_cpu_copy reads it under this lock
  if (impl_->cpu_copy_base.load()) return false;
  impl_->cpu_weight_copy = on;
  return true;
}
const Vocab *Model::vocab() const { return impl_->vocab.get(); }
const std::string &Model::arch_name() const { return impl_->hp.arch; }
int32_t Model::n_vocab() const { return static_cast<int32_t>(impl_->hp.n_vocab); }
uint64_t Model::n_params() const { return impl_->n_params; }
uint64_t Model::weight_bytes() const { return impl_->weight_bytes; }

uint64_t Model::decode_read_bytes() const {
  const auto &ts = gguf().tensors();
  const Hparams &hp = hparams();
  const bool tied = std::none_of(ts.begin(), ts.end(), [](const GgufTensorInfo &t) { return t.name == "output.weight"; });
  double bytes = 0;
  for (const auto &t : ts) {
    double b = static_cast<double>(t.nbytes);
    if (t.name.find("_exps") != std::string::npos && hp.n_expert > 0) b *= double(hp.n_expert_used) / double(hp.n_expert);
    else if (t.name == "token_embd.weight" && !tied && t.ne[1] > 0) b /= double(t.n_elements() / t.ne[0]);
    bytes += b;
  }
  return static_cast<uint64_t>(bytes);
}

const char *kv_type_name(KvType t) {
  switch (t) {
    case KvType::F32: return "f32";
    case KvType::F16: return "f16";
    case KvType::Q8_0: return "q8_0";
  }
  return "?";
}

bool kv_type_from_name(const std::string &s, KvType *out) {
  if (s == "f32") *out = KvType::F32;
  else if (s == "f16") *out = KvType::F16;
  else if (s == "q8_0") *out = KvType::Q8_0;
  else return false;
  return true;
}

}  // namespace moe
