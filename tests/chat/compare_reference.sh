#!/bin/sh
# Renders tests/chat/cases.json with moeinfer and with @huggingface/jinja (installed here from
# the npm registry) and compares every prompt byte for byte. Exit 77 (CTest: skipped) when
# node/npm or the registry is unavailable, so a missing reference never passes silently.
# usage: compare_reference.sh RENDER_TOOL SOURCE_DIR WORK_DIR
set -u
tool=$1 work=$3
src=$(cd "$2" && pwd) || exit 1
mkdir -p "$work" && work=$(cd "$work" && pwd) || exit 1
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { echo "SKIPPED: node/npm not found"; exit 77; }
prefix=$work/npm
if [ ! -f "$prefix/node_modules/@huggingface/jinja/package.json" ]; then
  mkdir -p "$prefix"
  if ! npm install --prefix "$prefix" --no-audit --no-fund @huggingface/jinja@0.5 >"$work/npm-install.log" 2>&1; then
    echo "SKIPPED: npm install @huggingface/jinja failed (no registry?); see $work/npm-install.log"
    exit 77
  fi
fi
echo "reference: @huggingface/jinja $(node -p "require('$prefix/node_modules/@huggingface/jinja/package.json').version")"
rm -rf "$work/ours" "$work/ref" && mkdir -p "$work/ours" "$work/ref"
"$tool" "$src/cases.json" "$src/templates" "$work/ours" || { echo "FAIL: moeinfer renderer exited with $?"; exit 1; }
TZ=UTC NPM_PREFIX=$prefix node "$src/reference_render.mjs" "$src/cases.json" "$src/templates" "$work/ref" ||
  { echo "FAIL: reference renderer exited with $?"; exit 1; }
node -e "for (const c of require('$src/cases.json')) console.log(c.family + ' ' + c.id + ' ' + (c.expect_error ? 1 : 0))" >"$work/ids.txt" ||
  { echo "FAIL: cannot list the cases"; exit 1; }
[ -s "$work/ids.txt" ] || { echo "FAIL: no cases"; exit 1; }
fail=0 all=0
for fam in $(cut -d' ' -f1 "$work/ids.txt" | uniq); do
  total=0 ok=0
  for entry in $(awk -v f="$fam" '$1 == f { print $2 ":" $3 }' "$work/ids.txt"); do
    id=${entry%:*} expect_error=${entry##*:}
    total=$((total + 1))
    if [ "$expect_error" = 0 ] && [ -f "$work/ref/$id.txt" ] && [ -f "$work/ours/$id.txt" ] &&
       cmp -s "$work/ref/$id.txt" "$work/ours/$id.txt"; then
      ok=$((ok + 1))
    elif [ "$expect_error" = 1 ] && [ -f "$work/ref/$id.error" ] && grep -q "raise_exception" "$work/ours/$id.error" 2>/dev/null; then
      ok=$((ok + 1))  # both refuse the conversation: the template's raise_exception()
    else
      fail=1
      echo "MISMATCH $id"
      for f in "$work/ref/$id".* "$work/ours/$id".*; do [ -f "$f" ] && echo "  $f"; done
      [ -f "$work/ref/$id.txt" ] && [ -f "$work/ours/$id.txt" ] && cmp "$work/ref/$id.txt" "$work/ours/$id.txt"
    fi
  done
  all=$((all + total))
  echo "$fam: $ok/$total conversations identical"
done
echo "$all conversations compared"
[ $fail -eq 0 ] && echo "PASS" || echo "FAIL"
exit $fail
