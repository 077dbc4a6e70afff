#!/bin/bash
# One-shot CUDA check for a GPU machine (run from the repository root):
#   tests/cuda/device_check.sh [build] [tests] [sanitize] [sanall] [conformance] [bench] [kernels] [profile] [ncu] [ncudeep] [models]
# Builds with ninja for sm_90, runs the [cuda] tests, compute-sanitizer memcheck/racecheck
# on the op tests, the conformance check on --device cuda, and the bench on a generated
# Qwen3-30B-A3B-shaped Q4_K_M file. Logs go to $OUT (default /tmp/moe-cuda-out); a summary
# is printed last. Extra dependencies for a bare machine may sit in .devdata/deps.
set -u
# Only summary.txt and logs.tgz come back (the device tool returns at most 8 files).
FINAL_OUT=${OUT:-/tmp/moe-cuda-out}
OUT=${LOGS:-/tmp/moe-logs}  # (LOGS: a second instance running beside the first needs its own)
rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL_OUT"
trap 'cp "$OUT/summary.txt" "$FINAL_OUT/" 2>/dev/null; tar -C "$OUT" -czf "$FINAL_OUT/logs.tgz" . 2>/dev/null' EXIT
PHASES=${*:-build tests sanitize conformance bench kernels profile}
B=build-dev
SUM=$OUT/summary.txt
: > "$SUM"
note() { echo "$*" | tee -a "$SUM" "$FINAL_OUT/summary.part"; }  # .part survives a kill
has() { [[ " $PHASES " == *" $1 "* ]]; }
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 ))s; }

nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
df -h /tmp >> "$OUT/gpu.txt" 2>&1
PREFIX="-DCMAKE_PREFIX_PATH="
[ -d .devdata/deps ] && PREFIX="-DCMAKE_PREFIX_PATH=$PWD/.devdata/deps"

BENCH=OFF
BENCH_TARGETS=""
if has kernels && [ -d .devdata/gbench-src ]; then
  # Google Benchmark from source (the machine reaches no registry), for bench-cuda_kernels.
  cmake -S .devdata/gbench-src -B /tmp/gb -G Ninja -DCMAKE_BUILD_TYPE=Release -DBENCHMARK_ENABLE_TESTING=OFF \
    -DBENCHMARK_ENABLE_GTEST_TESTS=OFF -DBENCHMARK_ENABLE_WERROR=OFF -DBENCHMARK_INSTALL_DOCS=OFF -DCMAKE_INSTALL_PREFIX=/tmp/gbi > "$OUT/gbench.log" 2>&1 &&
    cmake --build /tmp/gb -j16 >> "$OUT/gbench.log" 2>&1 && cmake --install /tmp/gb >> "$OUT/gbench.log" 2>&1 &&
    { BENCH=ON; BENCH_TARGETS=bench-cuda_kernels; PREFIX="-DCMAKE_PREFIX_PATH=$PWD/.devdata/deps;/tmp/gbi"; }
  note "google benchmark BENCH=$BENCH $(el)"
fi

if has build; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEINFER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DMOEINFER_BUILD_BENCH=$BENCH "$PREFIX" > "$OUT/build.log" 2>&1
  cmake --build $B -j16 --target moeinfer-cli moeinfer-tests $BENCH_TARGETS >> "$OUT/build.log" 2>&1
  rc=$?; note "build rc=$rc $(el)"
  [ $rc -ne 0 ] && { grep -E "error|Error" "$OUT/build.log" | head -30; exit 1; }
fi
CLI=$(find $B -name moeinfer-cli -type f | head -1)
TESTS=$(find $B -name moeinfer-tests -type f | head -1)

MK_PID=""
if (has bench || has profile || has ncu || has ncudeep) && [ ! -f /tmp/q3.gguf ]; then
  ( nice "$CLI" mkmodel --preset qwen3-30b-a3b --type q4_k_m -o /tmp/q3.gguf --threads 10 --quiet > "$OUT/mkmodel.log" 2>&1; echo "mkmodel rc=$?" >> "$OUT/mkmodel.log" ) &
  MK_PID=$!
fi

if has tests; then
  timeout ${TESTS_S:-150} "$TESTS" "${TEST_SPEC:-[cuda]}" -d yes > "$OUT/tests.log" 2>&1
  note "tests ${TEST_SPEC:-[cuda]} rc=$? $(el): $(grep -E '^test cases' "$OUT/tests.log" | tail -1)"
  grep -B3 -A14 "FAILED" "$OUT/tests.log" | grep -v "^with expansion" | head -150
fi

MODELS_PID=""
if has models; then
  # The other architectures' benchmark shapes (deepseek2: GLM-4.7-Flash, gpt-oss-20b MXFP4),
  # written while the tests run.
  # (MODELS: which of them, default both.)
  ( if [[ " ${MODELS:-glm oss} " == *" glm "* ]]; then [ -f /tmp/glm.gguf ] || nice "$CLI" mkmodel --preset glm-4.7-flash --type q4_k_m -o /tmp/glm.gguf --threads 6 --quiet > "$OUT/mk_glm.log" 2>&1; fi
    if [[ " ${MODELS:-glm oss} " == *" oss "* ]]; then [ -f /tmp/oss.gguf ] || nice "$CLI" mkmodel --preset gpt-oss-20b --type mxfp4 -o /tmp/oss.gguf --threads 6 --quiet > "$OUT/mk_oss.log" 2>&1; fi ) &
  MODELS_PID=$!
fi

CONF_PID=""
if has conformance; then
  # In the background: it drives the CLI (one process per check) while the sanitizer runs.
  D=.devdata/conformance
  ls ../shared/conformance/models/*.gguf > /dev/null 2>&1 && D=../shared/conformance
  # Greedy ids for every model present; logits for qwen3moe/deepseek2/qwen3next/qwen35moe with check.py and for
  # gpt-oss with the incremental feeder (the reference fed those tokens one at a time).
  # Greedy twice: in the CPU's float order (--cpu-order, the reproducible mode: the chaotic
  # K-quant files need it) and in the default tensor-core order (reported; see docs/perf/cuda.md).
  CLI_ABS=$PWD/$CLI
  ( timeout 150 python3 $D/check.py "$CLI_ABS" $D --device cuda --kinds greedy --extra=--cpu-order
    echo "greedy --cpu-order rc=$?"
    timeout 150 python3 $D/check.py "$CLI_ABS" $D --device cuda --kinds greedy
    echo "greedy default order rc=$?"
    for fam in qwen3moe deepseek2 qwen3next qwen35moe; do
      ls $D/models/$fam* >/dev/null 2>&1 || continue
      timeout 120 python3 $D/check.py "$CLI_ABS" $D --device cuda --kinds logits --only $fam --extra=--cpu-order; echo "logits $fam --cpu-order rc=$?"
    done
    if ls $D/models/gpt-oss* >/dev/null 2>&1; then
      timeout 120 python3 tests/conformance/incremental_logits.py "$CLI_ABS" $D --only gpt-oss --device cuda; echo "logits gpt-oss incremental rc=$?"
    fi ) > "$OUT/conformance.log" 2>&1 &
  CONF_PID=$!
fi

if has sanitize; then
  # memcheck and racecheck side by side (the conformance runs beside them too).
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  ( timeout ${MEMCHECK_S:-200} "$CS" --tool memcheck --error-exitcode 9 "$TESTS" "[ops][cuda],[cuda][delta_net]" > "$OUT/memcheck.log" 2>&1
    echo "rc=$?" >> "$OUT/memcheck.log" ) &
  MC_PID=$!
  timeout ${RACECHECK_S:-200} "$CS" --tool racecheck --error-exitcode 9 "$TESTS" "${RACECHECK_TAGS:-[routing],[attention],[mma],[fusion],[delta_net]}" > "$OUT/racecheck.log" 2>&1
  note "racecheck ${RACECHECK_TAGS:-[routing],[attention],[mma],[fusion],[delta_net]} rc=$? $(el): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^test cases' "$OUT/racecheck.log" | tr '\n' ' ')"
  wait $MC_PID
  note "memcheck [ops][cuda],[cuda][delta_net] $(tail -1 "$OUT/memcheck.log") $(el): $(grep -E 'ERROR SUMMARY|^test cases' "$OUT/memcheck.log" | tr '\n' ' ')"
fi

if has sanall; then
  # Every [cuda] test case under memcheck and racecheck, one process per (tool, case), SAN_P at
  # a time (the sanitizers are host bound, so cases run side by side on the one GPU). A case is
  # selected by its name up to the first character Catch2 treats specially, plus '*'.
  # SAN_CASES (a file of such patterns, one per line) replaces the list: e.g. the four cases that
  # ran past 440 s under racecheck on 2026-11-30 (docs/perf/cuda.md), alone with SAN_S=580.
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  mkdir -p "$OUT/san"
  if [ -n "${SAN_CASES:-}" ]; then grep -v '^ *$' "$SAN_CASES" > "$OUT/san/cases.txt"
  else "$TESTS" "${SAN_TAGS:-[cuda]}" --list-test-names-only | grep -v '^ *$' | sed -E 's/[],[].*$//; s/ +$//; s/$/*/' | sort -u > "$OUT/san/cases.txt"
  fi
  san_one() {  # tool index pattern
    timeout "${SAN_S:-300}" "$CS" --tool "$1" --error-exitcode 9 "$TESTS" "$3" > "$OUT/san/$1.$2.log" 2>&1
    echo "rc=$? case: $3" >> "$OUT/san/$1.$2.log"
  }
  export -f san_one; export CS TESTS OUT SAN_S
  for tool in ${SAN_TOOLS:-memcheck racecheck}; do nl -ba "$OUT/san/cases.txt" | sed "s/^/$tool/"; done |
    awk '{tool=$1; i=$2; $1=""; $2=""; sub(/^  /, ""); printf "%s\t%s\t%s\n", tool, i, $0}' |
    xargs -P "${SAN_P:-10}" -d '\n' -n 1 bash -c 'IFS=$(printf "\t") read -r t i p <<< "$0"; san_one "$t" "$i" "$p"'
  for f in "$OUT"/san/*.log; do
    echo "$(basename "$f") $(tail -1 "$f") | $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|^test cases|^All tests' "$f" | tr '\n' ' ')"
  done > "$OUT/san/summary.txt"
  note "sanitizers, every case $(el): $(grep -c 'rc=0 ' "$OUT/san/summary.txt") of $(wc -l < "$OUT/san/summary.txt") runs rc=0"
  grep -v 'rc=0 ' "$OUT/san/summary.txt" | tee -a "$SUM"
fi

if [ -n "$CONF_PID" ]; then
  wait $CONF_PID
  note "conformance cuda $(el): $(grep -E 'rc=|passed|failed|FAIL' "$OUT/conformance.log" | tail -12 | tr '\n' ' ')"
fi

if has bench; then
  [ -n "$MK_PID" ] && wait $MK_PID

  note "mkmodel $(el): $(tail -1 "$OUT/mkmodel.log") $(ls -la /tmp/q3.gguf 2>&1)"
  timeout 100 "$CLI" bench -m /tmp/q3.gguf --device cuda -p 512 -n 128 -r 3 > "$OUT/bench.log" 2>&1
  note "bench rc=$? $(el)"
  cat "$OUT/bench.log" | tail -15 | tee -a "$SUM"
  if [ "${BENCH_EXTRAS:-1}" = 1 ]; then
  # The per-step floor: a tiny model (2 layers of width 64) pays only launches and host work.
  "$CLI" mkmodel --preset tiny --type f16 -o /tmp/tiny.gguf --quiet > /dev/null 2>&1
  timeout 60 "$CLI" bench -m /tmp/tiny.gguf --device cuda -p 0 -n 128 -r 3 > "$OUT/bench_tiny.log" 2>&1
  note "bench tiny model (per-step floor) rc=$? $(el): $(grep -E 'tg128' "$OUT/bench_tiny.log")"
  # Graphs off: how launch-bound decode still is.
  timeout 60 "$CLI" bench -m /tmp/q3.gguf --device cuda -p 0 -n 128 -r 2 --no-gpu-graphs > "$OUT/bench_nographs.log" 2>&1
  note "bench (no CUDA graphs) rc=$? $(el): $(grep -E 'tg128' "$OUT/bench_nographs.log")"
  timeout 60 "$CLI" bench -m /tmp/q3.gguf --device cuda -p 512 -n 128 -r 2 --no-pdl > "$OUT/bench_nopdl.log" 2>&1
  note "bench (no PDL) rc=$? $(el): $(grep -E '(pp512|tg128) ' "$OUT/bench_nopdl.log" | tr '\n' ' ')"
  fi
  if [ -n "${BENCH_DEPTH:-}" ]; then
    timeout 120 "$CLI" bench -m /tmp/q3.gguf --device cuda -p 512 -n 128 -d $BENCH_DEPTH -r 2 > "$OUT/bench_depth.log" 2>&1
    note "bench depth $BENCH_DEPTH rc=$? $(el)"; grep -E '@ d' "$OUT/bench_depth.log" | tee -a "$SUM"
  fi
fi

if has kernels && [ "$BENCH" = ON ]; then
  KB=$(find $B -name bench-cuda_kernels -type f | head -1)
  timeout 90 "$KB" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_min_time=0.1 > "$OUT/kernels.log" 2>&1
  note "kernels rc=$? $(el)"
  grep -E "_median" "$OUT/kernels.log" | sed -E 's/ +/ /g' | tee -a "$SUM"
fi

if has profile; then
  [ -n "$MK_PID" ] && wait $MK_PID
  timeout 100 "$TESTS" "[.cuda-profile]" > "$OUT/profile.log" 2>&1
  note "profile rc=$? $(el)"
  grep -A16 -- "----" "$OUT/profile.log" | tee -a "$SUM"
  if [ -n "${PROFILE_GLM:-}" ]; then  # the deepseek2 (MLA) shape, GLM-4.7-Flash
    [ -f /tmp/glm.gguf ] || "$CLI" mkmodel --preset glm-4.7-flash --type q4_k_m -o /tmp/glm.gguf --threads 12 --quiet > /dev/null 2>&1
    MOE_PROFILE_MODEL=/tmp/glm.gguf timeout 100 "$TESTS" "[.cuda-profile]" > "$OUT/profile_glm.log" 2>&1
    note "profile glm rc=$? $(el)"
    grep -A16 -- "----" "$OUT/profile_glm.log" | tee -a "$SUM"
  fi
fi
if has models; then
  wait $MODELS_PID
  [ -f /tmp/oss.gguf ] && timeout 100 "$CLI" bench -m /tmp/oss.gguf --device cuda -p 512 -n 128 -r 2 > "$OUT/bench_oss.log" 2>&1
  note "bench gpt-oss-20b rc=$? $(el): $(grep -E '(pp|tg)[0-9]+ +\|' "$OUT/bench_oss.log" | tr '\n' ' ')"
  [ -f /tmp/glm.gguf ] && timeout 100 "$CLI" bench -m /tmp/glm.gguf --device cuda -p 512 -n 128 -r 2 > "$OUT/bench_glm.log" 2>&1
  note "bench glm-4.7-flash rc=$? $(el): $(grep -E '(pp|tg)[0-9]+ +\|' "$OUT/bench_glm.log" | tr '\n' ' ')"
fi

if has ncu; then
  # Kernel time of decode steps without launch gaps (ncu times each launch alone; eager launches).
  [ -n "$MK_PID" ] && wait $MK_PID
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 240 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    --csv --launch-skip ${NCU_SKIP:-4000} --launch-count ${NCU_COUNT:-1262} "$CLI" bench -m ${NCU_MODEL:-/tmp/q3.gguf} --device cuda \
    -p 0 -n 16 -r 1 --no-gpu-graphs > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  note "ncu rc=$? $(el)"
  python3 tests/cuda/ncu_summary.py "$OUT/ncu.csv" ${NCU_STEPS:-2} 2>&1 | head -40 | tee -a "$SUM"
fi
if has ncudeep; then
  # Full Nsight Compute sections (speed of light, occupancy, warp stall reasons, memory) for a
  # few decode launches of the kernels named by NCU_KERNELS, to see why a small kernel is slow
  # (NCU_BENCH_ARGS="-p 512 -n 0" with NCU_KERNELS=mmq_q4k looks at the prefill GEMM instead),
  # plus the per-SASS-instruction counts and stall samples (ncu_source.csv; summarise one launch
  # with tests/cuda/ncu_source_summary.py). NCU_SKIP counts matching launches only: keep it below
  # their number in the run (300, as used on 2026-11-30, skipped past every expert launch of 8 layers x 8 steps).
  [ -n "$MK_PID" ] && wait $MK_PID
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 200 "$NCU" --set full --import-source yes --clock-control none -k "regex:${NCU_KERNELS:-attn_decode|matvec}" --launch-skip ${NCU_SKIP:-40} \
    --launch-count ${NCU_DEEP_COUNT:-8} -o "$OUT/ncu_deep" "$CLI" bench -m ${NCU_MODEL:-/tmp/q3.gguf} --device cuda ${NCU_BENCH_ARGS:--p 0 -n 8} -r 1 \
    --no-gpu-graphs > "$OUT/ncu_deep.log" 2>&1
  note "ncu deep rc=$? $(el)"
  "$NCU" -i "$OUT/ncu_deep.ncu-rep" --page details > "$OUT/ncu_deep.txt" 2>&1
  "$NCU" -i "$OUT/ncu_deep.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_source.csv" 2>> "$OUT/ncu_deep.log"
  python3 tests/cuda/ncu_source_summary.py "$OUT/ncu_source.csv" 2>&1 | tee -a "$SUM"
fi
echo "==== summary"; cat "$SUM"
