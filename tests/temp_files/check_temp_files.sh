#!/bin/sh
# Unit tests that write the tiny model files (support/tiny_model.h) must write them under
# TMPDIR and remove them when the process ends:
#   1. TMPDIR = an empty folder: the tests pass and the folder is empty afterwards;
#   2. TMPDIR = a folder that does not exist: the tests fail (nothing was written elsewhere).
# Usage: check_temp_files.sh MOEINFER_TESTS WORK_DIR
set -u
tests=$1; dir=$2
run() {  # run TMPDIR: the two test cases, output in $dir.log
  TMPDIR="$1" "$tests" "engine: sequences share the cache without seeing each other,engine: the CPU huge-page weight copy gives the mapped weights' logits bit for bit" \
    > "$dir.log" 2>&1
}
rm -rf "$dir"; mkdir -p "$dir"
run "$dir" || { cat "$dir.log"; echo "FAIL: the unit tests failed with TMPDIR=$dir"; exit 1; }
grep -q "All tests passed (.* in 2 test cases)" "$dir.log" || { cat "$dir.log"; echo "FAIL: expected 2 test cases to run"; exit 1; }
left=$(ls -A "$dir")
[ -z "$left" ] || { echo "FAIL: left behind under TMPDIR: $left"; exit 1; }
if run "$dir/does-not-exist"; then
  cat "$dir.log"; echo "FAIL: the tests passed with an unusable TMPDIR: they wrote somewhere else"; exit 1
fi
echo PASS
