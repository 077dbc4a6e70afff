# Writes a host-compilable copy of the int8 MMQ kernels (matmul_mmq_i8.cu, its anonymous
# namespace only, renamed mmq_i8_emu) to OUT/mmq_i8_emu.inc (and OUT/old_mmq_i8.cu, if
# present, to OUT/mmq_i8_old.inc as mmq_i8_old), and a copy of mma_common.cuh
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
    # ldmatrix row addresses must be 16-byte aligned (a misaligned-address fault on the GPU)
    ('ldmatrix_x4', '{ emu_lag(); if (reinterpret_cast<uintptr_t>(p) & 15) std::abort(); emu_ldsm(r, p, false); }'),
    ('ldmatrix_x4_trans', '{ emu_lag(); if (reinterpret_cast<uintptr_t>(p) & 15) std::abort(); emu_ldsm(r, p, true); }'),
    ('cp_async_16', '{ emu_cp_async(smem, gmem); }'),
    ('cp_async_4', '{ emu_cp_async(smem, gmem, 4); }'),
    ('cp_async_commit_wait_all', '{ emu_cp_commit(); emu_cp_wait(0); }'),
    ('cp_async_commit', '{ emu_cp_commit(); }'),
    ('cp_async_wait', '{ emu_cp_wait(N); }'),
    ('mma16816', '{ emu_mma(d, a, b[0], b[1]); }'),
    ('mma_s8_k32', '{ emu_mma_s8(d, a, b, 32); }'),
    ('mma_s8_k16', '{ const uint32_t a2[2] = {a0, a1}; emu_mma_s8(d, a2, &b, 16); }'),
    ('prefetch_weights_l2', '{ (void)W, (void)row_bytes, (void)row0, (void)M, (void)K, (void)k; }'),
    ('prefetch_l2', '{ (void)p; }'),
]:
    common = with_body(common, name, body)
assert 'asm' not in common, 'an inline-asm helper has no emulation'
os.makedirs(os.path.join(out, 'inc/backends/cuda/ops'), exist_ok=True)
with open(os.path.join(out, 'inc/backends/cuda/ops/mma_common.cuh'), 'w') as f:
    f.write(common)
def shadow_raw(header, smem_name, size, edit=lambda text: text):
    """Writes a host copy of a raw-fragment MMQ kernel header (a header of matmul_mmq_i8.cu)
    to OUT/inc (first on the include path, so it shadows the real one): its dynamic shared
    memory `smem_name` a static array of `size` bytes, then `edit` applied."""
    text = open(os.path.join(ops, header)).read()
    smem = 'extern __shared__ __align__(128) uint8_t %s[];' % smem_name
    assert smem in text, header + ': dynamic shared memory line changed'
    text = edit(text.replace(smem, 'alignas(128) static uint8_t %s[%s];' % (smem_name, size)))
    assert 'asm' not in text and 'extern __shared__' not in text, header + ': not emulated'
    with open(os.path.join(out, 'inc/backends/cuda/ops', header), 'w') as f:
        f.write(text)


def q4k_checks(raw):
    """The Q4_K kernel's emulation hooks. Its 32-bit shared loads must be 4-byte aligned on
    the GPU: checked here. Its X sums are written between the wait and the barrier: the
    lagging warp computes them only once every other thread has reached its next barrier, so
    a read of them not ordered by that barrier shows (emu_lag_past_barrier; barriers counted)."""
    u32_body = '{ return *reinterpret_cast<const uint32_t *>(p); }'
    assert u32_body in raw, 'mmq_q4k_raw.cuh: u32_at changed'
    raw = raw.replace(u32_body, '{ if (reinterpret_cast<uintptr_t>(p) & 3) std::abort(); return *reinterpret_cast<const uint32_t *>(p); }')
    sums_head = 'template <int S> __device__ __forceinline__ void q4k_group_sums(uint8_t *st) {'
    assert sums_head in raw and '__syncthreads();' in raw, 'mmq_q4k_raw.cuh: q4k_group_sums or the barriers changed'
    return raw.replace(sums_head, sums_head + ' emu_lag_past_barrier();').replace('__syncthreads();', 'emu_counted_syncthreads();')


shadow_raw('mmq_q4k_raw.cuh', 'mmq_q4k_smem', 'Q4kRawSmem<S>::kBytes', q4k_checks)
shadow_raw('mmq_q6k_raw.cuh', 'mmq_q6k_smem', 'Q6kRawSmem::kBytes')  # (its shared loads go through u32_at / u16_at)


def kernel_inc(src, ns):
    """The anonymous namespace of a matmul_mmq_i8.cu source as namespace `ns`, its dynamic
    shared memory a static array of the kernel's size."""
    i = src.index('namespace {\n')
    j = src.index('}  // namespace\n', i)
    body = src[i + len('namespace {\n'):j]
    body = body.replace('extern __shared__ __align__(128) uint8_t mmq_i8_smem[];',
                        'alignas(128) static uint8_t mmq_i8_smem[I8Smem<T>::kBytes];')
    assert 'extern __shared__' not in body, 'dynamic shared memory not emulated'
    return 'namespace ' + ns + ' {\n' + body + '}  // namespace ' + ns + '\n'


with open(os.path.join(out, 'mmq_i8_emu.inc'), 'w') as f:
    f.write(kernel_inc(open(os.path.join(ops, 'matmul_mmq_i8.cu')).read(), 'mmq_i8_emu'))
# The kernel of an earlier revision (run_mmq.sh's OLD), for bit-for-bit comparison.
old_src = os.path.join(out, 'old_mmq_i8.cu')
with open(os.path.join(out, 'mmq_i8_old.inc'), 'w') as f:
    f.write(kernel_inc(open(old_src).read(), 'mmq_i8_old') if os.path.exists(old_src) else '')
