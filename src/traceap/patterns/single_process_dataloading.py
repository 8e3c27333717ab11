"""Single-process data loading: the GPU waits while the training process itself loads a batch.

Mechanism: `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__` (num_workers=0) runs
decoding and augmentation on the main thread; nothing is queued on the GPU meanwhile, so the
time of `__next__` that overlaps GPU idle time is lost (the `data_loading` cause of
`traceap.idle`: idle time no earlier cause claims, so a worker start-up on the first `__next__`
counts as warm-up).  A multi-process loader that still starves the GPU is the same bottleneck
with a different fix (more workers, prefetching) and its own title.
Anchor: the TensorBoard plugin flagged DataLoader time over 5% of a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..idle import measure, pattern_lost
from ..measures.signals import (LOADER_NEXT, fmt_us, idle_while, intersect, ramp, rows_named,
                                spans, union_in)
from ..trace import Trace
from ..windows import Windows
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs, named_rows

SINGLE = r"_SingleProcessDataLoaderIter|torch/utils/data/_utils/fetch\.py"
MULTI = r"_MultiProcessingDataLoaderIter"


@dataclass(frozen=True)
class LoaderConfig:
    """Thresholds: share of a window the GPU spends idle inside `__next__`."""

    idle_lo: float = 0.05     # TensorBoard plugin: DataLoader over 5% of the step
    idle_hi: float = 0.35
    #: A multi-process loader that starves the GPU is reported, but scores lower.
    multi_weight: float = 0.6


class SingleProcessDataloading(AntiPattern):
    id = "single_process_dataloading"
    title = "Data loading in the training process (GPU waits for the next batch)"
    mechanism = "DataLoader.__next__ runs on the main thread while the GPU has nothing queued"
    amount = ("loader_us",)
    fix = """\
Load batches in worker processes so the next batch is ready when the GPU finishes a step:

    loader = torch.utils.data.DataLoader(
        dataset, batch_size=bs, shuffle=True,
        num_workers=min(8, os.cpu_count()),   # was 0: loading ran in the training process
        pin_memory=True,                      # page-locked batches copy faster, asynchronously
        persistent_workers=True,              # keep workers alive between epochs
        prefetch_factor=4)                    # batches each worker prepares ahead

If the workers still cannot keep up, move augmentation to the GPU (e.g. torchvision.transforms.v2
on CUDA tensors or NVIDIA DALI), cache decoded images, or use a faster image decoder."""
    letter = "D"
    color = "#E69F00"
    short = "SPD"
    account = IdleCause("data_loading")
    signature = ("a long `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__` (or "
                 "collate/decode/transform ops) runs on the training thread while the GPU sits "
                 "idle; no `_MultiProcessingDataLoaderIter`.")

    def __init__(self, config: LoaderConfig = LoaderConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        nxt = rows_named(t, LOADER_NEXT)
        single = rows_named(t, SINGLE)
        multi = rows_named(t, MULTI)
        # With py-stack traces, frames nest inside the annotation; unions count each once.
        idle = pattern_lost(windows, self.id)
        idle_single = idle_while(windows, *spans(t, single))
        idle_multi = idle_while(windows, *spans(t, multi))
        loader_time = union_in(windows, *spans(t, nxt))
        # The part of the loader's own time the GPU spent idle for it: the data-loading idle
        # inside the `__next__` calls (a part of `loader_time`; `idle` also holds the rest of
        # the gaps the calls fill, so it can exceed the calls themselves).
        idle_in = union_in(windows, *intersect(*measure(t).segments("data_loading"),
                                              *spans(t, nxt)))
        frac = idle / windows.width_us
        # Unknown kind (python frames only) counts as single: workers' frames never show here.
        # Judged over the trace, not per window: the idle gap a loader leaves reaches windows
        # where no `__next__` runs, and a run has one kind of loader.
        weight = c.multi_weight if idle_multi.sum() > idle_single.sum() else 1.0
        score = ramp(frac, c.idle_lo, c.idle_hi) * weight
        return {"score": score, "lost_us": idle, "loader_us": loader_time,
                "idle_in_loader_us": idle_in,
                "idle_single_us": idle_single, "idle_multi_us": idle_multi}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        loader = float(m["loader_us"][idx].sum())
        inside = float(m["idle_in_loader_us"][idx].sum())
        lost = float(m["lost_us"][idx].sum())
        multi = float(m["idle_multi_us"][idx].sum()) > float(m["idle_single_us"][idx].sum())
        kind = ("multi-process DataLoader (workers cannot keep up)" if multi
                else "single-process DataLoader (num_workers=0)")
        share = inside / max(loader, 1e-9)
        text = (f"{kind}: DataLoader.__next__ takes {fmt_us(loader)}, of which {fmt_us(inside)} "
                f"({100 * share:.0f}%) with the GPU idle")
        if fmt_us(lost) != fmt_us(inside):
            # The cause's idle is larger than the calls: say what the difference is.
            text += (f"; the GPU idle charged to data loading ({fmt_us(lost)}) also holds the "
                     f"rest of each idle gap the calls fill at least half of (the batch's upload "
                     f"and the relaunch after it)")
        return text, {"loader_us": round(loader, 1), "gpu_idle_in_loader_us": round(inside, 1),
                      "multi_process": bool(multi)}

    def title_for(self, numbers: dict) -> str:
        if numbers.get("multi_process"):
            return "Data loading stalls the GPU (DataLoader workers cannot keep up)"
        return self.title

    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("loader_us", 0.0) > 0

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """DataLoader fetches on the training thread, longest first."""
        rows = named_rows(trace, in_runs(trace, runs),
                          lambda n: "DataLoader" in n and "__next__" in n)
        return ("DataLoader fetches on the training thread, longest first",
                event_rows(trace, rows, limit))


PATTERN = register_pattern(SingleProcessDataloading())
