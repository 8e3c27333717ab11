"""Stacks fitted on each fold's inner validation, read on the fold eval's held-out scores.

    python benchmarks/fold_stack_sweep.py --fold-models benchmarks/out/sp_e \\
        --scores benchmarks/out/sp_eval/scores.jsonl [--dataset datasets/real]

For every fold K, each stack below is fitted on K's inner-validation scores
(FOLD_MODELS/K/inner_validation/scores.jsonl, written by `fold_models.py`) and applied to the
held-out windows of K in the fold eval's scores.jsonl (`traceap eval --folds ... --out`, which
keeps the model's and the rules' scores per window); printed pooled over the folds: window AUC,
trace AUC (max), natural-trace window AUC, healthy windows flagged, and the patterns where the
stack ranks below the rules (each pattern's windows against every clean window, as eval.json's
per-pattern rows, compared at one decimal).

- `as shipped`: the folds' own hybrid.json (what the fold eval scored);
- `recipe`: `traceap ship stack`'s fit (the ratio grid, bias raised for the flag);
- `fewest below`: among the grid's ratios, the one with the fewest patterns below the rules on
  the inner validation (then window + trace AUC);
- `ratio R`: the model/expert ratio fixed (for reading only: a choice among these made on the
  held-out numbers would be a fit on them).

`--mix-with FOLD_MODELS2 SCORES2` reads the mean of two candidates' model scores per window
(the other's inner-validation and held-out scores, the same windows) as one model's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from traceap.detectors.hybrid import HybridParams
from traceap.detectors.stack import SHIPPED_RATIO_GRID, fit_stack, report
from traceap.eval.folds import FoldPlan, dataset_assignment
from traceap.eval.metrics import pattern_aucs
from traceap.eval.scores import merge_scores

FIXED = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)


def read_rows(path: Path, source: dict[str, str]) -> list[dict]:
    """The N = 100 records of a scores.jsonl (`traceap.eval.scores.merge_scores`) for the
    dataset's traces, window labels as booleans, each with its trace's source."""
    rows = [r for (_, n), r in merge_scores([path], ids=source).items() if n == 100]
    for r in rows:
        r["labels"] = np.asarray(r["labels"], bool)
        r["source"] = source[r["id"]]
    return rows


def numbers(rows: list[dict], score) -> dict:
    """`traceap.detectors.stack.report` of a score (window / natural / trace AUC, healthy
    flagged share) and its per-pattern window AUC ("per")."""
    y = np.concatenate([r["labels"] for r in rows])
    s = np.concatenate([score(r) for r in rows])
    truth = np.array([p for r in rows for p in r["patterns"]], dtype=object)
    per = pattern_aucs(truth, s, ~y, sorted({x for x in truth if x}))
    return {**report(rows, score), "per": {p: a for p, (a, _) in per.items()}}


def below(m: dict, rules: dict) -> list[tuple[str, float]]:
    return [(p, round(100 * (v - rules["per"][p]), 1)) for p, v in m["per"].items()
            if round(100 * v, 1) < round(100 * rules["per"][p], 1)]


def combine(params: HybridParams):
    return lambda r: params.combine(r["scores"]["model"], r["scores"]["expert"])


def at_ratio(rows: list[dict], ratio: float) -> HybridParams:
    """The stack with model/expert ratio fixed: `fit_stack` over a one-ratio grid, the bias
    raised for the flag as `traceap ship stack` does."""
    return fit_stack(rows, (100,), grid=(ratio,), bias=True)


def fewest_below(rows: list[dict]) -> HybridParams:
    rules = numbers(rows, lambda r: np.asarray(r["scores"]["expert"]))
    best = None
    for ratio in SHIPPED_RATIO_GRID:
        p = at_ratio(rows, ratio)
        m = numbers(rows, combine(p))
        key = (-len(below(m, rules)), m["window_auc"] + m["trace_auc_max"])
        if best is None or key > best[0]:
            best = (key, p)
    return best[1]


def mean_model(rows: list[dict], other: list[dict]) -> list[dict]:
    """The rows with each window's model score averaged with the other rows' (same traces)."""
    by_id = {r["id"]: r for r in other}
    out = []
    for r in rows:
        m = (np.asarray(r["scores"]["model"]) + np.asarray(by_id[r["id"]]["scores"]["model"])) / 2
        out.append({**r, "scores": {**r["scores"], "model": m}})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fold-models", type=Path, required=True)
    ap.add_argument("--scores", type=Path, required=True, help="the fold eval's scores.jsonl")
    ap.add_argument("--dataset", default="datasets/real")
    ap.add_argument("--folds", default="benchmarks/real_folds.yaml")
    ap.add_argument("--mix-with", nargs=2, type=Path, metavar=("FOLD_MODELS2", "SCORES2"),
                    help="average the model scores with a second candidate's")
    args = ap.parse_args()

    plan = FoldPlan.read(args.folds)
    entries, assignment = dataset_assignment(args.dataset, plan)
    source = {e.id: e.source for e in entries}
    folds = [f.name for f in plan.folds]
    held = read_rows(args.scores, source)
    inner = {k: read_rows(args.fold_models / k / "inner_validation" / "scores.jsonl", source)
             for k in folds}
    if args.mix_with:
        other_models, other_scores = args.mix_with
        held = mean_model(held, read_rows(other_scores, source))
        inner = {k: mean_model(v, read_rows(other_models / k / "inner_validation" / "scores.jsonl",
                                            source)) for k, v in inner.items()}
    rules = numbers(held, lambda r: np.asarray(r["scores"]["expert"]))

    def show(name: str, m: dict) -> None:
        b = below(m, rules)
        print(f"{name:14s} window {100 * m['window_auc']:.1f}  trace {100 * m['trace_auc_max']:.1f}  "
              f"natural {100 * m['natural_auc']:.1f}  healthy flagged {100 * m['healthy_flagged']:.1f}%  "
              f"below the rules on {len(b)}: {b}")

    def stacked(name: str, fitted: dict[str, HybridParams]) -> None:
        show(name, numbers(held, lambda r: fitted[assignment.fold[r["id"]]].combine(
            r["scores"]["model"], r["scores"]["expert"])))

    show("rules", rules)
    show("model", numbers(held, lambda r: np.asarray(r["scores"]["model"])))
    if not args.mix_with:
        stacked("as shipped", {k: HybridParams.read(args.fold_models / k / "hybrid.json")
                               for k in folds})
    stacked("recipe", {k: fit_stack(inner[k], (100,), grid=SHIPPED_RATIO_GRID, bias=True)
                       for k in folds})
    stacked("fewest below", {k: fewest_below(inner[k]) for k in folds})
    for ratio in FIXED:
        stacked(f"ratio {ratio:g}", {k: at_ratio(inner[k], ratio) for k in folds})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
