#!/usr/bin/env bash
# The README's "The learned detector on real traces": the model alone, the expert rules alone
# and the hybrid, on the real-based benchmark (by source: planted / natural / healthy) beside
# the synthetic test splits, with the names-masked ablation; then benchmarks/real_tables.py.
#
#   REAL=/work/datasets/real SYNTH=/work/datasets/synth_new ABLATION_DIR=benchmarks/out/abl_names \
#       bash benchmarks/run_real_tables.sh
#
# Environment (all optional):
#   REAL          real-based dataset (`traceap inject --split-plan benchmarks/real_splits.yaml`)
#   SYNTH         generated dataset (`traceap synth`)
#   OUT           output folder; default benchmarks/results/real_tables
#   DETECTORS     default expert,model,hybrid
#   WINDOWS       default 50,100,200
#   REAL_SPLITS   default test_unseen (add validation for the numbers every choice was made on)
#   ABLATION_DIR  folder holding the names-masked checkpoint (`traceap train ... --ablation
#                 names_masked`, same recipe as the bundled model); skipped when absent
#   MODEL         checkpoint for model and hybrid (default: the bundled one)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
REAL=${REAL:-/work/datasets/real}
SYNTH=${SYNTH:-/work/datasets/synth_new}
OUT=${OUT:-benchmarks/results/real_tables}
DETECTORS=${DETECTORS:-expert,model,hybrid}
WINDOWS=${WINDOWS:-50,100,200}
REAL_SPLITS=${REAL_SPLITS:-test_unseen}
ABLATION_DIR=${ABLATION_DIR:-benchmarks/out/abl_names}
model=()
[ -n "${MODEL:-}" ] && model=(--model "$MODEL")
abl=()
[ -d "$ABLATION_DIR" ] && abl=(--ablation --ablation-dir "$ABLATION_DIR")

mkdir -p "$OUT"
start=$(date +%s)
nice $PY -m traceap eval --dataset "$REAL" --split "$REAL_SPLITS" --detectors "$DETECTORS" \
  --windows "$WINDOWS" --classifier "" "${model[@]}" "${abl[@]}" --json --out "$OUT/real" \
  > /dev/null
echo "real: $(( $(date +%s) - start )) s" >&2
nice $PY -m traceap eval --dataset "$SYNTH" --split test_seen,test_unseen --detectors "$DETECTORS" \
  --windows "$WINDOWS" --classifier "" "${model[@]}" "${abl[@]}" --json --out "$OUT/synth" \
  > /dev/null
echo "real + synthetic: $(( $(date +%s) - start )) s" >&2
$PY benchmarks/real_tables.py --out "$OUT"
