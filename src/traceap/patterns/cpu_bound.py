"""CPU-bound execution: the GPU idles while the host runs the user's code between launches.

Mechanism: when the host takes longer to issue the next kernel than the device takes to run
the last one, the launch queue empties and the device waits.  What makes that an anti-pattern
rather than the nature of a workload is *where* the host spends the time: in the user's code
(`traceap.measures.host.user_code`), either Python between framework calls (a per-sample loop,
per-parameter optimizer code, hooks, `.tolist()` post-processing), which the profiler records
as nothing at all, a hole between ops, or ops on host tensors that launch nothing (per-sample
augmentation in the training loop: `aten::conv2d`, `aten::grid_sampler` on a CPU image, each
running hundreds of us to ms on its own, where the dispatch of a kernel takes 10-30 us).  Time
lost is the `python_host` idle of `traceap.idle`: starved GPU gaps (the next launch began after
the device went idle; the head of the GPU span too, when its first work was launched only
after the step began) that no earlier cause claims (warm-up, communication, graph breaks,
copies and syncs, data loading, unrecorded host work), while the host was in a hole longer
than twice the framework call before it or in such an op.  A launch-bound steady state whose
idle time sits in the framework's own dispatch (small-model inference at batch 2, DDP bucket
bookkeeping) is the idle account's `launch_bound` mechanism: shown as "launch-bound host", no anomaly, no finding.
Anchors: HTA's short kernel (GPU time < CPU launch time); TraceLens short kernels averaging
under 10 us and GPU idle over 15%; nsys-ai >= 5 launches under 10 us (in the evidence: they
hold for healthy small models too, so they do not score).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..idle import measure as idle_account
from ..idle import pattern_lost
from ..idle import per_window as idle_per_window
from ..measures.host import host_compute_ops, python_holes
from ..measures.signals import (count_in, fmt_us, kernel_rows, outer_cpu_ops, per_episode, ramp,
                                rows_in_windows, rows_named, sum_in, top_names)
from ..trace import Kind, Trace, merged_intervals
from ..windows import Windows, covered_time
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, gaps_and_ops


@dataclass(frozen=True)
class CpuBoundConfig:
    """Thresholds on the share of a window the GPU waits for the user's code.

    Chosen on the validation split of the real-based benchmark (particle_transformer, kineto;
    `benchmarks/real_rules_report.py`) and checked on the simulated train split: healthy
    small-model windows stay under python_lo (99%), planted Python stretches and simulated
    Python loops reach 0.4 and more."""

    python_lo: float = 0.1
    python_hi: float = 0.4
    #: Python stretches and ops on host tensors per episode (a run of windows it costs idle
    #: time in) that make a habit; one or two long ones (a microbenchmark's set-up between two
    #: kernels, in windows of tens of us) are not.  Counted per episode as excessive_memcpy
    #: counts its syncs.
    count_lo: float = 2.0
    count_hi: float = 4.0
    short_us: float = 10.0     # TraceLens / nsys-ai: kernels averaging under 10 us (evidence)


def short_kernels(trace, short_us: float) -> np.ndarray:
    """Per kernel row (aligned with kernel_rows): runs shorter than its launch call or short_us."""
    k = kernel_rows(trace)
    launch = trace.launch[k]
    call = np.where(launch >= 0, trace.dur[np.maximum(launch, 0)], 0.0)
    return (trace.dur[k] < call) | (trace.dur[k] < short_us)


OPTIMIZER_STEP = r"^Optimizer\.step#"


def optimizer_share(trace, kernels: np.ndarray) -> tuple[str, float]:
    """(name of the optimizer step, share of `kernels` launched inside an optimizer step)."""
    opt = rows_named(trace, OPTIMIZER_STEP, (Kind.USER_ANNOTATION, Kind.CPU_OP))
    launch = trace.launch[kernels]
    launch = launch[launch >= 0]
    if not len(opt) or not len(launch):
        return "", 0.0
    s, e = merged_intervals(trace.ts[opt], trace.end[opt])
    at = trace.ts[launch]
    j = np.searchsorted(s, at, side="right") - 1
    inside = (j >= 0) & (at < e[np.maximum(j, 0)])
    name = top_names(trace, opt, k=1)[0][0]
    return name, float(inside.mean())


class CpuBound(AntiPattern):
    id = "cpu_bound"
    title = "CPU-bound: the GPU waits while the host runs the user's code between short kernels"
    mechanism = ("the host runs the user's code (Python, ops on host tensors) between launches; "
                 "the GPU drains the queue and idles")
    amount = ("n_short_kernels",)
    fix = """\
Launch fewer, bigger kernels, or take the host out of the loop:

    model = torch.compile(model)                       # fuses elementwise chains
    model = torch.compile(model, mode="reduce-overhead")   # + CUDA graphs: one launch per step
    # or capture a static step yourself with CUDA graphs
    # (g = torch.cuda.CUDAGraph(); with torch.cuda.graph(g): ...)

Also: raise the batch size (more work per kernel), use fused optimizers
(`torch.optim.AdamW(params, fused=True)` or `foreach=True`), channels_last + AMP
(`torch.autocast("cuda", dtype=torch.bfloat16)`), and move per-sample Python loops into
batched tensor ops.  Per-sample work on CPU tensors in the training loop (augmentation,
preprocessing: the host ops named below) belongs in the Dataset's `__getitem__`, where
DataLoader(num_workers=N) runs it in parallel and ahead of the step, or batched on the GPU
after the upload (torchvision.transforms.v2 on CUDA tensors)."""
    letter = "C"
    color = "#D55E00"
    short = "CPU"
    account = IdleCause("python_host")
    signature = ("the GPU is mostly idle between many short kernels; kernels finish faster than "
                 "the CPU launches them (short kernels, long launch delays, busy "
                 "cudaLaunchKernel).")

    def __init__(self, config: CpuBoundConfig = CpuBoundConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        # The idle account's own bucket: starved time no earlier cause claims, while the host
        # ran the user's code; the framework's dispatch (launch_bound) is the steady state.
        lost = pattern_lost(windows, self.id)
        waiting = lost + idle_per_window(windows)["launch_bound"]
        # the habit: Python stretches and ops on host tensors, one by one (a per-sample loop
        # makes hundreds; a set-up op or two does not)
        h0 = np.concatenate((python_holes(t)[0], t.ts[host_compute_ops(t)]))
        n_python = count_in(windows, np.sort(h0))
        habit = ramp(per_episode(n_python, lost > 0), c.count_lo, c.count_hi)
        k = kernel_rows(t)
        short = short_kernels(t, c.short_us)
        return {"score": ramp(lost / windows.width_us, c.python_lo, c.python_hi) * habit,
                "lost_us": lost, "waiting_us": waiting, "n_python": n_python,
                "n_kernels": count_in(windows, t.ts[k]),
                "n_short": count_in(windows, t.ts[k[short]]),
                "kernel_us": sum_in(windows, t.ts[k], t.dur[k])}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        n_k = int(m["n_kernels"][idx].sum())
        n_s = int(m["n_short"][idx].sum())
        lost = float(m["lost_us"][idx].sum())
        mean = float(m["kernel_us"][idx].sum()) / max(n_k, 1)
        span = len(idx) * windows.width_us
        k = rows_in_windows(windows, kernel_rows(t), idx)
        ops = t.cpu_op[k]
        ops = ops[ops >= 0]
        top = top_names(t, ops, k=3)
        who = ("; most launches from " + ", ".join(f"{n} x{c}" for n, c, _ in top)) if top else ""
        waiting = float(m["waiting_us"][idx].sum())
        # Over the whole trace, a share of the GPU span: the span GPU idle is a share of.
        whole = len(idx) == windows.n and idle_account(t).span_us > 0
        of = (f"{100 * waiting / idle_account(t).span_us:.0f}% of the GPU span" if whole
              else f"{100 * waiting / max(span, 1e-9):.0f}% of these windows")
        text = (f"{n_k} kernels averaging {fmt_us(mean)} ({n_s} shorter than their launch or "
                f"{fmt_us(self.config.short_us)}); the GPU waited for the host {fmt_us(waiting)} "
                f"({of}), {fmt_us(lost)} of it "
                f"while the host ran the user's code (Python between framework calls, over twice "
                f"as long as the call before, and ops on host tensors that launch nothing){who}")
        opt, share = optimizer_share(t, k)
        if share >= 0.5:
            text += (f"; {100 * share:.0f}% of them are launched inside {opt}: a per-parameter "
                     f"optimizer loop (use foreach=True or fused=True)")
        host = host_ops_while_waiting(windows, idx)
        if host:
            text += ("; while the GPU waited the host ran " +
                     ", ".join(f"{n} ({fmt_us(us)})" for n, us in host))
        return text, {"n_kernels": n_k, "n_short_kernels": n_s, "mean_kernel_us": round(mean, 2),
                      "gpu_waiting_for_cpu_us": round(waiting, 1),
                      "python_between_calls_us": round(lost, 1),
                      "host_ops_while_waiting_us": {n: round(us, 1) for n, us in host}}

    def title_for(self, numbers: dict) -> str:
        if numbers.get("n_short_kernels", 0) >= 0.5 * max(numbers.get("n_kernels", 0), 1):
            return self.title
        return "CPU-bound: the GPU waits while the host runs the user's code between launches"

    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("n_kernels", 0) > 0

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """The longest GPU idle gaps, each with the CPU ops that ran meanwhile."""
        return ("Longest GPU idle gaps, and the CPU ops that ran meanwhile",
                gaps_and_ops(trace, runs, limit))


def host_ops_while_waiting(windows: Windows, idx: np.ndarray, k: int = 3) -> list[tuple[str, float]]:
    """The outermost host ops that ran while the GPU waited for the host (the launch-bound idle
    time in windows `idx`), heaviest first: (name, us of GPU idle they overlap)."""
    t = windows.trace
    acc = idle_account(t)
    sel = np.isin(acc.seg_code, [acc_code("launch_bound"), acc_code("python_host")])
    s, e = acc.seg_start[sel], acc.seg_end[sel]
    lo, hi = windows.edges[idx], windows.edges[idx + 1]
    # The segments inside the chosen windows (windows are disjoint, segments too).
    cut_s, cut_e = [], []
    for a, b in zip(lo, hi):
        i0, i1 = np.searchsorted(e, a, side="right"), np.searchsorted(s, b, side="left")
        if i1 > i0:
            cut_s.append(np.maximum(s[i0:i1], a))
            cut_e.append(np.minimum(e[i0:i1], b))
    if not cut_s:
        return []
    cs, ce = np.concatenate(cut_s), np.concatenate(cut_e)
    ops = outer_cpu_ops(t)
    if not len(ops):
        return []
    f = covered_time(cs, ce, np.concatenate((t.ts[ops], t.end[ops])))
    over = f[len(ops):] - f[:len(ops)]
    keep = over > 0
    if not keep.any():
        return []
    return [(n, us) for n, _, us in top_names(t, ops[keep], over[keep], k=k)]


def acc_code(mechanism: str) -> int:
    """The code of a mechanism in the idle account's segments."""
    from ..idle import MECHANISM_IDS
    return MECHANISM_IDS.index(mechanism)


PATTERN = register_pattern(CpuBound())
