#!/usr/bin/env bash
# Tune the one-token kernels of specd's CUDA draft-model engine on a GPU machine: times
# batch-1 decoding of each shape under several GEMV shapes (SPECD_DRAFT_GEMV) and
# attention prefetch levels, after checking the engine against transformers. Measured on
# an NVIDIA H200. Needs what draft-bench.sh needs (it creates the models with it).
#
# Usage: draft-tune.sh [BIN.gz]   (env: SHAPES, KERNELS=dir of .cu files to compile
#        instead of the built-in ones, CONFIGS_<shape>="qkv=1x2 down=1x8,lm=2x1 ...")
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN_GZ="${1:-$HERE/specd-bench.gz}"
SHAPES="${SHAPES:-qwen2.5-0.5b qwen2.5-1.5b}"
W=/tmp/specd-draft-work
CU13="$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))')"
export LD_LIBRARY_PATH="$CU13${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -n "${KERNELS:-}" ] && export SPECD_DRAFT_KERNELS="$KERNELS"
if [ ! -x "$W/specd-bench" ] || [ "$BIN_GZ" -nt "$W/specd-bench" ]; then
  mkdir -p "$W" && gunzip -c "$BIN_GZ" >"$W/specd-bench" && chmod +x "$W/specd-bench" || exit 1
fi
if [ ! -f "$W/tiny/qwen3.ref.safetensors" ]; then
  VARIANTS=0 ANCHOR=none BATCH=1 SHAPES="$SHAPES" bash "$HERE/draft-bench.sh" "$BIN_GZ" | grep -E '^\$|check:|^\| [0-9]'
fi
# One line per configuration: its name, then ms per token at batch 1.
t() {
  local name="$1" model="$2"; shift 2
  local ms
  ms=$(env "$@" "$W/specd-bench" draft --model "$W/$model" --device cuda:0 --batch 1 --repeat 3 2>&1 |
    awk -F'|' '/^\| 1 \|/ {print $3}')
  echo "$model $name: ${ms:-failed} ms"
}
for s in $SHAPES; do
  t default "$s" X=1
  var="CONFIGS_${s//[^a-z0-9]/_}"
  for c in ${!var:-}; do t "$c" "$s" SPECD_DRAFT_GEMV="$c"; done
  for p in 0 1 2; do t "att_prefetch=$p" "$s" SPECD_DRAFT_ATT_PREFETCH=$p; done
  t "cublas (SPECD_DRAFT_FUSED=0)" "$s" SPECD_DRAFT_FUSED=0
done
