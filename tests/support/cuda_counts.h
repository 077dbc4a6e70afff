// What the CUDA backends of one context did (CudaCounters, summed over its own registry's
// GPUs), and those backends, for tests of kernel launches and host waits per decode step and
// of the per-op profile. Each context counts its own: another context's work never shows.
//
//   const moe_test::CudaCounts before = moe_test::cuda_counts(*ctx);
//   ctx->decode(&t, 1);
//   const moe_test::CudaCounts step = moe_test::cuda_counts(*ctx) - before;   // step.launches, step.syncs
#pragma once
#ifdef MOEINFER_WITH_CUDA
#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "engine/context_impl.h"
#include "engine/engine.h"

namespace moe_test {

// The context's CUDA backends (its executors' and copies'), in registry order.
inline std::vector<moe::CudaBackend *> cuda_backends(const moe::Context &ctx) {
  std::vector<moe::CudaBackend *> out;
  const moe::BackendRegistry &reg = *ctx.impl().registry;
  for (size_t i = 0; i < reg.size(); ++i)
    if (auto *b = dynamic_cast<moe::CudaBackend *>(reg.at(i))) out.push_back(b);
  return out;
}

struct CudaCounts {
  uint64_t launches = 0, syncs = 0;
  uint64_t mla_glue = 0;                  // launches of the MLA glue kernel (CudaCounters::mla_glue_launches)
  uint64_t by[moe::kSyncWhyCount] = {};  // syncs by moe::SyncWhy
  uint64_t syncs_by(moe::SyncWhy why) const { return by[static_cast<int>(why)]; }
  CudaCounts operator-(const CudaCounts &o) const {
    CudaCounts d;
    d.launches = launches - o.launches;
    d.syncs = syncs - o.syncs;
    d.mla_glue = mla_glue - o.mla_glue;
    for (int k = 0; k < moe::kSyncWhyCount; ++k) d.by[k] = by[k] - o.by[k];
    return d;
  }
};

inline CudaCounts counts_of(const moe::CudaCounters &c) {
  CudaCounts r;
  r.launches = c.launches();
  r.syncs = c.syncs();
  r.mla_glue = c.mla_glue_launches();
  for (int k = 0; k < moe::kSyncWhyCount; ++k) r.by[k] = c.syncs(static_cast<moe::SyncWhy>(k));
  return r;
}

inline CudaCounts cuda_counts(const moe::Context &ctx) {
  CudaCounts sum;
  for (const moe::CudaBackend *b : cuda_backends(ctx)) {
    const CudaCounts c = counts_of(b->counters());
    sum.launches += c.launches;
    sum.syncs += c.syncs;
    sum.mla_glue += c.mla_glue;
    for (int k = 0; k < moe::kSyncWhyCount; ++k) sum.by[k] += c.by[k];
  }
  return sum;
}

}  // namespace moe_test
#endif
