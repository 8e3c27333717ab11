"""`traceap diff BEFORE AFTER`: did the change make the run faster, and which findings went away?

    from traceap.diff import compare
    d = compare("before/", "after/")          # traces, folders of ranks or analysis JSONs
    d.verdict            # 'step time -23% (...): <pattern> fixed'
    d.to_json()                                # traceap.diff/v1 (docs/FORMATS.md)

Each side is reduced to the same numbers, per profiler step so that recordings of different
lengths compare.  The steps are the analysis' steady steps (`traceap.idle`: a warm-up first step
left out; every profiler step of a CPU-only trace), so the step time here is the one the
findings' gains are shares of: the median step time, the GPU busy fraction (the idle account's, as
`traceap analyze` and `traceap info` print it), the
GPU idle time and its causes (when the analysis carries `gpu_idle`), the time each anti-pattern
costs, and the host time spent in `DataLoader.__next__`, which is the one number a CPU-only
recording can compare when no GPU pattern can be measured.  A trace or a folder is analysed
here; an analysis JSON is read as it is, and its trace (the "trace" key) is opened for the step
and data-loading numbers when it can be found.  This module compares; `traceap.report.diff`
shows the comparison in the terminal.
"""

from __future__ import annotations

import gzip
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from .errors import TraceapError
from .idle import busy_fraction_of
from .info import step_numbers
from .trace import Trace
from .units import fmt_us
from .windows import DEFAULT_WINDOWS, check_windows

SCHEMA = "traceap.diff/v1"
#: Per-finding numbers read from an analysis (docs/FORMATS.md) when present; a new one
#: is one more name here.
FINDING_NUMBERS = ("time_lost_us", "time_lost_per_step_us", "gain_pct")
#: Run-to-run noise of the median step time: repeated CPU recordings of
#: examples/train_small.py on a shared 2-core machine differ by up to ~5% (docs/PROFILE.md);
#: changes below this are called "no significant change".
NOISE_PCT = 5.0
#: A data-loading change is named in the verdict only when it moves at least this share of
#: the before step time (a 90% drop of 0.1% of the step explains nothing).
DATALOADER_SHARE = 0.02
#: `--fail-if-slower` exit code: distinct from 1 (internal error) and 2 (bad input).
EXIT_SLOWER = 3
#: A pattern's amount (`AntiPattern.amount`: pageable copies and bytes per step, loader time per
#: step, ...) that moved less than this between the sides did not change: the same code moves
#: the same batch the same way every step, and what varies is which steps a recording caught
#: and host noise (the step time's is 5%, NOISE_PCT).  20% still tells one copy more or less in
#: five per step, and a fix (copies gone or halved) or a regression (one more per step) moves
#: it further.
AMOUNT_TOL_PCT = 20.0
#: Windows the trace of an analysis JSON is cut into to measure the patterns' amounts (sums
#: over the whole trace, so the number barely matters; a trace analysed here brings its own,
#: measured on the analysis' windows).
AMOUNT_WINDOWS = DEFAULT_WINDOWS
_SCHEMA_RE = re.compile(rb'"schema"\s*:\s*"traceap\.analysis/')


# -- one side ------------------------------------------------------------------------------
@dataclass
class FindingSummary:
    """One finding of one side, with the numbers a comparison needs."""

    pattern: str
    rank: int | None
    title: str
    severity: str
    time_lost_us: float | None
    time_lost_per_step_us: float | None
    gain_pct: float | None
    cross_rank: bool = False        # found by comparing ranks (straggler, ...), not in one rank

    def to_json(self) -> dict:
        """JSON object (traceap.diff/v1 finding)."""
        return {"pattern": self.pattern, "rank": self.rank, "cross_rank": self.cross_rank,
                "title": self.title,
                "severity": self.severity, "time_lost_us": self.time_lost_us,
                "time_lost_per_step_us": self.time_lost_per_step_us, "gain_pct": self.gain_pct}


@dataclass
class Side:
    """One recording reduced to per-step numbers."""

    input: str
    kind: str                       # trace | job | analysis | job-analysis
    ranks: int
    n_steps: int | None             # profiler steps (summed over ranks)
    step_us: float | None           # median ProfilerStep duration (median over ranks)
    gpu_busy_fraction: float | None
    gpu_idle_us: float | None       # per rank, summed over its steps, averaged over ranks
    gpu_idle_by_cause_us: dict[str, float] | None
    dataloader_us_per_step: float | None
    findings: list[FindingSummary]
    notes: list[str] = field(default_factory=list)
    #: Pattern id -> its amount numbers (`AntiPattern.amount`) per step (per trace without
    #: steps), averaged over ranks; only patterns whose amount could be measured on a trace.
    amounts: dict[str, dict[str, float]] = field(default_factory=dict)
    #: GPU busy time spent inefficiently by busy-but-slow pattern (the analysis'
    #: `gpu_inefficient.by_pattern`), per rank averaged over ranks; None when not recorded.
    gpu_inefficient_by_pattern_us: dict[str, float] | None = None

    @property
    def gpu_inefficient_per_step_us(self) -> float | None:
        """GPU busy time spent inefficiently per step, all patterns."""
        by = self.gpu_inefficient_by_pattern_us
        return None if by is None else _per_step(sum(by.values()), self.n_steps, self.ranks)

    @property
    def gpu_idle_per_step_us(self) -> float | None:
        """GPU idle time per step (None without the analysis' gpu_idle or steps)."""
        return _per_step(self.gpu_idle_us, self.n_steps, self.ranks)

    def lost_per_step(self) -> dict[str, float | None]:
        """Time lost per step by pattern, rank findings only (averaged over ranks)."""
        out: dict[str, float | None] = {}
        for f in self.findings:
            if f.cross_rank:
                continue
            v = f.time_lost_per_step_us
            prev = out.get(f.pattern, 0.0)
            out[f.pattern] = None if v is None or prev is None else prev + v / self.ranks
        return out

    def to_json(self) -> dict:
        """JSON object (traceap.diff/v1 side)."""
        idle = None
        if self.gpu_idle_us is not None:
            steps = self.n_steps / self.ranks if self.n_steps else None
            idle = {"total_us": self.gpu_idle_us, "per_step_us": self.gpu_idle_per_step_us,
                    "by_cause_per_step_us": None if not (self.gpu_idle_by_cause_us and steps)
                    else {k: v / steps for k, v in self.gpu_idle_by_cause_us.items()}}
        slow = None
        if self.gpu_inefficient_by_pattern_us is not None:
            steps = self.n_steps / self.ranks if self.n_steps else None
            by = self.gpu_inefficient_by_pattern_us
            slow = {"total_us": sum(by.values()), "per_step_us": self.gpu_inefficient_per_step_us,
                    "by_pattern_per_step_us": {k: v / steps for k, v in by.items()}
                    if steps else None}
        return {"input": self.input, "kind": self.kind, "ranks": self.ranks,
                "n_steps": self.n_steps, "step_us": self.step_us,
                "gpu_busy_fraction": self.gpu_busy_fraction, "gpu_idle": idle,
                "gpu_inefficient": slow,
                "dataloader_us_per_step": self.dataloader_us_per_step,
                "time_lost_per_step_us": self.lost_per_step(),
                "amounts": self.amounts,
                "findings": [f.to_json() for f in self.findings], "notes": self.notes}


def _per_step(total: float | None, n_steps: int | None, ranks: int) -> float | None:
    if total is None or not n_steps:
        return None
    return total / (n_steps / ranks)


def _finding(d: dict, obj, n_steps: int | None, cross_rank: bool = False,
             process_rank: int | None = None) -> FindingSummary:
    """A finding from its JSON (the keys in FINDING_NUMBERS when present), else the object;
    its `rank` is the process's (`process_rank` for a rank's own finding)."""
    known = {k for k in FINDING_NUMBERS if k in d or hasattr(obj, k)}
    nums = {k: d[k] if k in d else getattr(obj, k, None) for k in FINDING_NUMBERS}
    nums = {k: None if v is None else float(v) for k, v in nums.items()}
    if "time_lost_per_step_us" not in known and nums["time_lost_us"] is not None and n_steps:
        # An analysis without per-step numbers: spread the time lost over the steps.
        nums["time_lost_per_step_us"] = nums["time_lost_us"] / n_steps
    # Only a cross-rank finding's "rank" names a process (the rank it concerns); a rank's own
    # finding's "rank" is its position in that rank's ranking (#1, #2, ...).
    rank = d.get("rank", getattr(obj, "rank", None)) if cross_rank else process_rank
    return FindingSummary(
        pattern=str(d.get("pattern")), rank=rank if isinstance(rank, int) else None,
        title=str(d.get("title") or getattr(obj, "title", None) or d.get("pattern")),
        severity=str(d.get("severity", "")), cross_rank=cross_rank, **nums)


def _rank_side(data: dict, obj, trace: Trace | None, rank: int | None) -> dict:
    """Numbers of one rank from its traceap.analysis/v1 object and either the `Analysis`
    (`obj`: its step numbers and pattern amounts, measured where it was analysed) or, for an
    analysis JSON, the trace it names (`trace`, measured here); `rank`: the process's rank
    (None: the one its summary records, if any)."""
    notes: list[str] = []
    if obj is not None:
        m = obj.steps or None
        has_gpu = bool(obj.has_gpu)
    else:
        m = step_numbers(trace) if trace is not None else None
        has_gpu = trace.has_gpu if trace is not None else None
    summary = data.get("summary") or getattr(obj, "summary", None) or {}
    basis = data.get("step_basis") or {}
    n_steps = m["n_steps"] if m else basis.get("n_steps", summary.get("n_profiler_steps"))
    step_us = m["step_us"] if m else basis.get("step_us")
    idle = data.get("gpu_idle")
    if has_gpu is False:
        idle = None  # a CPU-only trace has no GPU to be idle
    # GPU busy: the idle account's (busy + idle = its GPU span), read from the analysis' own
    # gpu_idle so that an analysis JSON without its trace has it too.
    busy = busy_fraction_of(idle)
    if rank is None:  # the rank the trace says it is (distributedInfo or file name), if any
        said = data.get("rank", summary.get("rank",
                                            trace.meta.rank if trace is not None else None))
        rank = said if isinstance(said, int) else None
    objs = list(getattr(obj, "findings", []) or [])
    findings = [_finding(f, objs[i] if i < len(objs) else None, n_steps or None,
                         process_rank=rank)
                for i, f in enumerate(data.get("findings", []))]
    per = max(m["n_steps"] if m else 0, 1)
    amounts = ({pid: {k: v / per for k, v in got.items()} for pid, got in obj.amounts.items()}
               if obj is not None else pattern_amounts(trace, m["n_steps"] if m else 0))
    slow = data.get("gpu_inefficient")
    return {"n_steps": n_steps or 0, "step_us": step_us, "busy": busy,
            "idle": idle, "slow": (slow or {}).get("by_pattern") if idle is not None else None,
            "dl": m["dataloader_us"] if m else None, "findings": findings,
            "notes": notes, "has_gpu": has_gpu, "amounts": amounts}


def pattern_amounts(trace: Trace | None, n_steps: int) -> dict[str, dict[str, float]]:
    """Every pattern's amount numbers (`AntiPattern.amount`) in a trace, per step when it has
    steps (else over the whole trace); empty without a trace or GPU work.  For the trace an
    analysis JSON names; a trace analysed here brings its own (`Analysis.amounts`)."""
    if trace is None or not trace.has_gpu:
        return {}
    from .patterns import REGISTRY
    from .windows import Windows

    w = Windows(trace, AMOUNT_WINDOWS)
    per = max(n_steps, 1)
    return {pid: {k: v / per for k, v in got.items()}
            for pid, p in REGISTRY.items() if (got := p.amounts(w))}


def _combine(path: str, kind: str, ranks: list[dict], cross: list[FindingSummary]) -> Side:
    n = len(ranks)
    steps = [r["n_steps"] for r in ranks]
    step_us = [r["step_us"] for r in ranks if r["step_us"] is not None]
    busy = [r["busy"] for r in ranks if r["busy"] is not None]
    idles = [r["idle"] for r in ranks if isinstance(r["idle"], dict)]
    dls = [r["dl"] for r in ranks]
    idle_total = by_cause = None
    if idles and len(idles) == n:
        idle_total = float(np.mean([float(i.get("total_us", 0.0)) for i in idles]))
        causes: dict[str, float] = {}
        for i in idles:
            for k, v in (i.get("by_cause") or {}).items():
                causes[k] = causes.get(k, 0.0) + float(v) / n
        by_cause = causes
    slows = [r["slow"] for r in ranks if isinstance(r["slow"], dict)]
    slow = None
    if slows and len(slows) == n:
        slow = {}
        for x in slows:
            for k, v in x.items():
                slow[k] = slow.get(k, 0.0) + float(v) / n
    total_steps = sum(steps)
    amounts: dict[str, dict[str, float]] = {}
    if all(r["amounts"] for r in ranks):   # an average needs every rank measured
        # in pattern order (the first rank's), not a set's: the JSON is the same every run
        for pid in [p for p in ranks[0]["amounts"] if all(p in r["amounts"] for r in ranks)]:
            keys = ranks[0]["amounts"][pid]
            amounts[pid] = {k: float(np.mean([r["amounts"][pid].get(k, 0.0) for r in ranks]))
                            for k in keys}
    dl = (sum(dls) / total_steps if total_steps and all(d is not None for d in dls) else None)
    notes = [x for r in ranks for x in r["notes"]]
    if not total_steps:
        notes.append("no ProfilerStep annotations: step time and per-step numbers are unknown")
    if any(r["has_gpu"] is False for r in ranks):
        notes.append("CPU-only recording: no GPU activity, so GPU busy/idle and the eight GPU "
                     "anti-patterns cannot be measured; compare the step time and the data "
                     "loading per step")
    return Side(input=path, kind=kind, ranks=n, n_steps=total_steps or None,
                step_us=float(np.median(step_us)) if step_us else None,
                gpu_busy_fraction=float(np.mean(busy)) if busy else None,
                gpu_idle_us=idle_total, gpu_idle_by_cause_us=by_cause,
                dataloader_us_per_step=dl,
                findings=[f for r in ranks for f in r["findings"]] + cross, notes=notes,
                amounts=amounts, gpu_inefficient_by_pattern_us=slow)


def is_analysis_json(path: Path) -> bool:
    """True for a traceap.analysis JSON (checked on the first bytes; traces are not read)."""
    if path.is_dir() or not path.name.endswith((".json", ".json.gz")):
        return False
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                head = f.read(4096)
        else:
            with open(path, "rb") as f:
                head = f.read(4096)
    except (OSError, EOFError, gzip.BadGzipFile):
        return False
    return bool(_SCHEMA_RE.search(head))


def side_of(path: str | os.PathLike, n_windows: int = DEFAULT_WINDOWS) -> Side:
    """Reduce a trace, a folder of ranks or an analysis JSON to a `Side`."""
    p = Path(path)
    if not p.exists():
        raise TraceapError(f"{p}: no such file or folder")
    if is_analysis_json(p):
        return _side_of_json(p)
    from .job import analyze_path

    result, _ = analyze_path(p, n_windows)
    if p.is_dir():
        # The analysis' rank: the job's (renumbered where ids repeat in one job).
        ranks = [_rank_side(a.to_json(), a, None, None) for a in result.ranks]
        cross = [_finding(f, obj, None, cross_rank=True) for f, obj in
                 zip(result.to_json().get("cross_rank", []), result.findings)]
        return _combine(str(p), "job", ranks, cross)
    return _combine(str(p), "trace", [_rank_side(result.to_json(), result, None, None)], [])


def _side_of_json(p: Path) -> Side:
    raw = p.read_bytes()
    if p.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceapError(f"{p}: not valid JSON ({exc})") from None
    schema = str(data.get("schema", ""))
    per_rank = data.get("ranks") if schema.endswith("+job") else [data]
    if not isinstance(per_rank, list) or not per_rank:
        raise TraceapError(f"{p}: a {schema} object without ranks")
    ranks = []
    for r in per_rank:
        trace = _trace_named(r.get("trace"), p)
        side = _rank_side(r, None, trace, None)
        if trace is None:
            side["notes"].append(f"{r.get('trace')}: trace not found next to {p.name}; data "
                                 f"loading is unknown" + ("" if side["step_us"] is not None
                                                          else ", and the step time"))
        ranks.append(side)
    cross = [_finding(f, None, None, cross_rank=True) for f in data.get("cross_rank", []) or []]
    return _combine(str(p), "job-analysis" if len(per_rank) > 1 or schema.endswith("+job")
                    else "analysis", ranks, cross)


def _trace_named(name, json_path: Path) -> Trace | None:
    """The trace an analysis JSON names: as given, or beside the JSON file."""
    if not name:
        return None
    from .load import load

    for cand in (Path(name), json_path.parent / name, json_path.parent / Path(name).name):
        if cand.is_file():
            try:
                return load(cand)
            except TraceapError:
                return None
    return None


# -- the comparison ------------------------------------------------------------------------
def pct(before: float | None, after: float | None) -> float | None:
    """Relative change in percent (None when either is unknown or before is 0)."""
    if before is None or after is None or before == 0:
        return None
    return 100.0 * (after / before - 1.0)


@dataclass
class FindingChange:
    """A finding present before, after, or both, and what became of it."""

    pattern: str
    rank: int | None
    title: str
    #: fixed | new | better | worse | same, or now_visible / now_hidden: found on one side
    #: only while its amount (`AntiPattern.amount`) did not change, so a bigger cause hid it.
    status: str
    before: FindingSummary | None
    after: FindingSummary | None
    #: The pattern that hid it (now_visible: on the before side; now_hidden: after).
    hidden_by: str | None = None
    #: Its amount per step on both sides ({"before": {...}, "after": {...}}), when measured.
    amount: dict | None = None

    @property
    def label(self) -> str:
        """The status in words: 'fixed', 'new', ..., 'now visible (was hidden by X)'."""
        by = f" by {self.hidden_by}" if self.hidden_by else ""
        if self.status == "now_visible":
            return f"now visible (was hidden{by})"
        if self.status == "now_hidden":
            return f"now hidden{by}"
        return self.status

    def to_json(self) -> dict:
        """JSON object (traceap.diff/v1 findings entry)."""
        return {"pattern": self.pattern, "rank": self.rank, "title": self.title,
                "status": self.status, "hidden_by": self.hidden_by, "amount": self.amount,
                "before": self.before.to_json() if self.before else None,
                "after": self.after.to_json() if self.after else None}


@dataclass
class Diff:
    """Two sides, their per-step changes, the findings' fate, and a one-line verdict."""

    before: Side
    after: Side
    findings: list[FindingChange]
    verdict: str
    fail_if_slower_pct: float | None = None

    @property
    def step_pct(self) -> float | None:
        """Median step time change in percent."""
        return pct(self.before.step_us, self.after.step_us)

    @property
    def dataloader_pct(self) -> float | None:
        """Data loading time per step, change in percent."""
        return pct(self.before.dataloader_us_per_step, self.after.dataloader_us_per_step)

    @property
    def slower(self) -> bool:
        """True when the step time grew by more than fail_if_slower_pct."""
        p = self.step_pct
        return (self.fail_if_slower_pct is not None and p is not None
                and p > self.fail_if_slower_pct)

    def pattern_rows(self) -> list[dict]:
        """Time lost per step by pattern, both sides."""
        b, a = self.before.lost_per_step(), self.after.lost_per_step()
        rows = []
        for p in sorted(set(b) | set(a), key=lambda k: -((b.get(k) or 0) + (a.get(k) or 0))):
            bv, av = b.get(p, 0.0 if p not in b else None), a.get(p, 0.0 if p not in a else None)
            rows.append({"pattern": p, "before_us_per_step": bv, "after_us_per_step": av,
                         "change_pct": pct(bv, av)})
        return rows

    def to_json(self) -> dict:
        """The traceap.diff/v1 object (docs/FORMATS.md)."""
        b, a = self.before, self.after
        busy = (None if b.gpu_busy_fraction is None or a.gpu_busy_fraction is None
                else 100.0 * (a.gpu_busy_fraction - b.gpu_busy_fraction))
        return {
            "schema": SCHEMA,
            "before": b.to_json(), "after": a.to_json(),
            "change": {"step_pct": self.step_pct, "gpu_busy_points": busy,
                       "gpu_idle_per_step_pct": pct(b.gpu_idle_per_step_us,
                                                    a.gpu_idle_per_step_us),
                       "gpu_inefficient_per_step_pct": pct(b.gpu_inefficient_per_step_us,
                                                           a.gpu_inefficient_per_step_us),
                       "dataloader_per_step_pct": self.dataloader_pct},
            "patterns": self.pattern_rows(),
            "findings": [f.to_json() for f in self.findings],
            "verdict": self.verdict,
            "fail_if_slower_pct": self.fail_if_slower_pct,
            "slower": self.slower,
        }


def match_findings(before: Side, after: Side, noise_pct: float = NOISE_PCT,
                   amount_tol_pct: float = AMOUNT_TOL_PCT) -> list[FindingChange]:
    """Pair the findings by (pattern, process rank): fixed, new, or better/worse/same by time
    lost; a fixed or new one whose pattern's amount did not change is now_hidden/now_visible."""
    def key(f: FindingSummary):
        return (f.pattern, f.rank, f.cross_rank)

    bmap = {key(f): f for f in before.findings}
    amap = {key(f): f for f in after.findings}
    out = []
    for k in list(bmap) + [k for k in amap if k not in bmap]:
        fb, fa = bmap.get(k), amap.get(k)
        if fa is None:
            status = "fixed"
        elif fb is None:
            status = "new"
        else:
            xb = fb.time_lost_per_step_us if fb.time_lost_per_step_us is not None \
                else fb.time_lost_us
            xa = fa.time_lost_per_step_us if fa.time_lost_per_step_us is not None \
                else fa.time_lost_us
            c = pct(xb, xa)
            status = ("same" if c is None or abs(c) < noise_pct
                      else "better" if c < 0 else "worse")
        f = fa or fb
        out.append(FindingChange(k[0], k[1], f.title, status, fb, fa))
    for c in out:
        one_side = {"new": c.after, "fixed": c.before}.get(c.status)
        if one_side is not None and not one_side.cross_rank:
            _check_hidden(c, before, after, out, amount_tol_pct)
    order = {"fixed": 0, "new": 1, "now_visible": 2, "now_hidden": 3, "worse": 4, "better": 5,
             "same": 6}
    out.sort(key=lambda c: order[c.status])
    return out


def _check_hidden(c: FindingChange, before: Side, after: Side, changes: list[FindingChange],
                  tol_pct: float) -> None:
    """A finding on one side only whose pattern's amount did not change (every amount number
    present on both sides and within `tol_pct`): now_visible / now_hidden, hidden by the
    other side's costliest other finding (one that went away or shrank, when there is one)."""
    b, a = before.amounts.get(c.pattern), after.amounts.get(c.pattern)
    if not b or not a:
        return
    c.amount = {"before": b, "after": a}
    keys = [k for k in b if k in a]
    if not keys or not all(b[k] > 0 and abs(pct(b[k], a[k])) <= tol_pct for k in keys):
        return
    hider_side = "before" if c.status == "new" else "after"
    moved = ("fixed", "better") if c.status == "new" else ("new", "worse")

    def cost(x: FindingChange) -> float:
        f = getattr(x, hider_side)
        v = f.time_lost_per_step_us if f.time_lost_per_step_us is not None else f.time_lost_us
        return v or 0.0
    others = [x for x in changes if x.pattern != c.pattern and getattr(x, hider_side)]
    preferred = [x for x in others if x.status in moved] or others
    c.hidden_by = max(preferred, key=cost).pattern if preferred else None
    c.status = "now_visible" if c.status == "new" else "now_hidden"


def verdict(before: Side, after: Side, changes: list[FindingChange],
            noise_pct: float = NOISE_PCT) -> str:
    """One line: the step time change, then what explains it."""
    sp = pct(before.step_us, after.step_us)
    if sp is None:
        missing = "BEFORE" if before.step_us is None else "AFTER"
        head = f"step time not comparable (no profiler steps in {missing})"
    else:
        head = (f"step time {sp:+.0f}% ({fmt_us(before.step_us)} -> "
                f"{fmt_us(after.step_us)})")
    reasons = []
    fixed = sorted({c.pattern for c in changes if c.status == "fixed"})
    new = sorted({c.pattern for c in changes if c.status == "new"})
    if fixed:
        reasons.append(", ".join(fixed) + " fixed")
    if new:
        reasons.append(", ".join(new) + " appeared")
    for c in changes:
        if c.status in ("now_visible", "now_hidden"):
            reasons.append(f"{c.pattern} {c.label}")
    dp = pct(before.dataloader_us_per_step, after.dataloader_us_per_step)
    if dp is not None and abs(dp) >= noise_pct and before.step_us:
        moved = abs(after.dataloader_us_per_step - before.dataloader_us_per_step)
        if moved >= DATALOADER_SHARE * before.step_us:
            reasons.append(f"data loading per step {dp:+.0f}% "
                           f"({fmt_us(before.dataloader_us_per_step)} -> "
                           f"{fmt_us(after.dataloader_us_per_step)})")
    ip = pct(before.gpu_idle_per_step_us, after.gpu_idle_per_step_us)
    if ip is not None and abs(ip) >= noise_pct:
        reasons.append(f"GPU idle per step {ip:+.0f}%")
    sp_slow = pct(before.gpu_inefficient_per_step_us, after.gpu_inefficient_per_step_us)
    if sp_slow is not None and abs(sp_slow) >= noise_pct:
        reasons.append(f"GPU time spent inefficiently per step {sp_slow:+.0f}%")
    if sp is not None and abs(sp) < noise_pct and not fixed and not new:
        reasons.insert(0, "no significant change")
    return head + (": " + ", ".join(reasons) if reasons else "")


def compare(before, after, n_windows: int = DEFAULT_WINDOWS,
            fail_if_slower_pct: float | None = None) -> Diff:
    """Compare two recordings (paths or `Side`s); `n_windows` cuts a trace analysed here."""
    check_windows(n_windows)   # before either side is read
    b = before if isinstance(before, Side) else side_of(before, n_windows)
    a = after if isinstance(after, Side) else side_of(after, n_windows)
    changes = match_findings(b, a)
    return Diff(b, a, changes, verdict(b, a, changes), fail_if_slower_pct)


__all__ = ["Diff", "EXIT_SLOWER", "FINDING_NUMBERS", "FindingChange", "FindingSummary",
           "NOISE_PCT", "SCHEMA", "Side", "compare", "is_analysis_json", "match_findings",
           "pct", "side_of", "verdict"]
