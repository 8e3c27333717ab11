"""The eight anti-patterns, one module each: signature score, evidence in numbers, curated fix.

`REGISTRY[id]` maps each pattern id of `traceap.dataset.PATTERNS` (docs/FORMATS.md) to its rule.
A new anti-pattern is a new module here with a `PATTERN` object, added to `_MODULES`.
"""

from __future__ import annotations

import importlib

import numpy as np

from ..dataset import PATTERNS
from .base import AntiPattern, Evidence, runs_of

_MODULES = PATTERNS  # module name == pattern id

REGISTRY: dict[str, AntiPattern] = {
    name: importlib.import_module(f"{__name__}.{name}").PATTERN for name in _MODULES
}
assert all(REGISTRY[k].id == k for k in REGISTRY)


def pattern_scores(windows) -> dict[str, np.ndarray]:
    """Every pattern's per-window score, by id."""
    return {pid: p.score_windows(windows) for pid, p in REGISTRY.items()}


__all__ = ["AntiPattern", "Evidence", "REGISTRY", "pattern_scores", "runs_of"]
