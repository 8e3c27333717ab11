"""The numbers of the paper's tables, computed by scikit-learn (never by hand).

Every function takes plain arrays and returns plain Python values, so the runner and the
tests can call them on anything: window labels against window scores, trace labels against
aggregated trace scores, true patterns against predicted ones.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from sklearn.metrics import accuracy_score, confusion_matrix, roc_curve

from .._auc import auc  # the one ROC AUC (model training and the detector stack read it too)

#: The label used in confusion matrices for "the classifier named no pattern".
NO_PATTERN = "none"


def roc(y_true, scores) -> tuple[np.ndarray, np.ndarray] | None:
    """(false positive rate, true positive rate) points of the ROC curve; None if undefined."""
    y = np.asarray(y_true, dtype=bool)
    if y.size == 0 or y.all() or not y.any():
        return None
    fpr, tpr, _ = roc_curve(y, np.asarray(scores, dtype=np.float64))
    return fpr, tpr


def accuracy(y_true: Sequence[str], y_pred: Sequence[str | None]) -> float | None:
    """Share of exact matches; a prediction of None counts as wrong.  None when empty."""
    if len(y_true) == 0:
        return None
    pred = [NO_PATTERN if p is None else p for p in y_pred]
    return float(accuracy_score(list(y_true), pred))


def confusion(y_true: Sequence[str], y_pred: Sequence[str | None],
              labels: Sequence[str]) -> np.ndarray:
    """Confusion matrix, rows = true, columns = predicted, over `labels` + NO_PATTERN.

    The extra last column (and row, always zero for true labels) counts windows the
    classifier left without a pattern, so every true window is counted exactly once.
    """
    names = list(labels) + [NO_PATTERN]
    pred = [NO_PATTERN if p is None else p for p in y_pred]
    if len(y_true) == 0:
        return np.zeros((len(names), len(names)), dtype=np.int64)
    return confusion_matrix(list(y_true), pred, labels=names).astype(np.int64)


def mean_defined(values: Sequence[float | None]) -> float | None:
    """Mean of the defined values (the tables' "Avg" over tasks); None if none is defined."""
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def runs(flags: np.ndarray) -> int:
    """Number of maximal runs of consecutive True values (flagged windows -> findings)."""
    f = np.asarray(flags, dtype=bool)
    if f.size == 0:
        return 0
    return int(f[0]) + int(np.count_nonzero(f[1:] & ~f[:-1]))


def pattern_aucs(truth: np.ndarray, scores: np.ndarray, clean: np.ndarray,
                 patterns: Sequence[str]) -> dict[str, tuple[float | None, int]]:
    """Per pattern of `patterns` with windows (`truth`: each window's pattern or None): window
    AUC of its windows against every clean window, and its window count.  Windows of other
    patterns are left out, so each pattern is ranked against the same healthy background."""
    out = {}
    for p in patterns:
        pos = truth == p
        if pos.any():
            keep = pos | clean
            out[p] = (auc(pos[keep], scores[keep]), int(pos.sum()))
    return out


__all__ = ["NO_PATTERN", "accuracy", "auc", "confusion", "mean_defined", "pattern_aucs", "roc",
           "runs"]
