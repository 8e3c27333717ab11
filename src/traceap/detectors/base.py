"""The one protocol every window detector follows (rule, clustering, expert, model, LLM).

The protocol names everything a caller reads from a detector (the analysis, the evaluation,
the CLI): no caller probes for an attribute.  `BaseDetector` gives the defaults (no threshold
of its own, no pattern head, nothing to say, no failures), so a detector declares only what it
has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from ..trace import Trace
from ..windows import Windows

#: Windows scoring at least this are flagged, unless the user or the detector says otherwise.
DEFAULT_THRESHOLD = 0.5
#: A learned pattern head: windows -> {pattern id: per-window probability}.
PatternHead = Callable[[Windows], dict[str, np.ndarray]]


@runtime_checkable
class Detector(Protocol):
    """Scores every window of a trace for anti-patterns.

    `fit` takes training traces and trace-level labels (1 = bad, 0 = good) and returns self;
    detectors without training return self unchanged.  `score_windows` returns one score
    in [0, 1] per window (higher = more likely an anti-pattern).
    """

    name: str
    #: Windows scoring at least this are flagged; None: the caller's default (0.5, or what
    #: the user asked for).  A calibrated detector (the model, the stack) brings its own.
    threshold: float | None
    #: The detector's learned per-pattern probabilities, which the offline classifier blends
    #: with the expert rules; None for a detector without one.
    pattern_head: PatternHead | None
    #: Parts of a trace the detector could not score (scored 0 there, never filled in), one
    #: reason each, and how many parts it scored in all (the pure-LLM baseline's sub-traces).
    failures: Sequence[str]
    subtraces: int

    def fit(self, traces: Sequence[Trace], labels: Sequence[int]) -> "Detector": ...

    def score_windows(self, windows: Windows) -> np.ndarray: ...

    @property
    def notes(self) -> list[str]:
        """What the detector has to say after a run, one line each (failed parts)."""


class BaseDetector:
    """The defaults of the `Detector` protocol: a detector subclasses this and sets `name`,
    `score_windows` (and `fit`, `threshold`, `pattern_head` when it has them)."""

    name: str = "detector"
    threshold: float | None = None
    pattern_head: PatternHead | None = None
    failures: Sequence[str] = ()
    subtraces: int = 0

    def fit(self, traces: Sequence[Trace], labels: Sequence[int]) -> "BaseDetector":
        """Nothing to learn: returns self."""
        return self

    def score_windows(self, windows: Windows) -> np.ndarray:
        raise NotImplementedError

    @property
    def notes(self) -> list[str]:
        """Nothing to say."""
        return []


def missing_members(obj: object) -> list[str]:
    """The `Detector` members `obj` lacks (for the one error a caller's object gets)."""
    members = ("name", "threshold", "pattern_head", "failures", "subtraces", "fit",
               "score_windows", "notes")
    return [m for m in members if not hasattr(obj, m)]


def clip01(x: np.ndarray) -> np.ndarray:
    """Scores as float64 in [0, 1] with NaN -> 0."""
    return np.clip(np.nan_to_num(np.asarray(x, dtype=np.float64)), 0.0, 1.0)
