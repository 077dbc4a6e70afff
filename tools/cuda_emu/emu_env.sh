# Sourced by the run_*.sh scripts (with HERE set to this folder): the repository, the CUDA
# headers and the flags every emulated kernel compiles with.
REPO=$(cd "$HERE/../.." && pwd)
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
EMU_FLAGS="-std=c++20 -O1 -include $HERE/emu.h -I$CUDA_INC -I$REPO/src -I$REPO/include -DMOEINFER_WITH_CUDA=1"

# One-file checks: gen_NAME.py writes NAME_emu.cpp (the kernels and the checks) into OUT,
# which is built and run. Usage: emu_one_file NAME [extra g++ flags]
emu_one_file() {
  name=$1
  shift
  OUT=${OUT:-/tmp/moe-cuda-emu-$name}
  mkdir -p "$OUT"
  python3 "$HERE/gen_$name.py" "$REPO" "$OUT"
  g++ $EMU_FLAGS "$@" -pthread "$OUT/${name}_emu.cpp" -o "$OUT/${name}_check"
  "$OUT/${name}_check"
}
