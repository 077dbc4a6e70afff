# Writes a host-compilable copy of the token-sequential DeltaNet kernel of delta_net.cu (with and
# without its fused output norm, DeltaNorm) and of gated_norm_kernel (delta_net_fused.cu, the
# unfused GatedNorm it must equal) into OUT/dnnorm_emu.cpp, followed by dnnorm_check.cpp, which
# runs them through emu.h. Usage: gen_dnnorm.py REPO OUT
import os
import sys

repo, out = sys.argv[1], sys.argv[2]
here = os.path.dirname(os.path.abspath(__file__))
ops = os.path.join(repo, 'src/backends/cuda/ops')
dn = open(os.path.join(ops, 'delta_net.cu')).read()
fu = open(os.path.join(ops, 'delta_net_fused.cu')).read()
text = ('#include "backends/cuda/cuda_fusion.h"\n#include "backends/cuda/ops/ew_value.cuh"\n'
        '#include "backends/cuda/ops/last_block.cuh"\n#include "backends/cuda/ops/ref_math.cuh"\n'
        '#include "backends/cuda/ops/row_ops.cuh"\n#undef __grid_constant__\n#define __grid_constant__\n'
        'namespace moe {\n' + dn[dn.index('// The state of table slot'):dn.index('// --- end of kernels')] +
        fu[fu.index('struct GatedNormArgs {'):fu.index('struct SharedGateArgs {')] + '}  // namespace moe\n'
        '#include "' + os.path.join(here, 'dnnorm_check.cpp') + '"\n')
with open(os.path.join(out, 'dnnorm_emu.cpp'), 'w') as f:
    f.write(text)
