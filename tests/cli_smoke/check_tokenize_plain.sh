#!/bin/sh
# tokenize: a plain text line gives the ids of the JSON line {"text": same, add_special true,
# parse_special false}; a line that is JSON but not an object ("quoted") is plain text too.
# Usage: check_tokenize_plain.sh CLI MODEL
set -eu
cli=$1; model=$2
out=$(printf '%s\n' 'Hello world' '{"text": "Hello world", "add_special": true, "parse_special": false}' \
        '"quoted"' '{"text": "\"quoted\"", "add_special": true, "parse_special": false}' \
      | "$cli" tokenize -m "$model")
printf '%s\n' "$out"
line() { printf '%s\n' "$out" | sed -n "$1p"; }
l1=$(line 1); l2=$(line 2); l3=$(line 3); l4=$(line 4)
[ "$(printf '%s\n' "$out" | wc -l)" = 4 ] || { echo "FAIL: expected 4 lines"; exit 1; }
printf '%s' "$l1" | grep -Eq '^\{"ids":\[[0-9]+(,[0-9]+)*\]\}$' || { echo "FAIL: line 1 is not {\"ids\":[...]}"; exit 1; }
[ "$l1" = "$l2" ] || { echo "FAIL: plain text and its JSON line differ"; exit 1; }
[ "$l3" = "$l4" ] || { echo "FAIL: a JSON string line was not read as plain text"; exit 1; }
[ "$l1" != "$l3" ] || { echo "FAIL: different texts gave the same ids"; exit 1; }
echo PASS
