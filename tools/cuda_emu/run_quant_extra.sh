#!/bin/sh
# Builds the host emulation of the extra weight types' kernels (src/backends/cuda/ops/quant_extra.cu:
# Q4_1 ... IQ1_M) and checks them against the CPU's quantizers, dequantizers and dot kernels
# (quant_extra_check.cpp). Needs g++ >= 12 (C++20) and the CUDA headers (no GPU). About a minute.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/emu_env.sh"
OUT=${OUT:-/tmp/moe-cuda-emu-quant_extra}
mkdir -p "$OUT"
python3 "$HERE/gen_quant_extra.py" "$REPO" "$OUT"
g++ $EMU_FLAGS -I"$HERE" -c "$OUT/quant_extra_emu.cpp" -o "$OUT/quant_extra_emu.o"
OBJS=""
for f in "$REPO"/src/quant/*.cpp "$REPO"/src/core/status.cpp "$REPO"/src/core/log.cpp "$REPO"/src/backends/cpu/kernels/vec_dot_extra_scalar.cpp; do
  o="$OUT/$(basename "$f" .cpp).o"
  [ "$o" -nt "$f" ] || g++ -std=c++20 -O2 -I"$REPO/src" -I"$REPO/include" -c "$f" -o "$o"
  OBJS="$OBJS $o"
done
g++ -pthread "$OUT/quant_extra_emu.o" $OBJS -o "$OUT/quant_extra_check"
"$OUT/quant_extra_check" "$@"
