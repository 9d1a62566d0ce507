#!/usr/bin/env bash
# Where a draft-model decode step spends its time on the GPU: every kernel of a short
# short run timed alone by Nsight Compute (ncu), summed per kernel name and divided by
# the decode steps. Set against the step's wall time from draft-bench.sh, the difference
# is what launches and the gaps between kernels cost. Measured on an NVIDIA H200.
#
# Usage: draft-profile.sh MODEL_DIR [BIN.gz]   (env: VARIANT="" or "SPECD_DRAFT_FUSED=1",
#        STEPS=24 decode steps, BATCH=1 streams, OUT=dir for the CSV,
#        NCU_ARGS="--cache-control none" to keep the caches between kernels, as in a step)
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
MODEL="$1"
BIN_GZ="${2:-$HERE/specd-bench.gz}"
STEPS="${STEPS:-24}"
OUT="${OUT:-/tmp/specd-draft-profile}"
# shellcheck source=scripts/device/lib.sh
. "$HERE/lib.sh"
mkdir -p "$OUT"
specd_cuda_libs && specd_unpack "$BIN_GZ" || exit 1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }

BATCH="${BATCH:-1}"
tag="${VARIANT:-default}-b$BATCH"
tag="${tag//[^A-Za-z0-9]/_}"
csv="$OUT/kernels-$tag.csv"
# shellcheck disable=SC2086
env ${VARIANT:-} "$NCU" ${NCU_ARGS:-} --clock-control none --metrics gpu__time_duration.sum --csv \
  --print-units base --log-file "$csv" \
  "$W/specd-bench" draft --model "$MODEL" --device cuda:0 --batch "$BATCH" --prompt-len 16 \
  --new-tokens "$STEPS" --repeat 1 >/dev/null 2>"$OUT/ncu-$tag.err"
echo "ncu exit $? ($(wc -l <"$csv") lines)"
python3 - "$csv" "$STEPS" <<'EOF'
import csv, sys, collections
path, steps = sys.argv[1], int(sys.argv[2])
rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
ki, vi = head.index("Kernel Name"), head.index("Metric Value")
per = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    name = r[ki].split("(")[0].split("<")[0].strip()
    per[name][0] += 1
    per[name][1] += float(r[vi].replace(",", "")) / 1e3  # ns -> µs
# Every step ends in argmax_final (argmax_final_block at batch 1).
n = max(1, per.get("argmax_final", [0])[0] + per.get("argmax_final_block", [0])[0])
total = sum(v[1] for v in per.values())
print(f"{len(rows)} kernels, {n} sampling steps; µs per step by kernel (sum over the run / steps):")
for name, (c, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
    print(f"  {name:40s} {c / n:7.1f} launches {us / n:9.2f} µs")
print(f"  {'all kernels':40s} {len(rows) / n:7.1f} launches {total / n:9.2f} µs")
EOF
