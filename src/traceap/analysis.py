"""The pipeline facade: a trace in, an `Analysis` out (windows, scores, findings with fixes).

    analysis = traceap.analysis.analyze("trace.json.gz")        # or a loaded Trace
    analysis.findings[0].evidence, analysis.findings[0].fix
    analysis.to_json()                                           # traceap.analysis/v1

`analyze_job` does the same for every rank of a multi-rank job and adds findings only a
comparison of ranks can make (stragglers, communication exposed on every rank).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from .classify.base import Classifier, PatternCall
from .detectors.base import Detector, clip01
from .errors import TraceapError
from .info import summarize
from .trace import Trace, busy_union
from .windows import DEFAULT_WINDOWS, Windows

SCHEMA = "traceap.analysis/v1"
JOB_SCHEMA = "traceap.analysis/v1+job"
DEFAULT_THRESHOLD = 0.5
#: Severity from the share of the trace span a finding costs.
SEVERITY = ((0.10, "high"), (0.03, "medium"), (0.0, "low"))


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


@dataclass
class Finding:
    """One anti-pattern found in a trace (all its windows), with evidence and a fix."""

    pattern: str
    windows: list[int]
    start_us: float
    end_us: float
    severity: str
    evidence: str
    fix: str
    time_lost_us: float
    title: str
    rank: int | None = None
    explanation: str = ""


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

    def to_json(self) -> dict:
        """The traceap.analysis/v1 object of docs/FORMATS.md (exactly its keys)."""
        return {
            "schema": SCHEMA,
            "trace": self.trace_path,
            "n_windows": int(self.n_windows),
            "span_us": [float(self.span_us[0]), float(self.span_us[1])],
            "windows": [{"index": int(w.index), "start_us": float(w.start_us),
                         "end_us": float(w.end_us), "score": float(w.score),
                         "flagged": bool(w.flagged), "pattern": w.pattern,
                         "confidence": None if w.confidence is None else float(w.confidence)}
                        for w in self.windows],
            "findings": [{"pattern": f.pattern, "windows": [int(i) for i in f.windows],
                          "start_us": float(f.start_us), "end_us": float(f.end_us),
                          "severity": f.severity, "evidence": f.evidence, "fix": f.fix}
                         for f in self.findings],
        }

    @property
    def scores(self) -> np.ndarray:
        """Detector score per window."""
        return np.array([w.score for w in self.windows])

    @property
    def flagged(self) -> np.ndarray:
        """Indices of flagged windows."""
        return np.array([w.index for w in self.windows if w.flagged], dtype=np.int64)


@dataclass
class JobAnalysis:
    """A multi-rank job: one `Analysis` per rank plus findings across ranks."""

    path: str
    ranks: list[Analysis]
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """{"schema": "traceap.analysis/v1+job", "job", "ranks": [v1 objects], "cross_rank"}."""
        return {
            "schema": JOB_SCHEMA,
            "job": self.path,
            "ranks": [a.to_json() for a in self.ranks],
            "cross_rank": [{"pattern": f.pattern, "rank": f.rank, "severity": f.severity,
                            "evidence": f.evidence, "fix": f.fix,
                            "time_lost_us": float(f.time_lost_us)} for f in self.findings],
        }


# -- choosing the stages ------------------------------------------------------------------
def default_model_path() -> Path:
    """Where the bundled trained detector lives (traceap/data/model.pt)."""
    return Path(str(resources.files("traceap") / "data" / "model.pt"))


def resolve_detector(detector: Detector | str | None, notes: list[str]) -> Detector:
    """A detector instance from an instance, a name, or None (the best one available)."""
    from .detectors.registry import make_detector

    if detector is None:
        path = default_model_path()
        if path.exists():
            try:
                det = make_detector("hybrid")
                notes.append(f"detector: the trained model ({path.name}) averaged with the "
                             f"expert rules")
                return det
            except Exception as exc:  # noqa: BLE001 - a broken checkpoint must not stop analysis
                notes.append(f"detector: expert rules (the bundled model did not load: {exc})")
        else:
            notes.append("detector: expert rules (no trained model bundled)")
        return make_detector("expert")
    if isinstance(detector, str):
        return make_detector(detector)
    return detector


def resolve_classifier(classifier: Classifier | str | None, detector: Detector | None = None,
                       notes: list[str] | None = None) -> Classifier:
    """A classifier instance from an instance, a name, or None (offline expert rules).

    The offline classifier blends in the detector's learned pattern head when it has one
    (`pattern_probabilities`, e.g. the trained model)."""
    from .classify import make_classifier

    if classifier is None or classifier == "offline":
        head = getattr(detector, "pattern_probabilities", None)
        if head is not None and notes is not None:
            notes.append("classifier: expert rules, averaged with the model's pattern scores")
        return make_classifier("offline", pattern_head=head)
    if isinstance(classifier, str):
        return make_classifier(classifier)
    return classifier


def _load(trace: Trace | str | os.PathLike) -> Trace:
    if isinstance(trace, Trace):
        return trace
    from .load import load
    return load(trace)


def severity_of(time_lost_us: float, span_us: float) -> str:
    """'high', 'medium' or 'low' from the share of the span a finding costs."""
    share = time_lost_us / span_us if span_us > 0 else 0.0
    return next(name for cut, name in SEVERITY if share >= cut)


# -- one trace ----------------------------------------------------------------------------
def analyze(trace: Trace | str | os.PathLike, n_windows: int = DEFAULT_WINDOWS,
            detector: Detector | str | None = None, classifier: Classifier | str | None = None,
            threshold: float | None = None) -> Analysis:
    """Cut a trace into windows, score them, name the pattern of flagged ones, rank findings."""
    if n_windows < 1:
        raise TraceapError("the number of windows must be at least 1")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise TraceapError("the threshold must be between 0 and 1")
    t = _load(trace)
    notes: list[str] = []
    det = resolve_detector(detector, notes)
    det_name = str(getattr(det, "name", type(det).__name__))
    clf = resolve_classifier(classifier, det, notes)
    windows = Windows(t, n_windows)

    scores = clip01(det.score_windows(windows))
    if scores.shape != (windows.n,):
        raise TraceapError(f"detector {det_name!r} returned {scores.shape} scores for "
                           f"{windows.n} windows")
    thr = float(threshold if threshold is not None else getattr(det, "threshold", DEFAULT_THRESHOLD))
    flagged = np.flatnonzero(scores >= thr)

    from .patterns import REGISTRY, pattern_scores
    pscores = pattern_scores(windows)
    calls = clf.classify(windows, flagged.tolist(), scores) if len(flagged) else []
    by_window: dict[int, PatternCall] = {c.window: c for c in calls}

    results = []
    for i in range(windows.n):
        c = by_window.get(i)
        results.append(WindowResult(
            index=i, start_us=float(windows.edges[i]), end_us=float(windows.edges[i + 1]),
            score=round(float(scores[i]), 6), flagged=bool(i in by_window or scores[i] >= thr),
            pattern=c.pattern if c and not c.false_alarm else None,
            confidence=None if c is None else round(float(c.confidence), 6)))

    findings = _findings(windows, calls, REGISTRY)
    span = t.span
    n_false = sum(1 for c in calls if c.false_alarm or c.pattern is None)
    if not t.has_gpu:
        notes.append("CPU-only trace: no GPU activity, so the eight GPU anti-patterns do not apply")
    if n_false:
        notes.append(f"{n_false} flagged window(s) show no known anti-pattern mechanism "
                     f"(likely false alarms of the {det_name} detector)")
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
                    pattern_scores=pscores, summary=summarize(t), notes=notes)


def _findings(windows: Windows, calls: list[PatternCall], registry) -> list[Finding]:
    """One finding per pattern over all its windows, ranked by time lost."""
    groups: dict[str, list[PatternCall]] = {}
    for c in calls:
        if c.pattern and not c.false_alarm:
            groups.setdefault(c.pattern, []).append(c)
    span = float(windows.edges[-1] - windows.edges[0])
    out = []
    for pid, cs in groups.items():
        idx = sorted(c.window for c in cs)
        best = max(cs, key=lambda c: c.confidence)
        pat = registry.get(pid)
        if pat is not None:
            ev = pat.evidence(windows, idx)
            evidence, lost, title = ev.text, ev.time_lost_us, pat.title
            fix = pat.fix if best.source == "offline" or not best.fix else best.fix
        else:  # a classifier may name something the rules do not know
            evidence, lost, title, fix = best.evidence, 0.0, pid, best.fix
        out.append(Finding(
            pattern=pid, windows=idx, start_us=float(windows.edges[idx[0]]),
            end_us=float(windows.edges[idx[-1] + 1]), severity=severity_of(lost, span),
            evidence=evidence, fix=fix, time_lost_us=float(lost), title=title,
            explanation=best.explanation))
    out.sort(key=lambda f: -f.time_lost_us)
    for k, f in enumerate(out, 1):
        f.rank = k
    return out


# -- a multi-rank job ---------------------------------------------------------------------
@dataclass(frozen=True)
class JobConfig:
    """Cross-rank thresholds: how much slower a straggler computes, how exposed is too exposed."""

    straggler_excess: float = 0.10   # compute time 10% over the median rank
    step_spread: float = 0.20        # slowest - fastest step over the median step
    exposed_share: float = 0.05      # TraceLens: exposed communication over 5% of GPU time


def analyze_job(job, n_windows: int = DEFAULT_WINDOWS, detector: Detector | str | None = None,
                classifier: Classifier | str | None = None, threshold: float | None = None,
                config: JobConfig = JobConfig()) -> JobAnalysis:
    """Analyse every rank of a job (a `Job` or a folder) and compare the ranks."""
    from .load import Job, load_job
    from .progress import track

    if not isinstance(job, Job):
        job = load_job(job)
    notes: list[str] = []
    det = resolve_detector(detector, notes)
    clf = resolve_classifier(classifier, det, notes)
    ranks = [analyze(t, n_windows, det, clf, threshold)
             for t in track(job.traces, "analysing ranks")]
    for a in ranks:
        a.notes[:0] = [n for n in notes if n not in a.notes]
    findings = cross_rank_findings(job.traces, config) if len(job.traces) > 1 else []
    return JobAnalysis(path=str(job.path), ranks=ranks, findings=findings, notes=notes)


def rank_profile(trace: Trace) -> dict:
    """Per-rank totals the cross-rank comparison needs (per profiler step where steps exist)."""
    from .patterns.signals import compute_rows, nccl_rows

    n_steps = max(len(trace.steps), 1)
    comp, nccl = compute_rows(trace), nccl_rows(trace)
    compute_us = busy_union(trace.ts[comp], trace.end[comp])
    comm_us = busy_union(trace.ts[nccl], trace.end[nccl])
    both = np.concatenate((comp, nccl))
    exposed = busy_union(trace.ts[both], trace.end[both]) - compute_us
    step_us = (float(np.mean([s.end_us - s.start_us for s in trace.steps]))
               if trace.steps else None)
    return {"rank": trace.meta.rank, "steps": len(trace.steps), "step_us": step_us,
            "compute_us": compute_us / n_steps, "comm_us": comm_us / n_steps,
            "exposed_us": exposed / n_steps, "n_steps_norm": n_steps}


def cross_rank_findings(traces: list[Trace], config: JobConfig = JobConfig()) -> list[Finding]:
    """Stragglers (a rank computing longer while the others wait in NCCL), step times that
    differ across ranks, and communication exposed on every rank."""
    from .patterns import REGISTRY
    from .patterns.signals import fmt_us

    prof = [rank_profile(t) for t in traces]
    comp = np.array([p["compute_us"] for p in prof])
    comm = np.array([p["comm_us"] for p in prof])
    exposed = np.array([p["exposed_us"] for p in prof])
    out: list[Finding] = []
    med = float(np.median(comp))
    if med > 0 and len(prof) > 1:
        worst = int(np.argmax(comp))
        excess = comp[worst] / med - 1.0
        # A straggler arrives last at each collective, so it waits least: a rank that computes
        # more but also waits more in NCCL is not the one holding the others up.
        if excess >= config.straggler_excess and comm[worst] <= np.median(comm):
            others = np.delete(np.arange(len(prof)), worst)
            wait = float(np.median(comm[others]) - comm[worst])
            steps = max(p["n_steps_norm"] for p in prof)
            lost = max(comp[worst] - med, 0.0) * steps
            step_txt = "per step " if traces[worst].steps else ""
            out.append(Finding(
                pattern="straggler", windows=[], start_us=float(traces[worst].span[0]),
                end_us=float(traces[worst].span[1]),
                severity="high" if excess >= 0.25 else "medium",
                evidence=(f"rank {prof[worst]['rank']} computes {fmt_us(comp[worst])} {step_txt}"
                          f"against a median of {fmt_us(med)} (+{100 * excess:.0f}%)" +
                          (f"; the other ranks spend {fmt_us(wait)} more {step_txt}in NCCL, "
                           f"waiting for it" if wait > 0 else "")),
                fix=("Balance the work per rank: equal batch sizes and sample lengths per rank "
                     "(DistributedSampler(drop_last=True); bucket variable-size images by "
                     "shape), the same data pipeline speed on every node, no rank-0-only work "
                     "(logging, checkpointing, evaluation) inside the step - move it after "
                     "a barrier or to every N steps; check that rank's GPU clocks/thermals."),
                time_lost_us=float(lost), title="Straggler rank (others wait for it)",
                rank=prof[worst]["rank"]))
    steps = np.array([p["step_us"] if p["step_us"] else np.nan for p in prof])
    if len(prof) > 1 and np.isfinite(steps).sum() > 1:
        ok = np.flatnonzero(np.isfinite(steps))
        slow, fast = ok[np.argmax(steps[ok])], ok[np.argmin(steps[ok])]
        med_step = float(np.median(steps[ok]))
        spread = (steps[slow] - steps[fast]) / med_step if med_step > 0 else 0.0
        if spread >= config.step_spread:
            d_comm, d_comp = comm[slow] - comm[fast], comp[slow] - comp[fast]
            why = ("mostly NCCL time: it waits on its peers longer (uneven all-to-all or "
                   "collective sizes, or a peer arriving late)" if d_comm >= d_comp else
                   "mostly compute: it has more work")
            out.append(Finding(
                pattern="rank_imbalance", windows=[], start_us=float(traces[slow].span[0]),
                end_us=float(traces[slow].span[1]),
                severity="high" if spread >= 0.5 else "medium",
                evidence=(f"profiler steps take {fmt_us(steps[slow])} on rank "
                          f"{prof[slow]['rank']} but {fmt_us(steps[fast])} on rank "
                          f"{prof[fast]['rank']} (median {fmt_us(med_step)}, spread "
                          f"{100 * spread:.0f}%); the difference is {why}: NCCL "
                          f"{fmt_us(comm[slow])} vs {fmt_us(comm[fast])}, compute "
                          f"{fmt_us(comp[slow])} vs {fmt_us(comp[fast])}"),
                fix=("Even out what each rank does per step: balanced embedding/expert sharding "
                     "(TorchRec planner with real table sizes; MoE capacity factor), equal "
                     "batch and sequence sizes per rank, and no rank-specific work (logging, "
                     "evaluation, checkpointing) inside the step.  Then compare the ranks' "
                     "traces of the same step again."),
                time_lost_us=float(steps[slow] - med_step), title="Step time differs across ranks",
                rank=prof[slow]["rank"]))
    tot = comp + exposed
    share = np.where(tot > 0, exposed / np.maximum(tot, 1e-9), 0.0)
    if len(prof) > 1 and np.all(share >= config.exposed_share) and np.any(comm > 0):
        inherent = float(np.min(exposed))
        out.append(Finding(
            pattern="nccl_compute_no_overlap", windows=[], start_us=float(traces[0].span[0]),
            end_us=float(traces[0].span[1]),
            severity=severity_of(inherent, float(np.median(tot))),
            evidence=(f"communication is exposed on every rank: {fmt_us(inherent)} to "
                      f"{fmt_us(float(np.max(exposed)))} per step "
                      f"({100 * float(np.min(share)):.0f}-{100 * float(np.max(share)):.0f}% of "
                      f"GPU time); the minimum over ranks is not waiting for a straggler but "
                      f"communication that no compute hides"),
            fix=REGISTRY["nccl_compute_no_overlap"].fix, time_lost_us=inherent,
            title="Exposed communication on every rank", rank=None))
    # Here `rank` is the job member a finding concerns (None: every rank), not an ordering.
    out.sort(key=lambda f: -f.time_lost_us)
    return out


__all__ = ["Analysis", "Finding", "JobAnalysis", "JobConfig", "WindowResult", "analyze",
           "analyze_job", "cross_rank_findings", "rank_profile", "severity_of"]
