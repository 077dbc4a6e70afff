# Writes a host-compilable copy of the kernels of quant_extra.cu (activation rounding, the
# integer-dot kernel, the one-token fused group kernels, f16 dequantization, GetRows and their
# per-type launchers) into OUT, followed by quant_extra_check.cpp, which runs them through emu.h against the CPU's own
# quantizers, dequantizers and dot kernels. Usage: gen_quant_extra.py REPO OUT
import os
import re
import sys

from emu_slice import write_slice

repo, out = sys.argv[1], sys.argv[2]
prelude = '''#include "emu_int8.h"  // (with the decoders' byte-wise __vsub4 / __vadd4)
inline float __shfl_sync(unsigned, float v, int src) { return emu_shfl_from(v, src); }
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/act_round_warp.cuh"
#include "backends/cuda/ops/kernel_error.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/quant_extra_decode.cuh"
#include "backends/cuda/ops/ref_math.cuh"
'''
write_slice(repo, out, 'quant_extra.cu', 'constexpr int kXWarps', '// ---- shapes and scratch', prelude, 'quant_extra_check.cpp',
            'quant_extra_emu.cpp')
path = os.path.join(out, 'quant_extra_emu.cpp')
s = open(path).read()
# <<< >>> launches become emu_launch; the launch checks (CUDA runtime) go.
s = re.sub(r'(\w+(?:<[^<>;]*>)?)<<<([^;]*?), ([^,;]*?), 0, ([\w.]+)>>>\(', r'emu_launch(dim3(\2), static_cast<int>(\3), \1, ', s)
s = re.sub(r'MOE_CUDA_LAUNCH_CHECK\("\w+"\);', '', s)
assert '<<<' not in s, 'a launch the generator does not know'
open(path, 'w').write(s)
