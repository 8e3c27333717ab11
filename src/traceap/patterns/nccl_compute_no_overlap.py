"""Exposed communication: NCCL runs while no compute kernel runs beside it.

Time lost is the `nccl` idle of `traceap.idle`: NCCL running while no compute kernel (memset,
on-device copy) runs, the one definition of exposed communication that `traceap info`, the
cross-rank view and every report use.  The gain of a fix is capped by the compute there is to
hide it under: a communication-bound step cannot overlap more.

Mechanism: DDP overlaps gradient all-reduce with the rest of backward; when buckets are
ready only at the end (one huge bucket, `find_unused_parameters=True`, hooks that wait), when
communication is issued after backward, or when a rank waits for a straggler, the collectives
run alone and the step waits for them.  Evidence: NCCL time on communication streams not
overlapped by any compute kernel.  Anchors: TraceLens flags exposed communication over 5% of
GPU time and overlap under 70% (ignoring under 100 us of communication); nsys-ai overlap < 30%.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..idle import pattern_lost
from ..measures.communication import BlockConfig, blocking_nccl
from ..measures.compile_regions import FORWARD
from ..measures.signals import (cached, compute_rows, count_in, fmt_us, nccl_rows, overlap_in, ramp,
                                rows_in_windows, rows_named, spans, top_names, union_in)
from ..trace import Kind, Trace, busy_union, merged_intervals
from ..windows import Windows, covered_time
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs


@dataclass(frozen=True)
class OverlapConfig:
    """Thresholds on exposed NCCL time (share of a window) and on the overlap ratio."""

    exposed_lo: float = 0.05   # TraceLens: exposed communication over 5% of GPU time
    exposed_hi: float = 0.30
    overlap_ok: float = 0.70   # TraceLens: overlap under 70% is a problem
    overlap_bad: float = 0.30  # nsys-ai: overlap under 30%
    min_comm_us: float = 100.0  # TraceLens ignores under 100 us of communication


def side_nccl(trace) -> np.ndarray:
    """NCCL kernels on their own streams (those on compute streams are the other pattern)."""
    def make():
        return np.setdiff1d(nccl_rows(trace), blocking_nccl(trace, BlockConfig()))
    return cached(trace, "side_nccl", make)


def trace_overlap(trace) -> float:
    """How much of the overlap that was possible happened, over the whole trace: NCCL time
    (side streams) hidden under compute, over min(NCCL time, compute time).  When the
    collectives outlast all compute, even perfect overlap leaves them exposed: that is being
    communication-bound, not failing to overlap."""
    def make() -> float:
        side, comp = side_nccl(trace), compute_rows(trace)
        if not len(side):
            return 1.0
        comm = busy_union(trace.ts[side], trace.end[side])
        compute = busy_union(trace.ts[comp], trace.end[comp])
        both = np.concatenate((side, comp))
        hidden = comm + compute - busy_union(trace.ts[both], trace.end[both])
        possible = min(comm, compute)
        return float(np.clip(hidden / possible, 0.0, 1.0)) if possible > 0 else 0.0
    return cached(trace, "trace_overlap", make)


class NcclComputeNoOverlap(AntiPattern):
    id = "nccl_compute_no_overlap"
    title = "Communication not overlapped with compute (exposed NCCL time)"
    mechanism = "collectives run while no compute kernel runs, so the step waits for them"
    amount = ("comm_us",)
    fix = """\
Let gradient communication run during backward:

    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[local_rank],
        bucket_cap_mb=25,                 # smaller first buckets start all-reduce earlier
        find_unused_parameters=False,     # True delays every bucket to the end of backward
        gradient_as_bucket_view=True, static_graph=True)

Don't all-reduce gradients yourself after `loss.backward()`; with FSDP use
`backward_prefetch=BackwardPrefetch.BACKWARD_PRE` and `forward_prefetch=True`; with gradient
accumulation, `model.no_sync()` on non-final micro-batches.  If one rank is slower (see the
straggler finding), the others' NCCL time is waiting: balance the data/work per rank."""
    letter = "O"
    color = "#6A3D9A"
    #: Lighter, same hue: the HTML colour is too dim on a dark terminal.
    terminal_color = "#9B6BD0"
    short = "NNO"
    account = IdleCause("nccl")
    signature = ("NCCL kernels on their own stream but no compute runs while they do: "
                 "communication is exposed and the GPU computes nothing during collectives.")

    def __init__(self, config: OverlapConfig = OverlapConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        side = side_nccl(t)
        comp = compute_rows(t)
        comm = union_in(windows, *spans(t, side))
        hidden = overlap_in(windows, spans(t, side), spans(t, comp))
        exposed = np.clip(comm - hidden, 0.0, None)
        # Judge overlap over the whole trace: even well-overlapped DDP exposes its last bucket
        # at the end of backward, so a window-level ratio would flag every healthy step.
        overlap = trace_overlap(t)
        # Scored on the idle account's exposed time: a collective that runs while the host has
        # not launched the next work yet (nothing queued behind it) holds nothing back.
        lost = pattern_lost(windows, self.id)
        score = (ramp(np.minimum(exposed, lost) / windows.width_us, c.exposed_lo, c.exposed_hi)
                 * float(ramp(1.0 - overlap, 1.0 - c.overlap_ok, 1.0 - c.overlap_bad))
                 * (comm >= c.min_comm_us))
        return {"score": score * (lost > 0), "lost_us": lost, "comm_us": comm,
                "hidden_us": hidden, "n_nccl": count_in(windows, t.ts[side])}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        comm = float(m["comm_us"][idx].sum())
        hidden = float(m["hidden_us"][idx].sum())
        # Exposed = the idle account's number (NCCL with no compute, memset or on-device copy
        # beside it), the same one `traceap info` and the cross-rank view report.
        exposed = float(m["lost_us"][idx].sum())
        rows = rows_in_windows(windows, side_nccl(t), idx)
        top = top_names(t, rows, weights=t.dur[rows], k=2)
        what = ", ".join(f"{n.split('(')[0]} x{c}" for n, c, _ in top)
        alone = max(comm - hidden, 0.0)
        text = (f"NCCL ran {fmt_us(comm)} ({what}) with only {100 * hidden / max(comm, 1e-9):.0f}% "
                f"overlapped by compute kernels ({100 * trace_overlap(t):.0f}% of the possible "
                f"overlap over the whole trace); ")
        if fmt_us(alone) != fmt_us(exposed):
            # Not all of the NCCL time without compute holds the step up: where nothing was
            # queued behind the collective, the host was late, and the host causes own it.
            text += (f"{fmt_us(alone)} with no compute kernel beside it, of which "
                     f"{fmt_us(exposed)} exposed (compute queued behind the collective waited "
                     f"for it; the rest ran while the host had not launched the next work yet "
                     f"and counts under the host's causes)")
        else:
            text += f"{fmt_us(exposed)} exposed (no compute beside it)"
        if len(rows_named(t, FORWARD)):
            text += (" (the model is compiled: keep torch._dynamo.config.optimize_ddp=True so "
                     "DDPOptimizer splits the graph at bucket boundaries and each bucket's "
                     "all-reduce starts during backward)")
        if top and ("SendRecv" in top[0][0] or "AllToAll" in top[0][0]):
            # all-to-all (embedding/expert exchange) is not DDP gradient traffic: say so.
            text += (" (mostly all-to-all: overlap it with the dense part, e.g. TorchRec "
                     "TrainPipelineSparseDist, or MoE expert-parallel pipelining)")
        return text, {"comm_us": round(comm, 1), "overlapped_us": round(hidden, 1),
                      "trace_overlap_fraction": round(trace_overlap(t), 3),
                      "exposed_us": round(exposed, 1), "without_compute_us": round(alone, 1),
                      "overlap_fraction": round(hidden / comm, 3) if comm > 0 else None}


    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("comm_us", 0.0) > 0

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """NCCL kernels by the time no compute kernel hides, most exposed first."""
        t = trace
        nccl = np.flatnonzero(in_runs(t, runs) & t.is_nccl)
        kernels = t.rows(Kind.KERNEL)
        compute = kernels[~t.is_nccl[kernels]]
        cs, ce = merged_intervals(t.ts[compute], t.end[compute])
        f = covered_time(cs, ce, np.concatenate((t.ts[nccl], t.end[nccl])))
        hidden = f[len(nccl):] - f[:len(nccl)]
        exposed = t.dur[nccl] - hidden
        share = dict(zip(nccl.tolist(), (hidden / np.maximum(t.dur[nccl], 1e-9)).tolist()))
        rows = nccl[np.argsort(-exposed, kind="stable")]
        return ("NCCL kernels by time no compute kernel hides, most exposed first",
                event_rows(t, rows, limit, detail="nelems", hidden=share))


PATTERN = register_pattern(NcclComputeNoOverlap())
