# Writes host-compilable copies of the attention kernels (prefill, decode) into OUT: launches
# kernel<<<grid, threads, 0, stream>>>(args) become emu_launch(grid, threads, kernel, args),
# the inline-asm helpers (mma, ldmatrix, cp.async) become calls into emu.h, and
# MOE_CUDA_LAUNCH_CHECK a no-op. Usage: gen_attention.py REPO OUT
import os
import re
import sys

from emu_slice import write_mma_common

src = os.path.join(sys.argv[1], 'src/backends/cuda/ops')
out = sys.argv[2]


def launches(s):
    return re.sub(r'(\w+(?:<\d+>)?)<<<(.+?), (\w+), 0, ([\w.]+)>>>\(', r'emu_launch(\2, \3, \1, ', s)


def no_launch_check(s):
    inc = '#include "backends/cuda/ops/attention.cuh"'
    return s.replace(inc, inc + '\n#undef MOE_CUDA_LAUNCH_CHECK\n#define MOE_CUDA_LAUNCH_CHECK(x) ((void)0)')


def swap_function(s, head, body):
    """Replaces the definition that starts with `head` (up to its closing brace at column 0
    or its one-line body) by `head` + body."""
    i = s.index(head)
    j = s.index('\n}\n', i) + 3 if s[i:s.index('\n', i)].rstrip()[-1] != '}' else s.index('\n', i) + 1
    return s[:i] + head + ' ' + body + '\n' + s[j:]


def write(name, text):
    with open(os.path.join(out, name), 'w') as f:
        f.write(no_launch_check(launches(text)))


m = open(os.path.join(src, 'attention_mma.cu')).read()
for head, body in [
    ('__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)', '{ emu_mma(c, a, b0, b1); }'),
    ('__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __half *row)', '{ emu_ldsm(r, row, false); }'),
    ('__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const __half *row)', '{ emu_ldsm(r, row, true); }'),
    ('__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)', '{ std::memcpy(smem, gmem, 16); }'),
    ('__device__ __forceinline__ void cp_async_commit()', '{}'),
    ('template <int N> __device__ __forceinline__ void cp_async_wait()', '{}'),
]:
    m = swap_function(m, head, body)
assert 'asm' not in m, 'an inline-asm helper has no emulation'
write('mma_emu.cpp', m)
write('tiled_emu.cpp', open(os.path.join(src, 'attention_tiled.cu')).read())
d = open(os.path.join(src, 'attention_decode.cu')).read()
write('decode_emu.cpp', d.replace('#include "backends/cuda/ops/pdl.cuh"\n', ''))  # emu.h has the PDL no-ops
# The tensor-core decode kernel takes its wrappers from mma_common.cuh (emulated copy in OUT/inc).
d = open(os.path.join(src, 'attention_decode_tc.cu')).read()
write('decode_tc_emu.cpp', d.replace('#include "backends/cuda/ops/pdl.cuh"\n', ''))
a = open(os.path.join(src, 'attention.cu')).read()
# The per-token / split decode kernels and the combine (everything up to attn_split_kernel),
# plus a launcher of the split kernel for attention_check.cpp.
k0 = a.index('namespace {')
k1 = a.index('\n}\n', a.index('__global__ void __launch_bounds__(kThreads) attn_split_kernel')) + 3
l0 = a.index('void attn_combine_launch')
l1 = a.index('\n}\n', l0) + 3
split_launch = (
    'void emu_split_launch(TView q, TView out, const AttnArgs &a, const DevUbatch &ub, float *part, int T, int n_head, int merge) {\n'
    '  launch_pdl(attn_split_kernel, dim3(n_head, T, kSplit), dim3(kThreads), 0, nullptr, q, out, a, ub, part, merge);\n'
    '  if (!merge) attn_combine_launch(out, a, part, T, n_head, kSplit, LaunchStream{});\n'
    '}\n'
    'int emu_split_count() { return kSplit; }\n')
write('comb_emu.cpp', '#include "backends/cuda/ops/attention.cuh"\n#include "backends/cuda/ops/kv_store.cuh"\n'
      '#include "backends/cuda/ops/reduce.cuh"\nnamespace moe {\n' + a[k0:k1] + '}  // namespace\n' + a[l0:l1] + split_launch +
      '}  // namespace moe\n')

# The MLA prefill kernel (attention_mla.cu) and the wrappers it takes from mma_common.cuh,
# whose emulated copy goes to OUT/inc (searched before the repository's src).
write_mma_common(sys.argv[1], out)
m = open(os.path.join(src, 'attention_mla.cu')).read()
m = swap_function(m, 'bool mla_smem_available(int smem_optin)', '{ return true; }')
smem = 'extern __shared__ __align__(16) uint8_t mla_smem[];'
assert smem in m
m = m.replace(smem, 'alignas(16) static uint8_t mla_smem[kSmemBytes];')
m, n = re.subn(r'launch_pdl\((\w+), (\w+), dim3\((\w+)\), \w+, \w+, ', r'emu_launch(\2, \3, \1, ', m)
assert n == 2, 'attention_mla.cu: the kernel and combine launches were not found'
write('mla_emu.cpp', m)
