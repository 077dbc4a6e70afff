#!/bin/sh
# Builds the host emulation of the few-token MatMulHeads kernel (matmul.cu: mmv_heads_kernel)
# and checks it against a float64 reference: run_heads.sh. Needs g++ >= 12 and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/moe-cuda-emu-heads}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$OUT"
python3 "$HERE/gen_heads.py" "$REPO" "$OUT"
g++ -std=c++20 -O1 -w -include "$HERE/emu.h" -include "$HERE/matvec_emu.h" -I"$CUDA_INC" -I"$REPO/src" -I"$REPO/include" \
  -DMOEINFER_WITH_CUDA=1 -c "$OUT/heads_emu.cpp" -o "$OUT/heads_emu.o"
g++ -std=c++20 -O1 -I"$REPO/src" -I"$REPO/include" -c "$HERE/heads_check.cpp" -o "$OUT/heads_check.o"
QUANT=""
for f in "$REPO"/src/quant/*.cpp "$REPO"/src/core/status.cpp "$REPO"/src/core/log.cpp; do
  o="$OUT/$(basename "$f" .cpp).o"
  [ "$o" -nt "$f" ] || g++ -std=c++20 -O2 -I"$REPO/src" -I"$REPO/include" -c "$f" -o "$o"
  QUANT="$QUANT $o"
done
g++ -pthread "$OUT/heads_emu.o" "$OUT/heads_check.o" $QUANT -o "$OUT/heads_check"
"$OUT/heads_check"
