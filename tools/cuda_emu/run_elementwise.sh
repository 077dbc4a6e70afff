#!/bin/sh
# Builds the host emulation of the elementwise kernels (elementwise.cu) and checks the flat
# kernel against the row kernel bit for bit: run_elementwise.sh. Needs g++ >= 12 and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/moe-cuda-emu-elementwise}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$OUT"
python3 "$HERE/gen_elementwise.py" "$REPO" "$OUT"
g++ -std=c++20 -O1 -w -include "$HERE/emu.h" -I"$CUDA_INC" -I"$REPO/src" -I"$REPO/include" -DMOEINFER_WITH_CUDA=1 -pthread \
  "$OUT/elementwise_emu.cpp" -o "$OUT/elementwise_check"
"$OUT/elementwise_check"
