"""no_channels_last: convolutions on NCHW tensors, wrapped in layout transposes.

Mechanism planted: around each of a step's convolution kernels (cuDNN implicit-GEMM / cutlass
s1688 fprop-dgrad-wgrad, MIOpen igemm, ...), the convolution's own cpu_op launches a transpose
of its input to NHWC just before the convolution kernel and one of its output back to NCHW
just after (`cudnn::ops::nchwToNhwcKernel` / `nhwcToNchwKernel` with the convolution's data
type; ROCm: MIOpen's `batched_transpose_*`), on the compute stream, each 15-50% of the
convolution kernel's time (a memory-bound pass over the activation the convolution reads or
writes: 474 transposes next to cutlass/xmma convolutions in the DDP CNN sample).  The transposes
are all the plant costs: the label is each transpose kernel (mode "work": GPU time spent
inefficiently, not a wait).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...measures.layout import CONV_OP, conv_rows, conv_transpose_rows
from ...measures.precision import is_amd
from ...measures.signals import name_mask
from ...patterns._registry import register_piece
from ...trace import Kind
from ..dialect import Factory
from .base import Base, Block, Instance, Launch, Plan, Unusable

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "no_channels_last"


@dataclass(frozen=True)
class Config:
    """How the transposes are sized and how many convolutions get them."""

    #: A transpose's time over its convolution kernel's (a memory-bound pass over one tensor).
    share: tuple = (0.15, 0.5)
    #: Shortest transpose (us): a launch of a small tensor still takes a few us.
    min_us: float = 3.0
    #: Share of the steps' convolution kernels that get transposes (a model in NCHW wraps
    #: most of them; some algorithms take NCHW directly).
    conv_share: tuple = (0.5, 1.0)
    max_instances: int = 12
    max_convs_per_step: int = 200


def transpose_name(base: Base, to_nhwc: bool, conv_name: str) -> str:
    """The transpose kernel in the base's dialect and the convolution's data type."""
    half = any(x in conv_name.lower() for x in ("bf16", "f16", "half"))
    if is_amd(base.doc.trace):
        return f"batched_transpose_32x32_{'half' if half else 'dword'}"
    n = ("__nv_bfloat16" if "bf16" in conv_name.lower() else "__half") if half else "float"
    if to_nhwc:
        return (f"void cudnn::ops::nchwToNhwcKernel<{n}, {n}, float, false, true, "
                f"(cudnnKernelDataType_t)2>(cudnn::ops::nchw2nhwc_params_t<float>, {n} const*, "
                f"{n}*)")
    return (f"void cudnn::ops::nhwcToNchwKernel<{n}, {n}, float, true, false, "
            f"(cudnnKernelDataType_t)0>(cudnn::ops::nhwc2nchw_params_t<float>, {n} const*, {n}*)")


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """Transposes before and after the convolution kernels of each step."""
    tr = base.doc.trace
    convs = conv_rows(tr)
    convs = convs[tr.launch[convs] >= 0]
    if not len(convs):
        raise Unusable("no convolution kernel with its launch call: nothing to wrap in "
                       "layout transposes")
    # launched by the main thread's convolution ops (the block runs on that thread)
    on_main = base.doc.thread[base.doc.row_event[tr.launch[convs]]] == base.tl.main_thread
    op = tr.cpu_op[convs]
    conv_op = (op >= 0) & name_mask(tr, CONV_OP)[tr.name[np.maximum(op, 0)]]
    convs = convs[on_main & (conv_op | (op < 0))]
    if not len(convs):
        raise Unusable("no convolution launched by the main thread")
    t_launch = base.start_rel(tr.launch[convs])
    t_end = tr.ts[tr.launch[convs]] + tr.dur[tr.launch[convs]] - base.tl.t0
    instances = []
    for _row, lo, hi, _kids in base.steady_steps_or_stretches()[: config.max_instances]:
        sel = np.flatnonzero((t_launch > lo) & (t_launch < hi))
        if not len(sel):
            continue
        n = max(1, min(config.max_convs_per_step, int(round(len(sel) * rng.uniform(*config.conv_share)))))
        sel = np.sort(rng.choice(sel, size=n, replace=False))
        blocks, kernels = [], []
        for i in sel.tolist():
            c = int(convs[i])
            name = tr.names[int(tr.name[c])]
            for to_nhwc, T in ((True, float(t_launch[i])), (False, float(t_end[i]))):
                dur = max(config.min_us, float(tr.dur[c]) * rng.uniform(*config.share))
                if base.doc.ts_is_int:  # whole us, or it rounds into the next kernel
                    dur = float(np.rint(dur))
                b = Block(T=T, thread=base.tl.main_thread)
                launch = b.add(Launch(rt_dur=4.0, stream=base.tl.compute_stream, gpu_dur=dur))
                blocks.append(b)
                kernels.append((launch, transpose_name(base, to_nhwc, name)))

        def emit(f: Factory, kernels=kernels):
            spans = []
            d = base.dialect
            for launch, name in kernels:
                ext = f.new_ext()
                rt, corr = f.runtime(d.launch_name, launch.t0, launch.t1, base.main_key, ext)
                op = f.gpu(Kind.KERNEL, name, launch.gpu_t0, launch.gpu_t1,
                           base.stream_key(launch.stream), corr, ext,
                           {"grid": [max(1, int(launch.gpu_dur // 2)), 1, 1],
                            "block": [256, 1, 1]})
                f.flows(rt, op, corr)
                spans.append((launch.gpu_t0, launch.gpu_t1))
            return spans

        instances.append(Instance(blocks, emit, label="work", min_idle_us=0.0,
                                  causes_wait=False))
    if not instances:
        raise Unusable("no step launches a convolution")
    return Plan(PATTERN, instances)


# -- the natural label: where a real trace shows the pattern by itself ----------------------
def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """The transposes around convolutions of the steps where they are >= `transpose_busy_share`
    of the GPU busy time."""
    tr = c.tr
    rows = conv_transpose_rows(tr)
    if not len(rows):
        return
    for s0, s1 in c.steps or [(tr.span[0], tr.span[1])]:
        inside = rows[(tr.ts[rows] >= s0) & (tr.ts[rows] < s1)]
        busy = float(np.clip(np.minimum(c.busy_e, s1) - np.maximum(c.busy_s, s0), 0.0, None).sum())
        if not len(inside) or tr.dur[inside].sum() < cfg.transpose_busy_share * busy:
            continue
        for r in inside.tolist():
            yield float(tr.ts[r]), float(tr.end[r])


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
