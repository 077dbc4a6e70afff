# Writes host-compilable copies for heads_tc_check.cpp into OUT: the F16 tensor-core GEMM
# (matmul_mma.cu, its MatMulId mode) over an emulated mma_common.cuh (gen_attention.py writes
# it to OUT/inc; the L2 prefetch becomes a no-op here), and heads_tables_kernel of
# matmul_heads.cu (MatMulHeads' routing tables). Usage: gen_heads_tc.py REPO OUT
import os
import re
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
repo, out = sys.argv[1], sys.argv[2]
src = os.path.join(repo, 'src/backends/cuda/ops')
subprocess.run([sys.executable, os.path.join(here, 'gen_attention.py'), repo, out], check=True)
inc = os.path.join(out, 'inc/backends/cuda/ops/mma_common.cuh')
c = open(inc).read()
head = 'if (row < M && off < row_bytes) asm volatile("prefetch.L2 [%0];\\n" : : "l"(W + static_cast<int64_t>(row) * row_bytes + off));'
assert head in c, 'prefetch_weights_l2 changed: update gen_heads_tc.py'
c = c.replace(head, '(void)row; (void)off;  // emulation: no L2')
with open(inc, 'w') as f:
    f.write(c)
m = open(os.path.join(src, 'matmul_mma.cu')).read()
m, n = re.subn(r'(mma_matmul_kernel<TY>)<<<grid, kThreads, 0, s>>>\(', r'emu_launch(grid, kThreads, \1, ', m)
assert n == 1, 'matmul_mma.cu: the kernel launch was not found'
m = m.replace('MOE_CUDA_LAUNCH_CHECK("mma_matmul_kernel");', '')
with open(os.path.join(out, 'mma_gemm_emu.cpp'), 'w') as f:
    f.write(m)
h = open(os.path.join(src, 'matmul_heads.cu')).read()
k0 = h.index('__global__ void heads_tables_kernel(')
k1 = h.index('\n}\n', k0) + 3
with open(os.path.join(out, 'heads_tables_emu.cpp'), 'w') as f:
    f.write('#include "backends/cuda/ops/matmul_mma.h"\nnamespace moe {\n' + h[k0:k1] +
            'void emu_heads_tables(int H, int T, int tph, int2 *entries, int4 *tiles) {\n'
            '  launch_pdl(heads_tables_kernel, dim3(3), dim3(64), 0, nullptr, H, T, tph, entries, tiles);\n}\n}  // namespace moe\n')
