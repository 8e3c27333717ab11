"""Window-level AUC on a dataset's test splits, as in the paper's Table 3.

For each split and N, the windows of all test traces of a task are pooled, the ROC AUC of
the detector's window scores against the window labels (a window is positive when it
overlaps an anomaly) is computed per task, and the split's figure is the mean over tasks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from ..dataset import read_manifest, trace_path, window_labels
from ..progress import track
from ..windows import Windows

TEST_SPLITS = ("test_seen", "test_unseen")


def window_auc(dataset: str | os.PathLike, detectors: dict[str, object],
               ns: Sequence[int] = (50, 100, 200), splits: Sequence[str] = TEST_SPLITS,
               limit: int | None = None, log: Callable[[str], None] | None = None) -> dict:
    """{detector: {N: {split: {"tasks": {task: auc}, "avg": auc}}}} plus "_seconds" timings.

    `detectors` maps a name to anything with `score_windows(windows)`."""
    from ..load import load
    entries = [e for e in read_manifest(dataset) if e.split in splits]
    if limit:
        entries = entries[:limit]
    pooled: dict = {}
    seconds: dict[str, float] = {name: 0.0 for name in detectors}
    for e in track(entries, "evaluating"):
        trace = load(trace_path(dataset, e))
        for n in ns:
            w = Windows(trace, n)
            y = window_labels(e, w)
            for name, det in detectors.items():
                t0 = time.perf_counter()
                s = np.asarray(det.score_windows(w), np.float64)
                seconds[name] += time.perf_counter() - t0
                key = (name, n, e.split, e.task)
                ys, ss = pooled.setdefault(key, ([], []))
                ys.append(y)
                ss.append(s)
    out: dict = {}
    for (name, n, split, task), (ys, ss) in sorted(pooled.items()):
        y, s = np.concatenate(ys), np.concatenate(ss)
        auc = float(roc_auc_score(y, s)) if 0 < y.sum() < len(y) else float("nan")
        out.setdefault(name, {}).setdefault(n, {}).setdefault(split, {"tasks": {}})["tasks"][task] = auc
    for name, per_n in out.items():
        for n, per_split in per_n.items():
            for split, d in per_split.items():
                vals = [v for v in d["tasks"].values() if np.isfinite(v)]
                d["avg"] = float(np.mean(vals)) if vals else float("nan")
                if log:
                    log(f"{name:>10} N={n:<4} {split:<12} avg {d['avg']:.4f}  " +
                        " ".join(f"{t}={v:.3f}" for t, v in d["tasks"].items()))
    out["_seconds"] = {k: v / max(1, len(entries) * len(ns)) for k, v in seconds.items()}
    return out


__all__ = ["TEST_SPLITS", "window_auc"]
