"""no_mixed_precision: matrix work left in FP32 on a GPU with tensor cores.

Mechanism planted: in each step, a few layers' GEMMs run in FP32 (outside autocast, or a
model never cast): an `aten::linear > aten::addmm` call launching an FP32 kernel named as the
trace's own GPU names them (`volta_sgemm_*` on V100, `ampere_sgemm_*` on A100, cutlass
`simt_sgemm` on H100, a Tensile `Cijk_..._S_B_...` kernel on AMD; or the base's own FP32 GEMM
name when it has one), on the compute stream, delaying the work after it.  Each kernel of
length D stands for a tensor-core one of D / s, with s the speed-up the rule credits
(`traceap.measures.precision.speedup`: the GPU's tensor-core over FP32 peak, capped at 3x), so
the plant costs D x (1 - 1/s) of GPU time per kernel: the label is that last part of each
kernel (label mode "work": GPU time spent inefficiently, not a wait).

The doc writer keeps every base event's name, so tensor-core kernels are not renamed in place:
the FP32 work is added beside them, which plants the same mechanism (a share of the step's
matrix work in FP32) with a cost that is known exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...measures.precision import fp32_matmul_rows, is_amd, speedup, _capability, _props
from ...patterns._registry import register_piece
from ...trace import merged_intervals
from ..dialect import Factory
from .base import Base, Block, Instance, Launch, Plan, Unusable, emit_call, op_launch

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "no_mixed_precision"

#: FP32 GEMM kernel names by GPU, as real traces write them (../shared/traces: V100 DLRM,
#: A100 AlexNet, H100 Qwen, MI300 Qwen).
FP32_NAMES = {
    "volta": "volta_sgemm_128x64_nn",
    "ampere": "ampere_sgemm_128x64_nn",
    "hopper": ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x128_8x4_nn_align1>"
               "(cutlass_80_simt_sgemm_128x128_8x4_nn_align1::Params)"),
    "amd": ("Cijk_Ailk_Bljk_S_B_Bias_HA_S_SAV_UserArgs_MT128x128x16_MI16x16x1_SN_LDSB1_AFC1_"
            "AFEM1_AFEM1_ASEM1_CLR1_CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA4_GRVWB4_GSUAMB_"
            "IU1_K1_LBSPPA512_LBSPPB512_LPA16_LPB16_LRVW4_MIAV0_MIWT4_4_MO40_NTn1_NTA0_NTB0_"
            "NTC0_NTD0_NEPBS0_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO0_SRVW0_SSO0_SVW4_"
            "TLDS1_USFGROn1_VSn1_VWA4_VWB4_WSGRA0_WSGRB0_WS64_WG32_8_1"),
}


@dataclass(frozen=True)
class Config:
    """How much of a step is planted in FP32."""

    #: FP32 GEMM time added per step, as a share of the step's GPU busy time: a few layers
    #: left in FP32 (a classifier head, an attention block) take 15-40% of a model's compute.
    busy_share: tuple = (0.15, 0.4)
    #: A step whose GPU idles most of the time (launch-bound) counts as busy for at least this
    #: share of it: the plant stays visible next to the base's own work.
    min_busy: float = 0.25
    #: FP32 GEMM kernels per step (one per layer left in FP32).
    kernels: tuple = (4, 12)
    #: Host time of one `aten::linear > aten::addmm` call around its launch (us): 20-60 us in
    #: the V100 / A100 traces of ../shared.
    host_us: tuple = (20.0, 60.0)
    #: A kernel goes where the base GPU has no idle gap longer than this (us) in the stretch
    #: it will run in (its queue and twice its length): between launches, not into a stall of
    #: the base (a loader wait, an exposed all-reduce: 1 ms and more) that it would fill.
    max_gap_us: float = 500.0
    max_instances: int = 12


def fp32_name(base: Base) -> str:
    """The FP32 GEMM kernel name in the base's dialect: its own most used one, else by GPU."""
    tr = base.doc.trace
    rows = fp32_matmul_rows(tr)
    if len(rows):
        return tr.names[int(np.bincount(tr.name[rows]).argmax())]
    if is_amd(tr):
        return FP32_NAMES["amd"]
    cc = _capability(_props(tr))
    if cc is None:
        ampere = any(n.startswith(("ampere_", "sm80", "sm86")) for n in tr.names)
        return FP32_NAMES["ampere" if ampere else "volta"]
    return FP32_NAMES["volta" if cc < (8, 0) else "ampere" if cc < (9, 0) else "hopper"]


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """FP32 GEMM launches spread over each step where the GPU is busy; each kernel's last
    (1 - 1/s) is the label."""
    tr = base.doc.trace
    s = speedup(tr)
    if s is None:
        raise Unusable("the GPU has no tensor cores (compute capability under 7.0, or an AMD "
                       "GPU without matrix cores): FP32 is all it has")
    name = fp32_name(base)
    main = base.tl.main_thread
    top = base.top_rows(main)
    starts = base.start_rel(top)
    backlog = base.tl.backlog_at(starts)
    busy_s, busy_e = _busy(base)
    instances = []
    for _row, lo, hi, _kids in base.steady_steps_or_stretches()[: config.max_instances]:
        inside = np.flatnonzero((starts > lo) & (starts < hi))
        if len(inside) < 2:
            continue
        n = int(min(rng.integers(config.kernels[0], config.kernels[1] + 1), len(inside)))
        step_busy = float(np.clip(np.minimum(busy_e, hi) - np.maximum(busy_s, lo), 0.0,
                                  None).sum())
        total = rng.uniform(*config.busy_share) * max(step_busy, config.min_busy * (hi - lo))
        durs = _whole_us(base, total * rng.dirichlet(np.ones(n)))
        at = []
        for dur in durs.tolist():
            # where the GPU stays busy past the new kernel: slower work in a busy stretch, not
            # GPU work filling a stall the base has (a loader wait, an exposed all-reduce)
            ok = [int(i) for i in inside if int(i) not in at and
                  _longest_gap(busy_s, busy_e, starts[i], starts[i] + backlog[i] + 2 * dur)
                  <= config.max_gap_us]
            if ok:
                at.append(int(rng.choice(ok)))
        for T, dur in zip(starts[at].tolist(), durs.tolist()):
            block = Block(T=float(T), thread=main)
            host = rng.uniform(*config.host_us)
            call = op_launch(block, ["aten::linear", "aten::addmm"], 0.6 * host,
                             Launch(rt_dur=min(8.0, host / 4), stream=base.tl.compute_stream,
                                    gpu_dur=float(dur)), 0.4 * host)

            def emit(f: Factory, call=call, dur=dur):
                spans = emit_call(f, base, call, base.main_key,
                                  kernel={"name": name, "args": _kernel_args(dur)})
                # the part a tensor-core kernel would not have taken: the plant's cost
                return [(b - (b - a) * (1.0 - 1.0 / s), b) for a, b in spans]

            instances.append(Instance([block], emit, label="work", min_idle_us=0.0,
                                      causes_wait=False))
    if not instances:
        raise Unusable("no step with top-level work to launch FP32 GEMMs from")
    return Plan(PATTERN, instances)


def _whole_us(base: Base, durs: np.ndarray) -> np.ndarray:
    """Kernel lengths as the trace can write them: whole us in a trace of integer times (a
    fraction would round into the next kernel on the stream)."""
    return np.maximum(np.rint(durs), 1.0) if base.doc.ts_is_int else durs


def _busy(base: Base) -> tuple[np.ndarray, np.ndarray]:
    """The base's GPU busy stretches (relative us): the union of its GPU work."""
    tl = base.tl
    return merged_intervals(tl.start, tl.end)


def _longest_gap(bs: np.ndarray, be: np.ndarray, lo: float, hi: float) -> float:
    """The longest GPU idle gap of the base inside [lo, hi] (relative us)."""
    i, j = np.searchsorted(be, lo, side="left"), np.searchsorted(bs, hi, side="right")
    gs = np.r_[lo, be[i:j]]
    ge = np.r_[bs[i:j], hi]
    gaps = np.minimum(ge, hi) - np.maximum(gs, lo)
    return float(gaps.max()) if len(gaps) else hi - lo


def _kernel_args(dur_us: float) -> dict:
    """A kernel's args as Kineto writes them (grid, block; a 128x64 tile GEMM)."""
    tiles = max(1, int(dur_us // 2))
    return {"grid": [tiles, 1, 1], "block": [256, 1, 1], "registers per thread": 126,
            "shared memory": 12544}


# -- the natural label: where a real trace shows the pattern by itself ----------------------
def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """FP32 GEMM/convolution kernels of the steps where they are >= `fp32_busy_share` of the
    GPU busy time, on a GPU with tensor cores."""
    tr = c.tr
    if speedup(tr) is None:
        return
    rows = fp32_matmul_rows(tr)
    if not len(rows):
        return
    for s0, s1 in c.steps or [(tr.span[0], tr.span[1])]:
        inside = rows[(tr.ts[rows] >= s0) & (tr.ts[rows] < s1)]
        busy = float(np.clip(np.minimum(c.busy_e, s1) - np.maximum(c.busy_s, s0), 0.0, None).sum())
        if not len(inside) or tr.dur[inside].sum() < cfg.fp32_busy_share * busy:
            continue
        for r in inside.tolist():
            yield float(tr.ts[r]), float(tr.end[r])


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
