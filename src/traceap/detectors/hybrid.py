"""The default detector: the trained model and the expert rules, combined.

The two err differently: the model ranks windows against the rest of their own trace from
everything in them (it was trained on simulated and on real traces with planted anomalies),
the rules see a mechanism (idle GPU under a DataLoader, pageable copies, exposed NCCL) in any
trace but miss what they were not written for.  Their window scores are combined as a
logistic stack,

    score = sigmoid(a * logit(model) + b * logit(expert) + d * warmup + c),

where `warmup` is the share of the window that the idle account gives to one-off start-up
(`traceap.idle.warmup_share`: allocator growth, graph capture, module loading, worker start):
the model ranks a window against the rest of its trace and reads a start-up stall as an
anomaly, the rules know it is not one of the steady state.  (a, b, c, d) are fitted on the
window labels of a `validation` split (never a test split) by `traceap.detectors.stack`
(`traceap ship stack`), which writes them to a hybrid.json with where they came from (the
shipped one: `traceap/data/hybrid.json`; d = 0 in files without `warmup_coef`); the score is then a probability calibrated on that split, flagged at
0.5 like the others.  `HybridDetector(model_weight=w)` is the plain weighted mean instead (the combination
of earlier releases).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..trace import Trace
from ..windows import Windows
from .base import clip01
from .expert import ExpertDetector

SCHEMA = "traceap.hybrid/v1"


@dataclass(frozen=True)
class HybridParams:
    """Coefficients of the logistic stack, and where they were fitted (free-form)."""

    model_coef: float = 1.0
    expert_coef: float = 1.0
    bias: float = 0.0
    #: Scores are clipped to [eps, 1 - eps] before the logit (expert scores are often exactly 0).
    eps: float = 1e-3
    tuned_on: dict = field(default_factory=dict)
    #: Weight of the window's warm-up share (`traceap.idle.warmup_share`); 0 ignores it.
    warmup_coef: float = 0.0

    def logit(self, p: np.ndarray) -> np.ndarray:
        """log(p / (1 - p)) of scores clipped to [eps, 1 - eps]: what the stack combines."""
        p = np.clip(np.asarray(p, np.float64), self.eps, 1.0 - self.eps)
        return np.log(p) - np.log1p(-p)

    def combine(self, model: np.ndarray, expert: np.ndarray,
                warmup: np.ndarray | None = None) -> np.ndarray:
        """The stacked probability per window (`warmup`: each window's warm-up share, needed
        when `warmup_coef` is not 0)."""
        z = self.model_coef * self.logit(model) + self.expert_coef * self.logit(expert) + self.bias
        if self.warmup_coef:
            if warmup is None:
                raise ValueError("this stack weighs the warm-up share: pass `warmup`")
            z = z + self.warmup_coef * np.asarray(warmup, np.float64)
        return 1.0 / (1.0 + np.exp(-z))

    def to_json(self) -> dict:
        """The hybrid.json object."""
        return {"schema": SCHEMA, "combine": "logit", "model_coef": self.model_coef,
                "expert_coef": self.expert_coef, "bias": self.bias, "eps": self.eps,
                "warmup_coef": self.warmup_coef, "tuned_on": self.tuned_on}

    @classmethod
    def read(cls, path: str | os.PathLike | None = None) -> "HybridParams":
        """Read hybrid.json (None: the bundled one).  Raises ModelError when unreadable."""
        path = Path(path) if path is not None else bundled_params_path()
        try:
            obj = json.loads(Path(path).read_text())
            if obj.get("schema") != SCHEMA:
                raise ValueError(f"expected schema {SCHEMA}")
            return cls(float(obj["model_coef"]), float(obj["expert_coef"]), float(obj["bias"]),
                       float(obj.get("eps", 1e-3)), dict(obj.get("tuned_on", {})),
                       float(obj.get("warmup_coef", 0.0)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"{path}: not a readable hybrid parameter file ({exc})") from None


def bundled_params_path() -> Path:
    """The hybrid parameters shipped inside the package."""
    return Path(str(resources.files("traceap") / "data" / "hybrid.json"))


class HybridDetector:
    """The trained model and the expert rules, stacked (or averaged with `model_weight`)."""

    name = "hybrid"

    def __init__(self, path: str | os.PathLike | None = None, model_weight: float | None = None,
                 params: HybridParams | str | os.PathLike | None = None):
        from .learned import LearnedDetector

        if model_weight is not None and not 0.0 <= model_weight <= 1.0:
            raise ValueError("model_weight must be between 0 and 1")
        self.learned = LearnedDetector(path)
        # In the plain mean, the rules' own evidence only: credit for evidence next door ranks
        # windows for the expert detector alone, but in a mean it would lift model-only windows
        # over the flag.  The stack is fitted on validation labels, so its threshold already
        # accounts for that credit, and it takes the expert detector as `expert` ranks alone.
        self.expert = ExpertDetector(nearby_reach=0) if model_weight is not None else \
            ExpertDetector()
        self.model_weight = model_weight
        self.params = None if model_weight is not None else (
            params if isinstance(params, HybridParams) else HybridParams.read(params))

    def fit(self, traces: Sequence[Trace], labels: Sequence[int]) -> "HybridDetector":
        """Both parts come trained (the checkpoint) or need none (the rules); returns self."""
        return self

    def score_windows(self, windows: Windows) -> np.ndarray:
        """Per window, in [0, 1]: the stacked probability (or the weighted mean)."""
        m = self.learned.score_windows(windows)
        e = self.expert.score_windows(windows)
        if self.params is None:
            w = self.model_weight
            return clip01(w * m + (1.0 - w) * e)
        warm = None
        if self.params.warmup_coef:
            from ..idle import warmup_share
            warm = warmup_share(windows)
        return clip01(self.params.combine(m, e, warm))

    def pattern_probabilities(self, windows: Windows) -> dict[str, np.ndarray]:
        """The model's learned pattern head (the offline classifier blends it with the rules)."""
        return self.learned.pattern_probabilities(windows)

    def __repr__(self) -> str:
        how = f"model_weight={self.model_weight}" if self.params is None else (
            f"stack a={self.params.model_coef:.3g} b={self.params.expert_coef:.3g} "
            f"c={self.params.bias:.3g} d={self.params.warmup_coef:.3g}")
        return f"HybridDetector({self.learned!r}, {how})"


__all__ = ["HybridDetector", "HybridParams", "SCHEMA", "bundled_params_path"]
