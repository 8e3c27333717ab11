"""Does a stack fitted on more kinds of workload rank unseen workloads better?  Leave one fold out.

    python benchmarks/stack_crossval.py --dataset /work/datasets/real --folds /work/datasets/folds \\
        --scores val_expert.jsonl --scores val_model.jsonl --scores train_expert.jsonl \\
        --scores fold1_model.jsonl ... [--ratio-grid 0,0.1,...] [--flag-bias]

The train split's traces, scored out of fold (`benchmarks/crossfit_folds.py`: each by a model
that never trained on its workload family), are cut into the same folds.  For each fold K the
stack is fitted (`traceap.detectors.stack.fit_stack`, the same procedure as the shipped one) on the
validation split alone, and on the validation split plus the other folds, and both are scored on
fold K, beside the model and the rules alone.  The pooled numbers over every fold are what a
stack fitted each way would read on workload families it never saw.  Nothing here reads a test
split.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from traceap.detectors.stack import fit_stack, report
from traceap.eval.scores import read_scores

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tune_hybrid import cells  # noqa: E402  (a sibling benchmark script)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--folds", type=Path, required=True, help="crossfit_folds.py's --out")
    ap.add_argument("--split", default="validation")
    ap.add_argument("--oof", default="train")
    ap.add_argument("--scores", type=Path, action="append", required=True)
    ap.add_argument("--windows", default="50,100,200")
    ap.add_argument("--ratio-grid", default="")
    ap.add_argument("--flag-bias", action="store_true")
    args = ap.parse_args(argv)
    if any(x.startswith("test") for x in (args.split, args.oof)):
        raise SystemExit("never on a test split")
    from traceap.manifest import read_manifest
    ns = [int(x) for x in args.windows.split(",")]
    rows = [r for r in read_scores(args.scores, args.dataset, args.split, (args.oof,))
            if r["n_windows"] in ns]
    fold_of = {e.id: k.parent.name for k in sorted(args.folds.glob("fold*/holdout"))
               for e in read_manifest(k)}
    val = [r for r in rows if r["split"] == args.split]
    oof = [r for r in rows if r["split"] == args.oof]
    missing = {r["id"] for r in oof if r["id"] not in fold_of}
    if missing:
        raise SystemExit(f"{len(missing)} {args.oof} traces are in no fold, e.g. {min(missing)}")
    grid = [float(r) for r in args.ratio_grid.split(",")] if args.ratio_grid else None
    val_only = fit_stack(val, ns, grid, args.flag_bias)
    folds = sorted({fold_of[r["id"]] for r in oof})
    # per kind of score, the held-out rows with that score under "s"
    scored: dict[str, list[dict]] = {k: [] for k in ("model", "expert", "stack_val", "stack_pooled")}
    print(f"stack on {args.split} alone: a {val_only.model_coef:.3f} b {val_only.expert_coef:.3f} "
          f"c {val_only.bias:+.3f}")
    for k in folds:
        held = [r for r in oof if fold_of[r["id"]] == k]
        pooled = fit_stack(val + [r for r in oof if fold_of[r["id"]] != k], ns, grid, args.flag_bias)
        print(f"{k}: {len({r['id'] for r in held})} traces held out; stack on {args.split} + the "
              f"other folds: a {pooled.model_coef:.3f} b {pooled.expert_coef:.3f} c {pooled.bias:+.3f}")
        for r in held:
            m, e = np.asarray(r["scores"]["model"]), np.asarray(r["scores"]["expert"])
            for name, s in (("model", m), ("expert", e), ("stack_val", val_only.combine(m, e)),
                            ("stack_pooled", pooled.combine(m, e))):
                scored[name].append(dict(r, s=s))
    print("| N | scores | window AUC | natural AUC | trace AUC (max) | healthy flagged |")
    print("|---:|---|---:|---:|---:|---:|")
    for n in ns:
        for name, rs in scored.items():
            m = report([r for r in rs if r["n_windows"] == n], lambda r: r["s"])
            print(f"| {n} | {name} | " + " | ".join(cells(m)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
