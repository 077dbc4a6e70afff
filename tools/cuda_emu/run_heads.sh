#!/bin/sh
# Builds the host emulations of MatMulHeads (matmul.cu's few-token mmv_heads_kernel;
# matmul_heads.cu's tables driving matmul_mma.cu's F16 GEMM) and checks both against float64:
# run_heads.sh. Needs g++ >= 12 and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/moe-cuda-emu-heads}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$OUT"
python3 "$HERE/gen_heads.py" "$REPO" "$OUT"
python3 "$HERE/gen_heads_tc.py" "$REPO" "$OUT"
# OUT/inc (the emulated mma_common.cuh) goes before the repository's src.
FLAGS="-std=c++20 -O1 -w -include $HERE/emu.h -include $HERE/matvec_emu.h -I$CUDA_INC -I$OUT/inc -I$REPO/src -I$REPO/include -DMOEINFER_WITH_CUDA=1"
for f in heads_emu mma_gemm_emu heads_tables_emu; do g++ $FLAGS -c "$OUT/$f.cpp" -o "$OUT/$f.o"; done
g++ $FLAGS -c "$HERE/heads_tc_check.cpp" -o "$OUT/heads_tc_check.o"
g++ -std=c++20 -O1 -I"$REPO/src" -I"$REPO/include" -c "$HERE/heads_check.cpp" -o "$OUT/heads_check.o"
LIBS=""  # the CPU's quantizers (reference), dtype_name, fail
for f in "$REPO"/src/quant/*.cpp "$REPO"/src/core/status.cpp "$REPO"/src/core/log.cpp; do
  o="$OUT/$(basename "$f" .cpp).o"
  [ "$o" -nt "$f" ] || g++ -std=c++20 -O2 -I"$REPO/src" -I"$REPO/include" -c "$f" -o "$o"
  LIBS="$LIBS $o"
done
g++ -pthread "$OUT/heads_emu.o" "$OUT/heads_check.o" $LIBS -o "$OUT/heads_check"
g++ -pthread "$OUT/mma_gemm_emu.o" "$OUT/heads_tables_emu.o" "$OUT/heads_tc_check.o" $LIBS -o "$OUT/heads_tc_check"
"$OUT/heads_check"
"$OUT/heads_tc_check"
