#!/bin/sh
# Builds the host emulation of gpt-oss's one-launch router (src/backends/cuda/ops/router_topk.cu)
# and checks it (router_topk_check.cpp); then a few mutations of the kernel, each of which the
# check must fail. Usage: run_router_topk.sh [quick] (quick: no mutations). Needs g++ >= 12.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/emu_env.sh"
OUT=${OUT:-/tmp/moe-cuda-emu-router_topk}
mkdir -p "$OUT"
build() {
  python3 "$HERE/gen_router_topk.py" "$REPO" "$OUT" "$@"
  g++ $EMU_FLAGS -pthread "$OUT/router_topk_emu.cpp" -o "$OUT/router_topk_check"
}
build
"$OUT/router_topk_check"
[ "$1" = quick ] && exit 0
# Each must fail: the a1 chain folded into a0 (the dot's order), the bias add dropped, the
# dot's tail past the last 64 values cut short, the gather taking a neighbour's logit, a chunk
# after the preloaded ones skipped. A control must pass: the softmax over one warp instead of
# the unfused kernel's block size (the same exps and sums for k <= 32).
# (The RmsNorm's reduction over 128 threads instead of 256 gave the same bits on these rows:
# the float rounding of the double sum hides it; the GPU tests compare with the unfused kernel.)
fail=0
mutate() {
  expect=$1
  shift
  build "$@"
  if "$OUT/router_topk_check" > "$OUT/mutant.log" 2>&1; then got=pass; else got=fail; fi
  echo "mutation '$1' -> '$2': $got (want $expect)"
  [ "$got" = "$expect" ] || fail=1
}
mutate fail 'a1 = fmaf(w1[u], x[e + 32 + lane], a1);' 'a0 = fmaf(w1[u], x[e + 32 + lane], a0);'
mutate fail '__fadd_rn(v, b);' 'v;'
mutate fail 'for (int e = np; e < a.K; ++e)' 'for (int e = np; e < a.K - 1; ++e)'
mutate fail 's_g[lane] = e >= 0 && e < a.E ? s_l[e] : 0.0f;' 's_g[lane] = e >= 0 && e < a.E ? s_l[e ^ 1] : 0.0f;'
mutate fail 'for (int i0 = kTrPre * kTrChunk; i0 < np; i0 += kTrChunk)' 'for (int i0 = (kTrPre + 1) * kTrChunk; i0 < np; i0 += kTrChunk)'
mutate pass 'softmax_row(s_g, s_p, a.k, s_max, s_sum, a.sm_nthr);' 'softmax_row(s_g, s_p, a.k, s_max, s_sum, 32);'
exit $fail
