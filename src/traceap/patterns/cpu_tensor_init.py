"""Tensors created on the CPU and then copied to the GPU inside the step.

Mechanism: `torch.zeros(shape).to(device)`, `torch.arange(n).cuda()`, `torch.randn(...).to(x.device)`
build the tensor with a host loop (an ATen factory op that launches no kernel), then copy it
host-to-device, from pageable memory: the launch blocks for the copy, nothing else is launched
meanwhile and the GPU runs dry.  On the device the same tensor is one fill kernel queued behind
the rest.  Anchor: TorchTidy's "extra CUDA copy" pattern (a factory op on the CPU followed by
`aten::to` to CUDA), removed from PyTorch with `torch.profiler._pattern_matcher`.

Which account: the idle account's `cpu_tensor_init` mechanism (`traceap.measures.host_init`),
from the factory op's start to the end of its upload.  It comes before the other copies in the
account's order, and the copy rules leave these copies out: an upload of a tensor just made
on the host is this pattern's (creating it on the device removes it; pinning, the
`no_pin_memory` fix, would not), so no microsecond is lost twice.  `no_pin_memory` keeps
pageable uploads of input batches (no factory op just before), `excessive_memcpy` the DtoH
copies, the other small uploads and the syncs.  Data loading (`DataLoader.__next__` and the
gaps it fills) comes first: a tensor made inside the loader is the loader's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..idle import pattern_lost, trace_costs
from ..measures.host_init import init_copies
from ..measures.signals import fmt_bytes, fmt_us, ramp, sum_in, top_names, union_in
from ..trace import Trace
from ..windows import Windows
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs, longest_first


@dataclass(frozen=True)
class CpuInitConfig:
    """Thresholds: share of a window the GPU idles while the host makes and uploads tensors."""

    #: As the pageable-copy rule (host-blocking uploads): 1% of a window starts to count,
    #: 10% scores in full (TraceLens flags a transfer direction over 5% of the time).
    idle_lo: float = 0.01
    idle_hi: float = 0.10


class CpuTensorInit(AntiPattern):
    id = "cpu_tensor_init"
    title = "Tensors created on the CPU, then copied to the GPU in the step"
    mechanism = ("a factory op (zeros, arange, randn, ...) fills a tensor on the host, then "
                 "aten::to uploads it while the GPU waits")
    amount = ("n_uploads", "bytes")
    fix = """\
Create the tensor where it is used, instead of on the CPU and then copying it:

    mask = torch.zeros(b, h, w, device=images.device)          # was torch.zeros(b, h, w).cuda()
    pos = torch.arange(seq_len, device=x.device)               # was torch.arange(seq_len).to(x.device)
    noise = torch.randn(x.shape, device=x.device, dtype=x.dtype)   # or torch.randn_like(x)

Tensors that never change (anchor grids, positional tables) can be built once, before the
loop, and kept on the GPU as a buffer: `self.register_buffer("anchors", anchors)` moves with
`model.to(device)`."""
    letter = "I"
    color = "#11A579"
    short = "CTI"
    account = IdleCause("cpu_tensor_init")
    signature = ("`aten::zeros` / `aten::arange` / `aten::randn` / `aten::full` on the host with no "
                 "kernel under it, then `aten::to` > `aten::_to_copy` > `aten::copy_` and a "
                 "`Memcpy HtoD (Pageable -> Device)` while the GPU idles.")

    def __init__(self, config: CpuInitConfig = CpuInitConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        fac, op, cp = init_copies(t)
        lost = pattern_lost(windows, self.id)
        score = ramp(lost / windows.width_us, c.idle_lo, c.idle_hi) * trace_costs(t, self.id)
        return {"score": score, "lost_us": lost,
                "n": sum_in(windows, t.ts[cp], np.ones(len(cp))),
                "bytes": sum_in(windows, t.ts[cp], np.nan_to_num(t.bytes[cp])),
                "host_us": union_in(windows, t.ts[fac], np.maximum(t.end[op], t.end[cp])),
                "copy_us": union_in(windows, t.ts[cp], t.end[cp])}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        n = int(m["n"][idx].sum())
        nbytes = float(m["bytes"][idx].sum())
        host = float(m["host_us"][idx].sum())
        fac, _, cp = init_copies(t)
        lo, hi = windows.edges[idx.min()], windows.edges[idx.max() + 1]
        top = top_names(t, fac[(t.ts[cp] >= lo) & (t.ts[cp] < hi)])
        names = ", ".join(f"{name} x{k}" for name, k, _ in top) or "factory ops"
        text = (f"{n} tensors created on the host ({names}) and uploaded right "
                f"after ({fmt_bytes(nbytes)}); making and copying them took the host {fmt_us(host)}")
        return text, {"n_uploads": n, "bytes": nbytes, "host_us": round(host, 1),
                      "copy_us": round(float(m["copy_us"][idx].sum()), 1)}

    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("n_uploads", 0) > 0

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """The host factory ops and their uploads, longest upload first."""
        fac, op, cp = init_copies(trace)
        keep = in_runs(trace, runs)[cp]
        order = longest_first(trace, cp[keep])
        pairs = {int(c): int(f) for f, c in zip(fac[keep], cp[keep])}
        rows = np.array([r for c in order.tolist() for r in (pairs[c], c)], dtype=np.int64)
        return ("Factory ops on the host and the uploads right after them, longest upload first",
                event_rows(trace, rows, limit, detail="bytes"))


PATTERN = register_pattern(CpuTensorInit())
