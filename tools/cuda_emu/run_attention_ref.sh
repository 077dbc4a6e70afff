#!/bin/sh
# Builds the host emulation of the reference-order F32 attention kernel
# (src/backends/cuda/ops/attention_ref_order.cu) and checks it bit for bit against the CPU's
# own attend_f32_reference_order (cut out of src/backends/cpu/ops/attention.cpp) on random
# cache states: run_attention_ref.sh [SEED] [CASES]. Needs g++ >= 12 and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/moe-cuda-emu-attn-ref}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$OUT"
python3 - "$REPO" "$OUT" <<'PY'
import os, sys
repo, out = sys.argv[1], sys.argv[2]
# The kernel (everything in its anonymous namespace) plus a launcher that needs no Graph.
k = open(os.path.join(repo, 'src/backends/cuda/ops/attention_ref_order.cu')).read()
k0 = k.index('namespace {')
k1 = k.index('}  // namespace\n', k0) + len('}  // namespace\n')
launcher = '''
void emu_ref_order_launch(TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *scratch, int n_cells) {
  const dim3 grid(static_cast<unsigned>(q.ne[1]), static_cast<unsigned>(q.ne[2]));
  if (q.ne[2] == 1) launch_pdl(attn_ref_order_kernel<64>, grid, dim3(kThreads), 0, nullptr, q, out, a, ub, scratch, n_cells);
  else launch_pdl(attn_ref_order_kernel<16>, grid, dim3(kThreads), 0, nullptr, q, out, a, ub, scratch, n_cells);
}
size_t emu_ref_row_floats(int n_cells) { return static_cast<size_t>(row_floats(n_cells)); }
'''
open(os.path.join(out, 'ref_kernel_emu.cpp'), 'w').write(
    '#include "backends/cuda/ops/attention.cuh"\n#include "backends/cuda/ops/ref_math.cuh"\nnamespace moe {\n' + k[k0:k1] + launcher +
    '}  // namespace moe\n')
# The CPU's function, verbatim.
c = open(os.path.join(repo, 'src/backends/cpu/ops/attention.cpp')).read()
c0 = c.index('template <class Hidden>\nvoid attend_f32_reference_order')
c1 = c.index('\n}\n', c0) + 3
open(os.path.join(out, 'cpu_ref_order.h'), 'w').write(
    '#pragma once\n#include <cmath>\n#include <cstring>\n#include "backends/cpu/kernels/ref_math.h"\n'
    'namespace moe {\nconstexpr int64_t kMaxHeadDim = 1024;\n' + c[c0:c1] + '}  // namespace moe\n')
PY
FLAGS="-std=c++20 -O1 -include $HERE/emu.h -I$CUDA_INC -I$REPO/src -I$REPO/include -DMOEINFER_WITH_CUDA=1"
g++ $FLAGS -c "$OUT/ref_kernel_emu.cpp" -o "$OUT/ref_kernel_emu.o"
g++ $FLAGS -I"$OUT" -c "$HERE/attention_ref_check.cpp" -o "$OUT/attention_ref_check.o"
g++ -pthread "$OUT/ref_kernel_emu.o" "$OUT/attention_ref_check.o" -o "$OUT/attention_ref_check"
"$OUT/attention_ref_check" "${1:-1}" "${2:-40}"
