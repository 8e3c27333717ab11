#!/usr/bin/env bash
# docs/RESULTS.md, "Detection quality": the model alone, the expert rules alone
# and the hybrid, on the real-based benchmark (by source: planted / natural / healthy) beside
# the synthetic test splits, with the names-masked probe; then benchmarks/real_tables.py.
#
#   REAL=/work/datasets/real SYNTH=/work/datasets/synth_new bash benchmarks/run_real_tables.sh
#
# The rules and the model are scored once each (`traceap eval --out`: every window's score in
# scores.jsonl) and the hybrid is stacked from those scores by benchmarks/combine_scores.py
# (the same numbers as `traceap eval --detectors expert,model,hybrid`, without running the
# rules twice).  The real validation split is scored too: the numbers every choice was made on.
#
# Environment (all optional):
#   REAL      real-based dataset (`traceap inject --split-plan benchmarks/real_splits.yaml`)
#   SYNTH     generated dataset (`traceap synth`)
#   OUT       output folder; default benchmarks/results/real_tables
#   WINDOWS   default 50,100,200
#   MODEL     checkpoint for model and hybrid (default: the bundled one)
#   REUSE_EXPERT=1  keep the rules' scores already in $OUT/scores (they do not depend on the
#             model): only the model is scored again after a new checkpoint
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
REAL=${REAL:-/work/datasets/real}
SYNTH=${SYNTH:-/work/datasets/synth_new}
OUT=${OUT:-benchmarks/results/real_tables}
WINDOWS=${WINDOWS:-50,100,200}
MODEL=${MODEL:-src/traceap/data/model.pt}
SCORES="$OUT/scores"
mkdir -p "$SCORES/probe"

# the names-masked probe: the shipped weights, every event nameless
$PY -c 'import sys; from traceap.model.ship import write_names_masked; write_names_masked(*sys.argv[1:])' \
  "$MODEL" "$SCORES/probe/names_masked.pt"

ev() {  # dataset split detectors out [extra...]
  local ds=$1 split=$2 dets=$3 out=$4; shift 4
  nice $PY -m traceap eval --dataset "$ds" --split "$split" --detectors "$dets" \
    --windows "$WINDOWS" --classifier "" --model "$MODEL" --json --out "$out" "$@" > /dev/null
}
start=$(date +%s)
expert() {  # dataset split out: the rules' scores, unless kept from an earlier run
  if [[ "${REUSE_EXPERT:-0}" == 1 && -s "$3/scores.jsonl" ]]; then echo "kept $3" >&2
  else ev "$1" "$2" expert "$3"; fi
}
expert "$REAL" validation "$SCORES/real_val_expert"
ev "$REAL" validation model "$SCORES/real_val_model"
expert "$REAL" test_unseen "$SCORES/real_test_expert"
ev "$REAL" test_unseen model "$SCORES/real_test_model" --ablation --ablation-dir "$SCORES/probe"
expert "$SYNTH" test_seen,test_unseen "$SCORES/synth_expert"
ev "$SYNTH" test_seen,test_unseen model "$SCORES/synth_model" --ablation --ablation-dir "$SCORES/probe"
echo "scored in $(( $(date +%s) - start )) s" >&2
$PY benchmarks/combine_scores.py --dataset "$REAL" --split test_unseen,validation \
  --scores "$SCORES/real_val_expert/scores.jsonl" --scores "$SCORES/real_val_model/scores.jsonl" \
  --scores "$SCORES/real_test_expert/scores.jsonl" --scores "$SCORES/real_test_model/scores.jsonl" \
  --model "$MODEL" --out "$OUT/real"
$PY benchmarks/combine_scores.py --dataset "$SYNTH" --split test_seen,test_unseen \
  --scores "$SCORES/synth_expert/scores.jsonl" --scores "$SCORES/synth_model/scores.jsonl" \
  --model "$MODEL" --out "$OUT/synth"
$PY benchmarks/real_tables.py --out "$OUT"
