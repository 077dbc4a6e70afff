# Writes a host-compilable copy of the fused op-sequence kernel of fused_sequence.cu
# (sequence_kernel: one block runs a group's ops in order) into OUT, followed by
# sequence_check.cpp, which runs it through emu.h. Usage: gen_sequence.py REPO OUT
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(sys.argv[1], 'src/backends/cuda/ops/fused_sequence.cu')).read()
out = sys.argv[2]
k0 = src.index('constexpr int kSeqThreads')
k1 = src.index('bool kv_store_fits(')
text = ('#include "backends/cuda/cuda_fusion.h"\n#include "backends/cuda/ops/ew_value.cuh"\n#include "backends/cuda/ops/kv_store.cuh"\n'
        '#include "backends/cuda/ops/rope.cuh"\n#include "backends/cuda/ops/row_ops.cuh"\n#include "backends/cuda/ops/top_k.cuh"\n'
        '#undef __grid_constant__\n#define __grid_constant__\n'
        'namespace moe {\n' + src[k0:k1] + '}  // namespace moe\n'
        '#include "' + os.path.join(here, 'sequence_check.cpp') + '"\n')
with open(os.path.join(out, 'sequence_emu.cpp'), 'w') as f:
    f.write(text)
