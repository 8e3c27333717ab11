"""Allocator churn: cudaMalloc / cudaFree (hipMalloc / hipFree) or `torch.cuda.empty_cache()`
inside steady-state training steps.

Mechanism: the caching allocator serves a warm loop from its cache and calls the driver only
when the program defeats it: `empty_cache()` in the loop hands every free block back
(`cudaFree` first waits for the device to drain) and the next step allocates it all again;
shapes that change every step keep growing and splitting segments.  The host is blocked in
the driver call and launches nothing, so the GPU runs dry.  Calls in the first profiler step
and in the idle account's warm-up steps are start-up (the cache growing) and stay warm-up;
without two profiler steps nothing here is steady state (`traceap.measures.allocator`).
Time lost is the idle account's `allocator_churn` mechanism: GPU idle inside the calls and in
the gap each returns into, up to a relaunch (50 us); it goes before warm-up in the
account's order (warm-up's calls name every cudaMalloc) and no other pattern claims it.
Anchors: HTA counts a runtime call over 50 us as an outlier; PyTorch's CUDA semantics notes
call empty_cache() in a loop an anti-pattern (it "will not increase the amount of GPU memory
available for PyTorch") and recommend `expandable_segments` for varying shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..idle import measure, pattern_lost, trace_costs
from ..measures.allocator import churn_calls
from ..measures.signals import fmt_us, name_mask, ramp, sum_in, union_in
from ..trace import Trace
from ..windows import Windows
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs, longest_first


@dataclass(frozen=True)
class ChurnConfig:
    """Thresholds: share of a window the GPU idles for steady-state allocator calls."""

    #: As the pageable-copy rule (a blocking call of the host): 1% of a window starts to
    #: count, 10% scores in full (TraceLens flags a transfer direction over 5% of the time).
    idle_lo: float = 0.01
    idle_hi: float = 0.10


class AllocatorChurn(AntiPattern):
    id = "allocator_churn"
    title = "Device memory allocated and freed inside the training loop (allocator churn)"
    mechanism = ("cudaMalloc/cudaFree or empty_cache() in steady steps block the host while the "
                 "GPU runs dry")
    amount = ("n_calls",)
    fix = """\
Let PyTorch's caching allocator keep its memory between steps:

    # no torch.cuda.empty_cache() inside the training loop: it frees every cached block
    # (cudaFree waits for the GPU) and the next step cudaMallocs it all again
    for images, targets in loader:
        ...

Shapes that change every step (multi-scale training, variable image sizes) fragment the cache;
let segments grow instead of allocating new ones, before the first CUDA call:

    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py

or pad/bucket inputs to a few fixed sizes and preallocate reused buffers once
(`buf = torch.empty(max_shape, device="cuda")`, then `buf[:n]`)."""
    letter = "A"
    color = "#7F3C8D"
    terminal_color = "#B57EDC"
    short = "ALC"
    account = IdleCause("allocator_churn")
    signature = ("`cudaMalloc` / `cudaFree` (`hipMalloc` / `hipFree`) runtime calls or "
                 "`torch.cuda.empty_cache` inside a later training step, lasting 0.1-10 ms each, "
                 "with no GPU kernel running meanwhile.")

    def __init__(self, config: ChurnConfig = ChurnConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        calls, empty = churn_calls(t, measure(t).warmup_steps)
        lost = pattern_lost(windows, self.id)
        score = ramp(lost / windows.width_us, c.idle_lo, c.idle_hi) * trace_costs(t, self.id)
        frees = calls[_is_free(t, calls)]
        return {"score": score, "lost_us": lost,
                "blocked_us": union_in(windows, t.ts[calls], t.end[calls]),
                "n": sum_in(windows, t.ts[calls], np.ones(len(calls))),
                "n_free": sum_in(windows, t.ts[frees], np.ones(len(frees))),
                "n_empty": sum_in(windows, t.ts[empty], np.ones(len(empty)))}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        n = int(m["n"][idx].sum())
        n_free = int(m["n_free"][idx].sum())
        n_empty = int(m["n_empty"][idx].sum())
        blocked = float(m["blocked_us"][idx].sum())
        text = (f"{n} device allocator calls in steady steps ({n - n_free} malloc, {n_free} free"
                + (f", {n_empty} torch.cuda.empty_cache()" if n_empty else "")
                + f"); the host blocked in them {fmt_us(blocked)}")
        return text, {"n_calls": n, "n_malloc": n - n_free, "n_free": n_free,
                      "n_empty_cache": n_empty, "host_blocked_us": round(blocked, 1)}

    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and (
            numbers.get("n_calls", 0) > 0 or numbers.get("n_empty_cache", 0) > 0)

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """Steady-state allocator calls and empty_cache, longest first."""
        calls, empty = churn_calls(trace, measure(trace).warmup_steps)
        rows = np.concatenate((calls, empty))
        rows = rows[in_runs(trace, runs)[rows]]
        return ("cudaMalloc / cudaFree / empty_cache in steady steps, longest first",
                event_rows(trace, longest_first(trace, rows), limit))


def _is_free(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Per row: the call frees memory (cudaFree, hipFree, cuMemFree)."""
    return name_mask(trace, r"Free")[trace.name[rows]] if len(rows) else np.zeros(0, bool)



PATTERN = register_pattern(AllocatorChurn())
