#!/bin/bash
# Same machine, same file, one call: builds this tree and a baseline (.devdata/base.tgz, made with
# `git archive <commit> -o .devdata/base.tgz`) side by side, then compares them on an 8-layer
# Qwen3-30B-A3B-shaped q4_k_m (mkmodel --layers 8): bench medians (BENCH_ARGS, REPS) and every
# decode kernel's time alone (ncu, two steps: BASE_COUNT / CUR_COUNT launches = 2 x launches per
# step). BUILD_SET=" " with CUR_CLI=path skips the builds (a tree device_check.sh built). Logs in $OUT.
set -u
O=$OUT; mkdir -p /tmp/base && tar xzf .devdata/base.tgz -C /tmp/base
PREFIX="-DCMAKE_PREFIX_PATH=$PWD/.devdata/deps"
for t in ${BUILD_SET:-cur base}; do
  src=$PWD; [ $t = base ] && src=/tmp/base
  cmake -S $src -B /tmp/b-$t -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEINFER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DMOEINFER_BUILD_BENCH=OFF "$PREFIX" > $O/cfg-$t.log 2>&1
  ( cmake --build /tmp/b-$t -j16 --target moeinfer-cli > $O/build-$t.log 2>&1; echo "build $t rc=$?" ) &
done
wait
CLI=${CUR_CLI:-$(find /tmp/b-cur -name moeinfer-cli -type f | head -1)}; CLIB=$(find /tmp/b-base -name moeinfer-cli -type f | head -1)
[ -f /tmp/q3s.gguf ] || $CLI mkmodel --preset qwen3-30b-a3b --type q4_k_m --layers 8 -o /tmp/q3s.gguf --quiet --threads 16
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for t in base cur; do
  C=$CLI; [ $t = base ] && C=$CLIB
  echo "== $t"; timeout 100 $C bench -m /tmp/q3s.gguf --device cuda ${BENCH_ARGS:--p 512 -n 128} -r ${REPS:-5} 2>&1 | grep -E "median"
  timeout 120 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    --csv --launch-skip 300 --launch-count $([ $t = base ] && echo ${BASE_COUNT:-138} || echo ${CUR_COUNT:-122}) $C bench -m /tmp/q3s.gguf --device cuda -p 0 -n 16 -r 1 --no-gpu-graphs > $O/ncu-$t.csv 2> $O/ncu-$t.err
  python3 tests/cuda/ncu_summary.py $O/ncu-$t.csv 2 2>&1 | head -16
done
