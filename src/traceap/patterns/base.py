"""The anti-pattern contract: a per-window score from the mechanism, evidence in numbers, a fix.

Each pattern module measures what its mechanism leaves in a trace (per window, as numpy arrays),
turns the measures into a score in [0, 1], and estimates the time it costs (`lost_us`).
Evidence for any set of windows is computed from the same measures, so the score, the number
the report shows and the ranking by time lost never disagree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ..idle import IdleAccount, measure
from ..measures.signals import cached, fmt_us
from ..report.idle_text import cause_split
from ..trace import Trace
from ..units import plural
from ..windows import Windows
from ._registry import BusyInefficient, IdleCause
from .proof import Proof, longest_gpu_events

Measures = dict[str, np.ndarray]


@dataclass
class Evidence:
    """What a pattern found in some windows: a sentence with numbers, and the time it costs."""

    text: str
    time_lost_us: float
    numbers: dict = field(default_factory=dict)


class AntiPattern(ABC):
    """One anti-pattern, declared whole: subclasses set every attribute below and implement
    `measure` / `describe` (and `proof_events` where the longest GPU events do not show the
    mechanism); the module registers an instance (`_registry.register_pattern`).  Every other
    module reads these through the registry (tests/test_pattern_conformance.py checks them)."""

    #: One capital letter, written under flagged windows in the terminal timeline (unique).
    letter: str = ""
    #: "#RRGGBB" in the HTML report and the terminal (unique; colour-blind-safe first).
    color: str = ""
    #: A lighter "#RRGGBB" of the same hue where `color` is too dim on a dark terminal.
    terminal_color: str | None = None
    #: Two to four capitals: the eval tables' confusion-matrix column (unique).
    short: str = ""
    #: What the pattern looks like in one window, as the LLM is told it (`traceap.llm.prompt`).
    signature: str = ""
    #: Whose time it is: `IdleCause(mechanism)` (a `traceap.idle` mechanism of GPU idle time)
    #: or `BusyInefficient()` (the GPU is busy but slow; `lost_us` measures it).
    account: IdleCause | BusyInefficient | None = None
    #: The pattern id (module name, manifest and JSON key: docs/FORMATS.md), the finding's
    #: title, and the curated fix (prose and code a user can paste).
    id: str = ""
    title: str = ""
    fix: str = ""
    #: One line on the mechanism, shown beside the evidence.
    mechanism: str = ""
    #: Keys of `describe`'s numbers that say how much of the mechanism a trace holds, whatever
    #: it costs (copies, bytes, loader time): a bigger cause can hide a pattern's cost but not
    #: these, so `traceap diff` compares them to tell a pattern that appeared from one that
    #: was there, hidden.
    amount: tuple[str, ...] = ()

    def measures(self, windows: Windows) -> Measures:
        """Per-window measures, including `score` and `lost_us` (cached per Windows)."""
        def make() -> Measures:
            if not windows.trace.has_gpu:
                z = np.zeros(windows.n)
                return {"score": z, "lost_us": z}
            m = self.measure(windows)
            m["score"] = np.clip(np.nan_to_num(m["score"]), 0.0, 1.0)
            m["lost_us"] = np.clip(np.nan_to_num(m["lost_us"]), 0.0, windows.width_us)
            return m
        # Keyed by the configuration too: two instances of one pattern with other thresholds
        # must not share results.
        return cached(windows, f"pattern:{self.id}:{getattr(self, 'config', None)!r}", make)

    @abstractmethod
    def measure(self, windows: Windows) -> Measures:
        """Compute the measures (with `score` and `lost_us`) for every window."""

    @abstractmethod
    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        """The evidence sentence and its numbers for windows `idx`."""

    def amounts(self, windows: Windows) -> dict[str, float]:
        """The `amount` numbers over the whole trace (empty without GPU work)."""
        if not self.amount or not windows.trace.has_gpu:
            return {}
        _, numbers = self.describe(windows, np.arange(windows.n), self.measures(windows))
        return {k: float(numbers[k]) for k in self.amount if numbers.get(k) is not None}

    def score_windows(self, windows: Windows) -> np.ndarray:
        """Per-window score in [0, 1]."""
        return self.measures(windows)["score"].copy()

    def evidence(self, windows: Windows, window_indices: Iterable[int],
                 where: Iterable[int] | None = None) -> Evidence:
        """Evidence in numbers for the given windows: what, where, time lost.

        The numbers are summed over `window_indices`; `where` (default: the same windows) are
        the windows named as the places to look, e.g. the flagged ones of a finding whose
        numbers cover the whole trace."""
        idx = np.unique(np.asarray(list(window_indices), dtype=np.int64))
        idx = idx[(idx >= 0) & (idx < windows.n)]
        m = self.measures(windows)
        lost = float(m["lost_us"][idx].sum()) if len(idx) else 0.0
        if not len(idx):
            return Evidence("no windows given", 0.0, {})
        text, numbers = self.describe(windows, idx, m)
        numbers = {"windows": int(len(idx)), "time_lost_us": round(lost, 1), **numbers}
        if where is None:
            return Evidence(f"{text}; {_where(windows, idx)}; about {fmt_us(lost)} of GPU time "
                            f"lost.", lost, numbers)
        at = np.unique(np.asarray(list(where), dtype=np.int64))
        at = at[(at >= 0) & (at < windows.n)]
        place = f"; flagged {_where(windows, at)}" if len(at) else ""
        split = ""
        mech = self.account.mechanism if isinstance(self.account, IdleCause) else None
        if mech and len(idx) == windows.n:  # the whole trace: comparable with the idle summary
            split = cause_split(measure(windows.trace), mech)
        kind = "GPU idle time" if isinstance(self.account, IdleCause) else \
            "GPU time spent inefficiently"
        return Evidence(f"{text}{place}; {fmt_us(lost)} of {kind} over the trace{split}.",
                        lost, numbers)

    def time_lost(self, windows: Windows, account: IdleAccount) -> tuple[float, float | None]:
        """(time lost over the trace, the part of it inside the steady profiler steps, or None
        without steps): the idle account's mechanism for an `IdleCause` pattern, the rule's own
        `lost_us` for a `BusyInefficient` one (a window's share inside the steady steps)."""
        if isinstance(self.account, IdleCause):
            mech = self.account.mechanism
            return float(account.by_mechanism[mech]), account.in_steady_steps(mech)
        lost = self.measures(windows)["lost_us"]
        if not account.steady_steps:
            return float(lost.sum()), None
        a, b = windows.edges[:-1], windows.edges[1:]
        inside = np.zeros(windows.n)
        for s, e, _ in account.steady_steps:
            inside += np.clip(np.minimum(b, e) - np.maximum(a, s), 0.0, None)
        share = np.clip(inside / max(windows.width_us, 1e-9), 0.0, 1.0)
        return float(lost.sum()), float((lost * share).sum())

    def window_lost(self, windows: Windows) -> np.ndarray:
        """Per window: the time lost in the account `time_lost` sums (the idle account's
        mechanism for an `IdleCause` pattern, the rule's own `lost_us` otherwise)."""
        if isinstance(self.account, IdleCause):
            from ..idle import pattern_lost
            return pattern_lost(windows, self.id)
        return self.measures(windows)["lost_us"].copy()

    def title_for(self, numbers: dict) -> str:
        """The title that fits this evidence (a pattern whose evidence can take two forms,
        e.g. copies or only syncs, says which one it found)."""
        return self.title

    def fix_for(self, numbers: dict) -> str:
        """The fix that fits this evidence (a pattern whose evidence can point at two causes,
        e.g. layout transposes from an NCHW model or from FP32 kernels, gives the one it
        found)."""
        return self.fix

    def supported(self, numbers: dict) -> bool:
        """Whether the evidence shows the mechanism at all (a finding needs time lost *and*
        the thing its title names: NCCL kernels, copies, a DataLoader, ...)."""
        return numbers.get("time_lost_us", 0.0) > 0.0

    def gain_cap_us(self, windows: Windows, n_steps: int) -> float | None:
        """The most a fix can gain per step (in total without steps), where less than the
        time lost: e.g. communication can only hide under the compute there is
        (`traceap.idle.gain_cap_us`, the one definition `traceap label` judges by too)."""
        from ..idle import gain_cap_us, measure
        return gain_cap_us(measure(windows.trace), self.id, n_steps)

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """The events inside `runs` (a finding's merged windows) that show the mechanism, most
        telling first: (caption, rows) as in `traceap.patterns.proof`.  Default: the longest
        GPU events."""
        return longest_gpu_events(trace, runs, limit)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"


def _where(windows: Windows, idx: np.ndarray) -> str:
    """'in windows 3-5, 40 (t = 12.1-15.3 ms ...)' — where to look in a trace viewer."""
    runs = runs_of(idx)
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:6]]
    more = f" and {plural(len(runs) - 6, 'more place')}" if len(runs) > 6 else ""
    t0 = windows.edges[0]
    a, b = runs[0]
    return (f"in window{'s' if len(idx) > 1 else ''} {', '.join(parts)}{more} "
            f"(first at +{fmt_us(windows.edges[a] - t0)} to +{fmt_us(windows.edges[b + 1] - t0)})")


def runs_of(idx: Iterable[int], gap: int = 1) -> list[tuple[int, int]]:
    """Sorted indices as runs [(first, last)], joining runs separated by at most `gap - 1`."""
    idx = sorted(set(int(i) for i in idx))
    runs: list[tuple[int, int]] = []
    for i in idx:
        if runs and i - runs[-1][1] <= gap:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs
