"""The learned detector of the paper (section 5): event encoder -> window encoder ->
window-to-window detector, trained weakly (trace labels; window labels too where a train trace's
anomalies are known and the config asks, `w_window`), plus a pattern head.

    from traceap.model import load_model, Predictor, train
    predictor = Predictor()                      # the checkpoint shipped with traceap
    pred = predictor.predict(traceap.windows.Windows(trace, 100))
    pred.scores, pred.patterns                   # [N], [N, P]: predictor.head_patterns

Names are imported on first use: scoring (`Predictor`) runs on numpy and must not pay for
importing torch, which the network, training and losses need.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "Checkpoint": "checkpoint", "bundled_model_path": "checkpoint", "load_model": "checkpoint",
    "save_model": "checkpoint",
    "ABLATIONS": "config", "ModelConfig": "config", "PRESETS": "config", "preset": "config",
    "TraceAPModel": "net", "collate": "net", "create_model": "net",
    "Prediction": "predict", "Predictor": "predict",
    "train": "train",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # `train`: the function, over the submodule of the same name
    return value


__all__ = sorted(_WHERE)
