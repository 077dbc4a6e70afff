#!/bin/sh
# generate stops at an end-of-generation token unless --ignore-eos, and --json stdout holds
# JSON lines only (notes go to stderr). The model is a copy of MODEL whose end-of-generation
# token is the first token generate picks after "Hello".
# Usage: check_generate_stops.sh CLI MODEL WORK_DIR SET_EOS_PY
set -eu
cli=$1; model=$2; work=$3; set_eos=$4
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
gen() { "$cli" generate -p Hello --device cpu --json "$@" 2>/dev/null; }

out=$(gen -m "$model" -n 3)
[ "$(printf '%s\n' "$out" | grep -c '^{"n_past": ')" = 3 ] || fail "expected 3 JSON lines, got: $out"
printf '%s\n' "$out" | grep -qv '^{' && fail "--json stdout has a line that is not JSON: $out"
first=$(printf '%s\n' "$out" | sed -n '1s/.*"id": \([0-9]*\).*/\1/p')

eog="$work/eog-$$.gguf"
python3 "$set_eos" "$model" "$eog" "$first"
trap 'rm -f "$eog"' EXIT
out=$(gen -m "$eog" -n 5)
[ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "did not stop at end-of-generation token $first: $out"
out=$(gen -m "$eog" -n 5 --ignore-eos)
[ "$(printf '%s\n' "$out" | wc -l)" = 5 ] || fail "--ignore-eos: expected 5 lines: $out"
# Text mode: the end-of-generation token itself is not printed; the prompt and a newline are.
out=$("$cli" generate -m "$eog" -p Hello --device cpu -n 5 2>/dev/null)
[ "$out" = "Hello" ] || fail "text mode printed '$out' after the end-of-generation token"
echo PASS
