# Writes a host-compilable copy of the fused router kernels of fused.cu (route_row,
# router_mv_kernel: the router's F32 mat-vec, optionally behind its RmsNorm -> Mul, with the
# last-block routing; a side product of the same row) into OUT, plus a launcher for router_check.cpp. Usage: gen_router.py REPO OUT
import os
import sys

src = open(os.path.join(sys.argv[1], 'src/backends/cuda/ops/fused.cu')).read()
out = sys.argv[2]
row_in0 = src.index('__device__ __forceinline__ const float *row_in(')
row_in1 = src.index('\n}\n', row_in0) + 3
k0 = src.index('struct RouterArgs {')
k1 = src.index('\n}\n', src.index('__global__ void __launch_bounds__(kRmThreads) router_mv_kernel')) + 3
launcher = '''
// The normalised F32 mat-vec (router_mv_kernel) behind the routing a describes.
// side_rows > 0: a side product of the same row (side_w [K, side_rows], row stride K) into side_out.
void launch_router_mv(const RouterArgs &a, const float *w, int64_t w_rs, const float *x, const float *nw, float *normed, float *logits,
                      unsigned *sync, int K, int E, const float *side_w = nullptr, int side_rows = 0, float *side_out = nullptr) {
  RouterMv m{};
  m.side_w = side_w;
  m.side_rs = K;
  m.side_rows = side_rows;
  m.side_out = side_out;
  m.w = w;
  m.w_rs = w_rs;
  m.x = x;
  m.nw = nw;
  m.normed = normed;
  m.eps = 1e-6f;
  m.rms_nthr = row_threads(K);
  m.logits = logits;
  m.sync = sync;
  m.K = K;
  m.nthr = row_threads(E);
  launch_pdl(router_mv_kernel, dim3((E + side_rows + kRmRows - 1) / kRmRows), dim3(kRmThreads), 0, nullptr, a, m);
}

void emu_router(const float *w, int64_t w_rs, const float *x, const float *nw, float *normed, float *logits, float *probs, unsigned *sync,
                int K, int E, int k, int32_t *ids, float *weights, const float *side_w, int side_rows, float *side_out) {
  auto view = [](void *p, int64_t n) { return TView{p, {n, 1, 1, 1}, {4, n * 4, n * 4, n * 4}}; };
  RouterArgs a{};
  a.logits = view(logits, E);
  a.probs = view(probs, E);
  a.ids = view(ids, k);
  a.gathered.data = nullptr;
  a.weights = view(weights, k);
  a.k = k;
  launch_router_mv(a, w, w_rs, x, nw, normed, logits, sync, K, E, side_w, side_rows, side_out);
}

// deepseek2's sigmoid gating behind the normalised mat-vec: sigmoid, + bias, top-k, gather,
// NormSum, Scale (sc0); probs and the biased scores written.
void emu_router_sigmoid(const float *w, int64_t w_rs, const float *x, const float *nw, float *normed, float *logits, float *probs,
                        float *selected, const float *bias, float sc0, unsigned *sync, int K, int E, int k, int32_t *ids, float *scaled) {
  auto view = [](void *p, int64_t n) { return TView{p, {n, 1, 1, 1}, {4, n * 4, n * 4, n * 4}}; };
  RouterArgs a{};
  a.logits = view(logits, E);
  a.probs = view(probs, E);
  a.ids = view(ids, k);
  a.gathered.data = nullptr;
  a.weights.data = nullptr;
  a.k = k;
  a.sigmoid = 1;
  a.bias = bias;
  a.selected = view(selected, E);
  a.norm = 1;
  a.scaled = view(scaled, k);
  a.sc0 = sc0;
  a.sc1 = 0.0f;
  launch_router_mv(a, w, w_rs, x, nw, normed, logits, sync, K, E);
}
'''
# (row_ops.cuh: kWeightRegs, stage_row, rms_mul_staged; last_block.cuh: the last-block counter)
text = ('#include "backends/cuda/cuda_ops.h"\n#include "backends/cuda/ops/ew_value.cuh"\n#include "backends/cuda/ops/row_ops.cuh"\n'
        '#include "backends/cuda/ops/last_block.cuh"\n'
        '#include "backends/cuda/ops/top_k.cuh"\n'
        'namespace moe {\nnamespace {\n' + src[row_in0:row_in1] + src[k0:k1] + '}  // namespace\n' + launcher + '}  // namespace moe\n')
with open(os.path.join(out, 'router_emu.cpp'), 'w') as f:
    f.write(text)
