# Writes a host-compilable copy of gpt-oss's one-launch router (router_topk.cu:
# topk_router_kernel) into OUT, followed by router_topk_check.cpp, which runs it through emu.h.
# Usage: gen_router_topk.py REPO OUT [OLD NEW]: with OLD NEW, the kernel text with OLD replaced
# by NEW (a mutation the check must catch; run_router_topk.sh runs a few).
import os
import sys

from emu_slice import write_slice

name = 'router_topk_emu.cpp'
write_slice(sys.argv[1], sys.argv[2], 'router_topk.cu', 'constexpr int kTrWarps', 'bool written(',
            '#include "backends/cuda/cuda_ops.h"\n#include "backends/cuda/ops/ew_value.cuh"\n#include "backends/cuda/ops/last_block.cuh"\n'
            '#include "backends/cuda/ops/row_ops.cuh"\n#include "backends/cuda/ops/top_k.cuh"\n'
            '#undef __grid_constant__\n#define __grid_constant__\n', 'router_topk_check.cpp', name)
if len(sys.argv) == 5:
    path = os.path.join(sys.argv[2], name)
    text = open(path).read()
    if sys.argv[3] not in text:
        sys.exit('mutation target not found: ' + sys.argv[3])
    open(path, 'w').write(text.replace(sys.argv[3], sys.argv[4], 1))
