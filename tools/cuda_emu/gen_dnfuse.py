# Writes a host-compilable copy of the fused gated DeltaNet kernels of delta_net_fused.cu
# (delta_in_kernel: gates + conv + L2 norms; gated_norm_kernel) into OUT, followed by
# dnfuse_check.cpp, which runs them through emu.h. Usage: gen_dnfuse.py REPO OUT
import sys

from emu_slice import write_slice

write_slice(sys.argv[1], sys.argv[2], 'delta_net_fused.cu', 'struct GateSrc {', '// --- end of kernels',
            '#include "backends/cuda/cuda_fusion.h"\n#include "backends/cuda/ops/ew_value.cuh"\n#include "backends/cuda/ops/row_ops.cuh"\n'
            '#undef __grid_constant__\n#define __grid_constant__\n', 'dnfuse_check.cpp', 'dnfuse_emu.cpp')
