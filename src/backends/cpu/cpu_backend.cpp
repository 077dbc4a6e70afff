// The CPU backend: host buffers, the per-context thread pool, and kernel dispatch.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/kernels/vec_dot.h"
#include "backends/cpu/ops/cpu_ops.h"
#include "backends/cpu/read_bandwidth.h"
#include "core/step_profile.h"
#include "backends/cpu/thread_pool.h"
#include "core/alloc_test_hook.h"
#include "core/status.h"

namespace moe {

CpuKernel cpu_kernel_for(Op op) {
  switch (op) {
    case Op::GetRows: return cpu_get_rows;
    case Op::MatMul: return cpu_matmul;
    case Op::MatMulId: return cpu_matmul_id;
    case Op::RmsNorm: return cpu_rms_norm;
    case Op::Mul: return cpu_mul;
    case Op::Add: return cpu_add;
    case Op::Scale: return cpu_scale;
    case Op::Rope: return cpu_rope;
    case Op::Softmax: return cpu_softmax;
    case Op::Sigmoid: return cpu_sigmoid;
    case Op::TopK: return cpu_top_k;
    case Op::GatherCols: return cpu_gather_cols;
    case Op::NormSum: return cpu_norm_sum;
    case Op::SwiGLU: return cpu_swiglu;
    case Op::MoeCombine: return cpu_moe_combine;
    case Op::KvStore: return cpu_kv_store;
    case Op::Attention: return cpu_attention;
    case Op::Copy: return cpu_copy;
    case Op::Transfer: return cpu_transfer;
    case Op::Slice: return cpu_slice;
    case Op::Concat: return cpu_concat;
    case Op::MatMulHeads: return cpu_matmul_heads;
    case Op::GroupedTopK: return cpu_grouped_top_k;
    case Op::AddId: return cpu_add_id;
    case Op::SwiGLUOai: return cpu_swiglu_oai;
    case Op::SsmConv: return cpu_ssm_conv;
    case Op::L2Norm: return cpu_l2_norm;
    case Op::Softplus: return cpu_softplus;
    case Op::DeltaNet: return cpu_delta_net;
    default: return nullptr;
  }
}

size_t cpu_work_size(const Graph &g, int id, int n_threads) {
  const Node &n = g.node(id);
  switch (n.op) {
    case Op::MatMul: {
      const Node &w = g.node(n.src[0]), &x = g.node(n.src[1]);
      const int64_t rows = x.ne[1] * x.ne[2] * x.ne[3];
      return cpu_matmul_work_per_copy(w.type, w.ne[0], rows) * static_cast<size_t>(private_activations(rows) ? n_threads : 1);
    }
    case Op::MatMulId: {
      const Node &w = g.node(n.src[0]), &x = g.node(n.src[1]), &ids = g.node(n.src[2]);
      const CpuTypeKernels &k = cpu_type_kernels(w.type);
      const int64_t rows = x.ne[1] * x.ne[2];
      const size_t act = k.vec_dot_type == DType::F32 ? 0 : row_size(k.vec_dot_type, w.ne[0]) * static_cast<size_t>(rows);
      return cpu_matmul_id_work_per_copy(act, w.ne[2], ids.ne[0] * ids.ne[1]) *
             static_cast<size_t>(private_activations(rows) ? n_threads : 1);
    }
    case Op::Attention: return cpu_attention_work(g, n, n_threads);
    case Op::MatMulHeads: return cpu_matmul_heads_work(g, n);
    case Op::GroupedTopK: return cpu_grouped_top_k_work(n, n_threads);
    case Op::DeltaNet: return cpu_delta_net_work(n, n_threads);
    default: return 0;
  }
}

namespace {

class HostBuffer final : public DeviceBuffer {
public:
  HostBuffer(size_t n, const char *purpose) : size_(n) {
    allocation_point(n, purpose);
    if (posix_memalign(&p_, 64, n ? n : 64) != 0) fail(Status::OutOfMemory, "cannot allocate %zu bytes of host memory", n);
  }
  ~HostBuffer() override { std::free(p_); }
  void *data() override { return p_; }
  size_t size() const override { return size_; }
  void upload(size_t off, const void *src, size_t n) override { std::memcpy(static_cast<uint8_t *>(p_) + off, src, n); }
  void download(size_t off, void *dst, size_t n) const override { std::memcpy(dst, static_cast<const uint8_t *>(p_) + off, n); }
  void clear() override { std::memset(p_, 0, size_); }
  void clear_range(size_t off, size_t n) override { std::memset(static_cast<uint8_t *>(p_) + off, 0, n); }
  void copy_within(size_t dst, size_t src, size_t n) override { std::memcpy(static_cast<uint8_t *>(p_) + dst, static_cast<uint8_t *>(p_) + src, n); }

private:
  void *p_ = nullptr;
  size_t size_;
};

// Nodes small enough that one thread runs them faster than the threads can meet at a
// barrier (a decode step's norms, RoPE, routing softmax / top-k, residual adds): thread 0
// runs them alone with nth = 1, and a run of them needs no barrier in between, since no
// other thread touches their data. Row-local kernels qualify, and products that convert
// their activations privately (no barrier inside) and share work only through the item
// counter, which thread 0 then restarts before each of them (ThreadPool::reset_items).
constexpr int64_t kSerialMaxElements = 4096;
// Weight bytes a decode product reads below which one thread beats a split: ~1.5 us of a
// cache-resident tile, about two barrier round trips between cores of this class of VM. The
// hybrids' router (16 F32 columns of 256 on the tiny presets), beta / alpha and shared-expert
// gate products; a real Qwen3-Next router (512 x 2048 F32, 4 MiB) stays split.
constexpr size_t kSerialMaxWeightBytes = 32 * 1024;

bool small_product(const Graph &g, const Node &n) {
  const Node &w = g.node(n.src[0]), &x = g.node(n.src[1]);
  if (n.op == Op::MatMul) {
    const int64_t rows = x.ne[1] * x.ne[2] * x.ne[3];
    return private_activations(rows) && row_size(w.type, w.ne[0]) * static_cast<size_t>(w.ne[1]) <= kSerialMaxWeightBytes;
  }
  const Node &ids = g.node(n.src[2]);  // MatMulId: the experts its tokens chose, each read once at most
  const int64_t rows = x.ne[1] * x.ne[2], picks = ids.ne[0] * ids.ne[1];
  return private_activations(rows) && row_size(w.type, w.ne[0]) * static_cast<size_t>(w.ne[1] * std::min(picks, w.ne[2])) <= kSerialMaxWeightBytes;
}

bool cpu_node_serial(const Graph &g, const Node &n) {
  switch (n.op) {
    case Op::MatMul: case Op::MatMulId:
      return small_product(g, n);
    case Op::MatMulHeads: case Op::Attention: case Op::Leaf: case Op::View:
      return false;
    case Op::DeltaNet: {
      // Its work is the d x d state of every value head per token, not its d outputs per head:
      // Qwen3-Next's 32 heads of 128 (0.5M state values) gain 3-6% tg on 2 threads in
      // parallel, while a tiny 4 x 64 x 64 state runs faster on one thread than at a barrier.
      const int64_t d = g.node(n.src[0]).ne[0], n_v = g.node(n.src[2]).ne[1], T = g.node(n.src[2]).ne[2];
      return d * d * n_v * T <= 8 * kSerialMaxElements;
    }
    default: break;
  }
  const int64_t src_elems = n.src[0] >= 0 ? g.node(n.src[0]).nelements() : 0;
  return n.nelements() <= kSerialMaxElements && src_elems <= kSerialMaxElements;
}

// Thread 0 after a node: a stop already seen, or the host's abort callback saying it now (then
// recorded in the pool, which no longer asks the callback in this job).
bool poll_abort(ThreadPool &pool, const ExecEnv &ev) {
  if (pool.stop_requested()) return true;
  if (!ev.abort || !ev.abort(ev.abort_data)) return false;
  pool.request_stop();
  return true;
}

class CpuExecutor final : public Executor {
public:
  explicit CpuExecutor(int n_threads) : pool_(n_threads) {}
  // Thread 0 (the decoding thread) polls env.abort after each node it runs (and inside
  // kernels that share work through ThreadPool::take_items, which then stop early); a stop is
  // published before the next barrier as that node's index, and every thread leaves the
  // node loop right after that barrier (threads between two barriers never disagree). A
  // kernel that throws on any thread ends the job on all of them; the pool rethrows here.
  void run(const Graph &g, int begin, int end, const ExecEnv &env) override {
    struct Job {
      const Graph *g;
      int begin, end;
      const ExecEnv *env;
      ThreadPool *pool;
      std::atomic<int> error{0};
      std::atomic<int> stop_at{INT_MAX};  // node after which the abort callback asked to stop
    } job{&g, begin, end, &env, &pool_};
    Job *jp = &job;  // one-pointer capture: std::function stores it inline (no heap allocation)
    serial_.resize(g.nodes().size());
    for (int i = begin; i < end; ++i) serial_[static_cast<size_t>(i)] = pool_.size() > 1 && cpu_node_serial(g, g.node(i));
    const std::vector<char> *serial = &serial_;
    // Long kernels poll too (thread 0, inside the pool's work sharing): a cancel then waits
    // for a fraction of a millisecond, not for a whole matmul over a long batch.
    pool_.set_stop_poll(env.abort, env.abort_data);
    pool_.set_stop_flag(env.cancel);
    struct NoPoll {
      ThreadPool &p;
      ~NoPoll() {
        p.set_stop_poll(nullptr, nullptr);
        p.set_stop_flag(nullptr);
      }
    } no_poll{pool_};
    pool_.run([jp, serial](int ith, int nth) {
      const Graph &gr = *jp->g;
      const ExecEnv &ev = *jp->env;
      bool stop = false;  // thread 0: the abort callback said stop (kernels skipped up to the next barrier)
      for (int i = jp->begin; i < jp->end; ++i) {
        const Node &n = gr.node(i);
        if (n.op == Op::Leaf || n.op == Op::View) continue;
        const double t0 = ith == 0 ? MOE_PROF_NOW() : 0.0;
        if ((*serial)[static_cast<size_t>(i)]) {
          if (ith == 0 && !stop) {
            jp->pool->reset_items();
            CpuKernelArgs args{gr, n, 0, 1, *jp->pool, static_cast<uint8_t *>(n.work), ev, &jp->error};
            cpu_kernel_for(n.op)(args);
            stop = poll_abort(*jp->pool, ev);
          }
          int next = i + 1;  // the next node that runs: no barrier while the serial run goes on
          while (next < jp->end && (gr.node(next).op == Op::Leaf || gr.node(next).op == Op::View)) ++next;
          if (next < jp->end && (*serial)[static_cast<size_t>(next)]) {
            if (ith == 0) MOE_PROF_ADD(op_name(n.op), t0);
            continue;
          }
        } else {
          CpuKernelArgs args{gr, n, ith, nth, *jp->pool, static_cast<uint8_t *>(n.work), ev, &jp->error};
          cpu_kernel_for(n.op)(args);
          if (ith == 0) stop = poll_abort(*jp->pool, ev);
        }
        if (stop) jp->stop_at.store(i, std::memory_order_relaxed);  // published by the barrier
        jp->pool->barrier();
        if (ith == 0) MOE_PROF_ADD(op_name(n.op), t0);
        if (jp->stop_at.load(std::memory_order_relaxed) <= i) break;
      }
    });
    if (int e = job.error.load()) {
      if (e == kErrBadExpertId) fail(Status::Internal, "an expert id out of range reached a MoE matmul");
      fail(Status::InvalidArgument, "a token id out of the vocabulary reached the embedding lookup");
    }
    if (const int at = job.stop_at.load(); at != INT_MAX)
      fail(Status::Aborted, "decode aborted by the abort callback (after node %d, %s)", at, op_name(g.node(at).op));
  }
  void synchronize() override {}

private:
  ThreadPool pool_;
  std::vector<char> serial_;  // per node of the graph being run: cpu_node_serial
};

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "CPU";
}

size_t meminfo_bytes(const char *key) {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return static_cast<size_t>(std::strtoull(line.c_str() + std::strlen(key), nullptr, 10)) * 1024;
  return 0;
}

class CpuBackend final : public Backend {
public:
  CpuBackend(const std::string &name, bool as_gpu) {
    info_.name = name;
    info_.description = cpu_model_name() + " (" + cpu_isa_name(active_cpu_isa()) + ")";
    info_.is_gpu = as_gpu;
    info_.integrated = true;
    info_.total_memory = meminfo_bytes("MemTotal:");
    info_.free_memory = meminfo_bytes("MemAvailable:");
  }
  const DeviceInfo &info() const override { return info_; }
  bool supports(const Graph &g, int id) const override {
    const Node &n = g.node(id);
    if (n.op == Op::Leaf || n.op == Op::View) return true;
    if (!cpu_kernel_for(n.op)) return false;
    if (n.op == Op::MatMul || n.op == Op::MatMulId || n.op == Op::GetRows || n.op == Op::MatMulHeads)
      return cpu_type_kernels(g.node(n.src[0]).type).vec_dot != nullptr || n.op == Op::GetRows;
    return true;
  }
  bool host_memory() const override { return true; }
  std::unique_ptr<DeviceBuffer> alloc(size_t bytes, const char *purpose) override { return std::make_unique<HostBuffer>(bytes, purpose); }
  std::unique_ptr<DeviceBuffer> alloc_mapped_host(size_t bytes) override { return std::make_unique<HostBuffer>(bytes, "mapped host memory"); }
  size_t work_size(const Graph &g, int node, int n_threads, const GpuTuning &) const override { return cpu_work_size(g, node, n_threads); }
  std::unique_ptr<Executor> make_executor(int n_threads, const GpuTuning &) override { return std::make_unique<CpuExecutor>(n_threads); }
  double read_bandwidth() override { return cpu_read_bandwidth(); }

private:
  DeviceInfo info_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const std::string &name, bool as_gpu) { return std::make_unique<CpuBackend>(name, as_gpu); }

}  // namespace moe
