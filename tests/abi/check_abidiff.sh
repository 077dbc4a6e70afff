#!/bin/sh
# Compares the library's ABI (abidw, from the DWARF of the C ABI translation units) with
# the committed baseline. abidiff exit status is a bit mask: 1 error, 2 usage error,
# 4 ABI change, 8 incompatible change. Added symbols are ignored (--no-added-syms); any change
# to an existing interface (4 or 8) fails until the baseline is updated (target abi-update).
# Usage: check_abidiff.sh LIB HEADERS_DIR BASELINE OUT_DIR [--update]
set -u
lib=$1; hdr=$2; base=$3; out=$4
cur="$out/moeinfer.current.abi"
abidw --headers-dir "$hdr" --drop-private-types --exported-interfaces-only --no-corpus-path --no-comp-dir-path \
  --no-elf-needed --no-architecture --short-locs \
  --out-file "$cur" "$lib" || { echo "abidw failed"; exit 1; }
if [ "${5:-}" = "--update" ]; then cp "$cur" "$base"; echo "baseline updated: $base"; exit 0; fi
abidiff --no-added-syms "$base" "$cur"
rc=$?
if [ $((rc & 1)) -ne 0 ] || [ $((rc & 2)) -ne 0 ]; then echo "abidiff error (rc=$rc)"; exit 1; fi
if [ $((rc & 8)) -ne 0 ]; then echo "INCOMPATIBLE ABI change vs $base (rc=$rc)"; exit 1; fi
if [ $((rc & 4)) -ne 0 ]; then echo "ABI change of existing interfaces vs $base (rc=$rc); run the abi-update target if intended"; exit 1; fi
echo "ABI compatible with $base"
exit 0
