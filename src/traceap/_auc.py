"""ROC AUC, the one definition every table and every training or stacking choice reads.

Plumbing (the leading underscore): it imports nothing of traceap, so the model's training
(`traceap.model.train`), the detector stack (`traceap.detectors.stack`) and the eval tables
(`traceap.eval.metrics`) all read it from the bottom layer (tests/test_architecture.py).
scikit-learn is imported at the first call, so importing this costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def auc(y_true: Sequence[bool] | np.ndarray, scores: Sequence[float] | np.ndarray) -> float | None:
    """Area under the ROC curve in [0, 1]; None when only one class is present (undefined)."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y_true, dtype=bool)
    if y.size == 0 or y.all() or not y.any():
        return None
    return float(roc_auc_score(y, np.asarray(scores, dtype=np.float64)))


__all__ = ["auc"]
