#!/bin/sh
# Builds the host emulation of the small-batch reference-order kernel
# (src/backends/cuda/ops/matmul_ref_order.cu: quantized and F32) and checks it bit for bit against the CPU's
# ref_order_dot_rows (see mmv_ref_check.cpp). Needs g++ >= 12 and the CUDA headers (no GPU).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/moe-cuda-emu-mmv-ref}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$OUT"
# <<< >>> launches become emu_launch; the launch check (CUDA runtime) goes.
python3 - "$REPO/src/backends/cuda/ops/matmul_ref_order.cu" "$OUT/mmv_ref.cpp" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
s = re.sub(r'(mmv_ref\w*_kernel(?:<TY>)?)<<<grid, block, 0, s>>>\(', r'emu_launch(grid, static_cast<int>(block.x), \1, ', s)
s = re.sub(r'MOE_CUDA_LAUNCH_CHECK\("mmv_ref\w*_kernel"\);', '', s)
assert '<<<' not in s, 'a launch the generator does not know'
s += '''
void emu_launch_mmv_ref(moe::DType t, const uint8_t *W, int64_t rb, int64_t eb, int K, int M, const int8_t *Xq, const float *Xs, float *Y,
                        int ncols, int gemm_cols, int NT, const int *tiles, const int *entries, int n_col_tiles) {
  moe::launch_mmv_ref(t, nullptr, W, rb, eb, K, M, Xq, reinterpret_cast<const float2 *>(Xs), Y, ncols, gemm_cols, NT,
                      reinterpret_cast<const int4 *>(tiles), reinterpret_cast<const int2 *>(entries), n_col_tiles);
}
void emu_launch_mmv_ref_f32(const float *W, int64_t row_stride, int K, int M, const float *X, float *Y, int ncols, int NT, bool gemm16) {
  moe::launch_mmv_ref_f32(nullptr, W, row_stride, K, M, X, Y, ncols, NT, gemm16);
}
'''
open(sys.argv[2], 'w').write(s)
PY
FLAGS="-std=c++20 -O1 -w -include $HERE/emu.h -include $HERE/matvec_emu.h -I$CUDA_INC -I$REPO/src -I$REPO/include -I$HERE -DMOEINFER_WITH_CUDA=1"
g++ $FLAGS -c "$OUT/mmv_ref.cpp" -o "$OUT/mmv_ref.o"
g++ -std=c++20 -O1 -I$REPO/src -I$REPO/include -I$HERE -c "$HERE/mmv_ref_check.cpp" -o "$OUT/mmv_ref_check.o"
OBJS=""
for f in "$REPO"/src/quant/*.cpp "$REPO"/src/core/status.cpp "$REPO"/src/core/log.cpp "$REPO"/src/backends/cpu/kernels/ref_order_dot.cpp; do
  o="$OUT/$(basename "$f" .cpp).o"
  [ "$o" -nt "$f" ] || g++ -std=c++20 -O2 -I$REPO/src -I$REPO/include -c "$f" -o "$o"
  OBJS="$OBJS $o"
done
g++ -pthread "$OUT/mmv_ref.o" "$OUT/mmv_ref_check.o" $OBJS -o "$OUT/mmv_ref_check"
"$OUT/mmv_ref_check"
