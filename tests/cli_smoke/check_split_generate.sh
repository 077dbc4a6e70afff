#!/bin/sh
# mkmodel --split-max-size writes a split model; generate from its first part prints the same
# JSON lines (tokens and logits) as the same model in one file; info lists the parts; a later
# part given alone is refused, naming the first.
# Usage: check_split_generate.sh CLI WORK_DIR
set -eu
cli=$1; work=$2
fail() { echo "FAIL: $*"; exit 1; }
d="$work/split-$$"
mkdir -p "$d"
trap 'rm -rf "$d"' EXIT
mk() { "$cli" mkmodel --preset tiny --type q8_0 --seed 4 --quiet "$@"; }
gen() { "$cli" generate -m "$1" -p Hello --device cpu -n 6 --json 2>/dev/null; }

mk -o "$d/whole.gguf"
mk -o "$d/parts.gguf" --split-max-size 100K
n=$(ls "$d" | grep -c '^parts-0000[1-9]-of-0000[1-9]\.gguf$') || true
[ "$n" -ge 2 ] || fail "expected 2 or more parts: $(ls "$d")"
first="$d/parts-00001-of-0000$n.gguf"
[ -f "$first" ] || fail "no first part $first: $(ls "$d")"

want=$(gen "$d/whole.gguf")
got=$(gen "$first")
[ -n "$want" ] || fail "no output from the single file"
[ "$want" = "$got" ] || fail "split model output differs: $got vs $want"

"$cli" info -m "$first" --ctx 64 | grep -q "^files *: $n parts (split model)" || fail "info does not list $n parts"

if err=$("$cli" generate -m "$d/parts-00002-of-0000$n.gguf" -p Hello -n 1 2>&1); then fail "a later part loaded alone"; fi
printf '%s' "$err" | grep -q "load the first part, '$first'" || fail "later part: unexpected message: $err"
echo PASS
