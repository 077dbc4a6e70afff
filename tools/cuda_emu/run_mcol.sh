#!/bin/sh
# Builds the host emulation of the multi-column mat-vec (src/backends/cuda/ops/matvec_cols.cu)
# and checks it against float64 (see mcol_check.cpp): run_mcol.sh [TYPE] (TYPE as dtype_name
# spells it: q4_K, f16, ...). Needs g++ >= 12 and the CUDA headers (no GPU).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/emu_env.sh"
OUT=${OUT:-/tmp/moe-cuda-emu-mcol}
mkdir -p "$OUT"
# pdl.cuh goes (emu.h has pdl_wait / pdl_trigger / launch_pdl: launches become emu_launch).
sed 's#^\#include "backends/cuda/ops/pdl.cuh"##' "$REPO/src/backends/cuda/ops/matvec_cols.cu" > "$OUT/mcol_emu.cpp"
# mma_common.cuh's inline-asm wrappers (the Q4_K tensor-core kernel's mma) as emu_int8.h calls:
# gen_mmq.py writes that copy to $OUT/inc, first on the include path.
python3 "$HERE/gen_mmq.py" "$REPO" "$OUT"
printf '#include "backends/cuda/ops/matmul_route.h"\n#include "%s/mcol_check.cpp"\n' "$HERE" >> "$OUT/mcol_emu.cpp"
g++ -I"$OUT/inc" $EMU_FLAGS -w -include "$HERE/matvec_emu.h" -I"$HERE" -c "$OUT/mcol_emu.cpp" -o "$OUT/mcol_emu.o"
OBJS=""  # the CPU's quantizers (reference), dtype_name, fail; ref_order_dot (check_data.h)
for f in "$REPO"/src/quant/*.cpp "$REPO"/src/core/status.cpp "$REPO"/src/core/log.cpp "$REPO"/src/backends/cpu/kernels/ref_order_dot.cpp; do
  o="$OUT/$(basename "$f" .cpp).o"
  [ "$o" -nt "$f" ] || g++ -std=c++20 -O2 -I"$REPO/src" -I"$REPO/include" -c "$f" -o "$o"
  OBJS="$OBJS $o"
done
g++ -pthread "$OUT/mcol_emu.o" $OBJS -o "$OUT/mcol_check"
"$OUT/mcol_check" "$@"
