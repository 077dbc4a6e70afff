# Writes a host-compilable copy of the MoE routing kernel of matmul.cu (route_kernel: count,
# scan, tiles, scatter in one block) into OUT, followed by route_check.cpp, which runs it
# through emu.h against a host reference. Usage: gen_route.py REPO OUT
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(sys.argv[1], 'src/backends/cuda/ops/matmul.cu')).read()
out = sys.argv[2]
k0 = src.index('struct RouteTables {')
k1 = src.index('// ---- the product ----')
text = ('#include "backends/cuda/cuda_ops.h"\n#include "backends/cuda/ops/kernel_error.cuh"\n'
        'namespace moe {\n' + src[k0:k1] + '}  // namespace moe\n'
        '#include "' + os.path.join(here, 'route_check.cpp') + '"\n')
with open(os.path.join(out, 'route_emu.cpp'), 'w') as f:
    f.write(text)
