"""The building blocks every phase calls: an eager op on a thread (its cpu_ops, host cost and
kernels), one-kernel elementwise ops, and where a host-side stall leaves the GPU waiting."""

from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..ops import Kern, OpCall
from ._state import _BOOKKEEPING, COMPUTE_STREAM, RunState


class HostOps(RunState):
    """The eager-op building blocks of one rank's loop (the lowest layer of the phases)."""

    def op(self, tid: int, call: OpCall, runtime: str = "cudaLaunchKernel",
           seq: int | None = None, cpu_mult: float = 1.0) -> tuple[float, float]:
        """Run an eager op: nested cpu_ops, their host cost, the kernels; (gpu_start, gpu_end)."""
        e = self.eng
        if tid == e.main:
            # the Python line that calls the op (argument handling, attribute lookups): real
            # traces leave 15-30% of the main thread outside any cpu_op between eager ops
            e.idle(tid, e.host(7.0))
        starts, exts = [], []
        for _ in call.chain:
            starts.append(e.clock[tid])
            exts.append(e.next_ext())
            e.clock[tid] += e.host(3.5 * cpu_mult)
        for child in call.extra_children:
            t = e.clock[tid]
            d = e.host(3.5)
            e.cpu_event(tid, child, t, d, e.next_ext())
            e.clock[tid] = t + d + e.host(0.6)
        if call.extra_children and call.extra_children[0].startswith("aten::empty"):
            # the caching allocator checks for stream capture when an op allocates its output
            e.runtime(tid, "cudaStreamIsCapturing", e.rt_cost(0.7), exts[-1])
        if len(call.chain) > 1:
            # TensorIterator / view bookkeeping every real op shows (aten::view, as_strided, ...)
            for child in _BOOKKEEPING[(exts[-1] + len(call.chain)) % len(_BOOKKEEPING)]:
                t = e.clock[tid]
                d = e.host(1.3)
                e.cpu_event(tid, child, t, d, e.next_ext())
                e.clock[tid] = t + d + e.host(0.4)
        # dispatch + argument checks + (cuDNN/cuBLAS) heuristics; calibrated on real traces
        # recorded with the profiler on (aten::conv2d ~150-330 us, aten::add ~15 us)
        e.clock[tid] += e.host(call.cpu_us * cpu_mult * (0.5 if len(call.chain) == 1 else 1.5))
        lo, hi = math.inf, -math.inf
        for k in call.kernels:
            if not k.memory_bound:
                # cuDNN / cuBLAS query the stream and set kernel attributes before launching
                if "cudnn" in k.name or "xmma" in k.name:
                    e.runtime(tid, "cudaStreamGetPriority", e.rt_cost(0.6), exts[-1])
                    e.runtime(tid, "cudaDeviceGetStreamPriorityRange", e.rt_cost(0.6), exts[-1])
                if e.jit() > 1.0:
                    e.runtime(tid, "cudaFuncSetAttribute", e.rt_cost(1.4), exts[-1])
                if e.jit() > 1.25:
                    e.runtime(tid, "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
                              e.rt_cost(1.1), exts[-1])
            dur = ops.kernel_duration_us(k, call, self.ctx, self.eff) * e.jit() ** 0.5
            rt = runtime
            if runtime == "cudaLaunchKernel" and not k.memory_bound and self.cfg.platform.sm_tag == "sm90":
                rt = "cudaLaunchKernelExC"
            s, en = e.launch(tid, k.name, dur, COMPUTE_STREAM, exts[-1], k.block, k.regs, k.smem, rt)
            lo, hi = min(lo, s), max(hi, en)
        for i in range(len(call.chain) - 1, -1, -1):
            e.clock[tid] += e.host(2.2 * cpu_mult)
            extra = None
            if i == 0 and seq is not None:
                extra = {"Sequence number": seq, "Fwd thread id": 0}
            e.cpu_event(tid, call.chain[i], starts[i], e.clock[tid] - starts[i], exts[i], extra=extra)
        return lo, hi

    def simple(self, tid: int, name: str, kern: str, mbytes: float, cpu_us: float = 12.0,
               cpu_mult: float = 1.0) -> tuple[float, float]:
        """A one-kernel elementwise op."""
        return self.op(tid, OpCall((name,), (Kern(kern, 1.0, True, 128, 16),), 0.0, mbytes, cpu_us),
                       cpu_mult=cpu_mult)

    #: aten op -> (kernel kind of `ops.elementwise`, dtype follows the run) for small tensor ops
    SMALL_OPS = {"add": ("aten::add", "add", True), "sub": ("aten::sub", "add", True),
                 "mul": ("aten::mul", "mul", True), "div": ("aten::div", "div", True),
                 "sigmoid": ("aten::sigmoid", "sigmoid", True), "index": ("aten::index", "index", False),
                 "cat": ("aten::cat", "cat", False), "sum": ("aten::sum", "sum", False),
                 "mean": ("aten::mean", "mean", False), "mul_": ("aten::mul_", "mul_scalar", True),
                 "add_": ("aten::add_", "add_", True), "fill_": ("aten::fill_", "fill", True),
                 "copy_": ("aten::copy_", "copy", True), "relu": ("aten::relu", "relu", True)}

    def small_op(self, tid: int, kind: str, mbytes: float, cpu_mult: float = 1.0,
                 dt: str | None = None) -> tuple[float, float]:
        """A one-kernel op on small tensors (loss terms, metrics, box decoding, loops)."""
        name, kern, typed = self.SMALL_OPS[kind]
        return self.simple(tid, name, ops.elementwise(kern, (dt or self.cfg.dt) if typed else "fp32"),
                           mbytes, cpu_mult=cpu_mult)

    def allocator_round(self, n: int) -> None:
        """`torch.cuda.empty_cache()` in the loop, then the next ops allocating again: `n`
        cudaFree (the first waits for the device) and `n` cudaMalloc under
        `aten::empty_strided` (allocator_churn's interval, once the GPU ran dry)."""
        e = self.eng
        t0, backlog = e.clock[e.main], e.stream_free(COMPUTE_STREAM)
        for i in range(n):
            wait = max(max(e.free.values(), default=0.0) - e.clock[e.main], 0.0) if i == 0 else 0.0
            e.runtime(e.main, "cudaFree", wait + e.rt_cost(float(self.rng.uniform(120, 800))),
                      e.next_ext())
        for _ in range(n):
            ts, ext = e.clock[e.main], e.next_ext()
            e.clock[e.main] += e.host(4.0)
            malloc_us = float(np.exp(self.rng.uniform(np.log(60.0), np.log(2000.0))))
            e.runtime(e.main, "cudaMalloc", e.rt_cost(malloc_us), ext)
            e.clock[e.main] += e.host(2.0)
            e.cpu_event(e.main, "aten::empty_strided", ts, e.clock[e.main] - ts, ext)
        self.starvation("allocator_churn", t0, e.clock[e.main], backlog)

    def starvation(self, pattern: str, cpu_start: float, cpu_end: float, backlog_end: float) -> None:
        """Mark where a host-side stall leaves the GPU without work: after its backlog drains."""
        start = max(cpu_start, backlog_end)
        if cpu_end - start > 20.0:
            self.eng.mark(pattern, start, cpu_end + 8.0)
