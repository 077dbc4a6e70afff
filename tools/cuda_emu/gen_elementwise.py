# Writes a host-compilable copy of the elementwise kernels of elementwise.cu (ew_kernel: a
# block per row; ew_flat_kernel: flat arrays, 16-byte vectors or scalars) into OUT, followed
# by elementwise_check.cpp, which runs them through emu.h. Usage: gen_elementwise.py REPO OUT
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(sys.argv[1], 'src/backends/cuda/ops/elementwise.cu')).read()
out = sys.argv[2]
k0 = src.index('__global__ void ew_kernel(')
k1 = src.index('__global__ void rms_norm_kernel(')
text = ('#include "backends/cuda/cuda_ops.h"\n#include "backends/cuda/ops/ew_value.cuh"\n#include "backends/cuda/ops/row_ops.cuh"\n'
        'namespace moe {\n' + src[k0:k1] + '}  // namespace moe\n'
        '#include "' + os.path.join(here, 'elementwise_check.cpp') + '"\n')
with open(os.path.join(out, 'elementwise_emu.cpp'), 'w') as f:
    f.write(text)
