# Writes a host-compilable copy of the few-token MatMulHeads kernel of matmul.cu
# (mmv_heads_kernel with row_dot1 / round_act32: a row on `width` lanes, several rows per
# warp) into OUT, plus an entry point for heads_check.cpp. Usage: gen_heads.py REPO OUT
import os
import sys

src = open(os.path.join(sys.argv[1], 'src/backends/cuda/ops/matmul.cu')).read()
out = sys.argv[2]
warps = src[src.index('constexpr int kWarps'):].split('\n', 1)[0] + '\n'
ws0 = src.index('__device__ __forceinline__ float warp_sum(')
ws1 = src.index('\n}\n', ws0) + 3
k0 = src.index('constexpr DType vdt_of(DType t)')
k1 = src.index('\n}\n', src.index('int heads_row_width(DType t, int64_t K)')) + 3
entry = '''
void emu_heads(DType t, const uint8_t *W, int64_t rb, int64_t hb, int K, int M, int H, int T, float *x, float *y) {
  const int width = heads_row_width(t, K), rows_per_block = kWarps * (32 / width);
  const dim3 grid(static_cast<unsigned>((M + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(H), static_cast<unsigned>(T));
  const TView xv{x, {K, H, T, 1}, {4, int64_t(K) * 4, int64_t(K) * H * 4, int64_t(K) * H * T * 4}};
  const TView yv{y, {M, H, T, 1}, {4, int64_t(M) * 4, int64_t(M) * H * 4, int64_t(M) * H * T * 4}};
  switch (t) {
#define EMU_CASE(TY) case TY: emu_launch(grid, kWarps * 32, mmv_heads_kernel<TY>, W, rb, hb, K, M, width, xv, yv, TView{}); break;
    EMU_CASE(DType::F16) EMU_CASE(DType::Q4_0) EMU_CASE(DType::Q8_0) EMU_CASE(DType::MXFP4) EMU_CASE(DType::Q2_K)
    EMU_CASE(DType::Q3_K) EMU_CASE(DType::Q4_K) EMU_CASE(DType::Q5_K) EMU_CASE(DType::Q6_K)
#undef EMU_CASE
    default: break;
  }
}
'''
text = ('#include "backends/cuda/cuda_ops.h"\n#include "backends/cuda/ops/kernel_error.cuh"\n#include "backends/cuda/ops/pdl.cuh"\n#include "backends/cuda/ops/quant.cuh"\n#include <cuda_bf16.h>\n'
        'namespace moe {\nnamespace {\n' + warps + src[ws0:ws1] + src[k0:k1] + '}  // namespace\n' + entry + '}  // namespace moe\n')
prefetch = 'asm volatile("prefetch.global.L2 [%0];" ::"l"(wrow + o));'
assert prefetch in text, 'mmv_heads_kernel\'s L2 prefetch changed: update gen_heads.py'
text = text.replace(prefetch, '(void)o;')  # (no L2 here)
with open(os.path.join(out, 'heads_emu.cpp'), 'w') as f:
    f.write(text)
