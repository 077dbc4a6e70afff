# Writes a host-compilable copy of the MoE routing kernel of matmul.cu (route_kernel: count,
# scan, tiles, scatter in one block) into OUT, followed by route_check.cpp, which runs it
# through emu.h against a host reference. Usage: gen_route.py REPO OUT
import sys

from emu_slice import write_slice

write_slice(sys.argv[1], sys.argv[2], 'matmul.cu', 'struct RouteTables {', '// ---- the product ----',
            '#include "backends/cuda/cuda_ops.h"\n#include "backends/cuda/ops/kernel_error.cuh"\n', 'route_check.cpp', 'route_emu.cpp')
