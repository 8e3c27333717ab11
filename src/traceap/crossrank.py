"""Findings only a comparison of ranks can make, from small per-rank summaries.

    summaries = [rank_summary(t) for t in job.traces]     # one small record per rank
    findings = cross_rank_findings(summaries)              # stragglers, imbalance, exposed comm

`rank_summary` is the only step that reads a trace: its output is a few numbers (step times,
the idle account by cause, communication times), so ranks can be summarised in separate
processes (or Ray tasks) and compared in one place.  Every number comes from the same
definitions as a single trace's report (`traceap.idle`): compute = GPU busy time, exposed
communication = the `communication` idle cause, time per step = inside the steady profiler
steps divided by their number.  Severity follows `traceap.findings` like any finding.

A cross-rank finding re-explains time already in the ranks' own accounts (who waits for whom),
so a job's totals are the sum over ranks and never add a cross-rank finding on top.

Copies of one trace given as two ranks (identical content) and traces that claim the same rank
are reported as such (`find_copies`, `same_rank_claims`) and not compared as a job.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

import numpy as np

from .findings import SEVERITY, Finding, SeverityConfig, StepBasis, judge
from .idle import CAUSES, MECHANISMS, measure
from .trace import Trace, merged_intervals
from .units import fmt_us
from .windows import covered_time


@dataclass(frozen=True)
class JobConfig:
    """Cross-rank thresholds: how much slower a straggler computes, how uneven steps may be,
    how exposed is too exposed (severity then follows `SeverityConfig` like every finding)."""

    straggler_excess: float = 0.10   # compute time 10% over the median rank
    step_spread: float = 0.20        # slowest - fastest step over the median step
    exposed_share: float = 0.05      # TraceLens: exposed communication over 5% of GPU time


@dataclass(frozen=True)
class RankSummary:
    """What the cross-rank comparison needs from one rank (small, picklable, JSON-able)."""

    rank: int | None
    declared_rank: int | None        # what the trace's distributedInfo says
    path: str
    fingerprint: str                 # identical traces have identical fingerprints
    span_us: tuple[float, float]
    n_steps: int                     # steady profiler steps (0 = none)
    step_us: float | None            # their median duration
    step_times_us: tuple[float, ...] = ()
    #: Per steady step (totals without steps): GPU busy (compute), all NCCL, exposed NCCL.
    compute_us: float = 0.0
    comm_us: float = 0.0
    exposed_comm_us: float = 0.0
    #: The whole trace: GPU idle and its causes.
    idle_us: float = 0.0
    idle_by_cause: dict = field(default_factory=dict)

    @property
    def basis(self) -> StepBasis:
        """What this rank's gains are a share of."""
        return StepBasis(self.n_steps, self.step_us, self.span_us[1] - self.span_us[0])

    def to_json(self) -> dict:
        """Plain dict (for logs, other processes, the job JSON)."""
        return asdict(self)


def fingerprint(trace: Trace) -> str:
    """A hash of the trace's events (times, durations, names): equal for copies of one file."""
    h = hashlib.blake2b(digest_size=12)
    h.update(np.int64(len(trace)).tobytes())
    for col in (trace.ts, trace.dur, trace.name, trace.kind):
        h.update(np.ascontiguousarray(col).tobytes())
    h.update("\x00".join(trace.names).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def rank_summary(trace: Trace) -> RankSummary:
    """The per-rank record `cross_rank_findings` compares."""
    from .measures.signals import nccl_rows

    acc = measure(trace)
    steady = acc.steady_steps
    n = len(steady)
    step_times = tuple(float(e - s) for s, e, _ in steady)
    if n:
        starts, ends = [s for s, _, _ in steady], [e for _, e, _ in steady]
        comm_ids = [m.id for m in MECHANISMS if m.cause == "communication"]
        exposed = sum(acc.time_in(m, starts, ends) for m in comm_ids) / n
        compute = acc.busy_in_steady_us / n
    else:
        exposed = acc.by_cause["communication"]
        compute = acc.busy_us
    nccl = nccl_rows(trace)
    cs, ce = merged_intervals(trace.ts[nccl], trace.end[nccl])
    if n and len(cs):
        f = covered_time(cs, ce, np.array([x for s, e, _ in steady for x in (s, e)]))
        comm = float(np.sum(f[1::2] - f[0::2])) / n
    else:
        comm = float(np.sum(ce - cs))
    di = trace.meta.distributed_info or {}
    declared = di.get("rank") if isinstance(di.get("rank"), int) else None
    lo, hi = trace.span
    return RankSummary(
        rank=trace.meta.rank, declared_rank=declared, path=trace.meta.path,
        fingerprint=fingerprint(trace), span_us=(float(lo), float(hi)), n_steps=n,
        step_us=float(np.median(step_times)) if n else None, step_times_us=step_times,
        compute_us=float(compute), comm_us=comm, exposed_comm_us=float(exposed),
        idle_us=float(acc.total_us), idle_by_cause={c: float(v) for c, v in acc.by_cause.items()})


def find_copies(summaries: list[RankSummary]) -> list[list[int]]:
    """Groups (positions in `summaries`, 2 or more) of traces with identical content."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(summaries):
        groups.setdefault(s.fingerprint, []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def same_rank_claims(summaries: list[RankSummary]) -> list[list[int]]:
    """Groups of different traces whose distributedInfo claims the same rank."""
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(summaries):
        if s.declared_rank is not None:
            groups.setdefault(s.declared_rank, []).append(i)
    out = []
    for g in groups.values():
        if len({summaries[i].fingerprint for i in g}) > 1:
            out.append(g)
    return out


def cross_rank_findings(summaries: list[RankSummary | Trace], config: JobConfig = JobConfig(),
                        severity: SeverityConfig = SEVERITY) -> list[Finding]:
    """Stragglers (a rank computing longer while the others wait in NCCL), step times that
    differ across ranks, and communication exposed on every rank.

    Copies of one trace are compared once (the first of each group is kept)."""
    prof = [s if isinstance(s, RankSummary) else rank_summary(s) for s in summaries]
    dup = {i for g in find_copies(prof) for i in g[1:]}
    prof = [p for i, p in enumerate(prof) if i not in dup]
    if len(prof) < 2:
        return []
    found = [_straggler(prof, config, severity), _rank_imbalance(prof, config, severity),
             _exposed_everywhere(prof, config, severity)]
    out = [f for f in found if f is not None and severity.reportable(f.time_lost_us, f.gain_pct)]
    # Here `rank` is the job member a finding concerns (None: every rank), not an ordering.
    out.sort(key=lambda f: -f.gain_pct)
    return out


def _finding(pattern: str, p: RankSummary, lost_per_unit: float, title: str, evidence: str,
             fix: str, rank: int | None, numbers: dict, severity: SeverityConfig,
             cap: float | None = None) -> Finding:
    """A cross-rank finding judged by the one gain/severity rule on rank p's step basis."""
    basis = p.basis
    total = lost_per_unit * max(basis.n_steps, 1)
    per_step, gain, pct, sev = judge(total, total if basis.n_steps else None, basis, cap,
                                     severity)
    return Finding(pattern=pattern, windows=[], start_us=p.span_us[0], end_us=p.span_us[1],
                   severity=sev, evidence=evidence, fix=fix, time_lost_us=float(total),
                   title=title, rank=rank, time_lost_per_step_us=per_step, gain_us=gain,
                   gain_pct=pct, numbers=numbers, source="cross-rank",
                   explanation=("compared across ranks; this time is already in the ranks' "
                                "own idle accounts (waiting on communication), so job "
                                "totals do not add it again"))


def _unit(p: RankSummary) -> str:
    return "per step " if p.n_steps else ""


def _straggler(prof: list[RankSummary], config: JobConfig,
               severity: SeverityConfig) -> Finding | None:
    """The rank that computes longest, when the others wait for it in NCCL."""
    comp = np.array([p.compute_us for p in prof])
    comm = np.array([p.comm_us for p in prof])
    med = float(np.median(comp))
    if med <= 0:
        return None
    worst = int(np.argmax(comp))
    excess = comp[worst] / med - 1.0
    # A straggler arrives last at each collective, so it waits least: a rank that computes
    # more but also waits more in NCCL is not the one holding the others up.
    if not (excess >= config.straggler_excess and comm[worst] <= np.median(comm)):
        return None
    others = np.delete(np.arange(len(prof)), worst)
    wait = float(np.median(comm[others]) - comm[worst])
    p = prof[worst]
    return _finding(
        "straggler", p, max(comp[worst] - med, 0.0), "Straggler rank (others wait for it)",
        (f"rank {p.rank} computes {fmt_us(comp[worst])} {_unit(p)}against a median of "
         f"{fmt_us(med)} (+{100 * excess:.0f}%)" +
         (f"; the other ranks spend {fmt_us(wait)} more {_unit(p)}in NCCL, waiting for it"
          if wait > 0 else "")),
        ("Balance the work per rank: equal batch sizes and sample lengths per rank "
         "(DistributedSampler(drop_last=True); bucket variable-size images by shape), "
         "the same data pipeline speed on every node, no rank-0-only work (logging, "
         "checkpointing, evaluation) inside the step - move it after a barrier or to "
         "every N steps; check that rank's GPU clocks/thermals."),
        p.rank, {"compute_us": round(float(comp[worst]), 1), "median_compute_us":
                 round(med, 1), "excess": round(float(excess), 3),
                 "others_wait_us": round(max(wait, 0.0), 1)}, severity)


def _rank_imbalance(prof: list[RankSummary], config: JobConfig,
                    severity: SeverityConfig) -> Finding | None:
    """Profiler steps that take longer on one rank than on another, and whether NCCL or
    compute makes the difference."""
    comp = np.array([p.compute_us for p in prof])
    comm = np.array([p.comm_us for p in prof])
    steps = np.array([p.step_us if p.step_us else np.nan for p in prof])
    if np.isfinite(steps).sum() <= 1:
        return None
    ok = np.flatnonzero(np.isfinite(steps))
    slow, fast = ok[np.argmax(steps[ok])], ok[np.argmin(steps[ok])]
    med_step = float(np.median(steps[ok]))
    spread = (steps[slow] - steps[fast]) / med_step if med_step > 0 else 0.0
    if spread < config.step_spread:
        return None
    d_comm, d_comp = comm[slow] - comm[fast], comp[slow] - comp[fast]
    why = ("mostly NCCL time: it waits on its peers longer (uneven all-to-all or "
           "collective sizes, or a peer arriving late)" if d_comm >= d_comp else
           "mostly compute: it has more work")
    ps, pf = prof[slow], prof[fast]
    return _finding(
        "rank_imbalance", ps, float(steps[slow] - med_step),
        "Step time differs across ranks",
        (f"profiler steps take {fmt_us(steps[slow])} on rank {ps.rank} but "
         f"{fmt_us(steps[fast])} on rank {pf.rank} (median {fmt_us(med_step)}, spread "
         f"{100 * spread:.0f}%); the difference is {why}: NCCL {fmt_us(comm[slow])} vs "
         f"{fmt_us(comm[fast])}, compute {fmt_us(comp[slow])} vs {fmt_us(comp[fast])} "
         f"per step"),
        ("Even out what each rank does per step: balanced embedding/expert sharding "
         "(TorchRec planner with real table sizes; MoE capacity factor), equal batch and "
         "sequence sizes per rank, and no rank-specific work (logging, evaluation, "
         "checkpointing) inside the step.  Then compare the ranks' traces of the same "
         "step again."),
        ps.rank, {"slow_step_us": round(float(steps[slow]), 1),
                  "fast_step_us": round(float(steps[fast]), 1),
                  "median_step_us": round(med_step, 1), "spread": round(float(spread), 3)},
        severity)


def _exposed_everywhere(prof: list[RankSummary], config: JobConfig,
                        severity: SeverityConfig) -> Finding | None:
    """Communication exposed on every rank: the least exposed rank is waiting for no
    straggler, so what it shows is communication no compute hides."""
    from .idle import pattern_of
    from .patterns import REGISTRY

    pid = pattern_of("nccl")  # the pattern whose time exposed collectives are
    comp = np.array([p.compute_us for p in prof])
    comm = np.array([p.comm_us for p in prof])
    exposed = np.array([p.exposed_comm_us for p in prof])
    tot = comp + exposed
    share = np.where(tot > 0, exposed / np.maximum(tot, 1e-9), 0.0)
    if not (np.all(share >= config.exposed_share) and np.any(comm > 0)):
        return None
    k = int(np.argmin(exposed))
    inherent = float(exposed[k])
    p = prof[k]
    return _finding(
        pid, p, inherent, "Exposed communication on every rank",
        (f"communication is exposed on every rank: {fmt_us(inherent)} to "
         f"{fmt_us(float(np.max(exposed)))} {_unit(p)}"
         f"({100 * float(np.min(share)):.0f}-{100 * float(np.max(share)):.0f}% of GPU time); "
         f"the minimum over ranks (rank {p.rank}) is not waiting for a straggler but "
         f"communication that no compute hides"),
        REGISTRY[pid].fix, None,
        {"exposed_min_us": round(inherent, 1), "exposed_max_us": round(float(np.max(exposed)), 1),
         "compute_us": round(float(comp[k]), 1)}, severity, cap=float(comp[k]))


def job_totals(summaries: list[RankSummary], rank_findings: list[list[Finding]]) -> dict:
    """A job's totals: the sum over ranks of GPU idle (by cause) and of the ranks' findings'
    time lost.  Cross-rank findings are never added (their time is in the ranks' accounts)."""
    by = {c: 0.0 for c in CAUSES}
    for s in summaries:
        for c, v in s.idle_by_cause.items():
            by[c] = by.get(c, 0.0) + v
    return {"gpu_idle_us": round(sum(s.idle_us for s in summaries), 1),
            "by_cause": {c: round(v, 1) for c, v in by.items()},
            "time_lost_us": round(sum(f.time_lost_us for fs in rank_findings for f in fs), 1),
            "cross_rank_counted": False}


__all__ = ["JobConfig", "RankSummary", "cross_rank_findings", "find_copies", "fingerprint",
           "job_totals", "rank_summary", "same_rank_claims"]
