"""Detectors by name, so the CLI, evaluation and notebooks build them the same way.

"model" and "llm" live in modules written separately (and may need a checkpoint or a server);
they are imported only when asked for, and a missing one is a clear `TraceapError`.
"""

from __future__ import annotations

import importlib

from ..errors import TraceapError
from .base import Detector

DETECTOR_NAMES = ("hybrid", "expert", "rule", "clustering", "model", "llm")
#: Detectors whose whole state comes from their options (nothing learnt by `fit`): they cross
#: to worker processes as (name, options) and are rebuilt there (`traceap.parallel`).
BUILT_FROM_OPTIONS = ("hybrid", "expert", "model", "llm")

_WHERE = {
    "hybrid": ("traceap.detectors.hybrid", "HybridDetector"),
    "expert": ("traceap.detectors.expert", "ExpertDetector"),
    "rule": ("traceap.detectors.rule", "RuleDetector"),
    "clustering": ("traceap.detectors.clustering", "ClusteringDetector"),
    "model": ("traceap.detectors.learned", "LearnedDetector"),
    "llm": ("traceap.detectors.llm", "PureLLMDetector"),
}


def make_detector(name: str, **options) -> Detector:
    """A detector by name with constructor options (e.g. `make_detector("model", path=...)`)."""
    if name not in _WHERE:
        raise TraceapError(f"unknown detector {name!r}; choose one of {', '.join(DETECTOR_NAMES)}")
    module, cls = _WHERE[name]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise TraceapError(f"the {name!r} detector is not available in this installation "
                               f"({module} is missing)") from None
        raise
    try:
        det = getattr(mod, cls)(**options)
    except TypeError as exc:
        raise TraceapError(f"detector {name!r}: bad option ({exc})") from None
    if name in BUILT_FROM_OPTIONS:
        from ..parallel import buildable
        buildable(det, make_detector, name, options)
    return det


__all__ = ["BUILT_FROM_OPTIONS", "DETECTOR_NAMES", "make_detector"]
