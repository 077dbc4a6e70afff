#!/bin/sh
# Builds the host emulation of the fused op-sequence kernel (fused_sequence.cu) and checks
# deepseek2's MLA glue and sigmoid router tail against host loops: run_sequence.sh.
# Needs g++ >= 12 (C++20) and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/moe-cuda-emu-sequence}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$OUT"
python3 "$HERE/gen_sequence.py" "$REPO" "$OUT"
g++ -std=c++20 -O1 -include "$HERE/emu.h" -I"$CUDA_INC" -I"$REPO/src" -I"$REPO/include" -DMOEINFER_WITH_CUDA=1 -pthread \
  "$OUT/sequence_emu.cpp" -o "$OUT/sequence_check"
"$OUT/sequence_check"
