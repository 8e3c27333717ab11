"""Fitting the hybrid detector's stack (`hybrid.HybridParams`) on a validation split's scores.

    rows = traceap.eval.scores.read_scores([expert_scores, model_scores], dataset, "validation")
    params = fit_stack(rows, (50, 100, 200), grid=SHIPPED_RATIO_GRID, bias=True)
    tuned(params, rows, (50, 100, 200), tuned_on).write(path)

A row is one trace at one window count N, as `traceap eval --out` writes it to scores.jsonl
(`id`, `n_windows`, `label`, `labels`: the window labels, `scores`: {"model": [...], "expert":
[...]}); `source` and `split` come from the dataset's manifest, `warmup` (each window's warm-up
share) from `add_warmup` where the stack weighs it.  The logistic stack is fitted on the pooled
window labels of every N.  `traceap ship stack` runs this with the recipe of the shipped
`hybrid.json` (`SHIPPED_RATIO_GRID`, bias raised); `benchmarks/tune_hybrid.py` runs it with
its research options.  Never fit on a test split.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from .._auc import auc as _auc
from ..errors import DatasetError
from ..outputs import failing_write
from .hybrid import HybridParams

#: The model/expert weight ratios the shipped stack was chosen among (window AUC + trace AUC).
SHIPPED_RATIO_GRID: tuple[float, ...] = (0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 4)

#: The combinations `stack_numbers` compares on the split.
COMBINATIONS = ("model", "expert", "mean", "stack")


def check_split(*splits: str) -> None:
    """Raise DatasetError for a test split: the stack (and the flag threshold) are fitted on
    validation, and a fit on test would make every test number a fit."""
    if any(s.startswith("test") for s in splits):
        raise DatasetError("tune on a validation split, never on a test split")


def warm_of(warmup: bool) -> Callable[[dict], np.ndarray | None]:
    """Row -> its windows' warm-up shares (`add_warmup`), or None when the stack has no
    warm-up term."""
    return (lambda q: q["warmup"]) if warmup else (lambda q: None)


def add_warmup(rows: list[dict], dataset: str | os.PathLike) -> None:
    """Give every row its windows' warm-up share ("warmup"), from its trace at its N."""
    from ..idle import warmup_share
    from ..load import load
    from ..manifest import read_manifest, trace_path
    from ..windows import Windows

    entries = {e.id: e for e in read_manifest(dataset)}
    by_id: dict[str, list[dict]] = {}
    for r in rows:
        by_id.setdefault(r["id"], []).append(r)
    for tid, recs in by_id.items():
        trace = load(trace_path(dataset, entries[tid]))
        for r in recs:
            r["warmup"] = warmup_share(Windows(trace, r["n_windows"]))


def report(rows: list[dict], score: Callable[[dict], np.ndarray]) -> dict:
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


def stack_numbers(params: HybridParams, rows: list[dict], ns: Sequence[int],
                  warmup: bool = False) -> dict[str, dict[str, dict]]:
    """N -> combination (`COMBINATIONS`) -> `report` on the rows: the model, the rules, their
    mean and the stack `params`."""
    warm = warm_of(warmup)
    candidates = {
        "model": lambda r: np.asarray(r["scores"]["model"]),
        "expert": lambda r: np.asarray(r["scores"]["expert"]),
        "mean": lambda r: (np.asarray(r["scores"]["model"])
                           + np.asarray(r["scores"]["expert"])) / 2,
        "stack": lambda r: params.combine(r["scores"]["model"], r["scores"]["expert"], warm(r)),
    }
    return {str(n): {k: report([r for r in rows if r["n_windows"] == n], f)
                     for k, f in candidates.items()} for n in ns}


def flag_bias(params: HybridParams, rows: list[dict], ns: Sequence[int],
              warm: Callable[[dict], np.ndarray | None], say=print) -> HybridParams:
    """The stack with its bias raised, in 0.05 steps up to +1, as long as no N's healthy
    flagged share (windows >= 0.5 on good traces) grows; says the flag's TPR / FPR per N."""
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


def fit_stack(rows: list[dict], ns: Sequence[int], grid: Sequence[float] | None = None,
              bias: bool = False, warmup: bool = False,
              say: Callable[[str], None] = lambda *_: None) -> HybridParams:
    """The stack's (a, b, c[, d]) fitted on the rows' pooled window labels: one logistic fit of
    both weights, or with `grid` the model/expert ratio of the best window AUC + trace AUC
    (max) among the grid's, calibrated by a logistic fit; with `bias` the flag's bias raised
    (`flag_bias`); with `warmup` the windows' warm-up shares (`add_warmup`) weighed too."""
    from sklearn.linear_model import LogisticRegression

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
    """The short commit of the checkout traceap runs from (None outside a git checkout)."""
    try:
        return subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse",
                               "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def tuned_on(dataset: str | os.PathLike, split: str, ns: Sequence[int], model: str,
             command: str, validation: dict, oof: dict | None = None) -> dict:
    """hybrid.json's `tuned_on`: where the stack was fitted, by which command, and its numbers
    on the split (`stack_numbers`; `oof`: split -> the same numbers on out-of-fold traces)."""
    return {"dataset": str(dataset), "split": split, "windows": list(ns),
            **({"oof": oof} if oof else {}),
            "model": model, "commit": commit(), "date": datetime.date.today().isoformat(),
            "command": command, "validation": validation}


def write_params(params: HybridParams, path: str | os.PathLike, tuned: dict) -> Path:
    """Write the stack with its `tuned_on` record as a hybrid.json (docs/FORMATS.md)."""
    path = Path(path)
    out = HybridParams(params.model_coef, params.expert_coef, params.bias, params.eps, tuned,
                       warmup_coef=params.warmup_coef)
    with failing_write(path, "--out"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out.to_json(), indent=1) + "\n")
    return path


__all__ = ["COMBINATIONS", "SHIPPED_RATIO_GRID", "add_warmup", "check_split", "commit",
           "fit_stack", "flag_bias", "report", "stack_numbers", "tuned_on", "warm_of",
           "write_params"]
