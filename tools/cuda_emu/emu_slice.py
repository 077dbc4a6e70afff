# The shared steps of the generators: write_slice (gen_route.py, gen_elementwise.py,
# gen_sequence.py, gen_delta_chunk.py) cuts the kernels between two markers out of a source in
# src/backends/cuda/ops, puts them in namespace moe after the given prelude (#include lines,
# macro fixes), and appends the check program, so that one .cpp builds the kernels and their
# check through emu.h; write_mma_common (gen_attention.py, gen_delta_chunk.py) writes the
# emulated mma_common.cuh to OUT/inc (searched before the repository's src).
import os


def write_slice(repo, out, source, begin, end, prelude, check, name):
    here = os.path.dirname(os.path.abspath(__file__))
    src = open(os.path.join(repo, 'src/backends/cuda/ops', source)).read()
    text = (prelude + 'namespace moe {\n' + src[src.index(begin):src.index(end)] + '}  // namespace moe\n'
            '#include "' + os.path.join(here, check) + '"\n')
    with open(os.path.join(out, name), 'w') as f:
        f.write(text)


def swap_function(s, head, body):
    """Replaces the definition that starts with `head` (up to its closing brace at column 0
    or its one-line body) by `head` + body."""
    i = s.index(head)
    j = s.index('\n}\n', i) + 3 if s[i:s.index('\n', i)].rstrip()[-1] != '}' else s.index('\n', i) + 1
    return s[:i] + head + ' ' + body + '\n' + s[j:]


def write_mma_common(repo, out):
    c = open(os.path.join(repo, 'src/backends/cuda/ops/mma_common.cuh')).read()
    for head, body in [
        ('__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t *p)', '{ emu_ldsm(r, p, false); }'),
        ('__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t *p)', '{ emu_ldsm(r, p, true); }'),
        ('template <bool BF> __device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])',
         '{ emu_mma<BF>(d, a, b[0], b[1]); }'),
        ('__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem)', '{ std::memcpy(smem, gmem, 16); }'),
        ('__device__ __forceinline__ void cp_async_4(void *smem, const void *gmem)', '{ std::memcpy(smem, gmem, 4); }'),
        ('__device__ __forceinline__ void cp_async_commit_wait_all()', '{}'),
        ('__device__ __forceinline__ void cp_async_commit()', '{}'),
        ('template <int N> __device__ __forceinline__ void cp_async_wait()', '{}'),
    ]:
        c = swap_function(c, head, body)
    # Other inline-asm helpers of that header stay as they are: unused inline functions are
    # never emitted, and a used one without emulation fails at assembly.
    os.makedirs(os.path.join(out, 'inc/backends/cuda/ops'), exist_ok=True)
    with open(os.path.join(out, 'inc/backends/cuda/ops/mma_common.cuh'), 'w') as f:
        f.write(c)
