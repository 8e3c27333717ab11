"""A multi-rank job: every rank analysed (`traceap.analysis.analyze`), then compared.

    job = traceap.job.analyze_job("ranks/")          # a folder of per-rank traces, or a Job
    job.ranks[0].findings, job.findings              # per rank; across ranks (stragglers, ...)
    job.to_json()                                    # traceap.analysis/v1+job

Ranks are read one at a time, each by the process that analyses it (this one, local workers or
Ray tasks: `traceap.parallel`); only small per-rank results come back, and the cross-rank
findings are computed from their summaries (`traceap.crossrank`), so the result is the same
however the work is spread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from .analysis import Analysis, analyze, resolve_classifier, resolve_detector
from .classify.base import Classifier
from .crossrank import (JobConfig, RankSummary, cross_rank_findings, find_copies, job_totals,
                        not_one_job, rank_summary, same_rank_claims)
from .detectors.base import Detector
from .errors import TraceapError
from .findings import SEVERITY, Finding, SeverityConfig
from .trace import Trace
from .windows import DEFAULT_WINDOWS

JOB_SCHEMA = "traceap.analysis/v1+job"


@dataclass
class JobAnalysis:
    """A multi-rank job: one `Analysis` per rank plus findings across ranks."""

    path: str
    ranks: list[Analysis]
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    summaries: list[RankSummary] = field(default_factory=list)
    #: Groups of input files that are copies of one trace (only the first was analysed).
    copies: list[list[str]] = field(default_factory=list)
    #: Rank files that could not be read or analysed: {"path", "error"} (the others were).
    unreadable: list[dict] = field(default_factory=list)
    #: Why the traces are not the ranks of one job (`traceap.crossrank.not_one_job`: world
    #: sizes, backends, ranks claimed twice, time ranges); empty for one job.  Traces that are
    #: not one job are analysed each on its own and never compared.
    not_one_job: list[str] = field(default_factory=list)
    #: How the work ran (where, seconds per rank file, the workers' peak memory); not in the
    #: JSON, which is the same however the ranks were spread.
    run: dict = field(default_factory=dict)

    @property
    def totals(self) -> dict:
        """Sum over ranks of idle time (by cause) and of the ranks' findings' time lost; the
        cross-rank findings are never added (their time is in the ranks' accounts)."""
        return job_totals(self.summaries, [a.findings for a in self.ranks])

    @property
    def one_job(self) -> bool:
        """True when the traces agree as the ranks of one job (and were compared)."""
        return not self.not_one_job

    def to_json(self) -> dict:
        """{"schema": "traceap.analysis/v1+job", "job", "one_job", "not_one_job", "ranks": [v1
        objects], "cross_rank", then "totals", "copies", "unreadable", "notes"}."""
        return {
            "schema": JOB_SCHEMA,
            "job": self.path,
            "one_job": self.one_job,
            "not_one_job": list(self.not_one_job),
            "ranks": [a.to_json() for a in self.ranks],
            "cross_rank": [{"pattern": f.pattern, "rank": f.rank, "severity": f.severity,
                            "evidence": f.evidence, "fix": f.fix,
                            "time_lost_us": float(f.time_lost_us), **f.to_json(),
                            "counted_in_ranks": True} for f in self.findings],
            "totals": self.totals,
            "copies": self.copies,
            "unreadable": list(self.unreadable),
            "notes": list(self.notes),
        }


def analyze_job(job, n_windows: int = DEFAULT_WINDOWS, detector: Detector | str | None = None,
                classifier: Classifier | str | None = None, threshold: float | None = None,
                config: JobConfig = JobConfig(), severity: SeverityConfig = SEVERITY, *,
                workers: int = 1, ray: str | None = None,
                details: Callable[[Analysis, Trace], object] | None = None) -> JobAnalysis:
    """Analyse every rank of a job (a folder of per-rank traces, or a loaded `Job`) and compare
    the ranks.

    Ranks of a folder are read one at a time, each by the process that analyses it: this one
    (`workers` 1), `workers` local processes, or Ray tasks (`ray`: "local", "auto" or a
    cluster address; see `traceap.parallel.Execution`).  Only the small per-rank results come
    back (the `Analysis` and a `RankSummary`), and the cross-rank findings are computed from
    the summaries, so memory holds at most one trace per worker and the results are the same
    however the work is spread.  `details`: what an output needs from each trace, computed
    while the trace is loaded (a module-level function of the analysis and the trace, e.g.
    `traceap.report.html.trace_details`, kept as `Analysis.trace_details`), so that writing
    the output reads no trace again; a job knows nothing of its outputs.

    A rank file that cannot be read is left out and named in `unreadable` and the notes; the
    other ranks are analysed.  Copies of one trace are analysed once and reported as copies;
    traces that claim the same rank are analysed but not compared as one job's ranks."""
    from .load import Job
    from .load.job import trace_files
    from .parallel import Execution, run
    from .progress import track

    # Checked here, once: inside a rank's task these would read as that rank's failure.
    if n_windows < 1:
        raise TraceapError("the number of windows must be at least 1")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise TraceapError("the threshold must be between 0 and 1")
    execution = Execution(workers, ray)
    if isinstance(job, Job):
        if execution.parallel:
            raise TraceapError("ranks already loaded are analysed in this process; give the "
                               "job's folder to analyse its ranks in parallel")
        path, sources = str(job.path), list(job.traces)
    else:
        path = str(job)
        if not Path(path).is_dir():
            raise TraceapError(f"{path}: not a folder of per-rank traces")
        sources = trace_files(path)
        if not sources:
            raise TraceapError(f"{path}: no .json or .json.gz traces in this folder")
    work = RankWork(n_windows, detector, classifier, threshold, severity, details)
    preload = _RANK_PRELOAD + ((details.__module__,) if details is not None else ())
    outcomes = [o for _, o in sorted(track(
        run(analyze_rank, list(enumerate(sources)), work, execution, preload=preload),
        "analysing ranks", total=len(sources)), key=lambda io: io[0])]
    result = _assemble_job(path, outcomes, classifier, config, severity)
    result.run = {"execution": execution.describe(),
                  "rank_seconds": [round(o.seconds, 4) for o in outcomes],
                  "rank_cpu_seconds": [round(o.cpu_seconds, 4) for o in outcomes],
                  "worker_peak_rss_bytes": max(o.peak_rss_bytes for o in outcomes)}
    return result


@dataclass
class RankOutcome:
    """One rank's result, small enough to come back from a worker: its analysis and summary,
    or why it could not be read."""

    index: int                       # position among the job's files
    path: str
    analysis: Analysis | None = None
    summary: RankSummary | None = None
    #: Warnings the trace had when loaded (an analysis lists at most 5 of them in its notes).
    n_warnings: int = 0
    error: str | None = None
    #: How the worker chose its detector and classifier (notes of `resolve_detector`).
    stage_notes: list[str] = field(default_factory=list)
    #: What a stateful classifier gathered on this rank (re-detection changes, LLM records).
    classifier_state: dict = field(default_factory=dict)
    peak_rss_bytes: int = 0
    seconds: float = 0.0             # wall, in the worker: reading + summarising + analysing
    cpu_seconds: float = 0.0         # the worker's CPU time for it
    #: The rank is only the file's position (the trace said none).
    rank_assigned: bool = False


class RankWork:
    """What every rank's task needs; sent to each worker once, where the detector and the
    classifier are built (from their specs) on first use."""

    def __init__(self, n_windows: int, detector, classifier, threshold: float | None,
                 severity: SeverityConfig,
                 details: Callable[[Analysis, Trace], object] | None = None):
        self.n_windows, self.detector, self.classifier = n_windows, detector, classifier
        self.threshold, self.severity, self.details = threshold, severity, details
        self._stages = None

    def stages(self) -> tuple[Detector, Classifier, list[str]]:
        """(detector, classifier, notes on how they were chosen), built once per process."""
        if self._stages is None:
            notes: list[str] = []
            det = resolve_detector(self.detector, notes)
            clf = resolve_classifier(self.classifier, det, notes)
            self._stages = (det, clf, notes)
        return self._stages

    def warm(self) -> None:
        """Build the stages now (run once in the local workers' server, `traceap.parallel`)."""
        self.stages()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_stages"} | {"_stages": None}


#: Errors that make one rank unreadable without stopping the job.
_RANK_ERRORS = (TraceapError, OSError, ValueError, EOFError, MemoryError)
#: Imported once by the local workers' server (`traceap.parallel`), not by every worker.
_RANK_PRELOAD = ("traceap.job", "traceap.crossrank", "traceap.detectors.registry", "traceap.classify")


def analyze_rank(work: RankWork, item: tuple[int, object]) -> RankOutcome:
    """The task of one rank (`traceap.parallel.run`): read its trace (a path, or a `Trace`
    already loaded), summarise it for the cross-rank comparison and analyse it."""
    import time

    from .load import load
    from .parallel import peak_rss_bytes

    t_start, cpu_start = time.perf_counter(), time.process_time()
    index, source = item
    loaded = isinstance(source, Trace)
    path = source.meta.path if loaded else str(source)
    det, clf, stage_notes = work.stages()
    try:
        t = source if loaded else load(source)
        if t.meta.rank is None:          # as `load_job`: the file's position when none is said
            t.meta.rank, t.meta.rank_assigned = index, True
        rank_assigned = t.meta.rank_assigned
        n_warnings = len(t.meta.warnings)
        summary = rank_summary(t)
        a = analyze(t, work.n_windows, det, clf, work.threshold, work.severity)
        if work.details is not None:
            a.trace_details = work.details(a, t)
        # The parent keeps one result per rank: no arrays that grow with the trace.
        a.idle = a.idle.totals_only() if a.idle is not None else None
    except _RANK_ERRORS as exc:
        # The loader's message starts with the path, which the outcome holds already.
        why = (str(exc) or type(exc).__name__).removeprefix(f"{path}: ")
        return RankOutcome(index, path, error=why,
                           stage_notes=list(stage_notes), classifier_state=_take_state(clf),
                           peak_rss_bytes=peak_rss_bytes(),
                           seconds=time.perf_counter() - t_start,
                           cpu_seconds=time.process_time() - cpu_start)
    finally:
        t = None  # the trace goes now, before the next rank is read
    return RankOutcome(index, path, a, summary, n_warnings, None, list(stage_notes),
                       _take_state(clf), peak_rss_bytes(), time.perf_counter() - t_start,
                       time.process_time() - cpu_start, rank_assigned)


def _assemble_job(path: str, outcomes: list[RankOutcome], classifier, config: JobConfig,
                  severity: SeverityConfig) -> JobAnalysis:
    """The job from its ranks' outcomes (in file order), as `load_job` + the serial loop made it:
    ranks ordered by rank id (renumbered when ids repeat), copies analysed once, cross-rank
    findings from the summaries.  Traces that are not one job (`not_one_job`) keep their own
    ranks and file order and are not compared."""
    failed = [o for o in outcomes if o.error is not None]
    ok = [o for o in outcomes if o.error is None]
    if not ok:
        first = failed[0]
        raise TraceapError(f"{path}: none of the {len(failed)} rank file(s) could be read "
                           f"({Path(first.path).name}: {first.error})")
    ok.sort(key=lambda o: o.summary.rank)        # stable: file order among equal ids
    summaries = [o.summary for o in ok]
    copies = find_copies(summaries)
    drop = {i for g in copies for i in g[1:]}
    # Copies are one trace; the others must agree to be one job's ranks.
    why = not_one_job([x for i, x in enumerate(summaries) if i not in drop], config)
    ids = [o.summary.rank for o in ok]
    if len(set(ids)) != len(ids) and not why:   # separate traces keep their own ranks
        for i, o in enumerate(ok):
            _renumber(o, i)
    notes = list(ok[0].stage_notes)
    summaries = [o.summary for o in ok]
    copy_paths = [[summaries[i].path for i in g] for g in copies]
    for g in copies:
        names = ", ".join(Path(summaries[i].path).name or f"#{i}" for i in g)
        notes.append(f"{len(g)} inputs are copies of one trace ({names}): analysed once, not "
                     f"compared as ranks of a job")
    kept = [o for i, o in enumerate(ok) if i not in drop]
    if why:  # separate traces: in the folder's order, as `traceap analyze` would take them
        kept.sort(key=lambda o: Path(o.path).name)
        for o in kept:   # ... each with the rank it says, or none
            if o.rank_assigned:
                o.summary = replace(o.summary, rank=None)
                o.analysis.summary["rank"] = None
    summaries = [o.summary for o in kept]
    claims = same_rank_claims(summaries)
    for g in claims:
        names = ", ".join(Path(summaries[i].path).name for i in g)
        notes.append(f"{names} all say they are rank {summaries[g[0]].declared_rank}: not "
                     f"ranks of one job (e.g. two runs), so they are not compared")
    ranks = [o.analysis for o in kept]
    for o in kept:  # what the caller's classifier would have gathered, in rank order
        _give_state(classifier, o.classifier_state)
    for a in ranks:
        a.notes[:0] = [n for n in notes if n not in a.notes]
    findings = (cross_rank_findings(summaries, config, severity)
                if len(summaries) > 1 and not claims and not why else [])
    job_notes = list(notes)
    if why:
        job_notes.insert(0, f"{path}: not one job ({'; '.join(why)}): analysed as "
                            f"{len(kept)} separate traces")
    for o in failed:
        job_notes.append(f"rank file {Path(o.path).name} could not be read ({o.error}): left "
                         f"out; the other {len(ok)} rank(s) were analysed")
    return JobAnalysis(path=path, ranks=ranks, findings=findings, notes=job_notes,
                       summaries=summaries, copies=copy_paths, not_one_job=why,
                       unreadable=[{"path": o.path, "error": o.error} for o in failed])


def _renumber(o: RankOutcome, rank: int) -> None:
    """Give a rank the id `load_job` gives when ids repeat, with the warning it adds."""
    warning = f"duplicate rank ids in job; rank {o.summary.rank} renumbered {rank}"
    o.summary = replace(o.summary, rank=rank)
    a = o.analysis
    a.summary["rank"] = rank
    a.summary.setdefault("warnings", []).append(warning)
    if o.n_warnings < 5:   # `analyze` lists the trace's first 5 warnings
        a.notes.append(f"trace warning: {warning}")


#: Attributes in which a classifier keeps what it gathered (re-detection `changes`, the LLM
#: classifier's `records`), on itself or on the classifier it wraps (`inner`).
_STATE_LISTS = ("changes", "records")


def _take_state(clf) -> dict:
    """Take what `clf` gathered on one rank out of it (so each rank's part can be kept or
    dropped, and given back to the caller's classifier in rank order)."""
    out: dict = {}
    for prefix, holder in (("", clf), ("inner.", getattr(clf, "inner", None))):
        for attr in _STATE_LISTS:
            got = getattr(holder, attr, None)
            if isinstance(got, list) and got:
                out[prefix + attr] = list(got)
                got.clear()
        down = getattr(holder, "_down", None)
        if down:
            out[prefix + "_down"] = down
    return out


def _give_state(clf, state: dict) -> None:
    for key, value in state.items():
        prefix, _, attr = key.rpartition(".")
        holder = getattr(clf, "inner", None) if prefix else clf
        if holder is None or not hasattr(holder, attr):
            continue
        if isinstance(value, list):
            getattr(holder, attr).extend(value)
        elif not getattr(holder, attr):
            setattr(holder, attr, value)


__all__ = ["JobAnalysis", "JobConfig", "RankOutcome", "RankWork", "analyze_job", "analyze_rank",
           "cross_rank_findings", "rank_summary"]
