// Context: owns the backend registry, KV cache, compiled plans (one per batch bucket) and
// their activation arenas; decode() splits a batch into ubatches and runs the plan.
#include <algorithm>
#include <cstring>
#include <exception>
#include <new>

#include "backends/cpu/thread_pool.h"
#include "core/alloc_test_hook.h"
#include "core/log.h"
#include "engine/context_impl.h"
#include "core/step_profile.h"
#include "gguf/gguf_reader.h"
#include "model/arch/arch.h"
#include "model/model_impl.h"
#include "placement/placed_compile.h"

namespace moe {

Context::Context() : impl_(std::make_unique<Impl>()) {}
Context::~Context() = default;

static Backend *pick_device(const BackendRegistry &reg, const std::string &want) {
  if (want == "auto" || want.empty()) {
    for (size_t i = 0; i < reg.size(); ++i)
      if (reg.at(i)->info().is_gpu) return reg.at(i);
    return reg.cpu();
  }
  Backend *b = reg.find(want);
  if (!b) {
    std::string names;
    for (size_t i = 0; i < reg.size(); ++i) names += (i ? ", " : "") + reg.at(i)->info().name;
    // A GPU name: say whether CUDA is missing from the build or no GPU answered.
    const std::string why = want.compare(0, 4, "cuda") == 0 ? gpu_unavailable_reason() : "";
    fail(Status::InvalidArgument, "device '%s' is not available (devices: %s)%s%s", want.c_str(), names.c_str(),
         why.empty() ? "" : "; ", why.c_str());
  }
  return b;
}

std::unique_ptr<Context> Context::create(const Model &model, const ContextParams &params) {
  const Model::Impl &m = model.impl();
  if (m.vocab_only) fail(Status::InvalidArgument, "model was loaded vocab-only; it cannot run");
  if (m.metadata_only) fail(Status::InvalidArgument, "model was opened for planning only (load_metadata); it cannot run");
  std::unique_ptr<Context> ctx(new Context());
  Impl &c = *ctx->impl_;
  c.model = &model;
  c.params = params;
  ContextParams &p = c.params;
  // Limits first: they bound what the steps below allocate.
  if (p.n_ctx > kMaxContextCells) fail(Status::InvalidArgument, "n_ctx %u exceeds the limit %u", p.n_ctx, kMaxContextCells);
  if (p.n_batch > kMaxBatchTokens) fail(Status::InvalidArgument, "n_batch %u exceeds the limit %u", p.n_batch, kMaxBatchTokens);
  if (p.n_ubatch > kMaxUbatchTokens) fail(Status::InvalidArgument, "n_ubatch %u exceeds the limit %u", p.n_ubatch, kMaxUbatchTokens);
  if (p.n_seq_max == 0 || p.n_seq_max > kMaxSequences)
    fail(Status::InvalidArgument, "n_seq_max %u is outside the limits 1..%u", p.n_seq_max, kMaxSequences);
  if (p.n_threads > kMaxThreads) fail(Status::InvalidArgument, "n_threads %d exceeds the limit %d", p.n_threads, kMaxThreads);
  if (p.n_ctx == 0) p.n_ctx = std::min<uint32_t>(m.hp.n_ctx_train ? m.hp.n_ctx_train : 4096, 4096);
  if (p.n_batch == 0) p.n_batch = 512;
  if (p.n_ubatch == 0 || p.n_ubatch > p.n_batch) p.n_ubatch = std::min<uint32_t>(p.n_batch, 512);

  c.registry = std::make_unique<BackendRegistry>(m.placement_params.twin_device);
  c.model_placement = p.device.empty() || p.device == "auto";
  if (c.model_placement) {
    for (size_t d = 0; d < m.placement.devices.size(); ++d) {
      Backend *b = c.registry->find(m.placement.devices[d]);
      if (!b) fail(Status::DeviceError, "device '%s' of the model's placement is gone", m.placement.devices[d].c_str());
      c.devices.push_back(b);
      c.model_dev.push_back(static_cast<int>(d));
    }
  } else {
    // One named device runs everything (weights: the model's copy when it put them all there).
    Backend *main = pick_device(*c.registry, p.device);
    c.devices.push_back(main);
    c.model_dev.push_back(m.placement.find(main->info().name));
    if (m.placement_params.allow_fallback && !main->host_memory()) {
      c.devices.push_back(c.registry->cpu());
      c.model_dev.push_back(m.placement.find("cpu"));
    }
    const int md = c.model_dev[0];
    const bool shared = md >= 0 && m.placement.all_on(md) && m.dev_weights[static_cast<size_t>(md)];
    if (!main->host_memory() && !shared) {
      std::vector<const GgufTensorInfo *> ts;
      for (const GgufTensorInfo &t : m.gguf->tensors()) ts.push_back(&t);
      c.dev_weights = DeviceWeights::upload(ts, *main);
    }
  }
  // Mixed: host and GPU devices both hold weights of the plan (a GPU-only placement keeps the
  // CPU in its device list, idle: that is not mixed).
  bool host = false, gpu = false;
  if (c.model_placement) {
    const std::vector<uint64_t> wb = m.placement.weight_bytes();
    for (size_t d = 0; d < c.devices.size(); ++d)
      if (wb[static_cast<size_t>(c.model_dev[d])]) (c.devices[d]->host_memory() ? host : gpu) = true;
  } else {
    for (Backend *b : c.devices) (b->host_memory() ? host : gpu) = true;
  }
  c.mixed = host && gpu;
  // CPU and GPU parts of one plan: one core is left to the thread that drives the GPU (its
  // waits and launches); measured on the H200 host, experts on the CPU: 16 of 16 threads
  // tg 32 t/s with wide spread, 15 threads 47 t/s (docs/perf/placement.md).
  if (p.n_threads <= 0) p.n_threads = c.mixed ? std::max(1, physical_core_count() - 1) : physical_core_count();
  for (Backend *b : c.devices) c.executors.push_back(b->make_executor(p.n_threads, p.gpu_tuning));
  c.pending.assign(c.executors.size(), false);
  if (!p.gpu_graphs)
    for (auto &e : c.executors) e->set_graphs_enabled(false);
  for (size_t d = 0; d < c.devices.size(); ++d)
    if (c.devices[d]->host_memory()) { m.ensure_cpu_copy(); break; }
  // Host weights a GPU copies (prompt streaming) must be page-locked: pageable copies are
  // staged by the driver at a fraction of the bus speed and cannot be captured in graphs.
  // Direct expert reads need them page-locked too (and readable in place).
  c.pinned_gpu = -1;
  if (c.mixed && c.model_placement && (p.stream_min_tokens != 0 || p.direct_expert_slots > 0))
    for (size_t d = 0; d < c.devices.size() && c.pinned_gpu < 0; ++d)
      if (!c.devices[d]->host_memory() && m.pin_cpu_weights(*c.devices[d])) c.pinned_gpu = static_cast<int>(d);
  c.stream_gpu = p.stream_min_tokens != 0 ? c.pinned_gpu : -1;
  c.marked.assign(c.executors.size(), false);
  c.plan_direct_slots();
  c.arenas.resize(c.devices.size());
  c.arena_bytes.assign(c.devices.size(), 0);
  {
    std::vector<KvLayerDims> layout = m.arch->kv_layout(m.hp);
    std::vector<Backend *> layer_dev;
    for (int l = 0; l < static_cast<int>(layout.size()); ++l) layer_dev.push_back(c.devices[static_cast<size_t>(c.kv_device_of(l))]);
    c.kv = std::make_unique<KvCache>(p.n_ctx, p.n_seq_max, p.kv_type, std::move(layout), layer_dev);
  }

  c.ub_tokens.resize(p.n_ubatch);
  c.ub_pos.resize(p.n_ubatch);
  c.ub_seq.resize(p.n_ubatch);
  c.ub_cells.resize(p.n_ubatch);
  c.ub_out_ids.resize(p.n_ubatch);
  c.claimed.reserve(p.n_batch);
  c.logit_row.assign(p.n_batch, -1);
  // Compile the buckets every generation loop uses, so arenas are sized up front and a
  // steady-state decode neither compiles nor allocates.
  c.plan_for(1, 1);
  c.plan_for(p.n_ubatch, 1);
  c.update_report();
  return ctx;
}

CompiledPlan &Context::Impl::plan_for(int64_t n_tokens, int64_t n_outputs) {
  auto key = std::make_pair(n_tokens, n_outputs);
  auto it = plans.find(key);
  if (it != plans.end()) return *it->second;
  const Model::Impl &m = model->impl();
  GraphBuildParams gp;
  gp.n_tokens = n_tokens;
  gp.n_outputs = n_outputs;
  gp.n_cells = kv->n_cells();
  gp.kv_type = params.kv_type;
  Graph g;
  g.cpu_float_order = params.cpu_float_order;
  if (n_tokens == 1) g.moe_direct_slots_by_layer = direct_slots;
  m.arch->build(m, gp, g);
  auto plan = compile_graph(std::move(g), compile_options(n_tokens));
  if (plan->input_tokens < 0 || plan->input_pos < 0 || plan->input_out_ids < 0 || plan->output_logits < 0)
    fail(Status::Internal, "%s graph lacks tokens/pos/out_ids inputs or logits output", m.hp.arch.c_str());
  // All or nothing: allocate every larger arena and bind the new plan to the arenas it
  // will use, then cache it; only then swap the arenas in and rebind the older plans (that
  // part cannot fail). A failure before the swap leaves sizes, arenas and plans unchanged.
  std::unique_ptr<DeviceBuffer> grown[kMaxDevices];
  void *bases[kMaxDevices] = {nullptr};
  bool grow = false;
  for (size_t d = 0; d < devices.size(); ++d) {
    if (plan->arena_bytes[d] > arena_bytes[d]) {
      grown[d] = alloc_arena(d, plan->arena_bytes[d]);
      grow = true;
    }
    DeviceBuffer *a = grown[d] ? grown[d].get() : arenas[d].get();
    bases[d] = a ? a->data() : nullptr;
  }
  bind_plan(*plan, bases, [this](const Node &n) { return weight_addr(n); });
  CompiledPlan &ref = *plan;
  plans.emplace(key, std::move(plan));
  if (grow) {
    for (size_t d = 0; d < devices.size(); ++d)
      if (grown[d]) {
        arena_bytes[d] = ref.arena_bytes[d];
        arenas[d] = std::move(grown[d]);
      }
    rebind_all();  // arenas moved: every older cached plan points at the old ones
  }
  MOE_LOG_DEBUG("compiled plan for %lld tokens / %lld outputs: %zu nodes, %zu segments, arena %zu bytes, %d in place",
                (long long)n_tokens, (long long)n_outputs, ref.graph.nodes().size(), ref.segments.size(), ref.arena_bytes[0], ref.n_inplace);
  return ref;
}

void Context::Impl::bind(CompiledPlan &plan) {
  void *bases[kMaxDevices] = {nullptr};
  for (size_t d = 0; d < devices.size(); ++d) bases[d] = arenas[d] ? arenas[d]->data() : nullptr;
  bind_plan(plan, bases, [this](const Node &n) { return weight_addr(n); });
}

void Context::Impl::rebind_all() {
  for (auto &kv_plan : plans) bind(*kv_plan.second);
  update_report();
}

CompileOptions Context::Impl::compile_options(int64_t n_tokens) const {
  const Model::Impl &m = model->impl();
  if (!model_placement) {  // everything on devices[0]
    CompileOptions co;
    co.devices = devices;
    co.n_threads = params.n_threads;
    co.gpu_tuning = params.gpu_tuning;
    co.allow_fallback = m.placement_params.allow_fallback;
    return co;
  }
  // The model's placement indices are this context's device indices (same order).
  PlacedCompile pc;
  pc.placement = &m.placement;
  pc.devices = devices;
  pc.n_threads = params.n_threads;
  pc.gpu_tuning = params.gpu_tuning;
  pc.allow_fallback = m.placement_params.allow_fallback;
  const int min_tokens = params.stream_min_tokens < 0 ? kStreamMinTokensAuto : params.stream_min_tokens;
  pc.stream = min_tokens > 0 && n_tokens >= min_tokens;
  pc.stream_fallback_gpu = stream_gpu;
  pc.direct_reads = !direct_slots.empty();
  return placed_compile_options(pc);
}

void Context::Impl::plan_direct_slots() {
  direct_slots.clear();
  const Model::Impl &m = model->impl();
  if (pinned_gpu < 0 || params.direct_expert_slots <= 0 || !m.cpu_copy_pin || !m.cpu_copy_pin->readable_in_place()) return;
  const int slots = std::min(params.direct_expert_slots, static_cast<int>(m.hp.n_expert_used) - 1);
  if (slots <= 0) return;
  const Placement &pl = m.placement;
  bool any = false;
  std::vector<int> per_layer(m.hp.n_layer, 0);
  for (uint32_t l = 0; l < m.hp.n_layer; ++l) {
    const GgufTensorInfo *t = m.find("blk." + std::to_string(l) + ".ffn_gate_exps.weight");
    const int kd = l < pl.kv_device.size() ? pl.kv_device[l] : -1;
    if (!t || kd < 0 || devices[static_cast<size_t>(kd)]->host_memory()) continue;
    if (!devices[static_cast<size_t>(pl.device_of(t))]->host_memory()) continue;  // experts on a GPU already
    per_layer[l] = slots;
    any = true;
  }
  if (any) direct_slots = std::move(per_layer);
}

// A host arena that GPU streams copy to and from is pinned (copies from pageable memory
// would be staged synchronously and could not be captured in a CUDA graph).
std::unique_ptr<DeviceBuffer> Context::Impl::alloc_arena(size_t d, size_t bytes) {
  if (devices[d]->host_memory())
    for (Backend *b : devices)
      if (!b->host_memory())
        if (auto buf = b->alloc_pinned_host(bytes)) return buf;
  return devices[d]->alloc(bytes, "activations");
}

void *Context::Impl::weight_addr(const Node &n) const {
  const Model::Impl &m = model->impl();
  const Backend *b = devices[static_cast<size_t>(n.device)];
  void *p = nullptr;
  if (dev_weights) p = dev_weights->find(n.weight);
  const int md = model_dev[static_cast<size_t>(n.device)];
  if (!p && md >= 0 && m.dev_weights[static_cast<size_t>(md)]) p = m.dev_weights[static_cast<size_t>(md)]->find(n.weight);
  if (!p && b->host_memory()) return const_cast<uint8_t *>(m.cpu_weights(*n.weight));
  if (!p) fail(Status::Internal, "weight '%s' has no copy on %s", n.weight->name.c_str(), b->info().name.c_str());
  return p;
}

void Context::Impl::update_report() {
  const Model::Impl &m = model->impl();
  report.devices.clear();
  const std::vector<uint64_t> placed = m.placement.weight_bytes();
  for (size_t d = 0; d < devices.size(); ++d) {
    DeviceMemory dm;
    dm.device = devices[d]->info().name;
    dm.activations = arena_bytes[d];
    for (int l = 0; l < kv->n_layer(); ++l)
      if (kv_device_of(l) == static_cast<int>(d)) dm.kv_cache += kv->layer_bytes(l);
    const int md = model_dev[d];
    if (!model_placement) dm.weights = devices[d]->host_memory() || !dev_weights ? model->weight_bytes() : dev_weights->bytes();
    else if (md >= 0) dm.weights = placed[static_cast<size_t>(md)];
    if (devices[d] == registry->cpu()) dm.other = logits.capacity() * sizeof(float);
    report.devices.push_back(dm);
  }
}

void Context::Impl::wait_pending() {
  // Every stretch is submitted before the host blocks on any (no capture may be open then).
  for (size_t k = 0; k < executors.size(); ++k)
    if (pending[k]) executors[k]->flush();
  for (size_t k = 0; k < executors.size(); ++k)
    if (pending[k]) { executors[k]->host_wait(); pending[k] = false; }
  std::fill(marked.begin(), marked.end(), false);
}

void Context::Impl::wait_for_host_segment() {
  for (size_t k = 0; k < executors.size(); ++k)
    if (pending[k]) executors[k]->flush();
  for (size_t k = 0; k < executors.size(); ++k) {
    if (!pending[k]) continue;
    if (marked[k]) {
      executors[k]->host_wait_mark();  // the overlapped stretch keeps running: still pending
    } else {
      executors[k]->host_wait();
      pending[k] = false;
    }
    marked[k] = false;
  }
}

int Context::Impl::kv_device_of(int layer) const {
  if (!model_placement) return 0;
  const auto &kd = model->impl().placement.kv_device;
  return layer < static_cast<int>(kd.size()) ? kd[static_cast<size_t>(layer)] : 0;
}

// Segments in schedule order with the ordering a placed plan needs and nothing more: a GPU
// segment after another GPU's waits on an event; a CPU segment first waits (on the host)
// for every GPU with work since its last wait, the one round trip of a GPU -> CPU boundary;
// a GPU segment after a CPU one needs nothing (the CPU ran synchronously). Each switch
// ends the previous device's stretch, which a GPU captures and replays as a CUDA graph.
void Context::Impl::run_segments(const CompiledPlan &plan, const ExecEnv &env) {
  const Graph &g = plan.graph;
  int prev = -1;
  for (const Segment &s : plan.segments) {
    if (abort_cb && abort_cb(abort_data)) fail(Status::Aborted, "decode aborted by the abort callback (layer %d)", s.layer);
    const size_t d = static_cast<size_t>(s.device);
    double t0 = MOE_PROF_NOW();
    if (s.overlap && !devices[d]->host_memory()) {
      // The host segments that follow do not read this stretch: their wait stops before it.
      executors[d]->mark();
      marked[d] = true;
    } else if (marked[d]) {
      marked[d] = false;  // later work on this GPU may feed the host: wait for all of it
    }
    if (prev >= 0 && prev != s.device) {
      Executor &pe = *executors[static_cast<size_t>(prev)];
      if (devices[d]->host_memory()) {
        wait_for_host_segment();
        MOE_PROF_ADD("switch: host waits for GPU", t0);
      } else if (!devices[static_cast<size_t>(prev)]->host_memory()) {
        executors[d]->wait_for(pe);
      } else {
        pe.flush();
      }
    }
    t0 = MOE_PROF_NOW();
    executors[d]->run(g, s.begin, s.end, env);
    MOE_PROF_ADD(devices[d]->host_memory() ? "segment: CPU runs" : "segment: GPU enqueue", t0);
    if (!devices[d]->host_memory()) pending[d] = true;
    prev = s.device;
  }
}

// A row holds a NaN or an infinity: exponent bits all ones. Integer ops, so it vectorizes.
static bool all_finite(const float *x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &x[i], 4);
    bad |= static_cast<uint32_t>((b & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

void Context::Impl::run_ubatch(const BatchToken *toks, int32_t n, int32_t out_base, size_t batch_base) {
  int32_t n_out = 0;
  for (int32_t i = 0; i < n; ++i) {
    ub_tokens[static_cast<size_t>(i)] = toks[i].token;
    ub_pos[static_cast<size_t>(i)] = toks[i].pos;
    ub_seq[static_cast<size_t>(i)] = toks[i].seq_id;
    if (toks[i].logits) ub_out_ids[static_cast<size_t>(n_out++)] = i;
  }
  const bool discard = n_out == 0;  // graphs always produce >= 1 row; drop it
  if (discard) ub_out_ids[static_cast<size_t>(n_out++)] = n - 1;
  if (!kv->find_slots(static_cast<uint32_t>(n), ub_cells.data()))
    fail(Status::ContextFull, "context full: %u of %u KV cells in use, %d more needed", kv->used(), kv->n_cells(), n);
  kv->claim(ub_cells.data(), ub_pos.data(), ub_seq.data(), static_cast<uint32_t>(n));
  claimed.insert(claimed.end(), ub_cells.begin(), ub_cells.begin() + n);

  CompiledPlan &plan = plan_for(n, n_out);
  const Graph &g = plan.graph;
  // GPU work of an earlier step that downloaded nothing may still read host arenas this step
  // is about to overwrite (another plan's inputs, values): wait for it first.
  if (mixed) wait_pending();
  auto upload = [&](int node, const void *src, size_t bytes) {
    const Node &nd = g.node(node);
    arenas[static_cast<size_t>(nd.device)]->upload(nd.offset, src, bytes);
  };
  upload(plan.input_tokens, ub_tokens.data(), static_cast<size_t>(n) * 4);
  upload(plan.input_pos, ub_pos.data(), static_cast<size_t>(n) * 4);
  upload(plan.input_out_ids, ub_out_ids.data(), static_cast<size_t>(n_out) * 4);

  UbatchInfo ub;
  ub.n_tokens = n;
  ub.cells = ub_cells.data();
  ub.pos = ub_pos.data();
  ub.seq = ub_seq.data();
  ub.n_kv = kv->n_kv();
  ub.cell_state = kv->cells();
  ExecEnv env{&ub, kv.get(), ++step, abort_cb, abort_data, cancel_flag};
  run_segments(plan, env);
  for (auto &e : executors) e->synchronize();
  if (!discard) {
    const Node &lg = g.node(plan.output_logits);
    const size_t nv = static_cast<size_t>(lg.ne[0]);
    arenas[static_cast<size_t>(lg.device)]->download(lg.offset, logits.data() + static_cast<size_t>(out_base) * nv,
                                                      static_cast<size_t>(n_out) * nv * sizeof(float));
    // The last device's work follows every other device's (events, host waits), so the
    // download's wait covers the whole step.
    if (!devices[static_cast<size_t>(lg.device)]->host_memory() || plan.segments.back().device == lg.device) pending.assign(pending.size(), false);
    // A row of NaN / infinite logits would sample garbage silently: fail the decode instead
    // (one pass over the rows actually downloaded).
    for (int32_t r = 0; r < n_out; ++r)
      if (!all_finite(logits.data() + (static_cast<size_t>(out_base) + static_cast<size_t>(r)) * nv, nv)) {
        const int32_t i = ub_out_ids[static_cast<size_t>(r)];
        fail(Status::NumericError,
             "decode produced non-finite logits (NaN or infinity) for batch entry %zu (token %d, position %d, sequence %d)",
             batch_base + static_cast<size_t>(i), toks[i].token, toks[i].pos, toks[i].seq_id);
      }
  }
  // Bad indices kernels met (a DeviceError: decode() marks the context unusable). After the
  // download they are this step's; a step without one reports at a later step's check.
  for (auto &e : executors) e->check_errors();
}

void Context::decode(const BatchToken *toks, size_t n_tokens) {
  Impl &c = *impl_;
  // Every failure is cleaned up first (fail_decode cannot throw: the cache is as before the
  // call, the logits are unavailable) and then leaves as a moe::Error. Building that Error
  // may itself run out of memory; std::bad_alloc then leaves instead, the state clean.
  try {
    c.decode_batch(toks, n_tokens);
  } catch (const Error &e) {
    c.fail_decode(e.code(), e.what());
    throw;
  } catch (const std::bad_alloc &) {
    c.fail_decode(Status::OutOfMemory, "decode: out of memory");
    throw Error(Status::OutOfMemory, "decode: out of memory");
  } catch (const std::exception &x) {
    c.fail_decode(Status::Internal, x.what());
    throw Error(Status::Internal, strfmt("decode: unexpected exception: %s", x.what()));
  } catch (...) {
    c.fail_decode(Status::Internal, "decode: unknown exception");
    throw Error(Status::Internal, "decode: unknown exception");
  }
}

void Context::Impl::decode_batch(const BatchToken *toks, size_t n_tokens) {
  claimed.clear();  // first: a failure below releases this call's cells only
  if (broken) fail(Status::ContextUnusable, "context unusable: %s", broken_why.c_str());
  if (!toks || n_tokens == 0) fail(Status::InvalidArgument, "decode: empty batch");
  if (n_tokens > params.n_batch) fail(Status::InvalidArgument, "decode: batch of %zu tokens exceeds n_batch %u", n_tokens, params.n_batch);
  const int32_t n_vocab = model->n_vocab();
  int32_t n_out = 0;
  for (size_t i = 0; i < n_tokens; ++i) {
    const BatchToken &t = toks[i];
    if (t.token < 0 || t.token >= n_vocab) fail(Status::InvalidArgument, "decode: token %d at batch index %zu is outside the vocabulary [0, %d)", t.token, i, n_vocab);
    if (t.seq_id < 0 || t.seq_id >= static_cast<int32_t>(params.n_seq_max)) fail(Status::InvalidArgument, "decode: seq_id %d at batch index %zu is outside [0, %u)", t.seq_id, i, params.n_seq_max);
    if (t.pos < 0) fail(Status::InvalidArgument, "decode: negative position %d at batch index %zu", t.pos, i);
    n_out += t.logits ? 1 : 0;
  }
  if (n_tokens > kv->n_cells() - kv->used())
    fail(Status::ContextFull, "context full: %u of %u KV cells in use, batch needs %zu", kv->used(), kv->n_cells(), n_tokens);
  const size_t need = static_cast<size_t>(n_out) * static_cast<size_t>(n_vocab);
  if (logits.size() < need) {  // grows only; resize leaves the vector as it was when it throws
    allocation_point(need * sizeof(float), "logits");
    logits.resize(need);
    update_report();
  }
  n_outputs = 0;
  last_failed = false;
  int32_t out_base = 0;
  for (size_t b = 0; b < n_tokens; b += params.n_ubatch) {
    const int32_t n = static_cast<int32_t>(std::min<size_t>(params.n_ubatch, n_tokens - b));
    run_ubatch(toks + b, n, out_base, b);
    kv->end_ubatch();  // recurrent states: the next ubatch reads what this one wrote
    for (int32_t i = 0; i < n; ++i)
      logit_row[b + static_cast<size_t>(i)] = toks[b + static_cast<size_t>(i)].logits ? out_base++ : -1;
  }
  for (size_t i = n_tokens; i < logit_row.size(); ++i) logit_row[i] = -1;
  n_outputs = out_base;
  kv->commit_recurrent();  // the call succeeded: its recurrent states become current
  claimed.clear();
}

void Context::Impl::fail_decode(Status code, const char *why) noexcept {
  // Leave the cache as it was before the call.
  kv->release(claimed.data(), static_cast<uint32_t>(claimed.size()));
  claimed.clear();
  std::fill(logit_row.begin(), logit_row.end(), -1);
  n_outputs = 0;
  last_failed = true;
  if (code == Status::DeviceError) broken = true;
  try {
    last_failure = strfmt("%s: %s", status_name(code), why);
    if (code == Status::DeviceError && broken_why.empty()) broken_why = why;
  } catch (...) {
    last_failure.clear();  // no memory for the message: logits() still refuses
  }
}

void Context::invalidate_logits(const std::string &why) {
  Impl &c = *impl_;
  std::fill(c.logit_row.begin(), c.logit_row.end(), -1);
  c.n_outputs = 0;
  c.last_failed = true;
  c.last_failure = why;
}

const float *Context::logits(int32_t i) const {
  const Impl &c = *impl_;
  if (c.last_failed) fail(Status::InvalidArgument, "logits(%d): no logits: the last decode failed: %s", i, c.last_failure.c_str());
  int32_t row = -1;
  if (i < 0) {
    row = c.n_outputs + i;
    if (row < 0) fail(Status::InvalidArgument, "logits(%d): only %d rows of logits", i, c.n_outputs);
  } else {
    if (static_cast<size_t>(i) >= c.logit_row.size() || c.logit_row[static_cast<size_t>(i)] < 0)
      fail(Status::InvalidArgument, "logits(%d): that batch entry did not ask for logits", i);
    row = c.logit_row[static_cast<size_t>(i)];
  }
  return c.logits.data() + static_cast<size_t>(row) * static_cast<size_t>(c.model->n_vocab());
}

int32_t Context::n_vocab() const { return impl_->model->n_vocab(); }
const ContextParams &Context::params() const { return impl_->params; }
const Model &Context::model() const { return *impl_->model; }
void Context::kv_clear() { impl_->kv->clear(); }
bool Context::kv_seq_rm(int32_t seq, int32_t p0, int32_t p1) { return impl_->kv->seq_rm(seq, p0, p1); }
void Context::kv_seq_cp(int32_t s, int32_t d, int32_t p0, int32_t p1) { impl_->kv->seq_cp(s, d, p0, p1); }
void Context::kv_seq_keep(int32_t seq) { impl_->kv->seq_keep(seq); }
int32_t Context::kv_seq_pos_max(int32_t seq) const { return impl_->kv->seq_pos_max(seq); }
uint32_t Context::kv_used_cells() const { return impl_->kv->used(); }
void Context::set_abort_callback(AbortCallback cb, void *user_data) { impl_->abort_cb = cb; impl_->abort_data = user_data; }
void Context::set_cancel_flag(const std::atomic<bool> *flag) { impl_->cancel_flag = flag; }
const MemoryReport &Context::memory_report() const { return impl_->report; }
bool Context::unusable(std::string *why) const {
  if (why) *why = impl_->broken_why;
  return impl_->broken;
}

void Context::set_gpu_graphs(bool on) {
  impl_->params.gpu_graphs = on;
  for (auto &e : impl_->executors) e->set_graphs_enabled(on);
}

}  // namespace moe
