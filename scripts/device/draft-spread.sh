#!/usr/bin/env bash
# The same 32-stream measurement in separate processes: how far its time spreads, and what
# differs between a fast and a slow process. Measured on an NVIDIA H100 80GB HBM3 and an
# NVIDIA H200.
# Needs what draft-bench.sh needs; the model comes from a draft-bench.sh run (made here
# when missing). Per process it prints ms per step (median of REPEAT timed runs of 128
# tokens), the engine's step count and mean rows per step over the whole process, the SM
# clock and power while it ran, and a signature of the cuBLASLt kernels and algorithms the
# process chose (every shape and algorithm it logged, addresses stripped, each pair once):
# equal signatures mean equal cuBLAS choices.
#
# Usage: draft-spread.sh [BIN.gz]
# Env:   SHAPE=qwen2.5-1.5b  PROCS=8  REPEAT=5  BATCH=32  OUT=dir (cuBLASLt logs kept there)
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN_GZ="${1:-$HERE/specd-bench.gz}"
SHAPE="${SHAPE:-qwen2.5-1.5b}"
# shellcheck source=scripts/device/lib.sh
. "$HERE/lib.sh"
OUT="${OUT:-/tmp/specd-draft-spread}"
mkdir -p "$OUT"
specd_models "$BIN_GZ" "$SHAPE"
specd_cuda_libs && specd_unpack "$BIN_GZ" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in $(seq 1 "${PROCS:-8}"); do
  rm -f "$W"/lt.*.log
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 250 >"$W/smi.log" &
  smi=$!
  out=$(CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE="$W/lt.%i.log" timeout 120 "$W/specd-bench" draft \
    --model "$W/$SHAPE" --device cuda:0 --batch "${BATCH:-32}" --repeat "${REPEAT:-5}" 2>&1)
  kill "$smi" 2>/dev/null
  cat "$W"/lt.*.log 2>/dev/null | sed -E 's/0[xX][0-9A-Fa-f]+/P/g; s/^\[[^]]*\]\[cublasLt\]\[[0-9]+\]//' \
    | sort -u >"$OUT/cublaslt-$i.txt"
  ms=$(echo "$out" | awk -F'|' '/^\| [0-9]+ \|/ {gsub(/ /, "", $3); print $3}')
  steps=$(echo "$out" | sed -n 's/^steps \([0-9]*\) (mean \([0-9.]*\) rows.*/\1 steps, \2 rows/p')
  clk=$(awk -F', ' '$2 > 100 {n++; c += $1; p += $2} END {if (n) printf "SM %.0f MHz, %.0f W", c / n, p / n}' "$W/smi.log")
  echo "process $i: ${ms:-failed} ms per step | $steps | $clk | cuBLASLt $(md5sum <"$OUT/cublaslt-$i.txt" | cut -c1-8)"
done
