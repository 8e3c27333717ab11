"""Excessive host<->device copies and the synchronisations they force.

Mechanism: `.item()`, `.cpu()`, `.numpy()`, `print(loss)` or building tensors on the host inside
the loop each produce a DtoH/HtoD memcpy and a `cudaStreamSynchronize` (or a synchronous
`cudaMemcpy`): the host waits for the device to drain, then the device waits for the host to
launch again.  Time lost = the `host_copy_sync` idle of `traceap.idle` that belongs to this
pattern: copy time no compute overlaps, and the GPU gap after each sync that the sync can have
caused (all of it when the sync fetched values to the host, at most the time the host waited in
it for a bare event/stream sync), and the later starved gaps of the lead it lost (up to the
compute the device ran while the host waited: `measures.copies.sync_costs`).  Copies and syncs inside a
torch.compile graph break (a data-dependent `.item()`/`nonzero` between compiled regions) are the
break's, and a trace with only device-to-device copies and free syncs has no finding.  Anchors: TraceLens flags a memcpy direction over 5% of time or over 10
transfers; nsys-ai flags sync APIs over 1 ms and 2% of GPU time.
"""

from __future__ import annotations

import re

import numpy as np

from ..idle import pattern_lost
from ..measures.compile_regions import compile_gaps
from ..measures.copies import MemcpyConfig, host_copies, sync_costs, sync_rows
from ..measures.signals import (busy_rows, compute_rows, count_in, enclosing_annotations,
                                fmt_bytes, fmt_us, overlap_in, per_episode, ramp, rows_in_windows,
                                rows_named, spans, sum_in, top_names, union_in)
from ..trace import CopyKind, Trace, merged_intervals
from ..windows import Windows
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs, longest_first

SCALAR_OPS = r"^aten::(item|_local_scalar_dense)$|^aten::(to|_to_copy|copy_)$"


class ExcessiveMemcpy(AntiPattern):
    id = "excessive_memcpy"
    title = "Frequent host<->device copies and synchronisations (.item(), .cpu())"
    mechanism = "DtoH/HtoD copies with cudaStreamSynchronize stall the host and then the GPU"
    amount = ("n_copies", "n_sync")
    fix = """\
Keep values on the GPU inside the loop and synchronise rarely:

    # before: a sync (DtoH copy + cudaStreamSynchronize) every iteration
    running_loss += loss.item()
    # after: accumulate on the device, read once per N steps / per epoch
    running_loss += loss.detach()
    if step % log_every == 0:
        print(running_loss.item() / log_every); running_loss.zero_()

Also: create tensors directly on the device (`torch.zeros(n, device=device)`, not
`torch.zeros(n).to(device)`), avoid `.cpu()`/`.numpy()`/`print(tensor)`/Python `if tensor:` in
the step, and use `torch.cuda.set_sync_debug_mode("warn")` to find the remaining syncs."""
    letter = "M"
    color = "#009E73"
    short = "MEM"
    account = IdleCause("host_copies_syncs")
    signature = ("many or large HtoD/DtoH memcpys (from .item(), .cpu(), .tolist(), .to(device) "
                 "inside the loop) taking a large share of the window, often with synchronising "
                 "calls.")

    def __init__(self, config: MemcpyConfig = MemcpyConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        w = windows.width_us
        copies = outside_breaks(t, host_copies(t, c.batch_bytes))
        sync = outside_breaks(t, sync_rows(t))
        comp = compute_rows(t)
        copy_us = union_in(windows, *spans(t, copies))
        exposed = copy_us - overlap_in(windows, spans(t, copies), spans(t, comp))
        b0, b1 = sync_costs(t, c.sync_tol_us)
        bubble_us = union_in(windows, b0, b1)
        sync_us = union_in(windows, *spans(t, sync))
        # Host time blocked in copies, and in syncs only while the GPU sits idle: a sync that
        # waits for a busy GPU to drain (the end of a step, a logged loss) costs nothing by
        # itself; what it costs afterwards is the bubble, counted in `lost`.
        host_us = copy_us + sync_us - overlap_in(windows, spans(t, sync), spans(t, busy_rows(t)))
        n_copies = count_in(windows, t.ts[copies])
        n_sync = count_in(windows, t.ts[sync])
        lost = pattern_lost(windows, self.id)
        # Counted per episode (a run of windows the copies and syncs cost idle time in): the
        # gap after a burst of `.item()` calls reaches windows where none starts.
        count = ramp(per_episode(n_copies + n_sync, lost > 0), c.count_lo, c.count_hi)
        # Many syncs in one window are the habit itself (a sync per item of a loop), even when
        # each bubble is short.
        habit = ramp(n_sync, c.many_lo, c.many_hi) * ramp(lost / w, c.habit_lost_lo, c.habit_lost_hi)
        score = np.maximum.reduce([ramp(lost / w, c.lost_lo, c.lost_hi), habit,
                                   c.host_weight * ramp(host_us / w, c.host_lo, c.host_hi)]) * count
        # No measured cost, no finding: syncs that cost the GPU nothing are not the habit.
        score = score * ramp(lost / w, 0.0, c.cost_gate)
        # A one-off sync that costs the run almost nothing is not the habit, however much of
        # its own window it idles (a sum over the batch's lengths copied to the host once).
        if c.trace_hi > 0:
            share = float(lost.sum()) / max(w * windows.n, 1e-9)
            score = score * float(ramp(share, c.trace_lo, c.trace_hi))
        nbytes = sum_in(windows, t.ts[copies], np.nan_to_num(t.bytes[copies]))
        dtoh = count_in(windows, t.ts[copies[t.copy_kind[copies] == CopyKind.DTOH]])
        return {"score": score, "lost_us": lost, "copy_us": copy_us, "exposed_copy_us": exposed,
                "sync_us": sync_us, "bubble_us": bubble_us, "n_copies": n_copies,
                "n_dtoh": dtoh, "n_sync": n_sync, "bytes": nbytes}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        s = {k: float(m[k][idx].sum()) for k in ("copy_us", "exposed_copy_us", "sync_us",
                                                  "bubble_us", "n_copies", "n_dtoh", "n_sync",
                                                  "bytes")}
        ops = rows_in_windows(windows, rows_named(t, SCALAR_OPS), idx)
        callers = top_names(t, ops, k=2)
        syncs = top_names(t, rows_in_windows(windows, sync_rows(t), idx), k=2)
        parts = []
        if s["n_copies"]:
            parts.append(f"{int(s['n_copies'])} host<->device copies ({int(s['n_dtoh'])} DtoH, "
                         f"{fmt_bytes(s['bytes'])}, {fmt_us(s['copy_us'])}, "
                         f"{fmt_us(s['exposed_copy_us'])} not overlapped by compute)")
        if s["n_sync"]:
            what = ", ".join(f"{n} x{c}" for n, c, _ in syncs)
            parts.append(f"{int(s['n_sync'])} host-blocking syncs ({what}; {fmt_us(s['sync_us'])})")
        text = " and ".join(parts) or "host<->device traffic"
        if callers:
            text += " from " + ", ".join(f"{n} x{c}" for n, c, _ in callers)
        text += where_syncs_are(t, rows_in_windows(windows, sync_rows(t), idx))
        if s["n_sync"]:
            text += (f"; the GPU then idled {fmt_us(s['bubble_us'])} waiting for the host to "
                     f"launch again (up to the lead the host lost in the syncs; a sync that "
                     f"fetched nothing is charged at most the time the host waited in it)")
        return text, {k: round(v, 1) for k, v in s.items()}

    def title_for(self, numbers: dict) -> str:
        if not numbers.get("n_copies"):
            return "Host-blocking synchronisations (.item(), .cpu(), torch.cuda.synchronize)"
        if not numbers.get("n_sync"):
            return "Frequent host<->device copies (.cpu(), torch.tensor(..., device=...))"
        return self.title

    def supported(self, numbers: dict) -> bool:
        return (numbers.get("time_lost_us", 0.0) > 0
                and numbers.get("n_copies", 0) + numbers.get("n_sync", 0) > 0)

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """Host<->device copies and host-blocking syncs, longest first."""
        copies = np.isin(trace.copy_kind, (CopyKind.HTOD, CopyKind.DTOH))
        rows = np.flatnonzero(in_runs(trace, runs) & (copies | trace.is_sync))
        return ("Host<->device copies and host-blocking syncs, longest first",
                event_rows(trace, longest_first(trace, rows), limit, detail="bytes"))


#: Annotations of TorchRec's sparse-feature distribution (the KJT all-to-all, whose split sizes
#: are fetched to the host every batch).
TORCHREC_DIST = r"sparse_data_dist|input_dist|all2all|KJTAllToAll"


def where_syncs_are(trace: Trace, syncs: np.ndarray) -> str:
    """'; 60 of the 61 syncs inside `## a ##` x30, `## b ##` x30' (the innermost user
    annotations around them), with a pointer to TorchRec's pipelining when the syncs sit in its
    sparse data distribution; '' when no annotation holds them."""
    ann = enclosing_annotations(trace, syncs)
    inside = ann[ann >= 0]
    if not len(inside):
        return ""
    top = top_names(trace, inside, k=2)
    text = (f"; {len(inside)} of the {len(syncs)} syncs inside "
            + ", ".join(f"`{n}` x{c}" for n, c, _ in top))
    if any(re.search(TORCHREC_DIST, n) for n, _, _ in top):
        text += (" (TorchRec's sparse-feature distribution: the all-to-all's split sizes reach "
                 "the host every batch; torchrec.distributed.train_pipeline."
                 "TrainPipelineSparseDist starts it for the next batch while this one computes, "
                 "off the critical path)")
    return text


def outside_breaks(trace, rows: np.ndarray) -> np.ndarray:
    """Rows that do not start inside a torch.compile graph break (whose copies and syncs are
    the break's: `.item()` between compiled regions is a graph break, not a memcpy habit)."""
    g0, g1 = compile_gaps(trace)
    if not len(g0) or not len(rows):
        return rows
    s, e = merged_intervals(g0, g1)
    at = trace.ts[rows]
    j = np.searchsorted(s, at, side="right") - 1
    inside = (j >= 0) & (at < e[np.maximum(j, 0)])
    return rows[~inside]


PATTERN = register_pattern(ExcessiveMemcpy())
