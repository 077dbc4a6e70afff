#!/bin/sh
# Builds the host emulation of the fused router kernel (fused.cu: router_mv_kernel) and checks
# it against a float64 reference: run_router.sh. Needs g++ >= 12 (C++20) and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/moe-cuda-emu-router}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$OUT"
python3 "$HERE/gen_router.py" "$REPO" "$OUT"
FLAGS="-std=c++20 -O1 -include $HERE/emu.h -I$CUDA_INC -I$REPO/src -I$REPO/include -DMOEINFER_WITH_CUDA=1"
g++ $FLAGS -c "$OUT/router_emu.cpp" -o "$OUT/router_emu.o"
g++ -std=c++20 -O1 -I$REPO/src -I$REPO/include -c "$HERE/router_check.cpp" -o "$OUT/router_check.o"
g++ -pthread "$OUT/router_emu.o" "$OUT/router_check.o" -o "$OUT/router_check"
"$OUT/router_check"
