"""Host-to-device copies from pageable memory (no `pin_memory`).

Mechanism: `Memcpy HtoD (Pageable -> Device)` cannot run as a true async DMA: the driver stages
the data through a pinned buffer and the launching `cudaMemcpyAsync` blocks the host for about
the whole copy, so neither the copy nor the next launches overlap anything.  ROCm traces say
`Host -> Device` without the memory kind; such copies count when the launching call blocked for
most of the copy (the synchronous signature).  Anchor: Nsight's "async copies from pageable
memory" rule; nsys-ai flags any pageable memcpy.  Time lost is the `pageable_copies` idle of
`traceap.idle` (copy-only time and the GPU idle while the launch call blocks), so a few ms of
pageable uploads per step in a healthy run make at most a low-severity finding.
"""

from __future__ import annotations

import numpy as np

from ..idle import pattern_lost, trace_costs
from ..measures.copies import PinConfig, pageable_h2d
from ..measures.signals import fmt_bytes, fmt_us, ramp, sum_in, union_in
from ..trace import CopyKind, Kind, MemKind, Trace
from ..windows import Windows
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs, longest_first


class NoPinMemory(AntiPattern):
    id = "no_pin_memory"
    title = "Host-to-device copies from pageable memory (no pin_memory)"
    mechanism = "pageable HtoD copies are staged by the driver and block the launching thread"
    amount = ("n_copies", "bytes")
    fix = """\
Copy batches from page-locked (pinned) memory, asynchronously:

    loader = DataLoader(dataset, batch_size=bs, num_workers=8, pin_memory=True)
    for images, targets in loader:
        images = images.to(device, non_blocking=True)    # async DMA from pinned memory
        targets = targets.to(device, non_blocking=True)

For tensors you build yourself, pin once and reuse: `buf = torch.empty(shape, pin_memory=True)`
(or `t.pin_memory()`), then `.to(device, non_blocking=True)`."""
    letter = "P"
    color = "#56B4E9"
    short = "NPM"
    account = IdleCause("pageable_copies")
    signature = ("`Memcpy HtoD (Pageable -> Device)` copies; the launching cudaMemcpyAsync blocks "
                 "the host for about as long as the copy itself.")

    def __init__(self, config: PinConfig = PinConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        rows, weight = pageable_h2d(t, c)
        # Judge each copy by its own size (a 4-byte scalar is not an input batch); copies of
        # unknown size (older traces) count.  A copy and its call span windows, so sizes are
        # applied per copy before measuring time, never per window.
        nb = t.bytes[rows]
        big = ~np.isfinite(nb) | (nb <= 0) | (nb >= c.bytes_lo)
        stall_by_kind = []
        for kind_w in (1.0, c.unknown_weight):
            r = rows[big & (weight == kind_w)]
            calls = t.launch[r]
            calls = calls[calls >= 0]
            stall = union_in(windows, np.concatenate((t.ts[r], t.ts[calls])),
                             np.concatenate((t.end[r], t.end[calls])))
            stall_by_kind.append(kind_w * ramp(stall / windows.width_us, c.time_lo, c.time_hi))
        score = np.maximum(*stall_by_kind)
        r = rows[big]
        calls = t.launch[r]
        calls = calls[calls >= 0]
        copy_us = union_in(windows, t.ts[r], t.end[r])
        blocked_us = union_in(windows, t.ts[calls], t.end[calls])
        # GPU time lost: the device idle while the host is stuck in the call or only the copy
        # runs (the idle account's bucket); copies hidden under compute cost nothing.
        lost = pattern_lost(windows, self.id)
        # The host blocks in a pageable copy while the GPU still drains earlier work: the window
        # shows the mechanism before the GPU pays for it, so only a trace where these copies
        # never cost the GPU anything has no finding (severity then follows the cost).
        score = score * trace_costs(t, self.id)
        nbytes = sum_in(windows, t.ts[r], np.nan_to_num(t.bytes[r]))
        n = sum_in(windows, t.ts[r], np.ones(len(r)))
        return {"score": score, "lost_us": lost, "copy_us": copy_us,
                "blocked_us": blocked_us, "bytes": nbytes, "n": n}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        n = int(m["n"][idx].sum())
        nbytes = float(m["bytes"][idx].sum())
        copy = float(m["copy_us"][idx].sum())
        blocked = float(m["blocked_us"][idx].sum())
        bw = nbytes / copy / 1e3 if copy > 0 and nbytes > 0 else None
        text = (f"{n} host-to-device copies from pageable memory ({fmt_bytes(nbytes)} in "
                f"{fmt_us(copy)}" + (f", {bw:.1f} GB/s" if bw else "") +
                f"); the launching thread blocked {fmt_us(blocked)}")
        return text, {"n_copies": n, "bytes": nbytes, "copy_us": round(copy, 1),
                      "host_blocked_us": round(blocked, 1),
                      "bandwidth_gbps": None if bw is None else round(bw, 2)}

    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("n_copies", 0) > 0

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """Copies from pageable (or unknown) host memory, longest first; all copies if none is."""
        t = trace
        mem = t.rows(Kind.GPU_MEMCPY)
        mem = mem[in_runs(t, runs)[mem]]
        host = np.where(t.copy_kind[mem] == CopyKind.DTOH, t.copy_dst[mem], t.copy_src[mem])
        pageable = mem[(host == MemKind.PAGEABLE) | (host == MemKind.HOST)]
        mem = pageable if len(pageable) else mem
        return ("Copies from pageable host memory (synchronous), longest first",
                event_rows(t, longest_first(t, mem), limit, detail="bytes"))


PATTERN = register_pattern(NoPinMemory())
