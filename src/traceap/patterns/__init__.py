"""The eight anti-patterns, one module each: signature score, evidence in numbers, curated fix.

`REGISTRY[id]` maps each pattern id of `traceap.manifest.PATTERNS` (docs/FORMATS.md) to its rule.
A new anti-pattern is a new module here with a `PATTERN` object, added to `_MODULES`.
"""

from __future__ import annotations

import importlib

import numpy as np

from ..manifest import PATTERNS
from .base import AntiPattern, Evidence, runs_of

_MODULES = PATTERNS  # module name == pattern id

REGISTRY: dict[str, AntiPattern] = {
    name: importlib.import_module(f"{__name__}.{name}").PATTERN for name in _MODULES
}
assert all(REGISTRY[k].id == k for k in REGISTRY)


def pattern_scores(windows) -> dict[str, np.ndarray]:
    """Every pattern's per-window score, by id."""
    return {pid: p.score_windows(windows) for pid, p in REGISTRY.items()}


def nearby(scores: np.ndarray, weight: float, reach: int) -> np.ndarray:
    """Per window: its own score, or `weight**k` x the score k windows away (k <= reach) when
    that is higher.  A mechanism's cost spills over window edges (the collective launched just
    before, the relaunch after a stall, the tail of a gap), so evidence next door speaks for a
    window, more weakly; with weight under the flagging threshold it ranks windows, never flags
    them."""
    s = np.asarray(scores, dtype=np.float64)
    out = s.copy()
    n = len(s)
    for k in range(1, min(reach, n - 1) + 1):
        f = weight ** k
        out[:-k] = np.maximum(out[:-k], f * s[k:])
        out[k:] = np.maximum(out[k:], f * s[:-k])
    return out


__all__ = ["AntiPattern", "Evidence", "REGISTRY", "nearby", "pattern_scores", "runs_of"]
