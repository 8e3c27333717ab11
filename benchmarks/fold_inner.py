"""Fold-model sets compared where a recipe is chosen: the pooled inner-validation slices.

    python benchmarks/fold_inner.py benchmarks/out/v9_e benchmarks/out/h2_e \\
        [--dataset datasets/real] [--folds benchmarks/real_folds.yaml]

Each FOLD_MODELS folder is `fold_models.py`'s output: per fold K, the inner-validation scores
(K/inner_validation/scores.jsonl, the slices of the other folds scored by K's model) and the
stack (K/hybrid.json).  Pooled over the folds at N = 100, one line per folder: window AUC and
trace AUC (max) for the rules / the model / the hybrid (each fold's windows through its own
stack), then the model's window AUC per pattern.  The decision rules of benchmarks/README.md
(a retrained recipe replaces the shipped one only if the model alone rises by 1.0 here and the
hybrid falls by no more than 0.1) read these lines; nothing here reads a held-out fold.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from fold_stack_sweep import numbers, read_rows

from traceap.detectors.hybrid import HybridParams
from traceap.eval.folds import FoldPlan, dataset_assignment


def inner_rows(models: Path, plan: FoldPlan, source: dict[str, str]) -> list[dict]:
    """Every fold's inner-validation records, each with its window scores through the fold's
    stack (`scores["stacked"]`)."""
    rows = []
    for fold in plan.folds:
        stack = HybridParams.read(models / fold.name / "hybrid.json")
        for r in read_rows(models / fold.name / "inner_validation" / "scores.jsonl", source):
            r["scores"]["stacked"] = np.asarray(stack.combine(r["scores"]["model"],
                                                              r["scores"]["expert"]))
            rows.append(r)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fold_models", type=Path, nargs="+")
    ap.add_argument("--dataset", default="datasets/real")
    ap.add_argument("--folds", default="benchmarks/real_folds.yaml")
    args = ap.parse_args()
    plan = FoldPlan.read(args.folds)
    entries, _ = dataset_assignment(args.dataset, plan)
    source = {e.id: e.source for e in entries}
    for models in args.fold_models:
        rows = inner_rows(models, plan, source)
        m = [numbers(rows, lambda r, d=d: np.asarray(r["scores"][d]))
             for d in ("expert", "model", "stacked")]
        trip = {k: " / ".join(f"{100 * x[k]:.1f}" for x in m)
                for k in ("window_auc", "trace_auc_max")}
        print(f"{models}  ({len(rows)} traces; rules / model / hybrid)  window "
              f"{trip['window_auc']}  trace {trip['trace_auc_max']}")
        print("  model per pattern: " + ", ".join(f"{p} {100 * v:.1f}"
                                                  for p, v in sorted(m[1]["per"].items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
