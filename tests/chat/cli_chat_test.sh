#!/bin/sh
# moeinfer-cli chat on the demo model, driven through stdin: the transcript has one reply per
# turn and the reset marker, turn 2 reuses every cached token of turn 1's prompt and decodes
# only the rest, the turn after /reset starts from an empty cache; generate --chat renders
# ChatML (the demo model's template) around -p; --json-schema replies are the schema's JSON.
# usage: cli_chat_test.sh MOEINFER_CLI WORK_DIR
set -u
cli=$1 work=$2
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

printf 'Hello there\nHow are you?\n/reset\nAgain\n' |
  "$cli" chat -n 6 --temp 0 --verbose --system "Be brief." >"$work/chat.out" 2>"$work/chat.err" ||
  fail "chat exited with $? ($(cat "$work/chat.err"))"
grep -q '^\[conversation reset\]$' "$work/chat.out" || fail "no reset marker in the transcript"
[ "$(grep -c '^\[turn [0-9]*\] prompt' "$work/chat.err")" -eq 3 ] || fail "expected 3 turn reports: $(cat "$work/chat.err")"
# "[turn N] prompt P tokens: R reused, D decoded; G generated"
field() { sed -n "s/^\[turn $1\] prompt \([0-9]*\) tokens: \([0-9]*\) reused, \([0-9]*\) decoded; \([0-9]*\) generated$/\\$2/p" "$work/chat.err"; }
p1=$(field 1 1) r1=$(field 1 2) d1=$(field 1 3) g1=$(field 1 4)
p2=$(field 2 1) r2=$(field 2 2) d2=$(field 2 3)
p3=$(field 3 1) r3=$(field 3 2)
echo "turn 1: prompt $p1, reused $r1, decoded $d1, generated $g1; turn 2: prompt $p2, reused $r2, decoded $d2; turn 3: prompt $p3, reused $r3"
[ "$r1" -eq 0 ] && [ "$d1" -eq "$p1" ] || fail "turn 1 must decode its whole prompt"
[ "$g1" -ge 1 ] || fail "turn 1 generated nothing"
[ "$r2" -ge "$p1" ] || fail "turn 2 reused $r2 tokens, fewer than turn 1's prompt ($p1): the KV cache was not kept"
[ $((r2 + d2)) -eq "$p2" ] && [ "$d2" -lt "$p2" ] || fail "turn 2 must decode only what is not cached"
[ "$r3" -eq 0 ] || fail "after /reset nothing may be reused (reused $r3)"
[ "$p3" -lt "$p2" ] || fail "after /reset the prompt must hold only the new conversation"

"$cli" generate --chat --system "S" -p "Hi" -n 1 --temp 0 >"$work/gen.out" 2>/dev/null || fail "generate --chat exited with $?"
printf '<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n' >"$work/gen.expected"
head -c "$(wc -c <"$work/gen.expected")" "$work/gen.out" | cmp -s - "$work/gen.expected" ||
  fail "generate --chat did not render the ChatML prompt: $(head -c 200 "$work/gen.out")"

# --json-schema: the reply is JSON valid under the schema (whitespace aside), ended by the grammar
# (an end-of-generation token once the object is complete), not by -n.
printf '{"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer"}},"required":["ok","n"]}' \
  >"$work/schema.json"
echo "Reply in JSON" | "$cli" chat -n 64 --temp 0 --verbose --json-schema "$work/schema.json" \
  >"$work/schema.out" 2>"$work/schema.err" || fail "chat --json-schema exited with $? ($(cat "$work/schema.err"))"
compact=$(tr -d ' \t\n' <"$work/schema.out")
echo "$compact" | grep -Eq '^\{"ok":(true|false),"n":-?[0-9]+\}$' || fail "reply is not the schema's JSON: $(cat "$work/schema.out")"
gen=$(sed -n 's/^\[turn 1\] .*; \([0-9]*\) generated$/\1/p' "$work/schema.err")
[ "$gen" -lt 64 ] || fail "the constrained reply was cut by -n ($gen tokens), not ended by the grammar"
echo x | "$cli" chat --json-schema "$work/missing.json" >/dev/null 2>"$work/missing.err" && fail "a missing schema file was accepted"
grep -q "missing.json" "$work/missing.err" || fail "the error does not name the schema file: $(cat "$work/missing.err")"
echo PASS
