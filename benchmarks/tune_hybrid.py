"""Fit the hybrid detector's combination of model and expert rules on a VALIDATION split.

    python benchmarks/tune_hybrid.py --dataset /work/datasets/real --split validation \
        [--windows 50,100,200] [--model CKPT] [--scores eval_out/scores.jsonl] [--write]

Scores every trace of the split with the `model` and `expert` detectors (or reads them from the
scores.jsonl of earlier `traceap eval --detectors model,expert --out DIR` runs), fits the
logistic stack of `traceap.detectors.hybrid` (score = sigmoid(a logit(model) + b logit(expert)
+ c)) on the pooled window labels of every N, and prints, on that split, window AUC, trace AUC
(max window score) and the share of flagged windows on healthy traces for the model, the rules,
their mean and the stack.  `--warmup` adds the window's warm-up share (`traceap.idle.
warmup_share`, from the traces themselves) to the stack with a fitted weight d.  `--write`
stores (a, b, c, d) in src/traceap/data/hybrid.json (the
default of `traceap analyze`) with the dataset, split, commit and numbers they came from.
Re-run it whenever the rules or the checkpoint change.  Never point it at a test split.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from traceap.detectors.hybrid import HybridParams, bundled_params_path

REPO = Path(__file__).resolve().parents[1]


def _auc(y, s):
    y = np.asarray(y, bool)
    return float(roc_auc_score(y, s)) if 0 < y.sum() < y.size else None


def collect(dataset: Path, split: str, windows, model: Path | None, workers_note=None) -> list[dict]:
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


def merge_scores(paths: list[Path], splits=(), ids=None) -> dict[tuple, dict]:
    """(trace id, N) -> record of `traceap eval --out` scores.jsonl lines in the splits (or of
    the trace ids `ids`, whatever split their scoring run called them), the detectors' scores of
    several files (e.g. one run per detector) merged into one record."""
    def wanted(r: dict) -> bool:
        return r["split"] in splits if ids is None else r["id"] in ids
    merged: dict[tuple, dict] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            r = json.loads(line) if line.strip() else None
            if r is None or not wanted(r):
                continue
            key = (r["id"], r["n_windows"])
            if key in merged:
                merged[key]["scores"].update(r["scores"])
            else:
                merged[key] = r
    return merged


def read_scores(paths: list[Path], dataset: Path, split: str,
                oof: tuple[str, ...] = ()) -> list[dict]:
    """Records of `traceap eval --out` scores.jsonl files for the traces of the split and of
    the `oof` splits (which traces: the dataset's manifest; source and split from it too), the
    detectors' scores of several files (e.g. one run per detector, or one run per fold of
    out-of-fold models) merged per trace and N."""
    from traceap.manifest import read_manifest
    entries = {e.id: e for e in read_manifest(dataset) if e.split in (split, *oof)}
    rows = [r for r in merge_scores(paths, ids=entries).values()
            if {"model", "expert"} <= set(r["scores"])]
    for r in rows:
        r["source"] = entries[r["id"]].source
        r["split"] = entries[r["id"]].split
    return rows


def add_warmup(rows: list[dict], dataset: Path) -> None:
    """Give every record its windows' warm-up share ("warmup"), from its trace at its N."""
    from traceap.idle import warmup_share
    from traceap.load import load
    from traceap.manifest import read_manifest, trace_path
    from traceap.windows import Windows

    entries = {e.id: e for e in read_manifest(dataset)}
    by_id: dict[str, list[dict]] = {}
    for r in rows:
        by_id.setdefault(r["id"], []).append(r)
    for tid, recs in by_id.items():
        trace = load(trace_path(dataset, entries[tid]))
        for r in recs:
            r["warmup"] = warmup_share(Windows(trace, r["n_windows"]))


def report(rows: list[dict], score) -> dict:
    """Window AUC, natural-trace window AUC, trace AUC (max) and healthy flagged share."""
    y = np.concatenate([r["labels"] for r in rows])
    s = np.concatenate([score(r) for r in rows])
    nat = [r for r in rows if r.get("source") == "natural"]
    healthy = [r for r in rows if r["label"] == "good"]
    return {
        "window_auc": _auc(y, s),
        "natural_auc": _auc(np.concatenate([r["labels"] for r in nat]),
                            np.concatenate([score(r) for r in nat])) if nat else None,
        "trace_auc_max": _auc([r["label"] == "bad" for r in rows],
                              [float(np.max(score(r))) for r in rows]),
        "healthy_flagged": float(np.mean([np.mean(score(r) >= 0.5) for r in healthy]))
        if healthy else None,
    }


def flag_bias(params: HybridParams, rows: list[dict], ns, warm, say=print) -> HybridParams:
    """The stack with its bias raised, in 0.05 steps up to +1, as long as no N's healthy
    flagged share (windows >= 0.5 on good traces) grows; prints the flag's TPR / FPR per N."""
    def at(c: float) -> HybridParams:
        return replace(params, bias=c)

    def flags(p: HybridParams) -> list[tuple[float, float, float]]:
        out = []
        for n in ns:
            sub = [r for r in rows if r["n_windows"] == n]
            z = [p.combine(r["scores"]["model"], r["scores"]["expert"], warm(r)) >= 0.5
                 for r in sub]
            y = np.concatenate([r["labels"] for r in sub]).astype(bool)
            f = np.concatenate(z)
            healthy = [np.mean(zz) for r, zz in zip(sub, z) if r["label"] == "good"]
            out.append((f[y].mean(), f[~y].mean(), float(np.mean(healthy)) if healthy else 0.0))
        return out

    budget = [h for *_, h in flags(params)]
    best = params
    for c in np.arange(params.bias + 0.05, params.bias + 1.0 + 1e-9, 0.05):
        if any(h > cap + 1e-12 for (*_, h), cap in zip(flags(at(float(c))), budget)):
            break
        best = at(float(c))
    for label, p in (("fitted", params), ("raised", best)):
        say(f"flag at 0.5, bias {p.bias:+.3f} ({label}): " + "; ".join(
            f"N={n} TPR {t:.3f} FPR {f:.3f} J {t - f:.3f} healthy {100 * h:.2f}%"
            for n, (t, f, h) in zip(ns, flags(p))))
    return best


def warm_of(warmup: bool):
    """Row -> its windows' warm-up shares (`add_warmup`), or None when the stack has no
    warm-up term."""
    return (lambda q: q["warmup"]) if warmup else (lambda q: None)


def cells(m: dict) -> list[str]:
    """A `report` as table cells (percent, "–" where undefined)."""
    return [f"{100 * v:.2f}" if v is not None else "–" for v in
            (m["window_auc"], m["natural_auc"], m["trace_auc_max"], m["healthy_flagged"])]


def fit_stack(rows: list[dict], ns, grid: list[float] | None = None, bias: bool = False,
              warmup: bool = False, say=lambda *_: None) -> HybridParams:
    """The stack's (a, b, c[, d]) fitted on the rows' pooled window labels: one logistic fit of
    both weights, or with `grid` the model/expert ratio of the best window AUC + trace AUC
    (max) among the grid's, calibrated by a logistic fit; with `bias` the flag's bias raised
    (`flag_bias`); with `warmup` the windows' warm-up shares (`add_warmup`) weighed too."""
    eps = HybridParams().eps
    logit = HybridParams().logit     # the stack's own transform
    warm = warm_of(warmup)
    # columns: logit(model), logit(expert) and, with warm-up, the warm-up share
    x = np.concatenate([np.stack([logit(r["scores"]["model"]), logit(r["scores"]["expert"])]
                                 + ([r["warmup"]] if warmup else []), 1) for r in rows])
    y = np.concatenate([r["labels"] for r in rows]).astype(int)
    lr = LogisticRegression(C=1.0).fit(x, y)
    (a, b, *d), c = lr.coef_[0], lr.intercept_[0]
    params = HybridParams(float(a), float(b), float(c), eps, warmup_coef=float(d[0]) if d else 0.0)
    if grid:
        # The log-loss fit weighs windows only, and a model that ranks traces better than
        # windows gets little weight; the ranking of windows and of traces depends mostly on
        # the ratio a / b, so pick it on window AUC + trace AUC (max), calibrating the scale,
        # bias (and warm-up weight) of the combined logit by a logistic fit for each ratio.
        def fit(r):
            z = np.column_stack([r * x[:, 0] + x[:, 1], x[:, 2:]])
            one = LogisticRegression(C=1.0).fit(z, y)
            k, *dd = (float(v) for v in one.coef_[0])
            return HybridParams(r * k, k, float(one.intercept_[0]), eps,
                                warmup_coef=dd[0] if dd else 0.0)

        def quality(p):
            z = [p.combine(q["scores"]["model"], q["scores"]["expert"], warm(q)) for q in rows]
            win = _auc(y, np.concatenate(z))
            tr = _auc([q["label"] == "bad" for q in rows], [float(np.max(v)) for v in z])
            return (win or 0) + (tr or 0), win, tr
        fits = {r: fit(r) for r in grid}
        scored = {r: quality(p) for r, p in fits.items()}
        for r, (qsum, win, tr) in scored.items():
            say(f"ratio a/b {r:g}: window AUC {win:.4f}, trace AUC (max) {tr:.4f}"
                + (f", warm-up weight {fits[r].warmup_coef:.3f}" if warmup else ""))
        params = fits[max(grid, key=lambda k: scored[k][0])]
    if bias:
        params = flag_bias(params, rows, ns, warm, say)
    return params


def commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or None
    except OSError:
        return None


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
    ap.add_argument("--write", action="store_true", help="store the fit in traceap/data/hybrid.json")
    ap.add_argument("--out", type=Path, help="write the parameters here instead")
    args = ap.parse_args(argv)
    if any(x.startswith("test") for x in (args.split, *args.oof)):
        raise SystemExit("tune on a validation split, never on a test split")
    if args.oof and not args.scores:
        raise SystemExit("--oof needs --scores: out-of-fold model scores come from fold models")
    ns = [int(x) for x in args.windows.split(",")]
    rows = read_scores(args.scores, args.dataset, args.split, tuple(args.oof)) if args.scores else \
        collect(args.dataset, args.split, ns, args.model)
    rows = [r for r in rows if r["n_windows"] in ns]
    if not rows:
        raise SystemExit("no scored traces")
    eps = HybridParams().eps
    if args.warmup:
        add_warmup(rows, args.dataset)
    warm = warm_of(args.warmup)

    grid = [float(r) for r in args.ratio_grid.split(",")] if args.ratio_grid else None
    params = fit_stack(rows, ns, grid, args.flag_bias, args.warmup, say=print)
    a, b, c = params.model_coef, params.expert_coef, params.bias
    candidates = {
        "model": lambda r: np.asarray(r["scores"]["model"]),
        "expert": lambda r: np.asarray(r["scores"]["expert"]),
        "mean": lambda r: (np.asarray(r["scores"]["model"]) + np.asarray(r["scores"]["expert"])) / 2,
        "stack": lambda r: params.combine(r["scores"]["model"], r["scores"]["expert"], warm(r)),
    }

    def table(group: list[dict]) -> dict:
        return {str(n): {k: report([r for r in group if r["n_windows"] == n], f)
                         for k, f in candidates.items()} for n in ns}
    # with --oof: the numbers of each split apart (the fit is pooled over them)
    groups = {args.split: [r for r in rows if r.get("split", args.split) == args.split]}
    groups.update({o: [r for r in rows if r.get("split") == o] for o in args.oof})
    numbers = {g: table(sub) for g, sub in groups.items()}
    print(f"fitted on {len(rows)} trace-N pairs of {args.dataset} "
          f"[{', '.join(groups)}]: a = {a:.4f} (model), b = {b:.4f} (expert), c = {c:.4f}, "
          f"d = {params.warmup_coef:.4f} (warm-up share)")
    for g, per_n in numbers.items():
        print(f"| {g}: N | combination | window AUC | natural AUC | trace AUC (max) | healthy flagged |")
        print("|---:|---|---:|---:|---:|---:|")
        for n, per in per_n.items():
            for k, m in per.items():
                print(f"| {n} | {k} | " + " | ".join(cells(m)) + " |")
    out = args.out or (bundled_params_path() if args.write else None)
    if out is not None:
        tuned = HybridParams(params.model_coef, params.expert_coef, params.bias, eps, {
            "dataset": str(args.dataset), "split": args.split, "windows": ns,
            **({"oof": {o: numbers[o] for o in args.oof}} if args.oof else {}),
            "model": str(args.model) if args.model else "bundled", "commit": commit(),
            "date": datetime.date.today().isoformat(),
            "command": "python benchmarks/tune_hybrid.py " + " ".join(argv or sys.argv[1:]),
            "validation": numbers[args.split]}, warmup_coef=params.warmup_coef)
        Path(out).write_text(json.dumps(tuned.to_json(), indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
