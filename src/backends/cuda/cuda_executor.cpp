// The CUDA executor: one stream per context per device (the backend's). Nodes are enqueued
// without host synchronisation. A stretch (the run() calls up to flush() or synchronize():
// the whole graph on one GPU, or a placed plan's GPU part between two CPU segments) is
// recorded; the second time the same stretch runs it is captured into a CUDA graph and from
// then on replayed, as long as every node address is unchanged (addresses move when the
// context grows an arena). Values that change per step live in device memory (DevUbatch),
// so replays need no re-capture.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backends/cuda/cuda_alloc.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_blas.h"
#include "backends/cuda/cuda_fusion.h"
#include "backends/cuda/cuda_kernel_errors.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/cuda_profile.h"
#include "backends/cpu/ops/rope_math.h"
#include "core/log.h"
#include "kv/kv_cache.h"

namespace moe {

namespace {

std::string prof_label(const Graph &g, const Node &n) {
  std::string l = op_name(n.op);
  if (n.op == Op::MatMul || n.op == Op::MatMulId || n.op == Op::GetRows) l += std::string(" ") + dtype_name(g.node(n.src[0]).type);
  if (n.op == Op::MatMul || n.op == Op::MatMulId || n.op == Op::Attention)
    l += " T=" + std::to_string(n.op == Op::MatMul ? n.ne[1] * n.ne[2] : n.op == Op::MatMulId ? n.ne[2] : n.ne[2]);
  return l;
}

struct Seg {
  int begin, end;
  bool operator==(const Seg &o) const { return begin == o.begin && end == o.end; }
};

struct GraphState {
  int seen = 0;
  bool eligible = false;           // the last eager pass of this stretch completed
  std::vector<Seg> segs;
  uint64_t fingerprint = 0;
  cudaGraphExec_t exec = nullptr;
};

enum class Mode { Eager, Capture, Replay };

// A fusion plan is valid for the graph it was made from: the key is the graph's address,
// checked against its node count and a hash of what the plan depends on (ops, sources,
// placement in the arenas), since a later graph may reuse a freed graph's address.
struct CachedFusion {
  size_t n_nodes = 0;
  uint64_t signature = 0;
  FusionPlan plan;
};

uint64_t fusion_signature(const Graph &g) {  // (the plan flags are the executor's, fixed)
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (const Node &n : g.nodes()) {
    mix(static_cast<uint64_t>(n.op));
    for (int s : n.src) mix(static_cast<uint64_t>(static_cast<int64_t>(s)));
    mix(static_cast<uint64_t>(static_cast<int64_t>(n.storage)));
    mix(n.offset);
    mix(n.work_size);
    mix(static_cast<uint64_t>(n.ne[0]) ^ (static_cast<uint64_t>(n.ne[1]) << 32));
  }
  for (int o : g.outputs()) mix(static_cast<uint64_t>(o));
  return h;
}

class CudaExecutor final : public Executor {
public:
  CudaExecutor(CudaBackend &be, const GpuTuning &tuning)
      : be_(be), tuning_(tuning), pdl_(cuda_use_pdl(tuning.dependent_launch, be.paths())) {
    be_.set_current();
    errors_.allocate(be_.stream());  // here, not in a decode: one small allocation per context
    // No handle where the options never use cuBLAS; null without cuBLAS: prompts stay on the int8 MMQ.
    if (tuning_.blas_min_tokens > 0) blas_ = cuda_blas_create(be_.stream());
  }
  ~CudaExecutor() override {
    (void)cudaSetDevice(be_.device());
    if (mode_ == Mode::Capture && pass_open_) {
      cudaGraph_t gr = nullptr;
      (void)cudaStreamEndCapture(be_.stream(), &gr);
      if (gr) (void)cudaGraphDestroy(gr);
    }
    for (auto &kv : states_)
      if (kv.second.exec) (void)cudaGraphExecDestroy(kv.second.exec);
    if (ub_dev_) (void)cudaFree(ub_dev_);
    if (sync_dev_) (void)cudaFree(sync_dev_);
    for (cudaEvent_t e : prof_ev_) (void)cudaEventDestroy(e);
    if (done_ev_) (void)cudaEventDestroy(done_ev_);
    if (mark_ev_) (void)cudaEventDestroy(mark_ev_);
    cuda_blas_destroy(blas_);
  }

  void set_graphs_enabled(bool on) override { graphs_ = on; }

  void check_errors() override {
    be_.set_current();
    errors_.check(be_.stream());
  }

  void run(const Graph &g, int begin, int end, const ExecEnv &env) override {
    be_.set_current();
    if (pass_open_ && (&g != pass_g_ || segs_.empty() || begin <= segs_.back().begin)) abandon_pass();
    try {
      // Inside the try: start_pass allocates (the state map, the ubatch tables) and may
      // throw with the pass half opened; abandon_pass then closes it (and any capture).
      if (!pass_open_) start_pass(g, begin, env);
      segs_.push_back({begin, end});
      if (mode_ == Mode::Replay) {
        const size_t k = segs_.size() - 1;
        if (k < st_->segs.size() && st_->segs[k] == segs_[k]) return;  // replayed at synchronize()
        // The pass diverged from the recording: run what was skipped, then go on eagerly.
        mode_ = Mode::Eager;
        st_->eligible = false;
        for (const Seg &s : segs_) launch(g, s.begin, s.end);
        return;
      }
      launch(g, begin, end);
    } catch (...) {
      abandon_pass();
      throw;
    }
  }

  void synchronize() override {
    flush();
    if (!readback_due_) return;
    readback_due_ = false;
    errors_.enqueue_readback(be_.stream());  // read by check_errors() after the step's download
  }

  void host_wait() override {
    flush();
    be_.set_current();
    if (!done_ev_) MOE_CUDA_CHECK(cudaEventCreateWithFlags(&done_ev_, cudaEventDisableTiming));
    MOE_CUDA_CHECK(cudaEventRecord(done_ev_, be_.stream()));
    cuda_sync_event(done_ev_, SyncWhy::Executor, be_.counters());
  }

  void mark() override {
    flush();
    be_.set_current();
    if (!mark_ev_) MOE_CUDA_CHECK(cudaEventCreateWithFlags(&mark_ev_, cudaEventDisableTiming));
    MOE_CUDA_CHECK(cudaEventRecord(mark_ev_, be_.stream()));
  }

  void host_wait_mark() override {
    flush();  // the overlapped stretch is launched before the host blocks
    be_.set_current();
    if (mark_ev_) cuda_sync_event(mark_ev_, SyncWhy::Executor, be_.counters());
  }

  void wait_for(Executor &other) override {
    auto *o = dynamic_cast<CudaExecutor *>(&other);
    if (!o) return;  // a CPU executor's work is complete when run() returns
    o->flush();
    o->be_.set_current();
    if (!o->done_ev_) MOE_CUDA_CHECK(cudaEventCreateWithFlags(&o->done_ev_, cudaEventDisableTiming));
    MOE_CUDA_CHECK(cudaEventRecord(o->done_ev_, o->be_.stream()));
    be_.set_current();
    MOE_CUDA_CHECK(cudaStreamWaitEvent(be_.stream(), o->done_ev_, 0));
  }

  // End of a stretch (the runs since the last flush): a recorded stretch is captured the
  // second time it comes and replayed from then on, keyed by the graph and its first node.
  void flush() override {
    if (!pass_open_) return;
    be_.set_current();
    pass_open_ = false;
    readback_due_ = true;
    cudaStream_t s = be_.stream();
    const bool whole = contiguous();
    if (mode_ == Mode::Capture) {
      cudaGraph_t gr = nullptr;
      MOE_CUDA_CHECK(cudaStreamEndCapture(s, &gr));
      cudaGraphExec_t ex = nullptr;
      cudaError_t e = cudaGraphInstantiate(&ex, gr, 0);
      (void)cudaGraphDestroy(gr);
      MOE_CUDA_CHECK(e);
      MOE_CUDA_CHECK(cudaGraphLaunch(ex, s));  // the captured kernels have not run yet
      if (st_->exec) (void)cudaGraphExecDestroy(st_->exec);
      st_->exec = whole ? ex : nullptr;
      if (!whole) (void)cudaGraphExecDestroy(ex);
      st_->segs = segs_;
      st_->fingerprint = fingerprint(*pass_g_, segs_);
      st_->eligible = whole;
    } else if (mode_ == Mode::Replay) {
      if (segs_.size() == st_->segs.size()) {
        MOE_CUDA_CHECK(cudaGraphLaunch(st_->exec, s));
        ++replays_;
      } else {
        for (const Seg &sg : segs_) launch(*pass_g_, sg.begin, sg.end);
        st_->eligible = false;
      }
    } else {
      st_->segs = segs_;
      st_->eligible = whole;
      if (whole) st_->fingerprint = fingerprint(*pass_g_, segs_);
    }
    collect_profile();  // only when profiling is on (it waits for the pass)
    // No host wait here: the caller's download (or the next upload's staging reuse) is
    // the one synchronisation of a step.
  }

private:
  void start_pass(const Graph &g, int begin, const ExecEnv &env) {
    fusion_ = nullptr;  // looked up at the first launch: a replayed pass never needs it
    st_ = nullptr;      // set below, once the lookup (an allocation) succeeded
    mode_ = Mode::Eager;
    pass_open_ = true;
    pass_g_ = &g;
    segs_.clear();
    kv_ = env.kv;
    // Once per step: later stretches of the step (a placed plan's GPU runs between CPU
    // segments) read the same ubatch.
    if (env.step == 0 || !ub_uploaded_ || env.step != ub_step_ || &g != ub_graph_) {
      upload_ubatch(env, g);
      ub_uploaded_ = true;
      ub_step_ = env.step;
      ub_graph_ = &g;
    }
    if (!sync_dev_) {  // the last-block counters (DevUbatch::sync): zero once, kept zero by their kernels
      sync_dev_ = static_cast<unsigned *>(cuda_malloc_checked(static_cast<size_t>(kCudaSyncSlots) * 4, "block counters"));
      be_.memset_async(sync_dev_, 0, static_cast<size_t>(kCudaSyncSlots) * 4);
    }
    ub_.sync = sync_dev_;
    ub_.err = errors_.device_words();
    st_ = &states_[{&g, begin}];
    st_->seen++;
    mode_ = Mode::Eager;
    if (!graphs_) return;
    if (st_->exec && st_->eligible && st_->fingerprint == fingerprint(g, st_->segs)) {
      mode_ = Mode::Replay;
    } else if (st_->eligible && st_->seen >= 2) {
      if (st_->exec) { (void)cudaGraphExecDestroy(st_->exec); st_->exec = nullptr; }
      MOE_CUDA_CHECK(cudaStreamBeginCapture(be_.stream(), cudaStreamCaptureModeThreadLocal));
      mode_ = Mode::Capture;
    }
  }

  // Drop a pass that never reached synchronize() (an abort or error between segments).
  void abandon_pass() {
    if (mode_ == Mode::Capture) {
      cudaGraph_t gr = nullptr;
      (void)cudaStreamEndCapture(be_.stream(), &gr);
      if (gr) (void)cudaGraphDestroy(gr);
      (void)cudaGetLastError();
    }
    if (st_) st_->eligible = false;
    pass_open_ = false;
    mode_ = Mode::Eager;
  }

  // A stretch whose runs follow one another in the schedule (a run of one executor between
  // two flushes; an abandoned pass never gets here).
  bool contiguous() const {
    if (segs_.empty()) return false;
    for (size_t i = 1; i < segs_.size(); ++i)
      if (segs_[i].begin != segs_[i - 1].end) return false;
    return true;
  }

  uint64_t fingerprint(const Graph &g, const std::vector<Seg> &segs) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(reinterpret_cast<uintptr_t>(ub_dev_));
    mix(reinterpret_cast<uintptr_t>(sync_dev_));
    mix(reinterpret_cast<uintptr_t>(kv_));
    mix(ub_.seq_cells ? 1 : 0);  // (picks the attention kernel: attn_decode_seqs_launch)
    for (const Seg &s : segs)
      for (int i = s.begin; i < s.end; ++i) {
        const Node &n = g.node(i);
        mix(reinterpret_cast<uintptr_t>(n.data));
        mix(reinterpret_cast<uintptr_t>(n.work));
      }
    return h;
  }

  const FusionPlan &fusion_plan(const Graph &g) {
    CachedFusion &cf = fusion_plans_[&g];
    const uint64_t sig = fusion_signature(g);
    if (cf.n_nodes != g.nodes().size() || cf.signature != sig) {
      cf.plan = plan_fusion(g, tuning_.delta_norm ? 0u : kNoDeltaNorm);
      cf.n_nodes = g.nodes().size();
      cf.signature = sig;
    }
    return cf.plan;
  }

  // A group cut by the range (only when a caller splits a segment): the whole range runs
  // unfused, so no fused group ever meets a member that already ran on its own.
  static bool cuts_a_group(const FusionPlan &p, int begin, int end) {
    if (begin >= end) return false;
    const int a = p.group_of[static_cast<size_t>(begin)], b = p.group_of[static_cast<size_t>(end - 1)];
    const bool cut_front = a >= 0 && p.groups[static_cast<size_t>(a)].first < begin;
    const bool cut_back = b >= 0 && p.groups[static_cast<size_t>(b)].last >= end;
    return cut_front || cut_back;
  }

  void launch(const Graph &g, int begin, int end) {
    const bool prof = be_.profile().enabled() && mode_ == Mode::Eager;
    const CudaLaunchCounting counting(be_.counters());
    if (tuning_.fusion && !fusion_) fusion_ = &fusion_plan(g);
    const FusionPlan *fp = fusion_ && !cuts_a_group(*fusion_, begin, end) ? fusion_ : nullptr;
    for (int i = begin; i < end; ++i) {
      const Node &n = g.node(i);
      const int gi = fp ? fp->group_of[static_cast<size_t>(i)] : -1;
      if (gi >= 0) {
        const FusedGroup &grp = fp->groups[static_cast<size_t>(gi)];
        if (i != grp.last) continue;  // members run in the group's launch at its last node
        if (skipped(grp.label)) continue;
        CudaOpCtx c{launch_stream(), g, n, ub_, kv_, be_.n_sm(), tuning_, blas_, be_.paths()};
        if (prof) timed(c.stream, grp.label, [&] { cuda_run_group(grp, c); });
        else cuda_run_group(grp, c);
        continue;
      }
      if (n.op == Op::Leaf || n.op == Op::View) continue;
      if (!tuning_.skip_launches.empty() && skipped(prof_label(g, n))) continue;  // (no label built otherwise)
      CudaOpCtx c{launch_stream(), g, n, ub_, kv_, be_.n_sm(), tuning_, blas_, be_.paths()};
      if (prof) timed(c.stream, prof_label(g, n), [&] { cuda_run_node(c); });
      else cuda_run_node(c);
    }
  }

  // GpuTuning::skip_launches (timing what-ifs): in captured graphs only, so the eager passes
  // before a capture fill every buffer once and a replay reads stale but finite values (valid
  // expert ids among them) where a skipped launch would have written.
  bool skipped(const std::string &label) const {
    const std::string &s = tuning_.skip_launches;
    if (s.empty() || mode_ != Mode::Capture) return false;
    for (size_t a = 0; a < s.size();) {
      size_t b = s.find('|', a);
      if (b == std::string::npos) b = s.size();
      const std::string pat = s.substr(a, b - a);
      if (!pat.empty() && (pat[0] == '=' ? label == pat.substr(1) : label.find(pat) != std::string::npos)) return true;
      a = b + 1;
    }
    return false;
  }

  LaunchStream launch_stream() { return LaunchStream{be_.stream(), pdl_, be_.paths().smem_optin}; }

  // Runs fn between two recorded events (eager profiling).
  template <typename Fn> void timed(cudaStream_t s, std::string label, Fn &&fn) {
    if (n_prof_ + 2 > prof_ev_.size()) {
      cudaEvent_t e0, e1;
      MOE_CUDA_CHECK(cudaEventCreate(&e0));
      MOE_CUDA_CHECK(cudaEventCreate(&e1));
      prof_ev_.push_back(e0);
      prof_ev_.push_back(e1);
    }
    MOE_CUDA_CHECK(cudaEventRecord(prof_ev_[n_prof_], s));
    fn();
    MOE_CUDA_CHECK(cudaEventRecord(prof_ev_[n_prof_ + 1], s));
    prof_label_.push_back(std::move(label));
    n_prof_ += 2;
  }

  void collect_profile() {
    if (!n_prof_) return;
    cuda_sync_event(prof_ev_[n_prof_ - 1], SyncWhy::Setup, be_.counters());
    for (size_t k = 0; k < n_prof_ / 2; ++k) {
      float ms = 0;
      MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, prof_ev_[2 * k], prof_ev_[2 * k + 1]));
      be_.profile().add(prof_label_[k], ms);
    }
    n_prof_ = 0;
    prof_label_.clear();
  }

  // The distinct RoPE configurations of g (a model has one or two).
  static std::vector<RopeParams> rope_configs(const Graph &g) {
    std::vector<RopeParams> v;
    for (const Node &n : g.nodes()) {
      if (n.op != Op::Rope) continue;
      bool seen = false;
      for (const RopeParams &p : v) seen = seen || rope_params_equal(p, n.rope);
      if (!seen) v.push_back(n.rope);
    }
    return v;
  }

  // DevUbatch::cell_pos_base, gathered while the cells are packed: the offset B with
  // pos == c + B for every used cell c, or kNoCellPosBase (several sequences, reordered or
  // reused cells, no used cell).
  struct CellPosBase {
    int64_t base = kNoCellPosBase;
    bool ordered = true;
    void add(size_t c, int32_t pos) {
      if (pos < 0) return;
      const int64_t b = static_cast<int64_t>(pos) - static_cast<int64_t>(c);
      if (base == kNoCellPosBase) base = b;
      else if (b != base) ordered = false;
    }
    int32_t value() const { return ordered && base > kNoCellPosBase && base <= INT32_MAX ? static_cast<int32_t>(base) : kNoCellPosBase; }
  };

  // Pack the ubatch (token cells/pos/seq, cell state, RoPE tables) and copy it to the device
  // buffer the kernels read; grows the buffer only when a larger batch or cache first appears.
  void upload_ubatch(const ExecEnv &env, const Graph &g) {
    ub_.rope = nullptr;
    ub_.rs = nullptr;
    ub_.seq_cells = ub_.seq_cells_at = nullptr;
    if (!env.ub) return;
    const UbatchInfo &u = *env.ub;
    const size_t T = static_cast<size_t>(u.n_tokens);
    const size_t C = static_cast<size_t>(std::max(u.n_kv, 1));
    const size_t cap_cells = env.kv ? std::max<size_t>(env.kv->n_cells(), C) : C;
    auto align = [](size_t x) { return (x + 15) & ~size_t(15); };
    const std::vector<RopeParams> ropes = u.pos && T ? rope_configs(g) : std::vector<RopeParams>{};
    size_t rope_bytes = 0;
    for (const RopeParams &p : ropes) rope_bytes += align(T * static_cast<size_t>(cuda_rope_table_stride(p)) * 4);
    const bool recurrent = env.kv && env.kv->has_recurrent() && u.seq && T;
    const size_t rs_bytes = recurrent ? align((1 + 3 * std::min<size_t>(T, 64)) * 4) : 0;
    seq_cell_lists(u, T);  // (host vectors: DevUbatch::seq_cells)
    const size_t lists_bytes = seq_at_.empty() ? 0 : align((seq_at_.size() + seq_list_.size()) * 4);
    // Layout: seq bits [cap_cells] u64 | cells[T] | pos[T] | seq[T] | cell_pos[cap_cells] | n_kv, cell_pos_base | RoPE tables |
    // recurrent table | sequence cell lists (last: their length changes from step to step, the rest keeps its place)
    const size_t need = align(cap_cells * 8) + 3 * align(T * 4) + align(cap_cells * 4) + 16 + rope_bytes + rs_bytes + lists_bytes;
    if (need > ub_cap_) {
      const size_t cap = need + lists_bytes / 2;  // room for the lists to grow a while (each new buffer: a new capture)
      host_.resize(cap);  // first: a throw leaves the old buffer and capacity in use
      void *grown = cuda_malloc_checked(cap, "the ubatch tables");
      if (ub_dev_) (void)cudaFree(ub_dev_);
      ub_dev_ = grown;
      ub_cap_ = cap;
    }
    uint8_t *h = host_.data();
    size_t o_seqbits = 0, o_cells = align(cap_cells * 8), o_pos = o_cells + align(T * 4), o_seq = o_pos + align(T * 4),
           o_cpos = o_seq + align(T * 4), o_nkv = o_cpos + align(cap_cells * 4), o_rope = o_nkv + 16;
    auto *sb = reinterpret_cast<unsigned long long *>(h + o_seqbits);
    auto *cp = reinterpret_cast<int32_t *>(h + o_cpos);
    CellPosBase base;
    for (size_t c = 0; c < C && u.cell_state; ++c) {
      sb[c] = u.cell_state[c].seq;
      cp[c] = u.cell_state[c].pos;
      base.add(c, cp[c]);
    }
    if (T) {
      if (u.cells) std::memcpy(h + o_cells, u.cells, T * 4);
      if (u.pos) std::memcpy(h + o_pos, u.pos, T * 4);
      if (u.seq) std::memcpy(h + o_seq, u.seq, T * 4);
    }
    const int32_t nkv = u.cell_state ? u.n_kv : 0;
    const int32_t pos_base = base.value();  // (no cell state: no used cell, kNoCellPosBase)
    std::memcpy(h + o_nkv, &nkv, 4);
    std::memcpy(h + o_nkv + 4, &pos_base, 4);
    uint8_t *d = static_cast<uint8_t *>(ub_dev_);
    rope_.n_tokens = static_cast<int64_t>(T);
    rope_.tables.clear();
    size_t o = o_rope;
    for (const RopeParams &p : ropes) {  // exactly the CPU Rope op's cos/sin (src/backends/cpu/ops/rope.cpp)
      const size_t stride = static_cast<size_t>(cuda_rope_table_stride(p));
      float corr[2];
      rope_yarn_corr_dims(p.n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow, corr);
      const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot));
      float *rows = reinterpret_cast<float *>(h + o);
      for (size_t t = 0; t < T; ++t) rope_cache_init(static_cast<float>(u.pos[t]), p, corr, theta_scale, p.n_rot, rows + t * stride);
      rope_.tables.push_back({p, reinterpret_cast<const float *>(d + o)});
      o += align(T * stride * 4);
    }
    // The recurrent table (DevUbatch::rs): copies as KvCache chose them for this ubatch.
    const size_t o_rs = o;
    ub_.rs = nullptr;
    if (recurrent) {
      auto *rs = reinterpret_cast<int32_t *>(h + o_rs);
      uint64_t seen = 0;
      int32_t n_seq = 0;
      for (size_t t = 0; t < T; ++t) {
        const int32_t q = u.seq[t];
        if (q < 0 || q >= 64 || (seen >> q & 1)) continue;
        seen |= 1ull << q;
        rs[1 + 3 * n_seq] = q;
        rs[2 + 3 * n_seq] = env.kv->recurrent_src_copy(q);
        rs[3 + 3 * n_seq] = env.kv->recurrent_dst_copy(q);
        ++n_seq;
      }
      rs[0] = n_seq;
      ub_.rs = reinterpret_cast<const int32_t *>(d + o_rs);
    }
    const size_t o_lists = o_rs + rs_bytes;
    if (lists_bytes) {
      std::memcpy(h + o_lists, seq_at_.data(), seq_at_.size() * 4);
      std::memcpy(h + o_lists + seq_at_.size() * 4, seq_list_.data(), seq_list_.size() * 4);
      ub_.seq_cells_at = reinterpret_cast<const int32_t *>(d + o_lists);
      ub_.seq_cells = ub_.seq_cells_at + seq_at_.size();
    }
    // Copies: the bit sets and cell positions for the cells in use, the per-token part, the tables.
    be_.upload_async(d, h, C * 8);
    be_.upload_async(d + o_cells, h + o_cells, o_cpos - o_cells + C * 4);
    be_.upload_async(d + o_nkv, h + o_nkv, 8);
    if (rope_bytes) be_.upload_async(d + o_rope, h + o_rope, rope_bytes);
    if (rs_bytes) be_.upload_async(d + o_rs, h + o_rs, rs_bytes);
    if (lists_bytes) be_.upload_async(d + o_lists, h + o_lists, (seq_at_.size() + seq_list_.size()) * 4);
    ub_.seq = nullptr;
    ub_.cell_seq = reinterpret_cast<const unsigned long long *>(d + o_seqbits);
    ub_.cells = reinterpret_cast<const int32_t *>(d + o_cells);
    ub_.pos = reinterpret_cast<const int32_t *>(d + o_pos);
    ub_.seq = reinterpret_cast<const int32_t *>(d + o_seq);
    ub_.cell_pos = reinterpret_cast<const int32_t *>(d + o_cpos);
    ub_.n_kv = reinterpret_cast<const int32_t *>(d + o_nkv);
    ub_.cell_pos_base = reinterpret_cast<const int32_t *>(d + o_nkv + 4);
    ub_.rope = ropes.empty() ? nullptr : &rope_;
  }

  // DevUbatch::seq_cells of u (T tokens) into seq_at_ / seq_list_; both empty where it has none.
  void seq_cell_lists(const UbatchInfo &u, size_t T) {
    seq_at_.clear();
    seq_list_.clear();
    // Only 2+ tokens, no two of one sequence (ids outside the cache's 64 sequence bits: the general kernels).
    if (!tuning_.seqs_decode_attention || !u.cell_state || u.n_kv <= 0 || T < 2 || !u.seq) return;
    int32_t tok_of[64];
    uint64_t mask = 0;
    for (size_t t = 0; t < T; ++t) {
      const int32_t q = u.seq[t];
      if (q < 0 || q >= 64 || (mask >> q & 1)) return;
      tok_of[q] = static_cast<int32_t>(t);
      mask |= 1ull << q;
    }
    const size_t C = static_cast<size_t>(u.n_kv);
    auto each_member = [&](auto &&f) {  // f(token, cell) for every used cell of a batch sequence
      for (size_t c = 0; c < C; ++c)
        for (uint64_t b = u.cell_state[c].pos >= 0 ? u.cell_state[c].seq & mask : 0; b; b &= b - 1)
          f(static_cast<size_t>(tok_of[__builtin_ctzll(b)]), static_cast<int32_t>(c));
    };
    seq_at_.assign(T + 1, 0);
    each_member([&](size_t t, int32_t) { ++seq_at_[t + 1]; });  // counts per token, then offsets
    for (size_t t = 0; t < T; ++t) seq_at_[t + 1] += seq_at_[t];
    if (static_cast<size_t>(seq_at_[T]) > 8 * C) {  // many shared cells: the general kernels
      seq_at_.clear();
      return;
    }
    seq_list_.resize(static_cast<size_t>(seq_at_[T]));
    seq_fill_.assign(seq_at_.begin(), seq_at_.end() - 1);
    each_member([&](size_t t, int32_t c) { seq_list_[static_cast<size_t>(seq_fill_[t]++)] = c; });
  }

  CudaBackend &be_;
  const GpuTuning tuning_;  // the context's options; its plans were sized with the same
  const bool pdl_;          // launches use programmatic dependent launch
  CudaKernelErrors errors_;
  bool graphs_ = true;
  bool pass_open_ = false;
  const Graph *pass_g_ = nullptr;
  std::vector<Seg> segs_;
  Mode mode_ = Mode::Eager;
  GraphState *st_ = nullptr;
  std::map<std::pair<const Graph *, int>, GraphState> states_;  // (graph, first node of the stretch)
  std::map<const Graph *, CachedFusion> fusion_plans_;
  const FusionPlan *fusion_ = nullptr;  // this pass's plan, once looked up
  KvCache *kv_ = nullptr;
  void *ub_dev_ = nullptr;
  void *blas_ = nullptr;  // cuBLAS handle on be_.stream(), or null
  unsigned *sync_dev_ = nullptr;
  size_t ub_cap_ = 0;
  std::vector<uint8_t> host_;
  CudaRopeTables rope_;  // host index of the ubatch's RoPE tables (DevUbatch::rope)
  std::vector<int32_t> seq_at_, seq_list_, seq_fill_;  // DevUbatch::seq_cells_at / seq_cells (host copies), fill cursors
  DevUbatch ub_;
  uint64_t replays_ = 0;
  cudaEvent_t mark_ev_ = nullptr;  // host_wait_mark: the work submitted before an overlapped stretch
  cudaEvent_t done_ev_ = nullptr;  // end of the flushed work (host_wait, another GPU's wait_for)
  bool readback_due_ = false;      // a stretch ran since the last error-word readback
  bool ub_uploaded_ = false;
  uint64_t ub_step_ = 0;
  const Graph *ub_graph_ = nullptr;
  std::vector<cudaEvent_t> prof_ev_;
  std::vector<std::string> prof_label_;
  size_t n_prof_ = 0;
};

}  // namespace

std::unique_ptr<Executor> make_cuda_executor(CudaBackend &be, const GpuTuning &tuning) { return std::make_unique<CudaExecutor>(be, tuning); }

}  // namespace moe
