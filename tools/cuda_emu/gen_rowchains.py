# Writes a host-compilable copy of the row-chain kernels of fused.cu (row_chains_kernel: a
# block per row; row_chains_warp_kernel: a block per token, a warp per row) into OUT, followed
# by rowchains_check.cpp, which runs both through emu.h. Usage: gen_rowchains.py REPO OUT
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(sys.argv[1], 'src/backends/cuda/ops/fused.cu')).read()
out = sys.argv[2]
k0 = src.index('struct ChainDesc {')
k1 = src.index('struct RouterArgs {')
kernels = src[k0:k1]
# Dynamic shared memory: a static array here (blocks run one after another).
kernels = kernels.replace('extern __shared__ float s_row[];', 'static float s_row[kEmuSmemFloats];')
kernels = kernels.replace('extern __shared__ float s_rows[];', 'static float s_rows[kEmuSmemFloats];')
assert 'extern __shared__' not in kernels
text = ('#include "backends/cuda/cuda_fusion.h"\n#include "backends/cuda/ops/kv_store.cuh"\n#include "backends/cuda/ops/rope.cuh"\n'
        '#include "backends/cuda/ops/row_ops.cuh"\n#undef __grid_constant__\n#define __grid_constant__\n'
        'namespace moe {\nconstexpr int kEmuSmemFloats = 16384;\n' + kernels + '}  // namespace moe\n'
        '#include "' + os.path.join(here, 'rowchains_check.cpp') + '"\n')
with open(os.path.join(out, 'rowchains_emu.cpp'), 'w') as f:
    f.write(text)
