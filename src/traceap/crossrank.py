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
are reported as such (`find_copies`, `same_rank_claims`) and not compared as a job; nor are
traces that do not agree as one job's ranks (`not_one_job`: world size, backend, clocks).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

import numpy as np

from .findings import SEVERITY, Finding, SeverityConfig, StepBasis, judge
from .idle import CAUSE_TITLES, CAUSES, MECHANISM_IDS, MECHANISMS, measure
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
    #: Ranks of one job record at the same time, so their wall-clock ranges overlap; clocks of
    #: different hosts agree within milliseconds under NTP, and a profiler schedule starts every
    #: rank at the same step, so 1 s of slack tells "recorded together" from "another run"
    #: (the unrelated traces at hand lie days to years apart).
    clock_slack_us: float = 1e6


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
    #: What the trace says of its job (distributedInfo): world size and backend, or None.
    world_size: int | None = None
    backend: str | None = None
    #: The span on the wall clock (epoch us: the trace's baseTimeNanoseconds + its timestamps).
    wall_span_us: tuple[float, float] = (0.0, 0.0)
    #: A mean steady step (the whole trace without steps) taken apart: "compute" (GPU busy),
    #: each idle cause of `traceap.idle` inside the steps, and "no_gpu_work" (step time outside
    #: the GPU's span); the parts add up to the mean step.
    step_parts_us: dict = field(default_factory=dict)

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
        in_steps = {c: 0.0 for c in CAUSES}
        for k, mid in enumerate(MECHANISM_IDS):
            cause = MECHANISMS[k].cause if k < len(MECHANISMS) else "not_explained"
            in_steps[cause] += acc.time_in(mid, starts, ends) / n
        exposed = in_steps["communication"]
        compute = acc.busy_in_steady_us / n
        whole = sum(step_times) / n
    else:
        in_steps = dict(acc.by_cause)
        exposed = acc.by_cause["communication"]
        compute = acc.busy_us
        whole = acc.span_us
    parts = {"compute": float(compute), **{c: float(v) for c, v in in_steps.items()}}
    parts["no_gpu_work"] = max(float(whole) - sum(parts.values()), 0.0)
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
    base = (trace.meta.base_time_ns or 0) / 1e3
    return RankSummary(
        rank=trace.meta.rank, declared_rank=declared, path=trace.meta.path,
        fingerprint=fingerprint(trace), span_us=(float(lo), float(hi)), n_steps=n,
        step_us=float(np.median(step_times)) if n else None, step_times_us=step_times,
        compute_us=float(compute), comm_us=comm, exposed_comm_us=float(exposed),
        idle_us=float(acc.total_us), idle_by_cause={c: float(v) for c, v in acc.by_cause.items()},
        world_size=trace.meta.world_size, backend=trace.meta.backend,
        wall_span_us=(base + float(lo), base + float(hi)), step_parts_us=parts)


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


def not_one_job(summaries: list[RankSummary], config: JobConfig = JobConfig()) -> list[str]:
    """Why these traces (copies already removed) are not the ranks of one job, in words; empty
    when they agree: one world size and backend where distributedInfo says, no more traces than
    that world size, no rank claimed twice, and wall-clock ranges that overlap."""
    why = []
    sizes = sorted({s.world_size for s in summaries if s.world_size})
    if len(sizes) > 1:
        why.append("world sizes " + _and(sizes))
    elif sizes and len(summaries) > sizes[0]:
        why.append(f"{len(summaries)} traces for world size {sizes[0]}")
    backends = sorted({s.backend for s in summaries if s.backend})
    if len(backends) > 1:
        why.append("backends " + _and(backends))
    claimed: dict[int, int] = {}
    for s in summaries:
        if s.declared_rank is not None:
            claimed[s.declared_rank] = claimed.get(s.declared_rank, 0) + 1
    twice = sorted(r for r, k in claimed.items() if k > 1)
    if twice:
        why.append("rank " + _and(twice) + " claimed by more than one trace")
    if len(summaries) > 1:
        latest_start = max(s.wall_span_us[0] for s in summaries)
        earliest_end = min(s.wall_span_us[1] for s in summaries)
        if latest_start - earliest_end > config.clock_slack_us:
            why.append("time ranges do not overlap")
    return why


def _and(xs) -> str:
    xs = [str(x) for x in xs]
    return ", ".join(xs[:-1]) + " and " + xs[-1] if len(xs) > 1 else "".join(xs)


def cross_rank_findings(summaries: list[RankSummary | Trace], config: JobConfig = JobConfig(),
                        severity: SeverityConfig = SEVERITY) -> list[Finding]:
    """Stragglers (a rank computing longer while the others wait in NCCL), step times that
    differ across ranks, and communication exposed on every rank.

    Copies of one trace are compared once (the first of each group is kept)."""
    prof = [s if isinstance(s, RankSummary) else rank_summary(s) for s in summaries]
    dup = {i for g in find_copies(prof) for i in g[1:]}
    prof = [p for i, p in enumerate(prof) if i not in dup]
    if len(prof) < 2 or not_one_job(prof, config):
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
    """Profiler steps that take longer on one rank than on another, and which part of the
    step (compute, exposed communication, another idle cause) makes the difference."""
    steps = np.array([p.step_us if p.step_us else np.nan for p in prof])
    if np.isfinite(steps).sum() <= 1:
        return None
    ok = np.flatnonzero(np.isfinite(steps))
    slow, fast = ok[np.argmax(steps[ok])], ok[np.argmin(steps[ok])]
    med_step = float(np.median(steps[ok]))
    spread = (steps[slow] - steps[fast]) / med_step if med_step > 0 else 0.0
    if spread < config.step_spread:
        return None
    ps, pf = prof[slow], prof[fast]
    why = _why_slower(ps, pf)
    return _finding(
        "rank_imbalance", ps, float(steps[slow] - med_step),
        "Step time differs across ranks",
        (f"profiler steps take {fmt_us(steps[slow])} on rank {ps.rank} but "
         f"{fmt_us(steps[fast])} on rank {pf.rank} (median {fmt_us(med_step)}, spread "
         f"{100 * spread:.0f}%); {why}"),
        ("Even out what each rank does per step: balanced embedding/expert sharding "
         "(TorchRec planner with real table sizes; MoE capacity factor), equal batch and "
         "sequence sizes per rank, and no rank-specific work (logging, evaluation, "
         "checkpointing) inside the step.  Then compare the ranks' traces of the same "
         "step again."),
        ps.rank, {"slow_step_us": round(float(steps[slow]), 1),
                  "fast_step_us": round(float(steps[fast]), 1),
                  "median_step_us": round(med_step, 1), "spread": round(float(spread), 3)},
        severity)


#: The parts of a step (`RankSummary.step_parts_us`) in words.
PART_TITLES = {"compute": "compute (GPU busy)", **CAUSE_TITLES,
               "communication": "waiting on communication (exposed NCCL)",
               "not_explained": "GPU idle not explained",
               "no_gpu_work": "step time with no GPU work"}


def _why_slower(ps: RankSummary, pf: RankSummary, shown: int = 3) -> str:
    """Which part of the step makes rank ps slower than rank pf, from the parts it prints:
    the mean steps taken apart (compute + each idle cause + no GPU work = the step), and the
    part that grew most named as the reason."""
    sp, fp = ps.step_parts_us, pf.step_parts_us
    mean_s, mean_f = sum(sp.values()), sum(fp.values())
    gap = mean_s - mean_f
    diff = {k: sp.get(k, 0.0) - fp.get(k, 0.0) for k in PART_TITLES}
    order = sorted(diff, key=lambda k: -abs(diff[k]))[:shown]
    parts = ", ".join(f"{PART_TITLES[k]} {fmt_us(sp.get(k, 0.0))} vs {fmt_us(fp.get(k, 0.0))}"
                      for k in order)
    head = (f"a mean step takes {fmt_us(mean_s)} vs {fmt_us(mean_f)}, of which {parts}")
    top = max(diff, key=diff.get)
    if gap <= 0 or diff[top] <= 0:
        return head + ": the mean steps do not differ the way the medians do"
    share = diff[top] / gap
    rest = gap - diff[top]
    return (head + f": the difference is {'mostly' if share >= 0.5 else 'largest in'} "
            f"{PART_TITLES[top]} (+{fmt_us(diff[top])}; the other parts together "
            f"{'+' if rest >= 0 else '-'}{fmt_us(abs(rest))})")


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
           "job_totals", "not_one_job", "rank_summary", "same_rank_claims"]
