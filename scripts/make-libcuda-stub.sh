#!/usr/bin/env bash
# Generate a link-time stand-in for the CUDA driver library (libcuda.so.1): one dummy
# function for every cu* symbol declared by cudarc's driver bindings. Only the linker sees
# it; at run time the dynamic loader finds the real driver.
# Usage: scripts/make-libcuda-stub.sh OUT_DIR
set -euo pipefail
OUT="${1:?output directory}"
mkdir -p "$OUT"
SYS="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.*/src/driver/sys/mod.rs | sort -V | tail -1)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
grep -oE 'pub unsafe fn cu[A-Za-z0-9_]+\(' "$SYS" | sed -E 's/pub unsafe fn (cu[A-Za-z0-9_]+)\(/\1/' | sort -u \
  | awk '{ printf "int %s(void) { return 999; }\n", $1 }' >"$TMP/stub.c"
gcc -shared -fPIC -o "$OUT/libcuda.so.1" -Wl,-soname,libcuda.so.1 "$TMP/stub.c"
ln -sf libcuda.so.1 "$OUT/libcuda.so"
echo "stub with $(wc -l <"$TMP/stub.c") symbols in $OUT"
