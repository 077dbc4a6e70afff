#!/bin/sh
# Builds the host emulation of the prefill attention kernels and checks them against a
# float64 reference: run_attention.sh [SEED] [CASES] [mla|dec|span|tcdec|mma] (mla: only the MLA kernel, dec: only the grouped decode kernel, span: only that kernel on caches in position order (ranges bounded by the window) and their fallbacks, tcdec: only its tensor-core variant, mma: only the tiled tensor-core kernel). Needs g++ >= 12 (C++20) and the CUDA
# headers (no GPU, no CUDA runtime library).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/moe-cuda-emu}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$OUT"
python3 "$HERE/gen_attention.py" "$REPO" "$OUT"
FLAGS="-std=c++20 -O1 -include $HERE/emu.h -include $HERE/matvec_emu.h -I$CUDA_INC -I$OUT/inc -I$REPO/src -I$REPO/include -DMOEINFER_WITH_CUDA=1"
for f in mma_emu tiled_emu comb_emu decode_emu decode_tc_emu mla_emu; do g++ $FLAGS -c "$OUT/$f.cpp" -o "$OUT/$f.o"; done
g++ $FLAGS -c "$HERE/attention_check.cpp" -o "$OUT/attention_check.o"
g++ -pthread "$OUT"/*.o -o "$OUT/attention_check"
"$OUT/attention_check" "${1:-1}" "${2:-20}" ${3:-}
