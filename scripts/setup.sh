#!/usr/bin/env bash
# Set up a virtual environment in .venv with traceap and everything it needs (CPU only).
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first and pinned: anything looser pulls a multi-GB CUDA build. (traceap itself accepts
# torch>=2.6, so a user's own environment keeps its torch; this pin is for this .venv only.)
.venv/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
# The constraint keeps the CPU torch above should a later requirement ask for another.
printf 'torch==2.13.0\n' > .venv/torch-constraint.txt
.venv/bin/python -m pip install -q -e ".[test]" -c .venv/torch-constraint.txt 2>&1 \
  | grep -v "^WARNING: Location" || true
# The callbacks' frameworks (the `integrations` extra: lightning, transformers, accelerate);
# optional: without them their tests skip and everything else works.
.venv/bin/python -m pip install -q -e ".[integrations]" -c .venv/torch-constraint.txt 2>&1 \
  | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import lightning, transformers, accelerate, nbclient, ipykernel" 2>/dev/null \
  || echo "setup: the integrations or notebook extras did not install: their tests will skip" >&2
# Ray (the `ray` extra) for the Ray tests; optional: without it (offline, no cached wheels)
# those tests skip and everything else works.
.venv/bin/python -m pip install -q -e ".[ray]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import ray" 2>/dev/null \
  || echo "setup: Ray is not installed (offline?): the Ray tests will skip" >&2
.venv/bin/python -c "import traceap, torch; assert torch.__version__.startswith('2.13.0')" \
  || { echo "setup: traceap did not install" >&2; exit 1; }
