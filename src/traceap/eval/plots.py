"""Figures of an evaluation, as PNG files (matplotlib, no display needed).

- ROC curves of every detector, pooled over the windows of the seen and unseen tests;
- score timelines of chosen traces with the labelled windows shaded, like the paper's
  Figure 7 (one panel per trace, one line per detector).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from . import metrics
from .runner import EvalResult, TraceRecord
from .tables import DETECTOR_TITLES, GROUP_TITLES, TASK_TITLES

TASK_SHORT = {"image_classification": "IC", "object_detection": "OD", "image_segmentation": "IS",
              "image_generation": "IG", "depth_estimation": "DE", "pose_estimation": "PE",
              "action_recognition": "AR", "other": "Other"}
SHADE = "#f7b6d2"   # the paper's pink for labelled windows


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def spans(flags: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of True as (first, last + 1) window index pairs."""
    f = np.concatenate(([False], np.asarray(flags, dtype=bool), [False]))
    d = np.diff(f.astype(np.int8))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist()))


def roc_curves(result: EvalResult, out: str | os.PathLike, n: int,
               names: Sequence[str] | None = None) -> Path:
    """OUT/roc_N{n}.png: window-level ROC of each detector, one panel per test group."""
    plt = _pyplot()
    names = list(result.detectors + result.ablation if names is None else names)
    groups = list(result.tasks)
    fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4.6), squeeze=False)
    for ax, group in zip(axes[0], groups):
        recs = [r for r in result.of(n) if r.group == group]
        y = np.concatenate([r.labels for r in recs]) if recs else np.zeros(0, bool)
        for name in names:
            s = np.concatenate([r.scores[name] for r in recs]) if recs else np.zeros(0)
            curve = metrics.roc(y, s)
            if curve is None:
                continue
            ax.plot(*curve, lw=1.6,
                    label=f"{DETECTOR_TITLES.get(name, name)} (AUC {100 * metrics.auc(y, s):.1f})")
        ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=0.8)
        ax.set(xlim=(0, 1), ylim=(0, 1.01), xlabel="false positive rate",
               ylabel="true positive rate",
               title=f"{GROUP_TITLES[group]} tasks, N = {n} ({int(y.sum())} / {y.size} positive)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = Path(out) / f"roc_N{n}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pick_traces(result: EvalResult, n: int, ids: Sequence[str] = ()) -> list[TraceRecord]:
    """The records to draw: the given ids, else one bad trace per task (most labelled windows)."""
    recs = result.of(n)
    if ids:
        by_id = {r.id: r for r in recs}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise KeyError(f"trace id {missing[0]!r} is not among the evaluated traces")
        return [by_id[i] for i in ids]
    chosen: dict[tuple[str, str], TraceRecord] = {}
    for r in recs:
        if not r.labels.any() or r.labels.all():
            continue
        key = (r.group, r.task)
        if key not in chosen or r.labels.sum() > chosen[key].labels.sum():
            chosen[key] = r
    order = {g: i for i, g in enumerate(result.tasks)}
    return sorted(chosen.values(), key=lambda r: (order[r.group], result.tasks[r.group].index(r.task)))


def timelines(result: EvalResult, out: str | os.PathLike, n: int, ids: Sequence[str] = (),
              names: Sequence[str] | None = None) -> Path | None:
    """OUT/timelines_N{n}.png: window scores of chosen traces, labelled windows shaded."""
    recs = pick_traces(result, n, ids)
    if not recs:
        return None
    plt = _pyplot()
    names = list(result.detectors if names is None else names)
    cols = 2 if len(recs) > 1 else 1
    rows = (len(recs) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 2.5 * rows), squeeze=False)
    x = np.arange(n)
    for ax, r in zip(axes.flat, recs):
        for a, b in spans(r.labels):
            ax.axvspan(a - 0.5, b - 0.5, color=SHADE, alpha=0.7, lw=0)
        for name in names:
            ax.plot(x, r.scores[name], lw=1.2, label=DETECTOR_TITLES.get(name, name))
        ax.set(xlim=(-0.5, n - 0.5), ylim=(-0.02, 1.02), ylabel="score")
        ax.set_title(f"{TASK_SHORT.get(r.task, r.task)} ({GROUP_TITLES[r.group].lower()}): {r.id}",
                     fontsize=9)
    for ax in list(axes.flat)[len(recs):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("window")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=max(1, len(labels)), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path = Path(out) / f"timelines_N{n}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["TASK_SHORT", "pick_traces", "roc_curves", "spans", "timelines"]
