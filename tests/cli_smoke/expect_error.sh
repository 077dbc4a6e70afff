#!/bin/sh
# Runs CMD; passes when it exits with status RC and its output (stdout and stderr) matches
# the extended regular expression PATTERN (CTest alone cannot require both). With
# --not ABSENT first, the output must also not match ABSENT (e.g. a prompt echoed before
# an error).
# Usage: expect_error.sh [--not ABSENT] RC PATTERN CMD [ARGS...]
absent=
if [ "$1" = "--not" ]; then absent=$2; shift 2; fi
rc_want=$1
pattern=$2
shift 2
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne "$rc_want" ]; then echo "exit status $rc, expected $rc_want"; exit 1; fi
if ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then echo "output does not match: $pattern"; exit 1; fi
if [ -n "$absent" ] && printf '%s\n' "$out" | grep -Eq -- "$absent"; then echo "output matches: $absent"; exit 1; fi
exit 0
