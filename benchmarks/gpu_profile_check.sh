#!/usr/bin/env bash
# The two `traceap profile` / `traceap diff` checks on a GPU machine (issue 16), in one go:
#   1. examples/train_small.py before (num_workers=0, pageable memory) and after
#      (--num-workers 4 --pin-memory), recorded by `traceap profile`, compared by `traceap diff`:
#      the verdict should name single_process_dataloading as fixed and the step time drop;
#   2. the overhead outside the recorded steps (benchmarks/bench_profile_overhead.py, cuda).
# Usage: bash benchmarks/gpu_profile_check.sh [OUT_DIR]     (about 3-5 minutes on one GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-benchmarks/out/gpu_profile_check}
rm -rf "$OUT" && mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}

$PY -c "import torch; assert torch.cuda.is_available(), 'no GPU'; print(torch.cuda.get_device_name())"
ARGS="--steps 40 --batch-size 64 --image-size 128"
$PY -m traceap profile --out "$OUT/before" --html -- $PY examples/train_small.py $ARGS \
    2> "$OUT/before.log"
$PY -m traceap profile --out "$OUT/after" --html -- $PY examples/train_small.py $ARGS \
    --num-workers 4 --pin-memory 2> "$OUT/after.log"
$PY -m traceap diff "$OUT/before" "$OUT/after" --json "$OUT/diff.json" | tee "$OUT/diff.txt"
$PY benchmarks/bench_profile_overhead.py --device cuda --reps 3 --steps 60 \
    -- --batch-size 64 --image-size 128 | tee "$OUT/overhead.txt"
