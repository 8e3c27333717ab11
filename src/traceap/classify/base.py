"""Stage 5: naming the anti-pattern of each flagged window.

A classifier receives the window table, the indices of the windows the detector flagged and
the detector's scores, and returns one `PatternCall` per flagged window: the pattern (or None
when it judges the window a false alarm), a confidence, evidence and a fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..windows import Windows


@dataclass
class PatternCall:
    """The verdict on one window."""

    window: int
    pattern: str | None
    confidence: float
    evidence: str
    fix: str
    false_alarm: bool = False
    explanation: str = ""
    source: str = "offline"


@runtime_checkable
class Classifier(Protocol):
    """Names the anti-pattern in flagged windows."""

    name: str

    def classify(self, windows: Windows, window_indices: Sequence[int],
                 scores: np.ndarray) -> list[PatternCall]: ...
