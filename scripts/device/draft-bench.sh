#!/usr/bin/env bash
# Check and time specd's CUDA draft-model engine on a GPU machine (measured on an NVIDIA
# H200 with this script). Needs: python3 with torch + transformers, the NVIDIA CUDA 13
# wheels (nvidia/cu13/lib) in that Python, and a gzipped specd-bench binary built by
#   scripts/build-cuda.sh --bench-bin specd-bench
#
# Usage: draft-bench.sh [BIN.gz]      (default: specd-bench.gz beside this script)
# Env:   ANCHOR=none|graph|compile    also run the plain-PyTorch anchor (torch_decode_anchor.py
#                                     beside this script) in that mode (default graph)
#        SHAPES="qwen2.5-0.5b qwen2.5-1.5b"   BATCH=1,8,32   OUT=dir for logs
#        VARIANTS=0                   skip the variant runs (one graph launch per token: the
#                                     engine before chained decode steps, on every shape)
#        VARIANTS=all                 also the older variants on the first shape (cuBLAS at
#                                     batch 1, PDL off, no graphs)
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REF="$HERE/draft_model_reference.py"
[ -f "$REF" ] || REF="$HERE/../draft_model_reference.py"
BIN_GZ="${1:-$HERE/specd-bench.gz}"
OUT="${OUT:-/tmp/specd-draft-bench}"
SHAPES="${SHAPES:-qwen2.5-0.5b qwen2.5-1.5b}"
BATCH="${BATCH:-1,8,32}"
ANCHOR="${ANCHOR:-graph}"
# shellcheck source=scripts/device/lib.sh
. "$HERE/lib.sh"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

specd_cuda_libs && specd_unpack "$BIN_GZ" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv

echo "== models (random init) and transformers references"
python3 - "$REF" "$W" $SHAPES <<'EOF' 2>&1 | grep -v -i -E 'warn|it/s\]'
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("ref", sys.argv[1]); r = importlib.util.module_from_spec(spec); spec.loader.exec_module(r)
w = sys.argv[2]
for shape in sys.argv[3:]:
    if not os.path.exists(f"{w}/{shape}/config.json"):
        r.random_model(shape, f"{w}/{shape}", "cuda")
    # f32 arithmetic on the bf16 weights; prints how far transformers' own bf16 run lands.
    r.reference(f"{w}/{shape}", f"{w}/{shape}.ref.safetensors", "cuda", "float32", calibrate="bfloat16")
if not os.path.exists(f"{w}/tiny/qwen3.ref.safetensors"):
    r.tiny(f"{w}/tiny")
EOF

run() { echo "\$ $*"; "$@" 2>&1; }
echo "== correctness of the CUDA engine (bf16) against transformers"
for m in llama qwen2 qwen3; do
  run "$W/specd-bench" draft --model "$W/tiny/$m" --device cuda:0 --reference "$W/tiny/$m.ref.safetensors" --batch 1 --new-tokens 8 --repeat 1
done
echo "== speed"
for s in $SHAPES; do
  run "$W/specd-bench" draft --model "$W/$s" --device cuda:0 --reference "$W/$s.ref.safetensors" --batch "$BATCH" --json | tee -a "$OUT/bench.txt"
done
first="${SHAPES%% *}"
if [ "${VARIANTS:-1}" != 0 ]; then
  echo "== variant: one graph launch and host synchronization per token (SPECD_DRAFT_CHAIN=1)"
  for s in $SHAPES; do
    SPECD_DRAFT_CHAIN=1 run "$W/specd-bench" draft --model "$W/$s" --device cuda:0 --batch "$BATCH" --json | tee -a "$OUT/bench-chain1.txt"
  done
fi
if [ "${VARIANTS:-1}" = all ]; then
echo "== variants on $first: the previous engine (cuBLAS at batch 1, no attention prefetch); without programmatic dependent launch; no CUDA graphs"
SPECD_DRAFT_FUSED=0 SPECD_DRAFT_ATT_PREFETCH=0 run "$W/specd-bench" draft --model "$W/$first" --device cuda:0 --batch "$BATCH" | tee -a "$OUT/bench.txt"
SPECD_DRAFT_PDL=0 run "$W/specd-bench" draft --model "$W/$first" --device cuda:0 --batch "$BATCH" | tee -a "$OUT/bench.txt"
run "$W/specd-bench" draft --model "$W/$first" --device cuda:0 --batch 1,32 --no-graphs --repeat 3 | tee -a "$OUT/bench.txt"
fi

if [ "$ANCHOR" != none ] && [ -f "$HERE/torch_decode_anchor.py" ]; then
  echo "== PyTorch anchor ($ANCHOR)"
  if [ "$ANCHOR" = compile ]; then
    timeout "${ANCHOR_TIMEOUT:-300}" python3 "$HERE/torch_decode_anchor.py" compile 2>&1 | grep RESULT | tee -a "$OUT/anchor.txt"
  else
    python3 "$HERE/torch_decode_anchor.py" 2>&1 | grep RESULT | tee -a "$OUT/anchor.txt"
  fi
fi
