"""The pipeline facade: a trace in, an `Analysis` out (windows, scores, findings with fixes).

    analysis = traceap.analysis.analyze("trace.json.gz")        # or a loaded Trace
    analysis.findings[0].evidence, analysis.findings[0].fix
    analysis.idle.by_cause                                       # where the GPU's idle time goes
    analysis.to_json()                                           # traceap.analysis/v1 (+ keys)

Findings are judged by one rule (`traceap.findings`): time lost = the GPU idle time the
pattern's mechanism costs over the whole trace (`traceap.idle`), gain and severity from its
share of the step.  A multi-rank job (every rank analysed, then compared) is `traceap.job`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from . import idle as idle_mod
from .classify.base import Classifier, PatternCall
from .detectors.base import DEFAULT_THRESHOLD, Detector, clip01
from .errors import TraceapError
from .findings import (SEVERITY, Finding, SeverityConfig, StepBasis, finding_order, judge,
                       step_basis)
from .idle import IdleAccount
from .info import step_numbers, summarize
from .report.idle_text import describe as describe_idle
from .report.idle_text import launch_bound_note
from .stages import resolve_classifier, resolve_detector
from .trace import Trace
from .units import fmt_us
from .windows import DEFAULT_WINDOWS, Windows, check_windows

SCHEMA = "traceap.analysis/v1"


@dataclass
class WindowResult:
    """One window's verdict."""

    index: int
    start_us: float
    end_us: float
    score: float
    flagged: bool
    pattern: str | None
    confidence: float | None
    #: Every reported pattern present in the window (its rule flags the window): `pattern`
    #: (the classifier's call) first, the others by the time they cost there, most first.
    patterns: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class InefficientAccount:
    """GPU time spent inefficiently: the part of the GPU *busy* time that the busy-but-slow
    anti-patterns (`account = BusyInefficient()`) cost, each pattern's time lost as its own
    rule measures it (`AntiPattern.time_lost`: the number its finding shows).

    It sits inside the busy time, not beside it: busy + idle still make the GPU span.  The
    rules measure disjoint kernels (FP32 GEMMs and convolutions, layout transposes,
    per-parameter optimizer kernels), so the parts add up; the total is capped at the busy
    time all the same."""

    busy_us: float
    #: Pattern id -> time lost (us), every registered BusyInefficient pattern, registry order.
    by_pattern: dict[str, float]
    #: Pattern id -> what the GPU spends that time on (`BusyInefficient.what`).
    titles: dict[str, str] = field(default_factory=dict)

    @property
    def total_us(self) -> float:
        """Busy time spent inefficiently, all patterns (at most the busy time)."""
        return min(float(sum(self.by_pattern.values())), max(self.busy_us, 0.0))

    def describe(self) -> str | None:
        """'Of the GPU busy time (90.1 ms), 31.2 ms (35%) spent inefficiently: FP32 without
        tensor cores 25.0 ms, ...', or None when no pattern costs any."""
        if self.total_us <= 0 or self.busy_us <= 0:
            return None
        parts = [f"{self.titles.get(p, p)} {fmt_us(v)}" for p, v in
                 sorted(self.by_pattern.items(), key=lambda kv: -kv[1]) if v > 0]
        return (f"Of the GPU busy time ({fmt_us(self.busy_us)}), {fmt_us(self.total_us)} "
                f"({100 * self.total_us / self.busy_us:.0f}%) spent inefficiently: "
                + ", ".join(parts))

    def to_json(self) -> dict:
        """The "gpu_inefficient" object of docs/FORMATS.md."""
        return {"definition": "part of the GPU busy time that busy-but-slow anti-patterns "
                              "cost, each measured by its own rule (its finding's time lost)",
                "busy_us": round(float(self.busy_us), 1), "total_us": round(self.total_us, 1),
                "by_pattern": {k: round(float(v), 1) for k, v in self.by_pattern.items()}}


def inefficient_account(windows: Windows, account: IdleAccount) -> InefficientAccount:
    """The GPU time spent inefficiently, read from every BusyInefficient pattern's rule."""
    from .patterns import BusyInefficient, patterns
    slow = [p for p in patterns() if isinstance(p.account, BusyInefficient)]
    by = {p.id: p.time_lost(windows, account)[0] if windows.trace.has_gpu else 0.0
          for p in slow}
    return InefficientAccount(busy_us=float(account.busy_us), by_pattern=by,
                              titles={p.id: p.account.what or p.title for p in slow})

@dataclass
class Analysis:
    """Everything `traceap analyze` knows about one trace."""

    trace_path: str
    n_windows: int
    span_us: tuple[float, float]
    windows: list[WindowResult]
    findings: list[Finding]
    detector: str
    pattern_scores: dict[str, np.ndarray]
    summary: dict
    notes: list[str] = field(default_factory=list)
    #: The GPU idle account (`traceap.idle`) the findings' time lost comes from.
    idle: IdleAccount | None = None
    #: Idle time per cause in each window.
    idle_per_window: dict[str, np.ndarray] = field(default_factory=dict)
    basis: StepBasis | None = None
    threshold: float | None = None
    severity: SeverityConfig = SEVERITY
    #: What the HTML report needs from the trace (`traceap.report.html.TraceDetails`), when it
    #: was computed where the trace was loaded (a job analysed by workers); never in the JSON.
    trace_details: object | None = None
    #: Whether the trace has GPU activity (a job analysed by workers has no `Trace` at hand).
    has_gpu: bool = True
    #: The trace's host-side step numbers (`traceap.info.step_numbers`: steps, median step,
    #: DataLoader time), which `traceap diff` and `traceap profile` print; never in the JSON.
    steps: dict = field(default_factory=dict)
    #: Pattern id -> its amount numbers over the whole trace (`AntiPattern.amounts`, measured
    #: on this analysis' windows), for the patterns that have one; never in the JSON.
    amounts: dict[str, dict[str, float]] = field(default_factory=dict)
    #: The part of the GPU busy time spent inefficiently (busy-but-slow patterns).
    inefficient: InefficientAccount | None = None

    def to_json(self) -> dict:
        """The traceap.analysis/v1 object of docs/FORMATS.md: its keys, then the added ones."""
        out = {
            "schema": SCHEMA,
            "trace": self.trace_path,
            "n_windows": int(self.n_windows),
            "span_us": [float(self.span_us[0]), float(self.span_us[1])],
            "windows": [{"index": int(w.index), "start_us": float(w.start_us),
                         "end_us": float(w.end_us), "score": float(w.score),
                         "flagged": bool(w.flagged), "pattern": w.pattern,
                         "confidence": None if w.confidence is None else float(w.confidence),
                         "patterns": list(w.patterns)}
                        for w in self.windows],
            "findings": [{"pattern": f.pattern, "windows": [int(i) for i in f.windows],
                          "start_us": float(f.start_us), "end_us": float(f.end_us),
                          "severity": f.severity, "evidence": f.evidence, "fix": f.fix,
                          **f.to_json()}
                         for f in self.findings],
        }
        out["gpu_idle"] = gpu_idle_json(self.idle, self.idle_per_window)
        out["gpu_inefficient"] = (self.inefficient or InefficientAccount(0.0, {})).to_json()
        out["step_basis"] = basis_json(self.basis)
        out["severity_rule"] = severity_json(self.severity, self.basis)
        out["notes"] = list(self.notes)
        # The process's rank (distributedInfo, the file name, or the job's), for readers of the
        # JSON alone (`traceap diff`); null for a trace that says none.
        out["rank"] = (self.summary or {}).get("rank")
        return out

    @property
    def scores(self) -> np.ndarray:
        """Detector score per window."""
        return np.array([w.score for w in self.windows])

    @property
    def flagged(self) -> np.ndarray:
        """Indices of flagged windows."""
        return np.array([w.index for w in self.windows if w.flagged], dtype=np.int64)


def gpu_idle_json(account: IdleAccount | None, per_window: dict[str, np.ndarray]) -> dict:
    """The "gpu_idle" object: total, by cause (every us in one), per window."""
    if account is None:
        return {"total_us": 0.0, "by_cause": {c: 0.0 for c in idle_mod.CAUSES}}
    out = account.to_json()
    out["explained_share"] = round(idle_mod.explained_share(account), 4)
    out["warmup_sources"] = {k: round(v, 1) for k, v in account.warmup_sources.items()}
    out["per_window"] = {c: [round(float(x), 1) for x in v] for c, v in per_window.items()}
    return out


def basis_json(basis: StepBasis | None) -> dict | None:
    """What gains are a share of: the median steady step, or the span without steps."""
    if basis is None:
        return None
    return {"unit": basis.unit, "n_steps": basis.n_steps,
            "step_us": None if basis.step_us is None else round(basis.step_us, 1),
            "span_us": round(basis.span_us, 1)}


def severity_json(config: SeverityConfig, basis: StepBasis | None) -> dict:
    """The cut-offs findings were judged by."""
    return {"high_pct": config.high_pct, "medium_pct": config.medium_pct,
            "min_gain_pct": config.min_gain_pct,
            "of": "step" if basis is not None and basis.n_steps else "span"}


def _load(trace: Trace | str | os.PathLike) -> Trace:
    if isinstance(trace, Trace):
        return trace
    from .load import load
    return load(trace)


# -- one trace ----------------------------------------------------------------------------
def analyze(trace: Trace | str | os.PathLike, n_windows: int = DEFAULT_WINDOWS,
            detector: Detector | str | None = None, classifier: Classifier | str | None = None,
            threshold: float | None = None, severity: SeverityConfig = SEVERITY) -> Analysis:
    """Cut a trace into windows, score them, name the pattern of flagged ones, rank findings
    (judged by `severity`: the cut-offs of `traceap.findings`)."""
    check_windows(n_windows)
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise TraceapError("the threshold must be between 0 and 1")
    t = _load(trace)
    notes: list[str] = []
    det = resolve_detector(detector, notes)
    det_name = str(det.name)
    clf = resolve_classifier(classifier, det, notes)
    windows = Windows(t, n_windows)

    scores = clip01(det.score_windows(windows))
    if scores.shape != (windows.n,):
        raise TraceapError(f"detector {det_name!r} returned {scores.shape} scores for "
                           f"{windows.n} windows")
    thr = float(threshold if threshold is not None else
                det.threshold if det.threshold is not None else DEFAULT_THRESHOLD)
    flagged = np.flatnonzero(scores >= thr)

    from .patterns import REGISTRY, pattern_scores
    pscores = pattern_scores(windows)
    calls = clf.classify(windows, flagged.tolist(), scores) if len(flagged) else []
    account = idle_mod.measure(t)
    basis = step_basis(t, account)
    findings, dropped = _findings(windows, calls, REGISTRY, account, basis, det_name, pscores, thr,
                                  severity)
    shown = {f.pattern for f in findings}
    by_window: dict[int, PatternCall] = {c.window: c for c in calls}

    present = _present(windows, REGISTRY, shown, pscores, thr)
    results = []
    for i in range(windows.n):
        c = by_window.get(i)
        named = c.pattern if c and not c.false_alarm and c.pattern in shown else None
        results.append(WindowResult(
            index=i, start_us=float(windows.edges[i]), end_us=float(windows.edges[i + 1]),
            score=round(float(scores[i]), 6), flagged=bool(i in by_window or scores[i] >= thr),
            pattern=named, confidence=None if c is None else round(float(c.confidence), 6),
            patterns=_window_patterns(present, i, named)))

    span = t.span
    n_false = sum(1 for c in calls if c.false_alarm or c.pattern is None)
    if not t.has_gpu:
        notes.append("CPU-only trace: no GPU activity, so the eight GPU anti-patterns do not apply")
    else:
        notes.insert(0, describe_idle(account))
        notes.extend(n for n in [launch_bound_note(account)] if n)
        if account.by_cause["warmup"] > 0:
            src = ", ".join(f"{k} {fmt_us(v)}" for k, v in
                            sorted(account.warmup_sources.items(), key=lambda kv: -kv[1]))
            steps = (f"; profiler step(s) {account.warmup_steps} are warm-up and left out of "
                     f"per-step figures" if account.warmup_steps else "")
            notes.append(f"warm-up: {fmt_us(account.by_cause['warmup'])} of GPU idle time is "
                         f"one-off start-up ({src}), not a steady-state anti-pattern{steps}")
    if n_false:
        notes.append(f"{n_false} flagged window(s) show no known anti-pattern mechanism "
                     f"(likely false alarms of the {det_name} detector)")
    notes.extend(dropped)
    if t.steps:
        step = float(np.median([x.end_us - x.start_us for x in t.steps]))
        if step > 0 and windows.width_us > 0.2 * step:
            # The paper's setting is 2-3 steps in 100 windows (about 30-50 per step).
            suggest = int(min(5000, max(windows.n, 33 * len(t.steps))))
            notes.append(f"each window spans {windows.width_us / step:.2f} profiler steps, so "
                         f"short stalls are averaged away; --windows {suggest} gives about 33 "
                         f"windows per step")
    notes.extend(f"trace warning: {w}" for w in t.meta.warnings[:5])
    return Analysis(trace_path=t.meta.path, n_windows=windows.n, span_us=(span[0], span[1]),
                    windows=results, findings=findings, detector=det_name,
                    pattern_scores=pscores, summary=summarize(t), notes=notes, idle=account,
                    idle_per_window=idle_mod.cause_per_window(windows), basis=basis,
                    threshold=thr, severity=severity, has_gpu=bool(t.has_gpu),
                    steps=step_numbers(t),
                    amounts={pid: got for pid, p in REGISTRY.items() if (got := p.amounts(windows))},
                    inefficient=inefficient_account(windows, account))


def _present(windows: Windows, registry, shown: set[str], pscores: dict[str, np.ndarray],
             threshold: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Reported pattern id -> (per window: its rule flags it, the time it costs there)."""
    return {pid: (pscores.get(pid, np.zeros(windows.n)) >= threshold,
                  registry[pid].window_lost(windows)) for pid in shown if pid in registry}


def _window_patterns(present: dict[str, tuple[np.ndarray, np.ndarray]], i: int,
                     named: str | None) -> list[str]:
    """Every reported pattern present in window `i` (its rule flags it, or the classifier
    named it): the named one first, the others by the time they cost there, most first.  An
    FP32 run with a loader stall reads as the stall, FP32 beside it, where the stall is."""
    here = [(pid, float(lost[i])) for pid, (flag, lost) in present.items()
            if (flag[i] or pid == named)]
    return [pid for pid, _ in sorted(here, key=lambda pl: (pl[0] != named, -pl[1]))]


def _findings(windows: Windows, calls: list[PatternCall], registry, account: IdleAccount,
              basis: StepBasis, det_name: str, pscores: dict[str, np.ndarray],
              threshold: float, severity: SeverityConfig = SEVERITY
              ) -> tuple[list[Finding], list[str]]:
    """One finding per pattern, judged by its measured time lost; (findings, notes on the
    ones not reported).

    A pattern the detector did not flag is still reported when its own rule flags windows and
    its mechanism costs at least the medium cut-off: a large measured cost is never hidden
    because another detector scored the windows lower."""
    groups: dict[str, list[PatternCall]] = {}
    for c in calls:
        if c.pattern and not c.false_alarm:
            groups.setdefault(c.pattern, []).append(c)
    out, dropped = [], []
    everywhere = np.arange(windows.n)
    for pid, pat in registry.items():
        cs = groups.get(pid, [])
        rule_idx = np.flatnonzero(pscores.get(pid, np.zeros(windows.n)) >= threshold)
        if not cs and not len(rule_idx):
            continue
        idx = sorted(c.window for c in cs) if cs else rule_idx.tolist()
        lost, lost_in_steps = pat.time_lost(windows, account)
        per_step, gain, pct, sev = judge(lost, lost_in_steps, basis,
                                         pat.gain_cap_us(windows, basis.n_steps), severity)
        if not cs and (pct < severity.medium_pct or lost <= 0):
            continue  # the rule's own flags matter only for a large measured cost
        ev = pat.evidence(windows, everywhere, where=idx)
        title = pat.title_for(ev.numbers)
        if not pat.supported(ev.numbers):
            dropped.append(f"{len(idx)} window(s) named {pid} not reported: no evidence of its "
                           f"mechanism costing GPU time ({fmt_us(lost)} measured)")
            continue
        if not severity.reportable(lost, pct):
            dropped.append(f"{pid} not reported: it costs {fmt_us(lost)} of GPU time, "
                           f"{pct:.2f}% of the {basis.unit} (under the "
                           f"{severity.min_gain_pct}% floor)")
            continue
        if cs:
            best = max(cs, key=lambda c: c.confidence)
            fix = pat.fix_for(ev.numbers) if best.source == "offline" or not best.fix else best.fix
            explanation = best.explanation
        else:
            fix = pat.fix_for(ev.numbers)
            explanation = (f"reported from the idle-time accounting: the {pid} rule flags "
                           f"{len(idx)} window(s) and the mechanism costs {pct:.1f}% of the "
                           f"{basis.unit}, though the {det_name} detector scored these windows "
                           f"below its threshold")
        out.append(Finding(
            pattern=pid, windows=[int(i) for i in idx], start_us=float(windows.edges[idx[0]]),
            end_us=float(windows.edges[idx[-1] + 1]), severity=sev, evidence=ev.text, fix=fix,
            time_lost_us=lost, title=title, explanation=explanation,
            time_lost_per_step_us=per_step, gain_us=gain, gain_pct=pct, numbers=ev.numbers,
            source="detector" if cs else "idle accounting"))
    for pid in set(groups) - set(registry):  # a classifier may name what the rules do not know
        dropped.append(f"{len(groups[pid])} window(s) named {pid!r} not reported: no rule "
                       f"measures its cost")
    out.sort(key=finding_order)
    for k, f in enumerate(out, 1):
        f.rank = k
    return out, dropped


__all__ = ["Analysis", "Finding", "InefficientAccount", "WindowResult", "analyze",
           "inefficient_account", "step_basis"]
