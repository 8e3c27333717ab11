#!/usr/bin/env bash
# Reproduce the paper tables kept in benchmarks/README.md ("The paper tables with the simulator-only checkpoint"): the paper's Tables 3 and 4 (and 5 when the
# ablation checkpoints exist), trace-level AUC and false findings, ROC curves and timelines.
#
#   bash benchmarks/run_paper_tables.sh                # the default generated dataset
#   DATASET=path/to/any/dataset bash benchmarks/run_paper_tables.sh
#
# Environment (all optional):
#   DATASET     dataset folder (docs/FORMATS.md); default datasets/torchtraceap, generated with
#               `traceap synth --seed 0` (the 610-trace default) when absent
#   OUT         output folder; default benchmarks/results/paper_tables
#   DETECTORS   default rule,clustering,expert,model,hybrid (add llm when a server is configured)
#   WINDOWS     default 50,100,200
#   CLASSIFIER  default offline,offline+model (add llm when a server is configured)
#   LIMIT       at most this many test traces per split (default: all)
#   ABLATION_LIMIT  the same for the ablation table (default: all)
#   ABLATION_DIR  folder of model checkpoints for Table 5; default benchmarks/out/ablation.
#               With TRAIN_ABLATION=1 the full model and the seven variants with switches off
#               (the paper's eight rows) are trained there first, on a reduced budget so that
#               all eight fit in about half an hour on 2 cores: `traceap train --windows 100 --epochs $EPOCHS (4)
#               --limit $TRAIN_LIMIT (160) [--ablation ...]`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/traceap ] || bash scripts/setup.sh
TRACEAP=".venv/bin/traceap"
DATASET=${DATASET:-datasets/torchtraceap}
OUT=${OUT:-benchmarks/results/paper_tables}
DETECTORS=${DETECTORS:-rule,clustering,expert,model,hybrid}
WINDOWS=${WINDOWS:-50,100,200}
CLASSIFIER=${CLASSIFIER:-offline,offline+model}
ABLATION_DIR=${ABLATION_DIR:-benchmarks/out/ablation}

if [ ! -f "$DATASET/manifest.jsonl" ]; then
  echo "run_paper_tables: generating the default dataset in $DATASET" >&2
  nice "$TRACEAP" synth --out "$DATASET" --seed 0 --jobs "$(nproc)"
fi

if [ "${TRAIN_ABLATION:-0}" = 1 ]; then
  # The paper's eight rows: every combination of the three module switches.
  mkdir -p "$ABLATION_DIR"
  for variant in full no-event-adapter no-transformer no-relation \
                 no-event-adapter+no-transformer no-event-adapter+no-relation \
                 no-transformer+no-relation no-event-adapter+no-transformer+no-relation; do
    ckpt="$ABLATION_DIR/$(echo "$variant" | tr -- '-+' '_-').pt"
    [ -f "$ckpt" ] && continue
    args=()
    if [ "$variant" != full ]; then
      IFS=+ read -ra switches <<< "$variant"
      for sw in "${switches[@]}"; do args+=(--ablation "$sw"); done
    fi
    nice "$TRACEAP" train --dataset "$DATASET" --out "$ckpt" --windows 100 \
      --epochs "${EPOCHS:-4}" --limit "${TRAIN_LIMIT:-160}" --threads 1 "${args[@]}"
  done
fi

extra=()
[ -n "${LIMIT:-}" ] && extra+=(--limit "$LIMIT")

mkdir -p "$OUT"
start=$(date +%s)
nice "$TRACEAP" eval --dataset "$DATASET" --detectors "$DETECTORS" --windows "$WINDOWS" \
  --classifier "$CLASSIFIER" --out "$OUT" "${extra[@]}" > /dev/null
echo "run_paper_tables: tables 3-4 in $(( $(date +%s) - start )) s: $OUT/eval.md" >&2

# Table 5: every checkpoint in ABLATION_DIR at N = 100, beside the expert rules (ABLATION_LIMIT
# caps the test traces per split when time is short).
if compgen -G "$ABLATION_DIR/*.pt" >/dev/null; then
  start=$(date +%s)
  limit=()
  [ -n "${ABLATION_LIMIT:-}" ] && limit=(--limit "$ABLATION_LIMIT")
  nice "$TRACEAP" eval --dataset "$DATASET" --detectors expert --windows 100 --classifier "" \
    --ablation --ablation-dir "$ABLATION_DIR" --out "$OUT/ablation" "${limit[@]}" > /dev/null
  echo "run_paper_tables: table 5 in $(( $(date +%s) - start )) s: $OUT/ablation/eval.md" >&2
fi
cat "$OUT/eval.md"
if [ -f "$OUT/ablation/eval.md" ]; then cat "$OUT/ablation/eval.md"; fi
