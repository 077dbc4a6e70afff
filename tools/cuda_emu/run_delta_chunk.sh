#!/bin/sh
# Builds the host emulation of the chunked DeltaNet kernel (delta_net_chunked.cu) and checks it
# against a float64 token-by-token recurrence: run_delta_chunk.sh [SEED] [CASES].
# Needs g++ >= 12 (C++20) and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/emu_env.sh"
OUT=${OUT:-/tmp/moe-cuda-emu-delta_chunk}
mkdir -p "$OUT"
python3 "$HERE/gen_delta_chunk.py" "$REPO" "$OUT"
g++ -I"$OUT/inc" $EMU_FLAGS -pthread "$OUT/delta_chunk_emu.cpp" -o "$OUT/delta_chunk_check"
"$OUT/delta_chunk_check" "$@"
