// The greedy continuation the CUDA-vs-CPU engine tests compare: a prompt decoded in one batch
// (sequence 0, logits of its last token), then `steps` one-token decodes of the arg-max token.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/engine.h"

namespace moe_test {

struct GreedyRun {
  std::vector<float> first_logits;  // after the prompt
  std::vector<int32_t> ids;         // the arg-max token of each step, first one after the prompt
};

// wrap_step (optional) runs each one-token decode: it gets the step and the decode to call
// (e.g. to count host synchronisations around it).
inline GreedyRun greedy_run(moe::Context &ctx, const std::vector<int32_t> &prompt, int steps,
                            const std::function<void(int, const std::function<void()> &)> &wrap_step = nullptr) {
  std::vector<moe::BatchToken> batch;
  const int32_t n = static_cast<int32_t>(prompt.size());
  for (int32_t i = 0; i < n; ++i) batch.push_back({prompt[static_cast<size_t>(i)], i, 0, i == n - 1});
  ctx.decode(batch.data(), batch.size());
  const int32_t nv = ctx.n_vocab();
  GreedyRun r;
  r.first_logits.assign(ctx.logits(-1), ctx.logits(-1) + nv);
  for (int step = 0; step < steps; ++step) {
    const float *l = ctx.logits(-1);
    int32_t best = 0;
    for (int32_t v = 1; v < nv; ++v)
      if (l[v] > l[best]) best = v;
    r.ids.push_back(best);
    const moe::BatchToken t{best, n + step, 0, true};
    const std::function<void()> decode = [&] { ctx.decode(&t, 1); };
    if (wrap_step) wrap_step(step, decode);
    else decode();
  }
  return r;
}

}  // namespace moe_test
