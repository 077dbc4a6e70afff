#!/bin/sh
# Runs CMD; passes when it exits with status RC and its output (stdout and stderr) matches
# the extended regular expression PATTERN (CTest alone cannot require both).
# Usage: expect_error.sh RC PATTERN CMD [ARGS...]
rc_want=$1
pattern=$2
shift 2
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne "$rc_want" ]; then echo "exit status $rc, expected $rc_want"; exit 1; fi
if ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then echo "output does not match: $pattern"; exit 1; fi
exit 0
