#!/bin/sh
# Runs one README snippet program twice on the tiny model and checks where it stops:
#   1. as written (random weights, n_ctx 256): "[context full]", exit status 0;
#   2. on a copy whose end-of-generation token is the first token the model picks:
#      "[end of generation]" before any text, exit status 0.
# Usage: run_snippet.sh SNIPPET CLI MODEL WORK_DIR SET_EOS_PY
set -eu
snippet=$1; cli=$2; model=$3; work=$4; set_eos=$5
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

out=$("$snippet" "$model" Hello) || fail "exit status $? on $model"
printf '%s\n' "$out" | tail -3
printf '%s\n' "$out" | grep -q '^\[context full\]$' || fail "did not stop at the full context"

first=$("$cli" generate -m "$model" -p Hello -n 1 --json --device cpu | sed -n 's/.*"id": \([0-9]*\).*/\1/p')
[ -n "$first" ] || fail "no first token from $cli"
eog_model="$work/$(basename "$snippet")-eog.gguf"
python3 "$set_eos" "$model" "$eog_model" "$first"
out=$("$snippet" "$eog_model" Hello) || fail "exit status $? on $eog_model"
rm -f "$eog_model"
printf '%s\n' "$out"
[ "$out" = "
[end of generation]" ] || fail "did not stop at the end-of-generation token $first"
echo "PASS"
