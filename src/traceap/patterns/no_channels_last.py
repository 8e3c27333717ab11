"""Convolutions in NCHW layout: cuDNN / MIOpen transpose every tensor to NHWC and back.

Mechanism: tensor-core convolution kernels work in NHWC (channels_last).  A model and input
left in PyTorch's default NCHW layout make cuDNN (MIOpen) wrap convolutions in layout
transposes (`nchwToNhwcKernel` before, `nhwcToNchwKernel` after, in forward and backward;
`batched_transpose_*` on ROCm), memory-bound kernels that do no useful work
(`traceap.measures.layout`).  The GPU looks busy: the time is lost inside the busy time, so
this pattern's account is `BusyInefficient`.

Time lost: the transpose kernels' own time, what `model.to(memory_format=torch.channels_last)`
removes; not the NCHW batch-norm and pooling kernels' extra time nor the faster NHWC
convolution algorithms (not measurable from one trace), so a floor of the gain (channels_last
gains 8-35% on vision models, 22% on ResNet-50: ../shared/ANCHORS.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..measures.layout import conv_rows, conv_transpose_rows
from ..measures.precision import fp32_matmul_rows
from ..measures.signals import (busy_per_window, fmt_us, ramp, rows_in_windows, steady_rows,
                                top_names, union_in)
from ..trace import Trace
from ..windows import Windows
from ._registry import BusyInefficient, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs, longest_first


@dataclass(frozen=True)
class ChannelsLastConfig:
    """When layout transposes are a finding.

    A transpose launched by a convolution is the mechanism itself (no name it could be mistaken
    for), so the cut-offs are low and the finding's severity follows its time lost.
    share_lo / share_hi: a window's score ramps from 0 to 1 as its transpose time goes from
    0.5% to 3% of the window (flagged at 1.75%).  trace_share: transposes under 0.5% of the GPU
    busy time over the trace are a stray layout change, not a model left in NCHW: no window
    scores.  Chosen on the real-based benchmark's validation split (planted into the Particle
    Transformer's few convolutions): window AUC 47.5 with 2% / 2-6%, where the plants stayed
    under the trace cut."""

    share_lo: float = 0.005
    share_hi: float = 0.03
    trace_share: float = 0.005


class NoChannelsLast(AntiPattern):
    id = "no_channels_last"
    title = "Layout transposes around convolutions (model not in channels_last)"
    mechanism = ("cuDNN / MIOpen transpose NCHW tensors to NHWC and back around each "
                 "convolution: memory-bound kernels that do no useful work")
    amount = ("n_transposes",)
    letter = "N"
    color = "#44AA99"
    short = "NCL"
    account = BusyInefficient("layout transposes (NCHW <-> NHWC)")
    signature = ("nchwToNhwcKernel / nhwcToNchwKernel (ROCm: batched_transpose_*) kernels "
                 "launched by aten::cudnn_convolution / convolution_backward, before and "
                 "after the convolution kernels, in the forward and the backward.")
    fix = """\
Keep the model and its inputs in channels_last (NHWC), so convolutions need no transposes:

    model = model.to(device, memory_format=torch.channels_last)
    for images, targets in loader:
        images = images.to(device, non_blocking=True, memory_format=torch.channels_last)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = criterion(model(images), targets)

Layers that need NCHW (a custom op, a view/reshape on the channel axis) convert back by
themselves; check with `x.is_contiguous(memory_format=torch.channels_last)`."""

    def __init__(self, config: ChannelsLastConfig = ChannelsLastConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        rows = steady_rows(t, conv_transpose_rows(t))  # autotuning's NCHW tries are one-off
        tr = union_in(windows, t.ts[rows], t.end[rows])
        busy = busy_per_window(windows)
        gate = float(tr.sum() >= c.trace_share * busy.sum() > 0)
        score = ramp(tr / max(windows.width_us, 1e-9), c.share_lo, c.share_hi) * gate
        return {"score": score, "lost_us": tr * gate, "transpose_us": tr, "busy_us": busy}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        tr = float(m["transpose_us"][idx].sum())
        busy = float(m["busy_us"][idx].sum())
        rows = rows_in_windows(windows, steady_rows(t, conv_transpose_rows(t)), idx)
        convs = rows_in_windows(windows, conv_rows(t), idx)
        top = top_names(t, rows, t.dur[rows], 2)
        names = ", ".join(f"{_short(n)} x{k} {fmt_us(w)}" for n, k, w in top)
        share = 100 * tr / busy if busy > 0 else 0.0
        numbers = {"n_transposes": int(len(rows)), "transpose_us": round(tr, 1),
                   "transpose_share_of_busy": round(share, 1),
                   "n_conv_kernels": int(len(convs)),
                   "n_fp32_conv_kernels": int(len(np.intersect1d(convs, fp32_matmul_rows(t))))}
        text = (f"{len(rows)} layout transposes around convolutions ran {fmt_us(tr)} "
                f"({share:.0f}% of the GPU busy time{': ' + names if names else ''}; "
                f"{len(convs)} convolution kernels")
        if _fp32(numbers):
            # FP32 cuDNN kernels work in NCHW: a channels_last model is transposed for them
            text += (f", {numbers['n_fp32_conv_kernels']} of them FP32 without tensor cores): "
                     f"FP32 convolution kernels work in NCHW, so the transposes come from the "
                     f"precision, not from the model's layout; time lost = the transposes' "
                     f"time, which mixed precision or TF32 removes")
        else:
            text += "): time lost = the transposes' time, which channels_last removes"
        return text, numbers

    def title_for(self, numbers: dict) -> str:
        if _fp32(numbers):
            return ("Layout transposes around FP32 convolutions (channels_last without tensor "
                    "cores)")
        return self.title

    def fix_for(self, numbers: dict) -> str:
        return FP32_FIX if _fp32(numbers) else self.fix

    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("n_transposes", 0) > 0

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """The layout transposes around convolutions, longest first."""
        rows = steady_rows(trace, conv_transpose_rows(trace))
        rows = rows[in_runs(trace, runs)[rows]]
        return ("Layout transposes around convolutions (NCHW <-> NHWC), longest first",
                event_rows(trace, longest_first(trace, rows), limit))


#: Share of the convolution kernels running FP32 without tensor cores above which the
#: transposes are the precision's: FP32 cuDNN kernels work in NCHW, so a model in channels_last
#: is transposed to NCHW and back around each of them (real H200 recordings: ResNet-50 in
#: channels_last and FP32 with TF32 off, 131 of 131 convolutions FP32, 726 transposes; in bf16
#: NCHW, 0 of 105).
FP32_CONVS = 0.5
FP32_FIX = """\
The convolutions run in FP32, whose cuDNN kernels work in NCHW: the model is in channels_last
already, and its tensors are transposed for them. Run them on the tensor cores, where NHWC is
the native layout, and the transposes go:

    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = criterion(model(images), targets)

or keep FP32 weights and allow TF32 (`torch.backends.cudnn.allow_tf32 = True`, PyTorch's
default for cuDNN). A run that must stay in strict FP32 is better left in NCHW."""


def _fp32(numbers: dict) -> bool:
    n = numbers.get("n_conv_kernels", 0)
    return n > 0 and numbers.get("n_fp32_conv_kernels", 0) >= FP32_CONVS * n


def _short(name: str, limit: int = 40) -> str:
    """A kernel name for a sentence: its namespace, template arguments and parameters dropped."""
    name = name.removeprefix("void ").split("<")[0].split("(")[0].split("::")[-1]
    return name if len(name) <= limit else name[:limit - 3] + "..."


PATTERN = register_pattern(NoChannelsLast())
