# Writes a host-compilable copy of the chunked DeltaNet kernel (delta_net_chunked.cu:
# delta_chunked_kernel, its shared memory as a static array) into OUT, followed by
# delta_chunk_check.cpp, which runs it through emu.h; the emulated mma_common.cuh goes to
# OUT/inc. Usage: gen_delta_chunk.py REPO OUT
import os
import sys

from emu_slice import write_mma_common, write_slice

repo, out = sys.argv[1], sys.argv[2]
write_mma_common(repo, out)
write_slice(repo, out, 'delta_net_chunked.cu', 'constexpr int kD', '}  // namespace\n\nbool cuda_delta_net_chunked(',
            '#include "backends/cuda/ops/arch_guard.cuh"\n#include "backends/cuda/ops/mma_common.cuh"\n',
            'delta_chunk_check.cpp', 'delta_chunk_emu.cpp')
p = os.path.join(out, 'delta_chunk_emu.cpp')
s = open(p).read()
smem = 'extern __shared__ __align__(16) uint8_t dn_smem[];'
assert smem in s, 'delta_net_chunked.cu: the shared-memory declaration was not found'
s = s.replace(smem, 'alignas(16) static uint8_t dn_smem[sizeof(Smem)];')
open(p, 'w').write(s)
