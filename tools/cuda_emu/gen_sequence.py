# Writes a host-compilable copy of the fused op-sequence kernel of fused_sequence.cu
# (sequence_kernel: one block runs a group's ops in order) into OUT, followed by
# sequence_check.cpp, which runs it through emu.h. Usage: gen_sequence.py REPO OUT
import sys

from emu_slice import write_slice

write_slice(sys.argv[1], sys.argv[2], 'fused_sequence.cu', '// The rows of a part this block runs', 'bool kv_store_fits(',
            '#include "backends/cuda/cuda_fusion.h"\n#include "backends/cuda/ops/fused_sequence.cuh"\n#include "backends/cuda/ops/ew_value.cuh"\n#include "backends/cuda/ops/kv_store.cuh"\n'
            '#include "backends/cuda/ops/rope.cuh"\n#include "backends/cuda/ops/row_ops.cuh"\n#include "backends/cuda/ops/top_k.cuh"\n'
            '#undef __grid_constant__\n#define __grid_constant__\n', 'sequence_check.cpp', 'sequence_emu.cpp')
