"""Iterative re-detection (paper section 5.6): a false alarm gets a second look at a finer scale.

When the classifier calls a flagged window a false alarm, the window may still hide a short
anti-pattern diluted by normal work around it.  Each round cuts the whole trace into `factor`
times more windows (same span, so every old window splits into `factor**round` sub-windows),
scores them with the same detector, and asks the classifier about the sub-windows of the
doubtful stretch that score over the threshold.  A named pattern replaces the false alarm; no
sub-window over the threshold confirms it; otherwise the next round looks finer still, up to
`max_rounds`.  Every decision is kept as a `Change` for the report.

`RedetectingClassifier` wraps any classifier with this loop, so `analyze(..., classifier=
RedetectingClassifier(inner, detector))` needs no change to the pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..detectors.base import DEFAULT_THRESHOLD, Detector, clip01
from ..units import fmt_us
from ..windows import Windows
from .base import BaseClassifier, Classifier, PatternCall


@dataclass(frozen=True)
class RedetectConfig:
    """Bounded rounds; each divides the window width by `factor`."""

    max_rounds: int = 2
    factor: int = 2
    #: At most this many hot sub-windows per doubtful window go to the classifier per round
    #: (the classifier may be an LLM at seconds per window).
    max_subwindows: int = 2

    def __post_init__(self):
        if self.max_rounds < 0:
            raise ValueError("max_rounds must be >= 0")
        if self.factor < 2:
            raise ValueError("factor must be >= 2")
        if self.max_subwindows < 1:
            raise ValueError("max_subwindows must be >= 1")


@dataclass
class Change:
    """What re-detection did with one window the classifier called a false alarm."""

    window: int
    start_us: float
    end_us: float
    #: "found" (a pattern at a finer scale), "dismissed" (nothing over the threshold there),
    #: or "unresolved" (hot sub-windows, but no pattern named within the rounds).
    outcome: str = "unresolved"
    pattern: str | None = None
    rounds: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """One line for the report."""
        head = {"found": f"window {self.window}: false alarm at the first scale, "
                         f"re-detected as {self.pattern}",
                "dismissed": f"window {self.window}: false alarm confirmed at a finer scale",
                "unresolved": f"window {self.window}: still unclear after "
                              f"{len(self.rounds)} finer round(s)"}[self.outcome]
        return head + ("; " + "; ".join(self.rounds) if self.rounds else "")


def _subwindows(w: int, scale: int) -> np.ndarray:
    """Sub-windows of old window w when every window is split into `scale` parts."""
    return np.arange(w * scale, (w + 1) * scale)


def redetect(windows: Windows, calls: Sequence[PatternCall], detector: Detector,
             classifier: Classifier, threshold: float = DEFAULT_THRESHOLD,
             config: RedetectConfig = RedetectConfig()) -> tuple[list[PatternCall], list[Change]]:
    """Re-examine the false alarms among `calls` at finer window sizes.

    Returns the calls (false alarms replaced where a pattern was found, others unchanged, in
    the same order) and one `Change` per false alarm examined.
    """
    from ..patterns import REGISTRY

    out = list(calls)
    pos = {c.window: i for i, c in enumerate(out) if c.false_alarm or c.pattern is None}
    changes = {w: Change(w, float(windows.edges[w]), float(windows.edges[w + 1])) for w in pos}
    pending = sorted(pos)
    span = (float(windows.edges[0]), float(windows.edges[-1]))
    for r in range(1, config.max_rounds + 1):
        if not pending:
            break
        scale = config.factor ** r
        fine = Windows(windows.trace, windows.n * scale, windows.config.span,
                       start_us=span[0], end_us=span[1])
        scores = clip01(detector.score_windows(fine))
        width = fine.width_us
        still = []
        asks: dict[int, np.ndarray] = {}
        for w in pending:
            sub = _subwindows(w, scale)
            hot = sub[scores[sub] >= threshold]
            if not len(hot):
                ch = changes[w]
                ch.outcome = "dismissed"
                ch.rounds.append(f"at {fine.n} windows ({fmt_us(width)}) its {scale} "
                                 f"sub-windows score at most {scores[sub].max():.2f} "
                                 f"< {threshold:.2f}")
                continue
            asks[w] = hot[np.argsort(-scores[hot], kind="stable")][: config.max_subwindows]
        flat = np.concatenate(list(asks.values())) if asks else np.zeros(0, np.int64)
        sub_calls = {c.window: c for c in classifier.classify(fine, flat.tolist(), scores)} \
            if len(flat) else {}
        for w, hot in asks.items():
            ch = changes[w]
            named = [sub_calls[s] for s in hot.tolist()
                     if s in sub_calls and sub_calls[s].pattern and not sub_calls[s].false_alarm]
            listed = ", ".join(f"{s} ({scores[s]:.2f})" for s in hot.tolist())
            if not named:
                ch.rounds.append(f"at {fine.n} windows sub-windows {listed} score over the "
                                 f"threshold but show no pattern")
                still.append(w)
                continue
            best = max(named, key=lambda c: c.confidence)
            same = [c.window for c in named if c.pattern == best.pattern]
            pat = REGISTRY.get(best.pattern)
            evidence = pat.evidence(fine, same).text if pat is not None else best.evidence
            fix = pat.fix if pat is not None else best.fix
            ch.outcome, ch.pattern = "found", best.pattern
            ch.rounds.append(f"at {fine.n} windows ({fmt_us(width)}) sub-windows {listed} "
                             f"score over {threshold:.2f}; {best.pattern} named in "
                             f"{', '.join(map(str, same))} (confidence {best.confidence:.2f})")
            out[pos[w]] = PatternCall(
                window=w, pattern=best.pattern, confidence=best.confidence, evidence=evidence,
                fix=fix, false_alarm=False, source=best.source,
                explanation=f"re-detected at {fine.n} windows: " + (best.explanation or ""))
        pending = still
    return out, [changes[w] for w in sorted(changes)]


class RedetectingClassifier(BaseClassifier):
    """A classifier that gives its own false alarms a finer second look (see `redetect`)."""

    def __init__(self, inner: Classifier, detector: Detector, threshold: float | None = None,
                 config: RedetectConfig = RedetectConfig()):
        self.inner = inner
        self.detector = detector
        self.threshold = float(threshold if threshold is not None else
                               detector.threshold if detector.threshold is not None
                               else DEFAULT_THRESHOLD)
        self.config = config
        self.name = f"{inner.name}+redetect"
        self.changes: list[Change] = []

    def classify(self, windows: Windows, window_indices: Sequence[int],
                 scores: np.ndarray) -> list[PatternCall]:
        """The inner classifier's calls, with false alarms re-examined at finer scales."""
        calls = self.inner.classify(windows, window_indices, scores)
        calls, changes = redetect(windows, calls, self.detector, self.inner, self.threshold,
                                  self.config)
        self.changes.extend(changes)
        return calls

    @property
    def notes(self) -> list[str]:
        """One line per re-examined window, for the report, then the inner classifier's."""
        return [c.text for c in self.changes] + self.inner.notes

    def take_state(self) -> dict:
        """The changes made since the last call (taken out), and the inner classifier's."""
        state = {"changes": list(self.changes), "inner": self.inner.take_state()}
        self.changes.clear()
        return state

    def give_state(self, state: dict) -> None:
        """Add a worker's changes, and its inner classifier's state to the inner one."""
        self.changes.extend(state.get("changes", ()))
        self.inner.give_state(state.get("inner", {}))


__all__ = ["Change", "RedetectConfig", "RedetectingClassifier", "redetect"]
