#!/bin/sh
# Installs the build into a temporary prefix, then builds and runs consumers against it:
# C via pkg-config (moeinfer.pc shared, moeinfer-static.pc static) and C++ via
# find_package (moeinfer::moeinfer, moeinfer::moeinfer_static), each on the fixture model.
# Usage: run_install_test.sh BUILD_DIR SOURCE_DIR WORK_DIR LIBDIR [MODEL]
set -eu
build=$1; src=$2; work=$3; libdir=$4; model=${5:-}
rm -rf "$work"; mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in include/moeinfer/moeinfer.h include/moeinfer/moeinfer.hpp include/moeinfer/export.h \
         "$libdir/pkgconfig/moeinfer.pc" \
         "$libdir/cmake/moeinfer/moeinferConfig.cmake" "$libdir/cmake/moeinfer/moeinferConfigVersion.cmake"; do
  [ -e "$prefix/$f" ] || { echo "missing from install: $f"; exit 1; }
done
has_static=0; [ -e "$prefix/$libdir/libmoeinfer.a" ] && has_static=1
has_shared=0; [ -e "$prefix/$libdir/libmoeinfer.so.1" ] && has_shared=1
[ $has_shared = 1 ] || [ $has_static = 1 ] || { echo "no library installed"; exit 1; }
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
# A shared build installs the static library too (MOEINFER_STATIC_LIB, CUDA or not).
if [ "${MOEINFER_EXPECT_STATIC:-0}" = 1 ] && [ $has_static = 0 ]; then echo "libmoeinfer.a not installed"; exit 1; fi
# cudart is linked statically: the shared library's .pc names no CUDA library at all, the
# static one cudart_static (never the shared -lcudart).
pc_shared=$(pkg-config --libs --static moeinfer)
if [ $has_shared = 1 ] && printf '%s' "$pc_shared" | grep -q cuda; then echo "moeinfer.pc names CUDA: $pc_shared"; exit 1; fi
if [ $has_static = 1 ]; then
  pc_static=$(pkg-config --libs --static moeinfer-static)
  if printf '%s' "$pc_static" | grep -Eq -- '-lcudart( |$)'; then echo "moeinfer-static.pc names -lcudart: $pc_static"; exit 1; fi
  if [ "${MOEINFER_HAVE_CUDA:-OFF}" = ON ] && ! printf '%s' "$pc_static" | grep -q -- -lcudart_static; then
    echo "moeinfer-static.pc lacks -lcudart_static: $pc_static"; exit 1
  fi
fi
run() {  # run BINARY: prints and checks the output
  echo "== $*"
  LD_LIBRARY_PATH="$prefix/$libdir" "$@" $model
}

# moeinfer.pc: the shared library when built shared, else the static one.
make -s -f "$src/examples/consumers/c-pkgconfig/Makefile" OUT="$work/c-default" PKG=moeinfer
if [ $has_shared = 1 ]; then
  ldd "$work/c-default" | grep -q "libmoeinfer.so.1" || { echo "c-default does not use libmoeinfer.so.1"; exit 1; }
fi
run "$work/c-default"
if [ -e "$prefix/$libdir/pkgconfig/moeinfer-static.pc" ]; then
  make -s -f "$src/examples/consumers/c-pkgconfig/Makefile" OUT="$work/c-static" PKG=moeinfer-static
  if ldd "$work/c-static" | grep -q libmoeinfer; then echo "c-static links the shared library"; exit 1; fi
  run "$work/c-static"
fi

# moeinfer::moeinfer (shared or static, as built) and moeinfer::moeinfer_static when present.
kinds=default; [ $has_shared = 1 ] && [ $has_static = 1 ] && kinds="default static"
for kind in $kinds; do
  st=OFF; [ $kind = static ] && st=ON
  cmake -S "$src/examples/consumers/cxx-cmake" -B "$work/cxx-$kind" -DCMAKE_PREFIX_PATH="$prefix" \
    -DMOEINFER_CONSUMER_STATIC=$st -DCMAKE_BUILD_TYPE=Release > "$work/cxx-$kind.cfg.log"
  cmake --build "$work/cxx-$kind" > "$work/cxx-$kind.build.log" || { cat "$work/cxx-$kind.build.log"; exit 1; }
  run "$work/cxx-$kind/consumer"
done
echo "install test passed (shared: $has_shared, static: $has_static, model: ${model:-none})"
