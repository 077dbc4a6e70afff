#!/bin/sh
# Builds the host emulation of the fused row-chain kernels (fused.cu) and checks that the
# prefill kernel (a warp per row) gives the decode kernel's bits (a block per row), which the
# GPU tests tie to the unfused ops: run_rowchains.sh. Needs g++ >= 12 (C++20) and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/moe-cuda-emu-rowchains}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$OUT"
python3 "$HERE/gen_rowchains.py" "$REPO" "$OUT"
g++ -std=c++20 -O1 -include "$HERE/emu.h" -I"$CUDA_INC" -I"$REPO/src" -I"$REPO/include" -DMOEINFER_WITH_CUDA=1 -pthread \
  "$OUT/rowchains_emu.cpp" -o "$OUT/rowchains_check"
"$OUT/rowchains_check"
