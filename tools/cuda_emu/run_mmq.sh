#!/bin/sh
# Builds the host emulation of the int8 MMQ kernel and checks it against a float64 product:
# run_mmq.sh [SEED [TYPE]] (TYPE: only that type's cases, e.g. Q4_K), and bit for bit against the kernel of revision OLD. Needs g++ >= 12 (C++20) and the CUDA headers (no GPU, no CUDA runtime
# library). SANITIZE=1 adds AddressSanitizer (out-of-bounds weight reads). Runs twice: as
# is, then with warp 1 lagging (EMU_LAG_WARP, emu_int8.h) to expose barrier misplacement.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/moe-cuda-emu-mmq}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$OUT"
# The kernel of revision OLD (default: 5993875, the register-staged kernel of 2026-11-30
# morning) is built beside the working tree's; every output must match it bit for bit.
git -C "$REPO" show "${OLD:-5993875}:src/backends/cuda/ops/matmul_mmq_i8.cu" > "$OUT/old_mmq_i8.cu"
python3 "$HERE/gen_mmq.py" "$REPO" "$OUT"
SAN=""
[ "${SANITIZE:-0}" = 1 ] && SAN="-fsanitize=address -fno-omit-frame-pointer"
# The CPU's dequantizers (the extra types' reference).
OBJS=""
for f in "$REPO"/src/quant/*.cpp "$REPO"/src/core/status.cpp "$REPO"/src/core/log.cpp; do
  o="$OUT/$(basename "$f" .cpp).o"
  [ "$o" -nt "$f" ] || g++ -std=c++20 -O2 $SAN -I"$REPO/src" -I"$REPO/include" -c "$f" -o "$o"
  OBJS="$OBJS $o"
done
g++ -std=c++20 -O1 $SAN -include "$HERE/emu.h" -I"$OUT/inc" -I"$OUT" -I"$HERE" -I"$CUDA_INC" -I"$REPO/src" -I"$REPO/include" \
  -DMOEINFER_WITH_CUDA=1 -DMMQ_I8_OLD=1 -c "$HERE/mmq_i8_check.cpp" -o "$OUT/mmq_i8_check.o"
g++ $SAN -pthread "$OUT/mmq_i8_check.o" $OBJS -o "$OUT/mmq_i8_check"
"$OUT/mmq_i8_check" "${1:-1}" $2
EMU_LAG_WARP=1 "$OUT/mmq_i8_check" "${1:-1}" $2
