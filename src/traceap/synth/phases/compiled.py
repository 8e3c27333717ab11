"""torch.compile everywhere it shows in a step: Inductor's kernel schedule per region, the
`Torch-Compiled Region` / `CompiledFunction` annotations, graph breaks, and the compiled loss,
backward and optimizer step."""

from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..engine import _Span
from ..ops import Kern, Layer, OpCall
from ._state import _COMPUTE_OPS, COMPUTE_STREAM, _FUSE_NAMES, RunState


class CompiledRegions(RunState):
    """torch.compile's frames: compiled forward regions, graph breaks, compiled loss/backward/optimizer."""

    def _regions(self) -> list[tuple[int, int]]:
        """Layer index ranges of the compiled regions (separately compiled modules and graph
        breaks split the forward; each region is its own torch.compile frame)."""
        n = len(self.layers)
        k = max(1, self.cfg.compiled_parts) + self.cfg.graph_breaks
        cuts = sorted(set(int(c) for c in np.linspace(0, n, k + 1)[1:-1]))
        bounds = [0, *cuts, n]
        return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]

    def _compiled_kernels(self, layers: tuple[Layer, ...],
                          backward: bool) -> list[tuple[str, OpCall, Kern, str | None]]:
        """Inductor's schedule for a region: extern conv/GEMM kernels and fused Triton kernels."""
        out: list[tuple[str, OpCall, Kern, str | None]] = []
        run: list[Layer] = []
        idx = 0

        def flush():
            nonlocal idx, run
            if not run:
                return
            names = "_".join(dict.fromkeys(_FUSE_NAMES[x.op] for x in run))[:90]
            mb = sum(x.act_mb for x in run) * self.ctx.scale * (0.5 if self.ctx.dt != "fp32" else 1.0)
            red = any(x.op in ("bn", "ln", "gn", "avgpool", "softmax") for x in run)
            kind = ("red" if backward else "per") if red else "poi"
            name = ops.triton_name(kind, names, idx)
            call = OpCall((), (Kern(name, 1.0, True, 256 if kind != "poi" else 512, 40),), 0.0,
                          mb * (2.2 if not backward else 3.0), 0.0)
            out.append(("triton", call, call.kernels[0], None))
            idx += 1
            run = []

        seq = list(reversed(layers)) if backward else list(layers)
        for layer in seq:
            if layer.op in _COMPUTE_OPS:
                flush()
                calls = (ops.backward_ops(layer, self.ctx) if backward
                         else [c for c in ops.forward_ops(layer, self.ctx) if c.gflop > 0 or
                               c.chain[0] != "aten::to"])
                for c in calls:
                    for k in c.kernels:
                        if "Kernel<4" in k.name or "nchwToNhwc" in k.name or "nhwcToNchw" in k.name:
                            continue  # inductor keeps tensors channels-last: no cuDNN transposes
                        if "vectorized_elementwise" in k.name or "reduce_kernel" in k.name:
                            continue
                        out.append(("extern", c, k, c.chain[-1]))
            else:
                run.append(layer)
        flush()
        return out

    def enter_compiled_region(self, frame: int, compile_id: int = 0) -> _Span:
        """Dynamo's guard check (`TorchDynamo Cache Lookup`), then the frame's
        `Torch-Compiled Region` annotation opens on the main thread."""
        e = self.eng
        t = e.clock[e.main]
        d = e.host(14.0)
        e.cpu_event(e.main, "TorchDynamo Cache Lookup", t, d, e.next_ext())
        e.clock[e.main] = t + d + e.host(8.0)
        return e.begin(e.main, f"Torch-Compiled Region: {frame}/{compile_id}")

    def leave_compiled_function(self, ann: _Span, cf_start: float, cf_ext: int) -> None:
        """`CompiledFunction` closes over the launches since cf_start, then the region."""
        e = self.eng
        e.clock[e.main] += e.host(10.0)
        e.cpu_event(e.main, "CompiledFunction", cf_start, e.clock[e.main] - cf_start, cf_ext,
                    extra={"Sequence number": self.seq, "Fwd thread id": 0})
        e.end(ann)

    def recompile(self) -> int:
        """recompilation: the first frame's guard fails in a later step (a new input shape), so
        Dynamo traces it again and Inductor compiles it on the host (the `(dynamo_timed)` phases
        PyTorch records) while the GPU drains and waits; returns the new compile id (1), or 0
        where this step does not recompile."""
        cfg, e = self.cfg, self.eng
        if self.step_index not in cfg.recompile_steps or self.step_index == 0:
            return 0
        cpu_start = e.clock[e.main]
        gpu_before = e.stream_free(COMPUTE_STREAM)
        d = e.host(cfg.recompile_us)
        phases = (("_compile.compile_inner (dynamo_timed)", 0.0, 1.0),
                  ("OutputGraph.call_user_compiler (dynamo_timed)", 0.18, 0.985),
                  ("compile_fx_inner (dynamo_timed)", 0.35, 0.97))
        for depth, (name, a, b) in enumerate(phases):
            e.cpu_event(e.main, name, cpu_start + a * d + depth, (b - a) * d - 2 * depth,
                        e.next_ext(), cat="user_annotation")
        e.clock[e.main] = cpu_start + d
        self.starvation("recompilation", cpu_start, e.clock[e.main], gpu_before)
        return 1

    def compiled_region(self, lo: int, hi: int, region: int) -> None:
        """One `Torch-Compiled Region`: a cache lookup, then CompiledFunction's launches."""
        cfg, e = self.cfg, self.eng
        cid = self.recompile() if region == 0 else 0
        ann = self.enter_compiled_region(region, cid)
        cf_start, cf_ext = e.clock[e.main], e.next_ext()
        e.clock[e.main] += e.host(25.0)
        for kind, call, k, aten in self._compiled_kernels(self.layers[lo:hi], False):
            dur = ops.kernel_duration_us(k, call, self.ctx, self.eff * 1.1) * e.jit() ** 0.5
            if kind == "triton":
                e.clock[e.main] += e.host(3.0)
                e.launch(e.main, k.name, dur, COMPUTE_STREAM, cf_ext, k.block, k.regs, k.smem,
                         "cuLaunchKernel")
            else:
                t = e.clock[e.main]
                x = e.next_ext()
                e.clock[e.main] += e.host(6.0)
                e.launch(e.main, k.name, dur, COMPUTE_STREAM, x, k.block, k.regs, k.smem)
                e.clock[e.main] += e.host(2.0)
                e.cpu_event(e.main, aten, t, e.clock[e.main] - t, x)
        self.leave_compiled_function(ann, cf_start, cf_ext)

    def compiled_forward(self) -> None:
        """Compiled regions: separately compiled modules follow each other through a little
        Python (nn.Module.__call__); after them, each graph break is an eager stretch."""
        cfg, e = self.cfg, self.eng
        regions = self._regions()
        parts = max(1, cfg.compiled_parts)
        for r, (lo, hi) in enumerate(regions):
            if r >= parts:
                self.graph_break_gap(lo)
            elif r > 0:
                e.idle(e.main, e.host(float(self.rng.uniform(15.0, 60.0))))
            self.compiled_region(lo, hi, r)

    def graph_break_gap(self, at_layer: int) -> None:
        """What a graph break costs: the resume in Python, a few eager ops, maybe a sync."""
        cfg, e = self.cfg, self.eng
        cpu_start = e.clock[e.main]
        gpu_before = e.stream_free(COMPUTE_STREAM)
        if self.rng.random() < 0.6:
            # data-dependent control flow (`if x.sum().item() > 0`) broke the graph: it syncs
            self.item_sync(e.main, "aten::item")
        e.idle(e.main, e.host(float(self.rng.uniform(250, 1200))))   # guard eval + resume frame
        lo = max(0, at_layer - 3)
        eager = [x for x in self.layers[lo:at_layer + 2] if x.op not in _COMPUTE_OPS][:4] or \
            [Layer("add", 0, 1.0)]
        g_lo, g_hi = math.inf, -math.inf
        for layer in eager:
            for call in ops.forward_ops(layer, self.ctx):
                s, en = self.op(e.main, call, cpu_mult=1.5)
                g_lo, g_hi = min(g_lo, s), max(g_hi, en)
        e.idle(e.main, e.host(float(self.rng.uniform(150, 500))))
        self.starvation("graph_break", cpu_start, e.clock[e.main], gpu_before)
        if g_hi > g_lo:
            e.mark("graph_break", g_lo, g_hi)

    def _frame(self, which: str) -> int:
        """torch.compile frame ids, in the order of first compilation: forward modules, the
        graph breaks' resume functions, then a compiled loss and a compiled optimizer step."""
        cfg = self.cfg
        first_after_forward = max(1, cfg.compiled_parts) + cfg.graph_breaks
        if which == "loss":
            return first_after_forward
        return first_after_forward + int(cfg.compiled_loss)

    def compiled_loss_region(self) -> None:
        """`torch.compile(criterion)`: one frame whose terms Inductor fuses into a few kernels."""
        cfg, e = self.cfg, self.eng
        ann = self.enter_compiled_region(self._frame('loss'))
        cf_start, cf_ext = e.clock[e.main], e.next_ext()
        e.clock[e.main] += e.host(25.0)
        fused = "_".join(dict.fromkeys(self.SMALL_OPS[k][0][6:] for k in cfg.loss_kinds))[:60] or "add"
        for i, kind in enumerate(("poi", "red", "per")):
            k = Kern(ops.triton_name(kind, fused, i), 1.0, True, 256, 40)
            dur = ops.kernel_duration_us(k, OpCall((), (k,), 0.0, 0.2 * cfg.batch * 0.05, 0.0),
                                         self.ctx, self.eff) * e.jit() ** 0.5
            e.clock[e.main] += e.host(3.0)
            e.launch(e.main, k.name, dur, COMPUTE_STREAM, cf_ext, k.block, k.regs, k.smem,
                     "cuLaunchKernel")
        self.leave_compiled_function(ann, cf_start, cf_ext)

    def compiled_backward(self, lo: int, hi: int) -> None:
        cfg, e = self.cfg, self.eng
        bw = e.bw
        x0, t0 = e.next_ext(), e.clock[bw]
        e.clock[bw] += e.host(5.0)
        x1, t1 = e.next_ext(), e.clock[bw]
        e.clock[bw] += e.host(30.0)
        for kind, call, k, aten in self._compiled_kernels(self.layers[lo:hi], True):
            dur = ops.kernel_duration_us(k, call, self.ctx, self.eff * 1.1) * e.jit() ** 0.5
            if kind == "triton":
                e.clock[bw] += e.host(3.0)
                e.launch(bw, k.name, dur, COMPUTE_STREAM, x1, k.block, k.regs, k.smem, "cuLaunchKernel")
            else:
                t = e.clock[bw]
                x = e.next_ext()
                e.clock[bw] += e.host(6.0)
                e.launch(bw, k.name, dur, COMPUTE_STREAM, x, k.block, k.regs, k.smem)
                e.clock[bw] += e.host(2.0)
                e.cpu_event(bw, aten, t, e.clock[bw] - t, x)
        e.clock[bw] += e.host(8.0)
        e.cpu_event(bw, "CompiledFunctionBackward", t1, e.clock[bw] - t1, x1,
                    extra={"Sequence number": self.seq, "Fwd thread id": 1})
        e.clock[bw] += e.host(1.0)
        e.cpu_event(bw, "autograd::engine::evaluate_function: CompiledFunctionBackward", t0,
                    e.clock[bw] - t0, x0, extra={"Sequence number": self.seq, "Fwd thread id": 1})
        for _ in range(min(6, sum(1 for x in self.layers[lo:hi] if x.params_m > 0))):
            self.accumulate_grad(bw)

    def compiled_optimizer_step(self, mbytes: float) -> None:
        """`torch.compile(optimizer.step)`: its own frame, Inductor's foreach (`triton_for_`) kernels."""
        e = self.eng
        ann = self.enter_compiled_region(self._frame('optimizer'))
        x = e.next_ext()
        e.clock[e.main] += e.host(30.0)
        n = int(np.clip(self.param_tensors // 40, 2, 12))
        for i in range(n):
            e.clock[e.main] += e.host(3.0)
            k = Kern(ops.triton_name("for", "", i).replace("fused__", "fused_"), 1.0 / n, True, 512, 40)
            dur = ops.kernel_duration_us(k, OpCall((), (k,), 0.0, mbytes, 0.0), self.ctx, self.eff) * e.jit() ** 0.5
            e.launch(e.main, k.name, dur, COMPUTE_STREAM, x, k.block, k.regs, k.smem, "cuLaunchKernel")
        e.clock[e.main] += e.host(10.0)
        e.end(ann)
