// CPU kernels for the graph IR ops. Each kernel runs on every pool thread (ith of nth),
// splits its own work, and may call args.pool.barrier() between phases. Kernels assume a
// validated graph (the builder checked shapes); run-time data errors (e.g. an expert id
// out of range) are reported through args.error, never by throwing across threads.
#pragma once
#include <atomic>
#include <cstdint>

#include "backends/backend.h"
#include "backends/cpu/thread_pool.h"
#include "graph/ir.h"

namespace moe {

struct CpuKernelArgs {
  const Graph &g;
  const Node &n;
  int ith, nth;
  ThreadPool &pool;
  uint8_t *work;              // node scratch (n.work_size bytes), shared by the threads
  const ExecEnv &env;
  std::atomic<int> *error;    // set to a non-zero code on bad run-time data
  const Node &src(int k) const { return g.node(n.src[k]); }
};

using CpuKernel = void (*)(const CpuKernelArgs &);

CpuKernel cpu_kernel_for(Op op);           // nullptr: not supported on CPU
size_t cpu_work_size(const Graph &g, int node, int n_threads);

// Individual kernels (defined in ops/*.cpp).
void cpu_get_rows(const CpuKernelArgs &a);
void cpu_matmul(const CpuKernelArgs &a);
void cpu_matmul_id(const CpuKernelArgs &a);
void cpu_rms_norm(const CpuKernelArgs &a);
void cpu_mul(const CpuKernelArgs &a);
void cpu_add(const CpuKernelArgs &a);
void cpu_scale(const CpuKernelArgs &a);
void cpu_rope(const CpuKernelArgs &a);
void cpu_softmax(const CpuKernelArgs &a);
void cpu_sigmoid(const CpuKernelArgs &a);
void cpu_top_k(const CpuKernelArgs &a);
void cpu_gather_cols(const CpuKernelArgs &a);
void cpu_norm_sum(const CpuKernelArgs &a);
void cpu_swiglu(const CpuKernelArgs &a);
void cpu_moe_combine(const CpuKernelArgs &a);
void cpu_kv_store(const CpuKernelArgs &a);
void cpu_attention(const CpuKernelArgs &a);
void cpu_copy(const CpuKernelArgs &a);
void cpu_transfer(const CpuKernelArgs &a);
void cpu_slice(const CpuKernelArgs &a);
void cpu_concat(const CpuKernelArgs &a);
void cpu_matmul_heads(const CpuKernelArgs &a);
void cpu_grouped_top_k(const CpuKernelArgs &a);
void cpu_add_id(const CpuKernelArgs &a);
void cpu_swiglu_oai(const CpuKernelArgs &a);
void cpu_ssm_conv(const CpuKernelArgs &a);   // ops/delta_net.cpp
void cpu_l2_norm(const CpuKernelArgs &a);
void cpu_softplus(const CpuKernelArgs &a);
void cpu_delta_net(const CpuKernelArgs &a);
constexpr int64_t kDeltaNetChunk = 64;  // tokens per chunk of the chunked delta rule (DeltaNet i[1] = 1)
size_t cpu_delta_net_work(const Node &n, int n_threads);
size_t cpu_matmul_heads_work(const Graph &g, const Node &n);
size_t cpu_grouped_top_k_work(const Node &n, int n_threads);

// Row range [r0, r1) of nrows for thread ith of nth.
inline void split_rows(int64_t nrows, int ith, int nth, int64_t &r0, int64_t &r1) {
  const int64_t per = (nrows + nth - 1) / nth;
  r0 = per * ith;
  r1 = r0 + per < nrows ? r0 + per : nrows;
  if (r0 > nrows) r0 = nrows;
}

// Matrix products with at most this many activation rows (decode) convert them once per
// thread into the thread's own slice of the scratch (MoE products also build their own
// routing tables) instead of sharing one copy behind a barrier: a row costs far less than
// making the threads meet. cpu_work_size sizes the scratch for it.
constexpr int64_t kPrivateActivationRows = 4;
inline bool private_activations(int64_t rows) { return rows <= kPrivateActivationRows; }
// Scratch bytes of one copy: a dense product's converted activations (n_rows of k values
// against weights of type wt), a MoE product's activations plus routing tables.
size_t cpu_matmul_work_per_copy(DType wt, int64_t k, int64_t n_rows);
size_t cpu_matmul_id_work_per_copy(size_t act_bytes, int64_t n_expert, int64_t n_entries);

constexpr int64_t kMaxHeadDim = 1024;  // attention scratch bound; larger heads are rejected at build
size_t cpu_attention_work(const Graph &g, const Node &n, int n_threads);
constexpr int64_t kMaxGqaGroup = 16;  // q heads per KV head handled together (F16 cache)

enum CpuKernelError : int { kErrNone = 0, kErrBadExpertId = 1, kErrBadTokenId = 2 };

}  // namespace moe
