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
    """Names the anti-pattern in flagged windows.

    Besides `classify`, what callers read: `notes` (what it has to say after a run), and the
    state it gathers while it classifies (re-detection changes, LLM records): a worker process
    takes it out per trace (`take_state`) and the caller's classifier is given it back in
    trace order (`give_state`), so a job analysed by workers reads like one analysed here."""

    name: str

    def classify(self, windows: Windows, window_indices: Sequence[int],
                 scores: np.ndarray) -> list[PatternCall]: ...

    @property
    def notes(self) -> list[str]:
        """What the classifier has to say after a run, one line each."""

    def take_state(self) -> dict:
        """What it gathered since the last call, taken out of it (empty: nothing)."""

    def give_state(self, state: dict) -> None:
        """Add what `take_state` took out of a copy of this classifier (in a worker)."""


class BaseClassifier:
    """The defaults of the `Classifier` protocol: nothing to say, no state gathered."""

    name: str = "classifier"

    def classify(self, windows: Windows, window_indices: Sequence[int],
                 scores: np.ndarray) -> list[PatternCall]:
        raise NotImplementedError

    @property
    def notes(self) -> list[str]:
        """Nothing to say."""
        return []

    def take_state(self) -> dict:
        """Nothing gathered."""
        return {}

    def give_state(self, state: dict) -> None:
        """Nothing to add."""
