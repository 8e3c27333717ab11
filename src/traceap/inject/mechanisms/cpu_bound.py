"""cpu_bound: Python overhead between ops makes launches slower than the kernels they run.

Mechanism: over a stretch of the step (the forward) every op is preceded by more Python
(dispatch, hooks, small-tensor bookkeeping; the ops a DataLoader's `__next__` runs are the
loader's, left alone): the host cadence slows by a factor of 2-6, the
queue of launched work runs dry and the GPU waits for each launch.  Each op's preceding gap
grows by (factor - 1) x the time since the previous op started (at most twice the stretch's
median interval: a pause the base had between two ops is not dispatch overhead).  Label: from
the first to the last stretch of GPU idle inside the slowed stretch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...measures.signals import LOADER_NEXT, inside, rows_named, spans
from ...patterns._registry import register_piece
from ...trace import Kind, merged_intervals
from .base import Base, Block, Busy, Instance, Plan, Unusable

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "cpu_bound"


@dataclass(frozen=True)
class Config:
    """How much slower the host gets."""

    #: Host slow-down: eager Python overhead of 2-6x per op (small ops, hooks, debug modes).
    factor: tuple = (2.0, 6.0)
    #: Ops in the slowed stretch (at least / at most), and its share of the forward's ops:
    #: part of the step stays as it was, so windows outside the stretch stay clean.
    min_ops: int = 6
    max_ops: int = 400
    share: tuple = (0.25, 0.6)
    #: The GPU must idle at least this share of the stretch for the instance to count.
    min_idle_share: float = 0.15
    max_instances: int = 8
    #: Longest interval between two ops that the slow-down scales, in median intervals.
    pause_cap: float = 2.0


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """Gaps before every op of each step's first half (its forward when it has one)."""
    tr = base.doc.trace
    main = base.tl.main_thread
    on_main = base.doc.thread[base.doc.row_event] == main
    # ops called from Python: cpu_ops not inside another cpu_op (a 2021 trace's ProfilerStep
    # is itself an `Operator`, so steps count as "not inside")
    par = base.effective_parent()
    steps = base.step_rows()
    ops = np.flatnonzero(on_main & (tr.kind == Kind.CPU_OP) & ~np.isin(np.arange(len(tr)), steps)
                         & ((par < 0) | np.isin(par, steps)
                            | (tr.kind[np.maximum(par, 0)] != Kind.CPU_OP)))
    # The ops a `DataLoader.__next__` runs (a single-process loader's collate) are the
    # loader's: slowing them plants a slower loader, a data-loading stall, not Python overhead.
    ops = ops[~inside(*_loader_spans(base, on_main), base.start_rel(ops))]
    starts_all = base.start_rel(ops)
    instances = []
    for _row, lo, hi, _kids in base.steps_or_stretches()[: config.max_instances]:
        bw = base.backward_rows()
        bws = base.start_rel(bw)
        bws = bws[(bws > lo) & (bws < hi)]
        stop = float(bws.min()) if len(bws) else lo + 0.6 * (hi - lo)
        sel = np.flatnonzero((starts_all > lo) & (starts_all < stop))
        if len(sel) < config.min_ops:
            continue
        n = int(np.clip(round(len(sel) * rng.uniform(*config.share)), config.min_ops,
                        min(config.max_ops, len(sel))))
        first = int(rng.integers(0, len(sel) - n + 1))
        sel = sel[first:first + n]
        f = rng.uniform(*config.factor)
        s = starts_all[sel]
        # Python overhead scales an op's dispatch, not a pause the base already had between
        # two ops (a sync, a log write): an interval counts up to `pause_cap` x the stretch's
        # median one (uncapped, one pause of the base became a single hole of a second).
        d = np.diff(s)
        gaps = (f - 1.0) * np.minimum(d, config.pause_cap * float(np.median(d)))
        blocks = [Block(T=float(t), thread=main, steps=[Busy(float(g))])
                  for t, g in zip(s[1:], gaps) if g > 0]
        if not blocks:
            continue
        inst = Instance(blocks, lambda fac: [], label="stretch",
                        min_idle_us=config.min_idle_share * (s[-1] - s[0] + gaps.sum()))
        instances.append(inst)
    if not instances:
        raise Unusable(f"no step has {config.min_ops} or more ops on the main thread to slow down")
    return Plan(PATTERN, instances)


def _loader_spans(base: Base, on_main: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Relative (start, end) of the main thread's `DataLoader.__next__` spans, merged."""
    rows = rows_named(base.doc.trace, LOADER_NEXT)
    s, e = spans(base.doc.trace, rows[on_main[rows]])
    return merged_intervals(base.rel(s), base.rel(e))


# -- the natural label: where a real trace shows the pattern by itself ----------------------
def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Where a real trace shows this pattern by itself (`traceap label`; thresholds in
    `NaturalConfig`): (start, end) intervals."""
    tr = c.tr
    k = c.compute_k[np.argsort(tr.ts[c.compute_k], kind="stable")]
    # a single step cannot tell a launch-bound model from warm-up (first calls, allocator,
    # cuDNN autotuning): only traces with a steady state after their first step are labelled
    if len(k) < 2 or len(c.steps) < 2:
        return
    lat = tr.launch_delay[k]
    waited = np.isfinite(lat) & (lat <= cfg.launch_bound_slack_us)
    for s0, s1 in c.steps:
        if s1 - s0 < cfg.min_step_us:
            continue
        gs, ge = c.idle_in(s0, s1)
        # a gap is launch-bound when the kernel that ends it started right after its launch
        j = np.searchsorted(tr.ts[k], ge - 1e-6)
        ok = j < len(k)
        ok[ok] = waited[j[ok]] & (np.abs(tr.ts[k][j[ok]] - ge[ok]) < 1.0)
        lb = (ge - gs)[ok].sum()
        if lb >= cfg.launch_bound_share * (s1 - s0):
            yield gs[ok][0], ge[ok][-1]




register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
