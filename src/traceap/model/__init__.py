"""The learned detector of the paper (section 5): event encoder -> window encoder ->
window-to-window detector, trained weakly (trace labels only), plus a pattern head.

    from traceap.model import load_model, Predictor, train
    predictor = Predictor()                      # the checkpoint shipped with traceap
    pred = predictor.predict(traceap.windows.Windows(trace, 100))
    pred.scores, pred.patterns                   # [N], [N, 8]
"""

from .checkpoint import Checkpoint, bundled_model_path, load_model, save_model
from .config import ABLATIONS, ModelConfig, PRESETS, preset
from .net import TraceAPModel, collate, create_model
from .predict import Prediction, Predictor
from .train import train  # noqa: E402 - binds the function over the submodule's name


__all__ = ["ABLATIONS", "Checkpoint", "ModelConfig", "PRESETS", "Prediction", "Predictor",
           "TraceAPModel", "bundled_model_path", "collate", "create_model", "load_model",
           "preset", "save_model", "train"]
