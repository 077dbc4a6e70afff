#!/bin/sh
# Builds the host emulation of MatMulHeads' tensor-core path (matmul_heads.cu's tables driving
# matmul_mma.cu's F16 GEMM) and checks it against float64: run_heads_tc.sh. Needs g++ >= 12
# and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/moe-cuda-emu-heads-tc}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$OUT"
python3 "$HERE/gen_heads_tc.py" "$REPO" "$OUT"
FLAGS="-std=c++20 -O1 -w -include $HERE/emu.h -include $HERE/matvec_emu.h -I$CUDA_INC -I$OUT/inc -I$REPO/src -I$REPO/include -DMOEINFER_WITH_CUDA=1"
g++ $FLAGS -c "$OUT/mma_gemm_emu.cpp" -o "$OUT/mma_gemm_emu.o"
g++ $FLAGS -c "$OUT/heads_tables_emu.cpp" -o "$OUT/heads_tables_emu.o"
g++ $FLAGS -c "$HERE/heads_tc_check.cpp" -o "$OUT/heads_tc_check.o"
LIBS=""
for f in "$REPO"/src/quant/*.cpp "$REPO"/src/core/status.cpp "$REPO"/src/core/log.cpp; do  # dtype_name, fail
  o="$OUT/$(basename "$f" .cpp).o"
  [ "$o" -nt "$f" ] || g++ -std=c++20 -O2 -I"$REPO/src" -I"$REPO/include" -c "$f" -o "$o"
  LIBS="$LIBS $o"
done
g++ -pthread "$OUT/mma_gemm_emu.o" "$OUT/heads_tables_emu.o" "$OUT/heads_tc_check.o" $LIBS -o "$OUT/heads_tc_check"
"$OUT/heads_tc_check"
