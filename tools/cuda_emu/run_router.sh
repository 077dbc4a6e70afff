#!/bin/sh
# Builds the host emulation of the fused router kernel (fused.cu: router_mv_kernel) and checks
# it against a float64 reference: run_router.sh. Needs g++ >= 12 (C++20) and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/emu_env.sh"
OUT=${OUT:-/tmp/moe-cuda-emu-router}
mkdir -p "$OUT"
python3 "$HERE/gen_router.py" "$REPO" "$OUT"
g++ $EMU_FLAGS -c "$OUT/router_emu.cpp" -o "$OUT/router_emu.o"
g++ -std=c++20 -O1 -I$REPO/src -I$REPO/include -c "$HERE/router_check.cpp" -o "$OUT/router_check.o"
g++ -pthread "$OUT/router_emu.o" "$OUT/router_check.o" -o "$OUT/router_check"
"$OUT/router_check"
