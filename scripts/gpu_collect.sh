#!/usr/bin/env bash
# Record a small real trace set on one GPU: resnet50, vit_b_16, a detection model
# (retinanet_resnet50_fpn) and a segmentation model (fcn_resnet50), each clean (bf16 autocast,
# channels_last, worker processes, pinned memory) and with every single-GPU anti-pattern
# switched on by its cause, training loop, 2 profiled steps.
# Traces (gzipped) and manifest.jsonl go to $OUT/dataset; a summary to $OUT/summary.txt.
#
#   bash scripts/gpu_collect.sh                    # on a GPU machine, into $OUT (or out/gpu_collect)
#   bash scripts/gpu_collect.sh --device cpu       # dry run on a CPU: small inputs, GPU-only
#                                                  # patterns skipped with the reason
# Options: --out DIR, --budget SECONDS (default 480: the sweep stops there and a rerun resumes).
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=cuda
DEST=${OUT:-out/gpu_collect}
BUDGET=480
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --out) DEST=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    *) echo "gpu_collect: unknown option $1 (use --device cuda|cpu, --out DIR, --budget S)" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cuda|cpu) ;; *) echo "gpu_collect: --device must be cuda or cpu" >&2; exit 2 ;; esac

# A Python that has torch (with CUDA for --device cuda) and everything `traceap` imports; the
# source tree is used directly, so nothing needs installing on the GPU machine.
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
pick_python() {
  for py in ${PYTHON:-} .venv/bin/python python3 python; do
    command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || continue
    if "$py" - "$DEVICE" <<'EOF' 2>"$DEST/python_check.err" >&2
import sys, torch, traceap.cli
assert sys.argv[1] != "cuda" or torch.cuda.is_available(), f"torch {torch.__version__}: no CUDA"
EOF
    then echo "$py"; return 0; fi
    echo "$py: $(tail -n 1 "$DEST/python_check.err")" >> "$DEST/python_check.txt"
  done
  return 1
}
mkdir -p "$DEST"
rm -f "$DEST/python_check.txt"
PY=$(pick_python) || {
  echo "gpu_collect: no Python here can run traceap collect on $DEVICE (set PYTHON=...):" >&2
  sed 's/^/  /' "$DEST/python_check.txt" >&2
  exit 2
}
rm -f "$DEST/python_check.txt" "$DEST/python_check.err"
export TRACEAP_PROGRESS=0
PLAN="$DEST/plan.yaml"

if [ "$DEVICE" = cuda ]; then
  # Batch sizes that keep an H100/H200-class GPU busy in bf16; each model clean first, then its
  # causes in the order of value (the budget may cut the tail; a rerun resumes); recompilation
  # and graph_break last (inductor compiles take the longest).
  cat > "$PLAN" <<'EOF'
steps: 2
workers: 8
compile_backend: inductor
runs:
  - models: [resnet50]
    patterns: [none, no_mixed_precision, no_channels_last, "no_mixed_precision,no_channels_last",
               unfused_optimizer, cpu_tensor_init, allocator_churn, single_process_dataloading,
               no_pin_memory, excessive_memcpy, cpu_bound]
    batch_sizes: [128]
  - models: [vit_b_16]
    patterns: [none, no_mixed_precision, unfused_optimizer, cpu_tensor_init, allocator_churn,
               single_process_dataloading, no_pin_memory, excessive_memcpy, cpu_bound]
    batch_sizes: [64]
  - models: [fcn_resnet50, retinanet_resnet50_fpn]
    patterns: [none, no_mixed_precision, no_channels_last, unfused_optimizer, cpu_tensor_init,
               allocator_churn, single_process_dataloading, no_pin_memory, excessive_memcpy,
               cpu_bound]
    batch_sizes: [16]
  - models: [resnet50]
    patterns: [recompilation, graph_break]
    batch_sizes: [128]
  - models: [vit_b_16]
    patterns: [graph_break]
    batch_sizes: [64]
EOF
  nvidia-smi -L > "$DEST/gpu.txt" 2>&1 || true
else
  # The same sweep, small enough for a CPU: 64 px inputs, batch 2, one profiled step.
  cat > "$PLAN" <<'EOF'
steps: 1
workers: 1
compile_backend: aot_eager
runs:
  - models: [resnet18, vit_b_16, retinanet_resnet18_fpn, fcn_resnet18]
    patterns: [none, single_process_dataloading, no_pin_memory, excessive_memcpy, cpu_bound,
               graph_break]
    batch_sizes: [2]
    image_size: 64
EOF
fi

echo "gpu_collect: $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)')," \
     "device $DEVICE, plan $PLAN, budget ${BUDGET}s"
status=0
timeout --signal=INT "$BUDGET" "$PY" -m traceap collect --plan "$PLAN" --out "$DEST/dataset" \
  --device "$DEVICE" || status=$?
if [ "$status" -eq 124 ] || [ "$status" -eq 130 ]; then
  echo "gpu_collect: budget of ${BUDGET}s reached; rerun to record the rest (it resumes)"
fi

"$PY" - "$DEST" <<'EOF' | tee "$DEST/summary.txt"
import sys
from pathlib import Path
from traceap.manifest import read_manifest
dest = Path(sys.argv[1]) / "dataset"
if not (dest / "manifest.jsonl").exists():
    sys.exit("gpu_collect: nothing recorded")
total = 0
for e in read_manifest(dest):
    size = (dest / e.path).stat().st_size
    total += size
    span = sum(a.end_us - a.start_us for a in e.anomalies) / 1e3
    print(f"{e.id:70s} {e.label:4s} {len(e.anomalies):3d} intervals {span:9.1f} ms "
          f"{size / 1e6:6.2f} MB  {e.platform}")
print(f"total {total / 1e6:.1f} MB in {dest}")
EOF
rm -rf "$DEST/dataset/.collect-tmp"
exit $(( status == 124 || status == 130 ? 0 : status ))
