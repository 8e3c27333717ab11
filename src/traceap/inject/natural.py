"""Natural labels: anomaly intervals a real trace shows by itself, read from its own events.

Each pattern's rule (`natural_label` in `inject/mechanisms/<id>.py`, the registry's `label`
piece, reading a `NaturalContext`) names the mechanism's events (a `_SingleProcessDataLoaderIter.__next__` range, a
run of tiny NCCL kernels, an NCCL kernel on the compute stream, ...) and keeps only the
part where the GPU demonstrably waits (no kernel runs) or, for communication, where the
collective is not hidden by compute.  The thresholds are deliberately conservative and
documented in `NaturalConfig`; none of them is an expert rule's score (`traceap.patterns`
is not used), so labels and rules do not measure the same quantity by construction.
Warm-up is not steady state: with two or more profiler steps, nothing in or before the
first step is labelled.

Where a pattern shows is the rules'; whether it counts is the one judgement `traceap analyze`
makes of a finding: the pattern's time lost by the idle account (`traceap.idle`), as a gain
in % of the median steady step (`traceap.findings.judge`, capped where a fix can only hide
it under compute), must reach `SeverityConfig.medium_pct` (3%) -- the cut at which analyze
reports a pattern on its measured cost alone.  A busy-but-slow pattern (`BusyInefficient`: FP32
matrix math, layout transposes) costs no idle time: its cost is its own rule's estimate, read
through the registry, as analyze reads it.  Below it the windows are listed apart
(`NaturalLabels.below_cut`) and do not make a trace bad: a launch-bound DDP step whose
collectives run while the host has not launched the next work "looks" exposed, and the
idle account gives that time to the host (the bundled DDP CNN: 21 windows, none costing 2%).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import idle
from ..findings import SEVERITY, SeverityConfig, judge, step_basis
from ..patterns._registry import BusyInefficient, get_pattern, is_pattern, pattern_ids, pieces
from ..measures.signals import steady_from
from ..trace import Kind, Trace, merged_intervals
from ..windows import DEFAULT_WINDOWS, Windows
from . import mechanisms  # noqa: F401 - each mechanism module registers its label rule


@dataclass(frozen=True)
class NaturalConfig:
    """Thresholds of the natural labels (conservative by design: a label must be obvious)."""

    #: A DataLoader fetch counts when it lasts >= 1 ms and the GPU runs no kernel for at
    #: least half of it (a fetch the GPU does not notice is not lost time).
    fetch_min_us: float = 1000.0
    fetch_idle_share: float = 0.5
    #: Tiny collectives: <= 50 us of kernel and <= 64 KB (NCCL's LL-protocol range), at least
    #: 16 of them, each starting <= 500 us after the previous one ends.
    tiny_nccl_us: float = 50.0
    tiny_nccl_bytes: float = 65536.0
    tiny_run_min: int = 16
    tiny_run_gap_us: float = 500.0
    #: NCCL on the compute stream: kernels >= 50 us that compute kernels queue behind.
    blocking_nccl_min_us: float = 50.0
    #: Exposed communication: >= 1 ms without any compute kernel running beside it (DDP
    #: with bucketing leaves a few hundred us of the last bucket exposed: not an anomaly).
    exposed_min_us: float = 1000.0
    #: Pageable, host-blocking HtoD copies: >= 10% of a step and >= 2 ms in it, with the
    #: compute idle for >= half of the copy time.
    pageable_step_share: float = 0.10
    pageable_min_us: float = 2000.0
    #: Read-backs: >= 8 host syncs in a step each followed by >= 20 us of GPU idle, together
    #: >= 5% of the step.
    syncs_per_step: int = 8
    sync_idle_us: float = 20.0
    sync_step_share: float = 0.05
    #: Graph breaks: >= 200 us between consecutive compiled regions, >= half of it idle.
    break_gap_us: float = 200.0
    #: Launch-bound GPU: in a step >= 1 ms (after the first, of two or more), >= 50% of it
    #: idle in gaps ended by a kernel that started within 20 us of its own launch (the GPU
    #: waited for the host).
    launch_bound_share: float = 0.5
    launch_bound_slack_us: float = 20.0
    min_step_us: float = 1000.0
    #: FP32 matrix work on a GPU with tensor cores: FP32 GEMM/convolution kernels (no tensor
    #: core) >= 10% of a step's GPU busy time (twice the rule's 5% trace gate: obvious).
    fp32_busy_share: float = 0.10
    #: Layout transposes around convolutions (a model in NCHW): >= 4% of a step's GPU busy
    #: time (twice the rule's 2% trace gate).
    transpose_busy_share: float = 0.04
    #: Unfused optimizer: an optimizer call with >= 5 per-parameter kernels (nsys-ai: at least
    #: 5 launches averaging under 10 us), the GPU idle for half of their stretch.
    optimizer_min_launches: int = 5
    #: ... of a median length <= 20 us (tiny elementwise updates, not Shampoo's matrix work).
    optimizer_tiny_us: float = 20.0
    #: Allocator churn: a cudaMalloc/cudaFree (hipMalloc/hipFree) after the first step lasting
    #: >= 50 us (HTA: a runtime call over 50 us is an outlier), the GPU idle for half of it.
    allocator_min_us: float = 50.0
    #: CPU tensor init: a host factory op and its upload together >= 20 us (a launch and a
    #: copy of a few KB; the cut on the cost decides whether it counts), the GPU idle for half.
    host_init_min_us: float = 20.0


@dataclass(frozen=True)
class NaturalLabels:
    """What a real trace shows by itself, split by the reporting cut."""

    #: (start_us, end_us, pattern), sorted: patterns whose cost reaches the cut (a bad trace).
    anomalies: list[tuple[float, float, str]]
    #: The same for patterns the rules find but whose cost stays under the cut.
    below_cut: list[tuple[float, float, str]]
    #: Per pattern found: its estimated gain in % of the step (of the span without steps).
    gain_pct: dict[str, float]
    #: The cut applied (`SeverityConfig.medium_pct`).
    cut_pct: float

    @property
    def bad(self) -> bool:
        """Whether the trace carries a natural anomaly worth reporting."""
        return bool(self.anomalies)


def pattern_gain_pct(trace: Trace, pattern: str, severity: SeverityConfig = SEVERITY) -> float:
    """A pattern's estimated gain in % of the step, judged exactly as `traceap analyze` judges
    its finding: the idle account's time lost, per steady step, capped where it can only
    hide under compute."""
    acc = idle.measure(trace)
    mech = idle.mechanism_of(pattern)
    basis = step_basis(trace, acc)
    if mech is None:
        # Time that is not GPU idle (`BusyInefficient`): the pattern's own rule measures it,
        # as analyze does (`AntiPattern.time_lost`, at analyze's default window count).
        rule = get_pattern(pattern) if is_pattern(pattern) else None
        if rule is None or not isinstance(rule.account, BusyInefficient):
            return 0.0
        windows = Windows(trace, DEFAULT_WINDOWS)
        lost, in_steps = rule.time_lost(windows, acc)
        cap = rule.gain_cap_us(windows, basis.n_steps)
    else:
        lost, in_steps = float(acc.by_mechanism[mech]), acc.in_steady_steps(mech)
        cap = idle.gain_cap_us(acc, pattern, basis.n_steps)
    _, _, pct, _ = judge(lost, in_steps, basis, cap, severity)
    return pct


def natural_labels(trace: Trace, patterns=None, config: NaturalConfig = NaturalConfig(),
                   severity: SeverityConfig = SEVERITY) -> NaturalLabels:
    """Where each pattern shows by itself (the rules), kept as an anomaly when its cost
    reaches `severity.medium_pct` of the step, else listed in `below_cut`."""
    cut = severity.medium_pct
    if not trace.has_gpu:
        return NaturalLabels([], [], {}, cut)
    ctx = NaturalContext(trace)
    found = []
    rules = pieces("label")
    for p in pattern_ids() if patterns is None else patterns:
        fn = rules.get(p)
        if fn is None:
            continue
        for a, b in fn(ctx, config):
            if b > a and b > ctx.steady_from:
                found.append((max(float(a), ctx.steady_from), float(b), p))
    gain = {p: round(pattern_gain_pct(trace, p, severity), 3)
            for p in sorted({p for _, _, p in found}, key=pattern_ids().index)}
    return NaturalLabels(sorted(x for x in found if gain[x[2]] >= cut),
                         sorted(x for x in found if gain[x[2]] < cut), gain, cut)


def natural_anomalies(trace: Trace, patterns=None, config: NaturalConfig = NaturalConfig(),
                      severity: SeverityConfig = SEVERITY) -> list[tuple[float, float, str]]:
    """(start_us, end_us, pattern) intervals the trace shows by itself whose pattern costs at
    least the reporting cut (`natural_labels`), sorted by start."""
    return natural_labels(trace, patterns, config, severity).anomalies


class NaturalContext:
    """Quantities every rule reads: kernels, compute idle, steps, the compute stream."""

    def __init__(self, tr: Trace):
        self.tr = tr
        k = tr.rows(Kind.KERNEL)
        self.kern = k
        nccl = tr.is_nccl[k]
        self.compute_k = k[~nccl]
        self.nccl_k = k[nccl]
        cs, ce = merged_intervals(tr.ts[self.compute_k], tr.end[self.compute_k])
        self.busy_s, self.busy_e = cs, ce
        w = np.bincount(tr.stream[self.compute_k].astype(np.int64) - tr.stream[self.compute_k].min(),
                        weights=tr.dur[self.compute_k]) if len(self.compute_k) else np.zeros(0)
        self.compute_stream = (int(w.argmax() + tr.stream[self.compute_k].min())
                               if len(w) else None)
        steps = tr.steps
        self.steps = [(s.start_us, s.end_us) for s in steps]
        self.steady_from = steady_from(tr)

    def idle_in(self, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        """Intervals in [lo, hi] with no compute kernel running."""
        gs = np.r_[lo, self.busy_e]
        ge = np.r_[self.busy_s, hi]
        gs, ge = np.maximum(gs, lo), np.minimum(ge, hi)
        m = ge > gs
        return gs[m], ge[m]

    def idle_under(self, rows: np.ndarray, min_us: float):
        """The compute-idle stretches of at least `min_us` under the (merged) spans of `rows`."""
        for s, e in zip(*merged_intervals(self.tr.ts[rows], self.tr.end[rows])):
            gs, ge = self.idle_in(float(s), float(e))
            for a, b in zip(gs, ge):
                if b - a >= min_us:
                    yield a, b

    def rows_named(self, prefix: str) -> np.ndarray:
        """Rows whose name starts with `prefix`."""
        codes = [i for i, n in enumerate(self.tr.names) if n.startswith(prefix)]
        return np.flatnonzero(np.isin(self.tr.name, codes)) if codes else np.zeros(0, int)

    def step_of(self, t: float) -> tuple[float, float] | None:
        """The step containing time t."""
        for s in self.steps:
            if s[0] <= t <= s[1]:
                return s
        return None


__all__ = ["NaturalConfig", "NaturalLabels", "natural_anomalies", "natural_labels",
           "pattern_gain_pct"]
