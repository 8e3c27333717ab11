"""Fit the hybrid detector's combination of model and expert rules on a VALIDATION split.

    python benchmarks/tune_hybrid.py --dataset /work/datasets/real --split validation \
        [--windows 50,100,200] [--model CKPT] [--scores eval_out/scores.jsonl] [--out FILE]

The research front of `traceap.detectors.stack` (the fit `traceap ship stack` runs to write the
shipped `hybrid.json`): the same fit with the options that are tried before one is shipped.

Scores every trace of the split with the `model` and `expert` detectors (or reads them from the
scores.jsonl of earlier `traceap eval --detectors model,expert --out DIR` runs), fits the
logistic stack of `traceap.detectors.hybrid` (score = sigmoid(a logit(model) + b logit(expert)
+ c)) on the pooled window labels of every N, and prints, on that split, window AUC, trace AUC
(max window score) and the share of flagged windows on healthy traces for the model, the rules,
their mean and the stack.  `--warmup` adds the window's warm-up share (`traceap.idle.
warmup_share`, from the traces themselves) to the stack with a fitted weight d; `--oof SPLIT`
pools out-of-fold scored traces into the fit.  `--out FILE` stores (a, b, c, d) as a
hybrid.json with the dataset, split, commit and numbers they came from; the shipped one
(src/traceap/data/hybrid.json, the default of `traceap analyze`) is written by `traceap ship
stack --into-package`.  Never point it at a test split.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from traceap.detectors.stack import (add_warmup, check_split, fit_stack, stack_numbers,
                                     tuned_on, write_params)
from traceap.errors import TraceapError
from traceap.eval.scores import read_scores


def collect(dataset: Path, split: str, windows, model: Path | None) -> list[dict]:
    """Per trace and N: labels, label/source and the model's and rules' window scores."""
    from traceap.detectors.expert import ExpertDetector
    from traceap.detectors.learned import LearnedDetector
    from traceap.eval import EvalConfig, evaluate

    result = evaluate(dataset, {"model": LearnedDetector(model), "expert": ExpertDetector()},
                      config=EvalConfig(windows=tuple(windows), splits=(split,)),
                      on_warning=lambda m: print(f"warning: {m}", file=sys.stderr))
    return [{"id": r.id, "n_windows": r.n, "label": "bad" if r.bad else "good",
             "source": r.source, "labels": r.labels.astype(int).tolist(),
             "scores": {k: v.tolist() for k, v in r.scores.items()}} for r in result.records]


def cells(m: dict) -> list[str]:
    """A `report` as table cells (percent, "–" where undefined)."""
    return [f"{100 * v:.2f}" if v is not None else "–" for v in
            (m["window_auc"], m["natural_auc"], m["trace_auc_max"], m["healthy_flagged"])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--oof", action="append", default=[], metavar="SPLIT",
                    help="the traces of this split of the dataset join the fit too, with the "
                         "model scores of --scores files from models that never trained on "
                         "them (out of fold: benchmarks/crossfit_folds.py); repeatable")
    ap.add_argument("--windows", default="50,100,200")
    ap.add_argument("--model", type=Path, help="checkpoint (default: the bundled one)")
    ap.add_argument("--scores", type=Path, action="append",
                    help="scores.jsonl of traceap eval (model, expert; repeat to merge runs)")
    ap.add_argument("--ratio-grid", default="",
                    help="comma-separated model/expert weight ratios: pick the ratio by window "
                         "AUC + trace AUC (max) on the split, then calibrate (default: one "
                         "logistic fit of both weights)")
    ap.add_argument("--warmup", action="store_true",
                    help="weigh each window's warm-up share in the stack too (reads the traces)")
    ap.add_argument("--flag-bias", action="store_true",
                    help="after the fit, raise the bias (0.05 steps, up to +1) to the highest "
                         "value whose 0.5 flag marks no more windows of healthy traces, at any N, "
                         "than the fitted bias: the log-loss intercept flags fewer anomalous "
                         "windows than the healthy budget allows (Youden's J at the flag rises "
                         "with the bias on real validation)")
    ap.add_argument("--out", type=Path, help="write the parameters here (a hybrid.json)")
    args = ap.parse_args(argv)
    try:
        return run(args, argv)
    except TraceapError as exc:
        raise SystemExit(str(exc)) from None


def run(args: argparse.Namespace, argv) -> int:
    """Fit, print the numbers on each split, write --out."""
    check_split(args.split, *args.oof)
    if args.oof and not args.scores:
        raise SystemExit("--oof needs --scores: out-of-fold model scores come from fold models")
    ns = [int(x) for x in args.windows.split(",")]
    rows = read_scores(args.scores, args.dataset, args.split, tuple(args.oof)) if args.scores else \
        collect(args.dataset, args.split, ns, args.model)
    rows = [r for r in rows if r["n_windows"] in ns]
    if not rows:
        raise SystemExit("no scored traces")
    if args.warmup:
        add_warmup(rows, args.dataset)

    grid = [float(r) for r in args.ratio_grid.split(",")] if args.ratio_grid else None
    params = fit_stack(rows, ns, grid, args.flag_bias, args.warmup, say=print)
    a, b, c = params.model_coef, params.expert_coef, params.bias
    # with --oof: the numbers of each split apart (the fit is pooled over them)
    groups = {args.split: [r for r in rows if r.get("split", args.split) == args.split]}
    groups.update({o: [r for r in rows if r.get("split") == o] for o in args.oof})
    numbers = {g: stack_numbers(params, sub, ns, args.warmup) for g, sub in groups.items()}
    print(f"fitted on {len(rows)} trace-N pairs of {args.dataset} "
          f"[{', '.join(groups)}]: a = {a:.4f} (model), b = {b:.4f} (expert), c = {c:.4f}, "
          f"d = {params.warmup_coef:.4f} (warm-up share)")
    for g, per_n in numbers.items():
        print(f"| {g}: N | combination | window AUC | natural AUC | trace AUC (max) | healthy flagged |")
        print("|---:|---|---:|---:|---:|---:|")
        for n, per in per_n.items():
            for k, m in per.items():
                print(f"| {n} | {k} | " + " | ".join(cells(m)) + " |")
    if args.out is not None:
        write_params(params, args.out, tuned_on(
            args.dataset, args.split, ns, str(args.model) if args.model else "bundled",
            "python benchmarks/tune_hybrid.py " + " ".join(argv or sys.argv[1:]),
            numbers[args.split], {o: numbers[o] for o in args.oof}))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
