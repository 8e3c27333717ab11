"""GPU idle time, split by cause: where the time goes while no compute kernel runs.

Definitions (one for every report: terminal, HTML, JSON, `traceap info`, cross-rank, diff):

- GPU span: from the first start to the last end of any GPU work (kernel, memcpy, memset),
  widened to whole profiler steps where the trace has them (a step that starts by loading a
  batch leaves the GPU idle before its first kernel, and that wait is the step's too), and
  without steps to the start of a `DataLoader.__next__` that runs up to the first GPU work
  (the first batch the GPU waits for; `measures.gaps.gpu_span`).
- GPU busy: a compute kernel (any kernel but NCCL/RCCL communication), a memset or an on-device
  copy (DtoD, PtoP) runs on any stream of the trace.
- GPU idle: the GPU span less the busy time.  Stretches where only communication or only a
  host<->device copy runs are idle time *with a cause*: the device does no compute then, and
  a fix (overlap, pinned async copies) would let compute fill them.

Every idle microsecond goes to exactly one mechanism, the first in `MECHANISMS` whose
intervals cover it; mechanisms roll up into the causes of `CAUSES`.  A pattern whose time is
idle time names its mechanism in its declaration (`AntiPattern.account = IdleCause(id)`;
`pattern_of` reads it from the registry), shown here as the pattern's subject in brackets:

 0 recompilation   torch.compile compiling again after the first profiler step [recompiles]:
                   Dynamo/Inductor compile spans in a later step and the relaunch after them
                   (`measures.compile_regions.recompile_intervals`).  Before warm-up, whose
                   `measures.warmup.WARMUP_HOST` names the same calls: in a later step they are
                   not one-off.
 0 allocator_churn cudaMalloc/cudaFree (hipMalloc/hipFree) and empty_cache inside steady
                   profiler steps (after the first and the warm-up ones), and the idle gap
                   each returns into, up to a relaunch (50 us) [allocator churn]
                   (`measures/allocator.py`).  Before warm-up, whose calls name every
                   cudaMalloc: these are the ones start-up does not explain.
 1 warmup          one-off start-up: allocator growth (cudaMalloc, cudaHostAlloc), stream and
                   CUDA-graph creation, module loading (cuModuleLoad, the slow first launch of a
                   kernel under lazy loading), torch.compile / Triton compilation, autotuning,
                   DataLoader worker start-up (a first `__next__` far longer than the others),
                   and a first profiler step much longer than the others whose extra time such
                   calls largely cover (`measures/warmup.py`).  First, because a one-off cost is
                   not the steady state.
 2 dataparallel    nn.DataParallel's host work (`DataParallel.forward`, replicate / scatter /
                   gather, their backward nodes) in a trace driving two or more GPUs
                   [DataParallel]: one process serialises what DDP runs in parallel; before
                   communication, as its broadcasts may be NCCL kernels.
 2 accum_allreduce the all-reduces of the non-final micro-steps of a gradient accumulation
                   (`measures.accumulation`) while no compute runs [all-reduce every micro-step]:
                   before the other NCCL mechanisms, as `no_sync` removes them altogether; the
                   final micro-step's all-reduce stays with them.
 2 communication   an NCCL/RCCL kernel runs while no compute does (exposed communication):
                   on a compute stream [collectives on the compute stream], small
                   collectives [small collectives], any other [exposed collectives].  Before
                   the host causes: the device is executing a collective, not waiting for the
                   host.  Except where nothing waits for the collective (no compute launched and
                   queued, the host in no sync: `measures.communication.host_late_under_nccl`):
                   the host had not launched the next work yet, the collective only looks
                   exposed, and those gaps are starved gaps for the host causes below.  Small
                   collectives keep the part of it the host spends in their own c10d calls,
                   and the gaps between their kernels while the host is in the call that
                   launches the next one (`measures.communication.collective_calls`): their
                   cost, which bucketing removes.
 3 compile_gaps    between two compiled regions of one step [graph breaks]: eager code, often a
                   data-dependent op (.item(), nonzero) with its copy and sync, so a gap framed
                   by compiled regions is a break before it is a copy.
 4 data_loading    `DataLoader.__next__` runs on the host [data loading]: named
                   host work, so it goes before the copies and syncs around it.  A GPU idle gap
                   that the loader fills for at least half of its length is the loader's whole:
                   the batch's upload and the relaunch after it are part of waiting for data.
 5 host_copy_sync  a tensor created on the host (an ATen factory op with no kernel under it)
                   and uploaded right after it [CPU tensor init] (`measures/host_init.py`):
                   from the factory op to the end of its copy, ahead of the other copies (the
                   fix is creating it on the device; pinning would not remove it); then
                   a host<->device copy runs (pageable uploads and their blocked launch call
                   [pageable copies]; other DtoH / small HtoD copies [host copies and syncs]; large
                   pinned input uploads: no pattern), and the GPU gap after a host-blocking sync
                   [host copies and syncs]: all of it when the sync fetched values to the host (a
                   DtoH copy ends inside it: .item(), .tolist(), .cpu(): the host then works on
                   what it fetched, and keeping the values on the GPU removes both), at most the
                   time the host waited in it for a bare sync (an event/stream/device sync: the
                   wait is how far ahead of the device the host was, all it can have cost).  And
                   the later starved gaps of the lead the sync lost, up to the compute the device
                   ran while the host waited (`measures.copies.sync_debt`; both: `sync_costs`):
                   a host far ahead of a deep queue that relaunches at the device's pace after
                   the sync starves it until that lead would have been used up.  Not where
                   the user's code or unrecorded host work fills those later gaps: that is
                   named first.
 6 unrecorded_host a starved gap while the host recorded nothing for a long stretch (over
                   `measures.host.HostConfig.unrecorded_host_us` between framework calls: no op,
                   no runtime call): the host was busy with something the profiler did not see
                   (model set-up, unannotated data preparation, evaluation), not launching.
                   Rolls up into "not explained": nothing in the trace says what it was.
 7 python_host     a starved gap (the launch of the work that ends it began only after the
                   device had gone idle; also the head of the GPU span, when its first work
                   was launched only after the span began: `measures.gaps.leading_gap`) while
                   the host ran the user's code (`measures.host.user_code`): Python between
                   framework calls for longer than `HostConfig.python_ratio` x the framework
                   call before it, outside a compiled graph's run (Inductor's wrapper
                   launching from Python is the framework's), or a run of ops that launch
                   nothing holding one on host tensors that runs over
                   `HostConfig.host_compute_us` on its own (per-sample augmentation in the
                   loop, CPU preprocessing): the user's code, not the framework, kept the GPU
                   waiting [CPU-bound].
 8 launch_bound    the rest of the starved gaps: the framework's own dispatch and launch calls
                   (a small model's steady state; no pattern: fixed by CUDA graphs or
                   torch.compile, not by removing a mistake).  Rolls up with python_host into
                   the launch-bound cause.
 9 not_explained   the rest (dependencies on other streams, host work between steps that no
                   marker names, events the profiler did not record).

This module is the account: the mechanism table, its priority, the assignment of each idle
microsecond (`measure`), and the per-window and per-step views of it.  The intervals each
mechanism covers are measured in `traceap.measures` (the GPU span and its gaps: `gaps.py`;
warm-up: `warmup.py`; the host's holes between framework calls: `host.py`; ...), the sentences
about the account are `traceap.report.idle_text`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from .measures.accumulation import wasted_intervals
from .measures.allocator import churn_intervals
from .measures.communication import (BlockConfig, SmallNcclConfig, blocking_nccl,
                                     collective_calls, host_late_outside_collectives,
                                     host_late_under_nccl, small_nccl)
from .measures.compile_regions import compile_gaps, recompile_intervals
from .measures.copies import MemcpyConfig, PinConfig, host_copies, pageable_h2d, sync_costs
from .measures.dataparallel import dp_intervals
from .measures.gaps import gpu_span, leading_gap, loader_gaps
from .measures.host import HostConfig, unrecorded_host, user_code
from .measures.host_init import init_intervals
from .measures.signals import (busy_rows, cached, inside, intersect, nccl_rows, spans,
                               starved_gaps, subtract)
from .measures.warmup import WarmupConfig, warmup
from .patterns._registry import mechanism_of_pattern, pattern_of_mechanism
from .trace import CopyKind, Kind, Trace, merged_intervals
from .windows import Windows, covered_time

CAUSES = ("warmup", "communication", "compile_gaps", "data_loading", "host_copy_sync",
          "launch_bound", "not_explained")

CAUSE_TITLES = {
    "warmup": "warm-up / first step",
    "communication": "waiting on communication",
    "compile_gaps": "torch.compile gaps",
    "host_copy_sync": "host<->device copies and syncs",
    "data_loading": "data loading",
    "launch_bound": "launch-bound host (CPU-bound)",
    "not_explained": "not explained",
}


class Mechanism(NamedTuple):
    """One way the GPU ends up idle: its id, the cause it rolls up into, and whether a fix can
    only hide it under the compute there is (collectives: overlapping them better cannot gain
    more than the compute they would overlap).  The pattern whose time a mechanism is declares
    it (`AntiPattern.account = IdleCause(id)`); `pattern_of` reads that from the registry.
    `model_as`: for a mechanism added after the bundled checkpoint was trained, the one whose
    time it was before (the learned model's inputs keep their meaning: `model.features`)."""

    id: str
    cause: str
    hides_under_compute: bool = False
    model_as: str | None = None


#: Priority order: a microsecond covered by several mechanisms goes to the first.
MECHANISMS = (
    Mechanism("recompilation", "compile_gaps", model_as="warmup"),
    # Before warm-up: WARMUP_CALLS names every cudaMalloc; these are only the steady steps' ones.
    Mechanism("allocator_churn", "host_copy_sync", model_as="warmup"),
    Mechanism("warmup", "warmup"),
    Mechanism("dataparallel", "communication", model_as="nccl"),
    Mechanism("accum_allreduce", "communication", model_as="nccl"),
    Mechanism("nccl_on_compute_stream", "communication", True),
    Mechanism("small_nccl", "communication"),
    Mechanism("nccl", "communication", True),
    Mechanism("compile_gaps", "compile_gaps"),
    Mechanism("data_loading", "data_loading"),
    # Before the other copies: a tensor made on the host and uploaded costs its creation's fix.
    Mechanism("cpu_tensor_init", "host_copy_sync", model_as="host_copies_syncs"),
    Mechanism("pageable_copies", "host_copy_sync"),
    Mechanism("host_copies_syncs", "host_copy_sync"),
    Mechanism("input_copies", "host_copy_sync"),      # large pinned uploads: no pattern
    Mechanism("unrecorded_host", "not_explained"),
    Mechanism("python_host", "launch_bound"),
    Mechanism("launch_bound", "launch_bound"),        # the framework's own launches: no pattern
)
#: What each mechanism is, for a sentence that splits a cause into its parts.
MECHANISM_TITLES = {
    "recompilation": "torch.compile recompiling after the first step",
    "allocator_churn": "cudaMalloc/cudaFree and empty_cache in steady steps",
    "warmup": "one-off start-up",
    "dataparallel": "nn.DataParallel's replicate / scatter / gather",
    "accum_allreduce": "all-reduces of non-final accumulation micro-steps",
    "nccl_on_compute_stream": "collectives on a compute stream",
    "small_nccl": "many small collectives",
    "nccl": "exposed collectives",
    "compile_gaps": "gaps between compiled regions",
    "data_loading": "DataLoader.__next__ and the gaps it fills",
    "cpu_tensor_init": "tensors created on the host, then uploaded",
    "pageable_copies": "pageable host<->device uploads",
    "host_copies_syncs": "DtoH / small copies and host-blocking syncs",
    "input_copies": "large pinned input uploads (no anti-pattern)",
    "unrecorded_host": "host work the profiler did not record",
    "python_host": "the user's code (Python between framework calls, ops on host tensors)",
    "launch_bound": "the framework's own dispatch and launch calls",
    "not_explained": "not explained",
}
NOT_EXPLAINED = len(MECHANISMS)  # the code of idle time no mechanism covers
MECHANISM_IDS = tuple(m.id for m in MECHANISMS) + ("not_explained",)


def pattern_of(mechanism: str) -> str | None:
    """The anti-pattern whose time a mechanism's idle time is (the registry's declarations),
    or None (warm-up, large pinned uploads, the framework's own launches, ...)."""
    return pattern_of_mechanism().get(mechanism)


def mechanism_of(pattern: str) -> str | None:
    """The mechanism holding an anti-pattern's idle time, or None (an unknown id, or a
    pattern whose time is not idle time)."""
    return mechanism_of_pattern().get(pattern)

@dataclass(frozen=True)
class IdleConfig:
    """The thresholds of the account's own measurements: how warm-up is recognised, when a host
    hole is the user's Python or unrecorded work, and when an idle gap is the loader's (the
    mechanisms of a pattern keep their pattern's config)."""

    warmup: WarmupConfig = WarmupConfig()
    host: HostConfig = HostConfig()
    #: A GPU idle gap a `DataLoader.__next__` fills for at least this share is the loader's.
    loader_gap_share: float = 0.5


@dataclass
class IdleAccount:
    """A trace's GPU idle time, each microsecond assigned to one mechanism (`measure`)."""

    gpu_span: tuple[float, float]
    busy_us: float
    total_us: float
    by_mechanism: dict[str, float]
    #: Idle segments (trace clock), disjoint and sorted, with their mechanism code
    #: (index into MECHANISM_IDS).
    seg_start: np.ndarray = field(repr=False)
    seg_end: np.ndarray = field(repr=False)
    seg_code: np.ndarray = field(repr=False)
    #: Profiler steps that are warm-up (their numbers), and the steady ones as (start, end).
    warmup_steps: list[int] = field(default_factory=list)
    steady_steps: list[tuple[float, float, int]] = field(default_factory=list)
    #: What the warm-up was made of (name -> us of GPU idle under it), for sentences.
    warmup_sources: dict[str, float] = field(default_factory=dict)
    #: GPU busy time inside the steady steps (all busy time without steps).
    busy_in_steady_us: float = 0.0
    #: False once `totals_only` dropped the segments (`time_in` then cannot answer).
    has_segments: bool = True

    def totals_only(self) -> "IdleAccount":
        """This account without its per-segment arrays (they grow with the trace: about 7 KB
        per MB of trace), keeping every total the reports use; for results sent back from a
        worker and kept for many ranks (`traceap.job.analyze_job`)."""
        empty = np.zeros(0)
        return replace(self, seg_start=empty, seg_end=empty,
                       seg_code=np.zeros(0, self.seg_code.dtype), has_segments=False)

    @property
    def span_us(self) -> float:
        """Length of the GPU span."""
        return self.gpu_span[1] - self.gpu_span[0]

    @property
    def busy_fraction(self) -> float | None:
        """GPU busy time over the GPU span (None without GPU activity); idle is the rest."""
        return self.busy_us / self.span_us if self.span_us > 0 else None

    @property
    def busy_pct(self) -> int | None:
        """GPU busy in whole percent of the GPU span, as every report prints it."""
        return busy_pct(self.busy_fraction)

    @property
    def idle_pct(self) -> int | None:
        """GPU idle in whole percent of the GPU span: 100 - `busy_pct`, so the two printed
        numbers always add up to the span."""
        b = self.busy_pct
        return None if b is None else 100 - b

    @property
    def by_cause(self) -> dict[str, float]:
        """Idle time per cause (every cause present, in `CAUSES` order)."""
        out = {c: 0.0 for c in CAUSES}
        for m in MECHANISMS:
            out[m.cause] += self.by_mechanism[m.id]
        out["not_explained"] += self.by_mechanism["not_explained"]
        return out

    @property
    def by_pattern(self) -> dict[str, float]:
        """Idle time per anti-pattern id (the mechanisms that belong to a pattern)."""
        owner = pattern_of_mechanism()
        return {owner[m.id]: self.by_mechanism[m.id] for m in MECHANISMS if m.id in owner}

    def time_in(self, mechanism: str, starts: Iterable[float], ends: Iterable[float]) -> float:
        """Idle time of one mechanism (an id of MECHANISM_IDS) inside disjoint ranges."""
        if not self.has_segments:
            raise ValueError("this idle account keeps totals only (its segments stayed with "
                             "the worker that measured it); measure the trace again")
        code = MECHANISM_IDS.index(mechanism)
        s = np.asarray(list(starts), dtype=np.float64)
        e = np.asarray(list(ends), dtype=np.float64)
        if not len(s):
            return 0.0
        sel = self.seg_code == code
        f = covered_time(self.seg_start[sel], self.seg_end[sel], np.concatenate((s, e)))
        fs, fe = f[:len(s)], f[len(s):]
        return float(np.sum(fe - fs))

    def segments(self, mechanism: str) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends) of the idle time assigned to one mechanism (an id of MECHANISM_IDS)."""
        if not self.has_segments:
            raise ValueError("this idle account keeps totals only; measure the trace again")
        sel = self.seg_code == MECHANISM_IDS.index(mechanism)
        return self.seg_start[sel], self.seg_end[sel]

    def in_steady_steps(self, mechanism: str) -> float | None:
        """A mechanism's idle time inside the steady profiler steps (None without steps)."""
        if not self.steady_steps:
            return None
        return self.time_in(mechanism, [s for s, _, _ in self.steady_steps],
                            [e for _, e, _ in self.steady_steps])

    def to_json(self) -> dict:
        """{"total_us", "by_cause", ...} as written in the analysis and info JSON."""
        r = lambda x: round(float(x), 1)  # noqa: E731 - one rounding for every number here
        return {"definition": "GPU span minus time with a compute kernel, memset or on-device "
                              "copy running; each idle us in exactly one cause",
                "gpu_span_us": [r(self.gpu_span[0]), r(self.gpu_span[1])],
                "busy_us": r(self.busy_us), "total_us": r(self.total_us),
                "by_cause": {k: r(v) for k, v in self.by_cause.items()},
                "by_pattern": {k: r(v) for k, v in self.by_pattern.items()},
                "warmup_steps": list(self.warmup_steps),
                "steady_steps": len(self.steady_steps)}


def busy_pct(busy_fraction: float | None) -> int | None:
    """A GPU busy fraction (of the GPU span) in whole percent: the one rounding every report
    uses, so "GPU busy" and "GPU idle" (100 minus it) printed anywhere agree and add up."""
    return None if busy_fraction is None else int(round(100.0 * busy_fraction))


def busy_fraction_of(gpu_idle: dict | None) -> float | None:
    """`IdleAccount.busy_fraction` read back from its JSON (`to_json`: busy_us over the span of
    gpu_span_us); None without GPU activity."""
    if not isinstance(gpu_idle, dict) or not gpu_idle.get("gpu_span_us"):
        return None
    lo, hi = gpu_idle["gpu_span_us"]
    span = float(hi) - float(lo)
    return float(gpu_idle.get("busy_us", 0.0)) / span if span > 0 else None


# -- cause intervals ---------------------------------------------------------------------------
def mechanism_intervals(trace: Trace, config: IdleConfig = IdleConfig()
                        ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per mechanism id (priority order): the (starts, ends) where it would explain idle time."""
    t = trace
    w0, w1, _, wsteps = warmup(t, config.warmup)
    out = {"recompilation": recompile_intervals(t), "allocator_churn": churn_intervals(t, wsteps),
           "warmup": (w0, w1), "dataparallel": dp_intervals(t)}
    blk = blocking_nccl(t, BlockConfig())
    sc = SmallNcclConfig()
    small = np.setdiff1d(small_nccl(t, sc), blk)
    # A few short collectives per step (a broadcast of buffers, a metric) are not "many small
    # collectives": their exposed time is plain exposed communication.
    if len(small) / max(len(t.steps), 1) < sc.per_step_lo:
        small = small[:0]
    # A collective running while no compute is queued and the host is not waiting on the device
    # holds nothing back: the host had not launched the next work yet.  That idle goes to the
    # host-side mechanisms below (the starved gaps under the collective), not to communication.
    # Except the host inside a wasted all-reduce's own c10d calls: that is its cost (no_sync
    # removes the calls too), as for small collectives.
    l0, l1 = host_late_under_nccl(t)
    out["accum_allreduce"] = subtract(*wasted_intervals(t), *host_late_outside_collectives(t))
    out["nccl_on_compute_stream"] = subtract(*spans(t, blk), l0, l1)
    # Small collectives' cost is their kernels and the host's calls that launch them: between
    # two of them the device waits (a starved gap) while the host is in the next one's c10d
    # call; bucketing removes both (the kernels alone were 41% of what planted ones add).  Not
    # a call the host made far ahead of a device idle for other reasons.
    calls = collective_calls(t, small)
    g0, g1, _ = starved_gaps(t)
    w0, w1 = intersect(t.ts[calls], t.end[calls], g0, g1)
    c0, c1 = merged_intervals(np.concatenate((t.ts[small], w0)), np.concatenate((t.end[small], w1)))
    out["small_nccl"] = subtract(c0, c1, *host_late_outside_collectives(t))
    out["nccl"] = subtract(*spans(t, nccl_rows(t)), l0, l1)
    # One compiled frame called again and again (a sampler loop) has no breaks between calls.
    out["compile_gaps"] = compile_gaps(t)
    pin = PinConfig()
    page, _ = pageable_h2d(t, pin)
    nb = t.bytes[page]
    page = page[~np.isfinite(nb) | (nb <= 0) | (nb >= pin.bytes_lo)]
    calls = t.launch[page]
    calls = calls[calls >= 0]
    out["cpu_tensor_init"] = init_intervals(t)
    out["pageable_copies"] = (np.concatenate((t.ts[page], t.ts[calls])),
                              np.concatenate((t.end[page], t.end[calls])))
    mc = MemcpyConfig()
    habit = host_copies(t, mc.batch_bytes)
    b0, b1 = sync_costs(t, mc.sync_tol_us, config.host)
    out["host_copies_syncs"] = (np.concatenate((t.ts[habit], b0)),
                                np.concatenate((t.end[habit], b1)))
    copies = t.rows(Kind.GPU_MEMCPY)
    host_side = copies[~np.isin(t.copy_kind[copies], (CopyKind.DTOD, CopyKind.PTOP))]
    rest = np.setdiff1d(host_side, np.concatenate((page, habit)))
    out["input_copies"] = spans(t, rest)
    out["data_loading"] = loader_gaps(t, config.loader_gap_share)
    # The host-cause stretches: the starved gaps, the host late under a collective and the
    # span's leading gap; the user's code inside them is python_host, all of them launch-bound.
    f0, f1 = leading_gap(t)
    a0, a1 = np.concatenate((g0, l0, f0)), np.concatenate((g1, l1, f1))
    h0, h1 = unrecorded_host(t, config.host.unrecorded_host_us)
    out["unrecorded_host"] = (h0, h1)
    p0, p1 = user_code(t, config.host)
    out["python_host"] = intersect(a0, a1, p0, p1)
    out["launch_bound"] = (a0, a1)
    return out


# -- the account -------------------------------------------------------------------------------
def measure(trace: Trace, config: IdleConfig = IdleConfig()) -> IdleAccount:
    """The trace's idle account (computed once per trace and config)."""
    return cached(trace, f"idle:{config!r}", lambda: _measure(trace, config))


def _measure(trace: Trace, config: IdleConfig) -> IdleAccount:
    t = trace
    zero = {m: 0.0 for m in MECHANISM_IDS}
    empty = np.zeros(0)
    if not t.has_gpu:
        # No GPU to idle, and so no warm-up step to tell apart: every profiler step is steady
        # (the steps the step basis, the analysis JSON and `traceap diff` count).
        steps = [(s.start_us, s.end_us, s.number) for s in sorted(t.steps, key=lambda x: x.start_us)
                 if s.end_us > s.start_us]
        return IdleAccount((0.0, 0.0), 0.0, 0.0, zero, empty, empty, np.zeros(0, np.int16),
                           steady_steps=steps)
    lo, hi = gpu_span(t)
    b = busy_rows(t)
    # Work relative to the span start: epoch-microsecond clocks lose precision in sums.
    bs, be = merged_intervals(np.clip(t.ts[b], lo, hi) - lo, np.clip(t.end[b], lo, hi) - lo)
    mech = mechanism_intervals(t, config)
    merged = {}
    points = [np.array([0.0, hi - lo]), bs, be]
    for mid, (s, e) in mech.items():
        s = np.clip(np.asarray(s, np.float64), lo, hi) - lo
        e = np.clip(np.asarray(e, np.float64), lo, hi) - lo
        ok = e > s
        ms, me = merged_intervals(s[ok], e[ok])
        merged[mid] = (ms, me)
        points += [ms, me]
    p = np.unique(np.concatenate(points))
    mid_pt = 0.5 * (p[:-1] + p[1:])
    length = np.diff(p)
    code = np.full(len(mid_pt), -1, dtype=np.int16)
    idle = ~inside(bs, be, mid_pt)
    free = idle.copy()
    for k, m in enumerate(MECHANISMS):
        hit = free & inside(*merged[m.id], mid_pt)
        code[hit] = k
        free &= ~hit
    code[free] = NOT_EXPLAINED
    by = {mid: float(length[code == k].sum()) for k, mid in enumerate(MECHANISM_IDS)}
    keep = code >= 0
    seg_s, seg_e, seg_c = p[:-1][keep] + lo, p[1:][keep] + lo, code[keep]
    busy = float(np.sum(be - bs))
    steady = [(s.start_us, s.end_us, s.number) for s in sorted(t.steps, key=lambda x: x.start_us)
              if s.end_us > s.start_us]
    _, _, sources, wsteps = warmup(t, config.warmup)
    # What the warm-up was made of: each warm-up us to the first source covering it.
    src_us = {}
    left = code == MECHANISM_IDS.index("warmup")
    for name, (s, e) in sources.items():
        s = np.clip(np.asarray(s, np.float64), lo, hi) - lo
        e = np.clip(np.asarray(e, np.float64), lo, hi) - lo
        ms, me = merged_intervals(s[e > s], e[e > s])
        hit = inside(ms, me, mid_pt) & left
        left &= ~hit
        if hit.any():
            src_us[name] = float(length[hit].sum())
    steady = [x for x in steady if x[2] not in wsteps]
    if steady:
        fb = covered_time(bs, be, np.array([x for s, e, _ in steady for x in (s - lo, e - lo)]))
        busy_steady = float(np.sum(fb[1::2] - fb[0::2]))
    else:
        busy_steady = busy
    return IdleAccount((lo, hi), busy, float(length[idle].sum()), by, seg_s, seg_e, seg_c,
                       warmup_steps=wsteps, steady_steps=steady, warmup_sources=src_us,
                       busy_in_steady_us=busy_steady)


# -- per window, per step ------------------------------------------------------------------------
def per_window(windows: Windows, config: IdleConfig = IdleConfig()) -> dict[str, np.ndarray]:
    """Per mechanism id (and "not_explained"): idle time in each window (cached per Windows)."""

    def make() -> dict[str, np.ndarray]:
        acc = measure(windows.trace, config)
        out = {}
        for k, mid in enumerate(MECHANISM_IDS):
            sel = acc.seg_code == k
            out[mid] = np.clip(np.diff(covered_time(acc.seg_start[sel], acc.seg_end[sel],
                                                    windows.edges)), 0.0, None)
        return out
    return cached(windows, f"idle:windows:{config!r}", make)


def cause_per_window(windows: Windows, config: IdleConfig = IdleConfig()) -> dict[str, np.ndarray]:
    """Per cause: idle time in each window."""
    pw = per_window(windows, config)
    out = {c: np.zeros(windows.n) for c in CAUSES}
    for m in MECHANISMS:
        out[m.cause] = out[m.cause] + pw[m.id]
    out["not_explained"] = out["not_explained"] + pw["not_explained"]
    return out


def pattern_lost(windows: Windows, pattern: str) -> np.ndarray:
    """Per window: the idle time an anti-pattern's mechanism costs (zeros for other ids)."""
    mid = mechanism_of(pattern)
    return per_window(windows)[mid].copy() if mid else np.zeros(windows.n)


def warmup_share(windows: Windows) -> np.ndarray:
    """Per window: the share of its time that is GPU idle of one-off start-up (the `warmup`
    mechanism: allocator growth, graph capture, module loading, compilation, worker start)."""
    return np.clip(per_window(windows)["warmup"] / max(windows.width_us, 1e-9), 0.0, 1.0)


def compute_per_step(account: IdleAccount, n_steps: int) -> float:
    """GPU busy (compute) time per steady step, or in total without steps: the most that
    communication could hide under."""
    return account.busy_in_steady_us / n_steps if n_steps else account.busy_us


def gain_cap_us(account: IdleAccount, pattern: str, n_steps: int) -> float | None:
    """The most fixing an anti-pattern can gain per step (in total without steps), where less
    than its time lost (`Mechanism.hides_under_compute`); None where it is not capped."""
    mid = mechanism_of(pattern)
    mech = next((m for m in MECHANISMS if m.id == mid), None)
    return compute_per_step(account, n_steps) if mech and mech.hides_under_compute else None


def trace_costs(trace: Trace, pattern: str) -> float:
    """1.0 when an anti-pattern's mechanism costs any GPU idle time in the trace, else 0.0."""
    return float(measure(trace).by_pattern.get(pattern, 0.0) > 0.0)


def per_step(trace: Trace, config: IdleConfig = IdleConfig()) -> list[dict]:
    """Per profiler step: number, duration, warm-up or not, idle total and by cause."""
    acc = measure(trace, config)
    steps = sorted(trace.steps, key=lambda x: x.start_us)
    if not steps:
        return []
    edges = np.array([x for s in steps for x in (s.start_us, s.end_us)], dtype=np.float64)
    by = {c: np.zeros(len(steps)) for c in CAUSES}
    for k, mid in enumerate(MECHANISM_IDS):  # one pass over the segments per mechanism
        cause = MECHANISMS[k].cause if k < len(MECHANISMS) else "not_explained"
        sel = acc.seg_code == k
        f = covered_time(acc.seg_start[sel], acc.seg_end[sel], edges)
        by[cause] += f[1::2] - f[0::2]
    return [{"number": s.number, "dur_us": round(s.end_us - s.start_us, 1),
             "warmup": s.number in acc.warmup_steps,
             "idle_us": round(float(sum(by[c][i] for c in CAUSES)), 1),
             "by_cause": {c: round(float(by[c][i]), 1) for c in CAUSES}}
            for i, s in enumerate(steps)]


def explained_share(account: IdleAccount) -> float:
    """Share of the idle time assigned to a named cause."""
    if account.total_us <= 0:
        return 1.0
    return 1.0 - account.by_cause["not_explained"] / account.total_us


__all__ = ["CAUSES", "CAUSE_TITLES", "IdleAccount", "IdleConfig", "MECHANISMS", "MECHANISM_IDS",
           "MECHANISM_TITLES", "Mechanism", "busy_fraction_of", "busy_pct", "cause_per_window",
           "compute_per_step", "explained_share", "gain_cap_us", "measure", "mechanism_intervals",
           "mechanism_of", "pattern_lost", "pattern_of", "per_step", "per_window", "trace_costs",
           "warmup_share"]
