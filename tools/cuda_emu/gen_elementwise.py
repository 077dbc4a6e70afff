# Writes a host-compilable copy of the elementwise kernels of elementwise.cu (ew_kernel: a
# block per row; ew_flat_kernel: flat arrays, 16-byte vectors or scalars) into OUT, followed
# by elementwise_check.cpp, which runs them through emu.h. Usage: gen_elementwise.py REPO OUT
import sys

from emu_slice import write_slice

write_slice(sys.argv[1], sys.argv[2], 'elementwise.cu', '__global__ void ew_kernel(', '__global__ void rms_norm_kernel(',
            '#include "backends/cuda/cuda_ops.h"\n#include "backends/cuda/ops/ew_value.cuh"\n#include "backends/cuda/ops/row_ops.cuh"\n',
            'elementwise_check.cpp', 'elementwise_emu.cpp')
