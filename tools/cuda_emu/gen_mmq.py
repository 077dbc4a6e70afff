# Writes a host-compilable copy of the int8 MMQ kernels (matmul_mmq_i8.cu, its anonymous
# namespace only, renamed mmq_i8_emu) to OUT/mmq_i8_emu.inc, and a copy of mma_common.cuh
# whose inline-asm helpers call emu.h / emu_int8.h to OUT/inc/backends/cuda/ops/ (first on
# the include path, so it shadows the real one). Usage: gen_mmq.py REPO OUT
import os
import re
import sys

ops = os.path.join(sys.argv[1], 'src/backends/cuda/ops')
out = sys.argv[2]


def with_body(text, name, body):
    """`text` with the definition of device function `name` (signature, then a body closed
    by a brace at column 0, or a one-line body) given `body` instead."""
    m = re.search(r'\n((?:template <[^\n>]*> )?__device__ __forceinline__ void ' + name + r'\([^{]*\))\s*\{', text)
    assert m, name
    line_end = text.index('\n', m.end())
    one_line = text[m.end():line_end].rstrip().endswith('}')  # `{ ...; }` on the signature's line
    end = line_end + 1 if one_line else text.index('\n}\n', m.end()) + 3
    return text[:m.start()] + '\n' + m.group(1) + ' ' + body + '\n' + text[end:]


common = open(os.path.join(ops, 'mma_common.cuh')).read()
for name, body in [
    ('ldmatrix_x4', '{ emu_lag(); emu_ldsm(r, p, false); }'),
    ('ldmatrix_x4_trans', '{ emu_lag(); emu_ldsm(r, p, true); }'),
    ('cp_async_16', '{ std::memcpy(smem, gmem, 16); }'),
    ('cp_async_commit_wait_all', '{}'),
    ('mma16816', '{ emu_mma(d, a, b[0], b[1]); }'),
    ('mma_s8_k32', '{ emu_mma_s8(d, a, b, 32); }'),
    ('mma_s8_k16', '{ const uint32_t a2[2] = {a0, a1}; emu_mma_s8(d, a2, &b, 16); }'),
    ('prefetch_weights_l2', '{ (void)W, (void)row_bytes, (void)row0, (void)M, (void)K, (void)k; }'),
]:
    common = with_body(common, name, body)
assert 'asm' not in common, 'an inline-asm helper has no emulation'
os.makedirs(os.path.join(out, 'inc/backends/cuda/ops'), exist_ok=True)
with open(os.path.join(out, 'inc/backends/cuda/ops/mma_common.cuh'), 'w') as f:
    f.write(common)

k = open(os.path.join(ops, 'matmul_mmq_i8.cu')).read()
i = k.index('namespace {\n')
j = k.index('}  // namespace\n', i)
with open(os.path.join(out, 'mmq_i8_emu.inc'), 'w') as f:
    f.write('namespace mmq_i8_emu {\n' + k[i + len('namespace {\n'):j] + '}  // namespace mmq_i8_emu\n')
