"""NCCL on the compute stream: communication serialised with the kernels that could hide it.

Mechanism: a collective issued on the stream that runs the model's kernels (e.g.
`dist.all_reduce` on the default stream, a custom hook without a side stream, some FSDP/TorchRec
settings) makes every later compute kernel on that stream wait for the collective, and the
collective waits for its peers.  Evidence: NCCL kernels on a stream that carries a large share
of compute-kernel time, and the compute they hold up.  Time lost is the
`nccl_on_compute_stream` idle of `traceap.idle` (such NCCL running with no compute beside it).
"""

from __future__ import annotations

import numpy as np

from ..idle import pattern_lost, trace_costs
from ..measures.communication import BlockConfig, blocking_nccl
from ..measures.signals import (compute_rows, count_in, fmt_us, overlap_in, ramp, rows_in_windows,
                                spans, top_names, union_in)
from ..trace import Kind, Trace
from ..windows import Windows
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs, longest_first


class NcclBlocksComputeStream(AntiPattern):
    id = "nccl_blocks_compute_stream"
    title = "NCCL collectives on the compute stream (compute waits for communication)"
    mechanism = "collectives queued on the stream of the model's kernels serialise with them"
    amount = ("n_nccl_on_compute_stream",)
    fix = """\
Run collectives on their own stream and let compute continue:

    # DDP / FSDP already use a separate NCCL stream: prefer them to hand-written all_reduce.
    work = torch.distributed.all_reduce(t, async_op=True)   # NCCL stream, returns at once
    ...                                                     # independent compute here
    work.wait()                                             # only where `t` is needed

    # custom code: issue on a side stream and join explicitly
    comm = torch.cuda.Stream()
    comm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(comm):
        torch.distributed.all_reduce(t)
    torch.cuda.current_stream().wait_stream(comm)

Avoid `torch.cuda.synchronize()` / blocking `.wait()` right after launching a collective."""
    letter = "B"
    color = "#8F6D00"
    #: Lighter, same hue: the HTML colour is too dim on a dark terminal.
    terminal_color = "#C9A227"
    short = "NBS"
    account = IdleCause("nccl_on_compute_stream")
    signature = ("NCCL kernels run on the same stream as compute kernels, so compute waits behind "
                 "communication on that stream.")

    def __init__(self, config: BlockConfig = BlockConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        blk = blocking_nccl(t, c)
        comp = compute_rows(t)
        on_stream = union_in(windows, *spans(t, blk))
        hidden = overlap_in(windows, spans(t, blk), spans(t, comp))
        exposed = np.clip(on_stream - hidden, 0.0, None)
        n = count_in(windows, t.ts[blk])
        score = np.maximum(ramp(on_stream / windows.width_us, c.time_lo, c.time_hi),
                           c.presence * (n > 0) * (len(blk) >= c.presence_min))
        lost = pattern_lost(windows, self.id)
        # Each such kernel stalls the stream, in windows that lose no idle time too; but a trace
        # where they never cost the GPU anything has no finding.
        return {"score": score * trace_costs(t, self.id), "lost_us": lost, "nccl_on_compute_us": on_stream,
                "n_blocking": n, "exposed_us": exposed}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        n = int(m["n_blocking"][idx].sum())
        tot = float(m["nccl_on_compute_us"][idx].sum())
        rows = rows_in_windows(windows, blocking_nccl(t, self.config), idx)
        streams = sorted(int(s) for s in np.unique(t.stream[rows]))
        top = top_names(t, rows, k=2)
        what = ", ".join(f"{n_.split('(')[0]} x{c}" for n_, c, _ in top)
        text = (f"{n} NCCL kernels ({fmt_us(tot)}) run on compute stream(s) {streams}, "
                f"so the kernels queued behind them wait: {what}")
        return text, {"n_nccl_on_compute_stream": n, "nccl_on_compute_us": round(tot, 1),
                      "streams": streams}


    def supported(self, numbers: dict) -> bool:
        return (numbers.get("time_lost_us", 0.0) > 0
                and numbers.get("n_nccl_on_compute_stream", 0) > 0)

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """NCCL kernels on a stream that also runs compute kernels, longest first."""
        t = trace
        nccl = np.flatnonzero(in_runs(t, runs) & t.is_nccl)
        kernels = t.rows(Kind.KERNEL)
        # Every stream that runs a compute kernel (`blocking_nccl` also asks for a share of the
        # compute time): the proof lists each collective that can hold compute back.
        streams = np.unique(t.stream[kernels[~t.is_nccl[kernels]]])
        rows = nccl[np.isin(t.stream[nccl], streams)]
        return ("NCCL kernels on a stream that also runs compute kernels",
                event_rows(t, longest_first(t, rows), limit, detail="nelems"))


PATTERN = register_pattern(NcclBlocksComputeStream())
