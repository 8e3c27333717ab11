"""Phase 4 of a step: loss.backward() on the autograd thread (one node per eager layer, or the
compiled backward), with DDP's gradient buckets filling and sent as they become ready, and
the three NCCL anti-patterns marked where they make the GPU wait."""

from __future__ import annotations

from .. import ops
from ..ops import Layer
from ._state import COMPUTE_STREAM, RunState
from .communication import _Reduction


class Backward(RunState):
    """The backward pass and DDP's bucketing: where the NCCL patterns are planted and marked."""

    def backward(self) -> None:
        """loss.backward(): the autograd nodes on the backward thread, DDP's all-reduces as its
        gradient buckets fill, then DDP's finalize on the main thread."""
        cfg, e = self.cfg, self.eng
        main, bw = e.main, e.bw
        self.simple(main, "aten::ones_like", ops.elementwise("fill", "fp32"), 0.001)
        if cfg.dt == "fp16":   # GradScaler: loss * scale
            self.simple(main, "aten::mul", ops.elementwise("mul", "fp32"), 0.001)
        e.clock[bw] = max(e.clock[bw], e.clock[main] + e.host(15.0))
        red = _Reduction(stream=COMPUTE_STREAM if cfg.nccl_on_compute else self.nccl_stream,
                         first_cap=1.0 * 2**20,          # DDP's first bucket is 1 MB
                         cap=cfg.bucket_mb * 2**20)
        if cfg.ddp and cfg.gather_features:
            # the all_gather's backward: gradients of the gathered embeddings, reduce-scattered
            self.blocking_collective(bw, "ReduceScatter", cfg.batch * 256 * 4.0 * cfg.world_size)
        if cfg.compiled:
            regions = self._regions()
            for r in range(len(regions) - 1, -1, -1):
                lo, hi = regions[r]
                self.compiled_backward(lo, hi)
                red.filled += sum(x.params_m for x in self.layers[lo:hi]) * 4e6
                if cfg.ddp and red.filled >= red.limit and not cfg.allreduce_after_backward:
                    red.spans.append(self.allreduce(bw, red.filled, red.stream))
                    red.n_buckets += 1
                    red.filled = 0.0
        else:
            for layer in reversed(self.layers):
                self.autograd_node(layer)
                if layer.params_m > 0:
                    self.layer_gradients(layer, red)
        compute_done = e.stream_free(COMPUTE_STREAM)
        if cfg.ddp and red.filled > 0:
            if cfg.allreduce_after_backward:
                red.pending.append(red.filled)
            else:
                red.spans.append(self.allreduce(bw, red.filled, red.stream))
        e.clock[main] = max(e.clock[main], e.clock[bw] + e.host(20.0))
        nccl_spans = red.spans
        if red.pending:
            # a hand-written all-reduce of the flattened gradients after loss.backward(): nothing
            # overlaps, the compute stream sits idle until it is done.  work.wait() makes the
            # compute stream wait for the NCCL stream without blocking the host, so the
            # optimizer's kernels are launched at once and queue behind the all-reduce (what real
            # exposed all-reduces look like: HTA's DLRM traces have compute queued through
            # 80-100% of their exposed NCCL).  No DDP reducer: no finalize.
            nccl_spans.append(self.blocking_collective(main, "AllReduce", sum(red.pending)))
            e.mark("nccl_compute_no_overlap", compute_done, nccl_spans[-1][1])
        elif cfg.ddp:
            self.ddp_finalize()
        if cfg.bucket_mb < 2.0 and nccl_spans:
            e.mark("small_nccl_kernels", nccl_spans[0][0], nccl_spans[-1][1])
        if cfg.nccl_on_compute:
            for s, en in nccl_spans:
                e.mark("nccl_blocks_compute_stream", s, en)

    def autograd_node(self, layer: Layer) -> None:
        """One eager layer's backward node: `evaluate_function: XBackward0` around its ops."""
        cfg, e = self.cfg, self.eng
        bw = e.bw
        node = ops.backward_node(layer, self.ctx)
        calls = ops.backward_ops(layer, self.ctx)
        e.idle(bw, e.host(4.0))          # the engine's ready queue between nodes
        seq = self.seq
        self.seq -= 1
        x0, t0 = e.next_ext(), e.clock[bw]
        e.clock[bw] += e.host(4.0)
        x1, t1 = e.next_ext(), e.clock[bw]
        e.clock[bw] += e.host(3.0)
        for call in calls:
            self.op(bw, call, cpu_mult=1.8)
        e.clock[bw] += e.host(6.0)
        if layer.op == "add":
            # the residual fork: the engine sums the two incoming gradients
            self.simple(bw, "aten::add", ops.elementwise("add", cfg.dt),
                        layer.act_mb * self.ctx.scale * 3)
        e.cpu_event(bw, node, t1, e.clock[bw] - t1, x1,
                    extra={"Sequence number": seq, "Fwd thread id": 1})
        e.clock[bw] += e.host(1.5)
        e.cpu_event(bw, f"autograd::engine::evaluate_function: {node}", t0,
                    e.clock[bw] - t0, x0, extra={"Sequence number": seq, "Fwd thread id": 1})

    def layer_gradients(self, layer: Layer, red: "_Reduction") -> None:
        """A layer's gradients: AccumulateGrad, then DDP's bucketing and all-reduce (one per
        tensor when buckets are smaller than a tensor; else once a bucket is full)."""
        cfg, e = self.cfg, self.eng
        bw = e.bw
        self.accumulate_grad(bw)
        if cfg.ddp and cfg.bucket_mb < 1.0 and not cfg.allreduce_after_backward:
            # buckets smaller than a tensor: one all-reduce per parameter tensor
            self.simple(bw, "torch::distributed::reducer::mul_out",
                        ops.elementwise("mul_scalar", "fp32"), layer.params_m * 8)
            sizes = [layer.params_m * 4e6]
            if layer.op in ("bn", "ln", "gn", "linear"):
                sizes = [sizes[0] * 0.5, sizes[0] * 0.5] if layer.op != "linear" else \
                    [sizes[0], 4096.0]
            for nb in sizes:
                e.idle(bw, e.host(80.0))   # the per-tensor Python grad hook
                red.spans.append(self.allreduce(bw, nb, red.stream))
                red.n_buckets += 1
            return
        red.filled += layer.params_m * 4e6
        if cfg.ddp:
            self.simple(bw, "torch::distributed::reducer::mul_out",
                        ops.elementwise("mul_scalar", "fp32"), layer.params_m * 8)
            self.copy_into_bucket(bw, layer.params_m * 4e6)
            if red.filled >= red.limit:
                if cfg.allreduce_after_backward:
                    red.pending.append(red.filled)
                else:
                    red.spans.append(self.allreduce(bw, red.filled, red.stream))
                red.n_buckets += 1
                red.filled = 0.0

    def accumulate_grad(self, tid: int) -> None:
        e = self.eng
        x0, t0 = e.next_ext(), e.clock[tid]
        e.clock[tid] += e.host(2.5)
        x1, t1 = e.next_ext(), e.clock[tid]
        e.clock[tid] += e.host(1.5)
        t2 = e.clock[tid]
        e.cpu_event(tid, "aten::detach", t2, e.host(1.2), e.next_ext())
        e.clock[tid] += e.host(2.5)
        e.cpu_event(tid, "torch::autograd::AccumulateGrad", t1, e.clock[tid] - t1, x1)
        e.clock[tid] += e.host(0.8)
        e.cpu_event(tid, "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
                    t0, e.clock[tid] - t0, x0)
