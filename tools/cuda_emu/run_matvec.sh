#!/bin/sh
# Builds the host emulation of the mat-vec kernels at OLD (a git revision, default the one
# before the MatVecs group) and in the working tree and checks that they give bit-identical
# outputs: run_matvec.sh [TYPE|group] (TYPE as dtype_name spells it: q4_K, q8_0, ...; see
# matvec_check.cpp). The reference-order types (q4_K, q5_K, q6_K, q8_0) are checked against
# the CPU's ref_order_dot_rows bit for bit instead of against OLD. Needs g++ >= 12 and the CUDA
# headers (no GPU, no CUDA runtime library). run_matvec.sh bias [TYPE]: gpt-oss's expert groups
# with their biases against the unfused sequence (check_bias; mxfp4, q8_0, q4_0 or one of
# them). MATVEC_CU=path: check another copy of matvec.cu as the new version (a mutation must
# fail).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/moe-cuda-emu-matvec}
OLD=${OLD:-26bdc12}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$OUT"
git -C "$REPO" show "$OLD:src/backends/cuda/ops/matvec.cu" > "$OUT/matvec_old.cu"
git -C "$REPO" show "$OLD:src/backends/cuda/ops/matvec_units.cuh" > "$OUT/matvec_units_old.cuh"
sed 's#backends/cuda/ops/matvec_units.cuh#matvec_units_old.cuh#' "$OUT/matvec_old.cu" > "$OUT/matvec_old2.cu"
python3 "$HERE/gen_matvec.py" "$OUT/matvec_old2.cu" "$OUT/mv_old.cpp" old old
python3 "$HERE/gen_matvec.py" "${MATVEC_CU:-$REPO/src/backends/cuda/ops/matvec.cu}" "$OUT/mv_new.cpp" new new
FLAGS="-std=c++20 -O1 -w -include $HERE/emu.h -include $HERE/matvec_emu.h -I$CUDA_INC -I$REPO/src -I$REPO/include -I$HERE -I$OUT -DMOEINFER_WITH_CUDA=1"
for f in mv_old mv_new; do g++ $FLAGS -c "$OUT/$f.cpp" -o "$OUT/$f.o"; done
g++ -std=c++20 -O1 -I$REPO/src -I$REPO/include -I$HERE -c "$HERE/matvec_check.cpp" -o "$OUT/matvec_check.o"
QUANT=""
# The CPU's reference-order dot products (portable build: MOEINFER_X86 undefined) for the
# bit-exact checks of the reference-order types.
for f in "$REPO"/src/quant/*.cpp "$REPO"/src/core/status.cpp "$REPO"/src/core/log.cpp "$REPO"/src/backends/cpu/kernels/ref_order_dot.cpp; do
  o="$OUT/$(basename "$f" .cpp).o"
  [ "$o" -nt "$f" ] || g++ -std=c++20 -O2 -I$REPO/src -I$REPO/include -c "$f" -o "$o"
  QUANT="$QUANT $o"
done
g++ -pthread "$OUT/mv_old.o" "$OUT/mv_new.o" "$OUT/matvec_check.o" $QUANT -o "$OUT/matvec_check"
"$OUT/matvec_check" "$@"
