"""FP32 GEMMs and convolutions on a GPU with tensor cores (no mixed precision, no TF32).

Mechanism: a model trained in plain FP32 runs its matrix work on the GPU's FP32 units
(`volta_sgemm_*`, `ampere_sgemm_*`, `*scudnn*`, `implicit_convolve_sgemm`, hipBLASLt `Cijk_..._S_`
kernels; `traceap.measures.precision`), while the same GPU's tensor cores do it several times
faster in BF16/FP16 (autocast) or TF32.  The GPU looks busy: the time is lost *inside* the busy
time, so this pattern's account is `BusyInefficient`, not the idle account.

Time lost (stated in the evidence): the measured FP32 matrix kernel time x (1 - 1/s), with s the
GPU's tensor-core over FP32 peak (datasheets, by compute capability or Instinct model; TF32 where
the GPU has it, the smaller fix) capped at 3x, PyTorch's "AMP up to 3x" (the performance
tuning guide; ../shared/ANCHORS.md).  So at most 2/3 of the FP32 kernel time, whatever the peak
ratio: memory-bound GEMMs and the casts autocast adds gain less than the peak says.  Only the
GEMM / convolution kernels count (elementwise and normalisation kernels gain from bf16 too,
through halved memory traffic: not credited, so the estimate stays a floor of the gain).
Anchors: the TensorBoard profiler plugin's "Tensor Cores unused on a capable GPU -> AMP" and
TorchTidy's "FP32 matmul where TF32 is available" (both being removed from PyTorch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..measures.precision import (MAX_SPEEDUP, describe_gpu, fp32_matmul_rows, lost_share,
                                  speedup, tensor_core_ratio)
from ..measures.signals import (busy_per_window, fmt_us, ramp, rows_in_windows, steady_rows,
                                top_names, union_in)
from ..trace import Trace
from ..windows import Windows
from ._registry import BusyInefficient, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs, longest_first


@dataclass(frozen=True)
class MixedPrecisionConfig:
    """When FP32 matrix work is a finding.

    share_lo / share_hi: a window's score ramps from 0 to 1 as its FP32 GEMM/convolution time
    goes from 5% to 15% of the window (0.5, flagged, at 10%: the TensorBoard plugin's cut for
    communication, 10% of the step; provisional until chosen on the validation split).
    trace_share: below 5% of the GPU busy time over the whole trace (the plugin's DataLoader
    cut), FP32 matrix work is a stray kernel (a loss, a metric), not a model trained in FP32:
    no window scores."""

    share_lo: float = 0.05
    share_hi: float = 0.15
    trace_share: float = 0.05


class NoMixedPrecision(AntiPattern):
    id = "no_mixed_precision"
    title = "FP32 matrix math on a GPU with tensor cores (no mixed precision / TF32)"
    mechanism = ("GEMM and convolution kernels run on the FP32 units (sgemm, scudnn, Tensile "
                 "S kernels) while the GPU's tensor cores would run them several times faster")
    amount = ("fp32_matmul_us",)
    letter = "F"
    color = "#AA3377"
    terminal_color = "#EE6699"
    short = "NMP"
    account = BusyInefficient("FP32 matrix math without tensor cores")
    signature = ("GPU busy with FP32 GEMM/convolution kernels (volta_sgemm_*, ampere_sgemm_*, "
                 "*scudnn*, implicit_convolve_sgemm, Cijk_*_S_*) on a GPU with tensor cores; "
                 "no s1688/tensorop/bf16/fp16 kernels doing the matrix work.")
    fix = """\
Run the matrix math on the tensor cores. Mixed precision (bf16 on Ampere / Hopper / MI200+):

    for images, targets in loader:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = criterion(model(images), targets)
        loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

On V100 / T4 (no bf16) use dtype=torch.float16 with `scaler = torch.amp.GradScaler("cuda")`
(`scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()`).  To keep FP32
weights and activations, TF32 alone (Ampere and later) already moves GEMMs and convolutions to
the tensor cores:

    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True"""

    def __init__(self, config: MixedPrecisionConfig = MixedPrecisionConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        rows = steady_rows(t, fp32_matmul_rows(t))  # autotuning's FP32 tries are one-off
        fp32 = union_in(windows, t.ts[rows], t.end[rows])
        busy = busy_per_window(windows)
        gate = float(speedup(t) is not None and fp32.sum() >= c.trace_share * busy.sum() > 0)
        score = ramp(fp32 / max(windows.width_us, 1e-9), c.share_lo, c.share_hi) * gate
        # Time lost: the FP32 kernel time the tensor cores would save (1 - 1/speedup), in the
        # windows the kernels run in; none below the trace gate.
        return {"score": score, "lost_us": fp32 * lost_share(t) * gate, "fp32_us": fp32,
                "busy_us": busy}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        fp32 = float(m["fp32_us"][idx].sum())
        busy = float(m["busy_us"][idx].sum())
        s, ratio = speedup(t), tensor_core_ratio(t)
        rows = rows_in_windows(windows, steady_rows(t, fp32_matmul_rows(t)), idx)
        top = top_names(t, rows, t.dur[rows], 3)
        names = ", ".join(f"{_short(n)} {fmt_us(w)}" for n, _, w in top)
        share = 100 * fp32 / busy if busy > 0 else 0.0
        text = (f"FP32 GEMM/convolution kernels without tensor cores ran {fmt_us(fp32)} "
                f"({share:.0f}% of the GPU busy time{': ' + names if names else ''}) on a "
                f"{describe_gpu(t)}")
        if s is not None:
            text += (f", whose tensor cores have {ratio:.1f}x its FP32 peak; credited with "
                     f"{s:.1f}x (capped at {MAX_SPEEDUP:.0f}x, the AMP speed-up PyTorch's "
                     f"tuning guide gives), the kernels would take {fmt_us(fp32 / s)}: time "
                     f"lost = FP32 time x (1 - 1/{s:.1f})")
        return text, {"fp32_matmul_us": round(fp32, 1), "fp32_share_of_busy": round(share, 1),
                      "tensor_core_ratio": ratio, "credited_speedup": s,
                      "top_kernels": [n for n, _, _ in top]}

    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("fp32_matmul_us", 0.0) > 0

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """The FP32 GEMM / convolution kernels, longest first."""
        rows = steady_rows(trace, fp32_matmul_rows(trace))
        rows = rows[in_runs(trace, runs)[rows]]
        return ("FP32 GEMM / convolution kernels (no tensor cores), longest first",
                event_rows(trace, longest_first(trace, rows), limit))


def _short(name: str, limit: int = 48) -> str:
    """A kernel name for a sentence: its template arguments and parameters dropped."""
    name = name.removeprefix("void ").split("<")[0].split("(")[0]
    return name if len(name) <= limit else name[:limit - 3] + "..."


PATTERN = register_pattern(NoMixedPrecision())
