"""Phase 2 of a step: the eager forward (DDP's forward hooks and buffer broadcast, one layer
after another, data-dependent `aten::nonzero` syncs); compiled forwards are in `compiled`."""

from __future__ import annotations

from .. import ops
from ._state import COMPUTE_STREAM, RunState


#: What `aten::nonzero` launches on CUDA (cub's reduce for the count, then its select).
NONZERO_KERNELS = (
    "void at_cuda_detail::cub::DeviceReduceSingleTileKernel<at_cuda_detail::cub::DeviceReducePolicy"
    "<long, unsigned int, at_cuda_detail::cub::Sum>::Policy600, at::native::(anonymous namespace)::"
    "NonZeroOp<bool>*, long*, int, at_cuda_detail::cub::Sum, long>(at::native::(anonymous "
    "namespace)::NonZeroOp<bool>*, long*, int, at_cuda_detail::cub::Sum, long)",
    "void at_cuda_detail::cub::DeviceCompactInitKernel<at_cuda_detail::cub::ScanTileState<int, "
    "true>, int*>(at_cuda_detail::cub::ScanTileState<int, true>, int, int*)",
    "void at_cuda_detail::cub::DeviceSelectSweepKernel<at_cuda_detail::cub::DispatchSelectIf<"
    "at_cuda_detail::cub::CountingInputIterator<long, long>, at::native::(anonymous namespace)::"
    "NonZeroOp<bool>*, long*, int*, at_cuda_detail::cub::NullType, at_cuda_detail::cub::NullType, "
    "int, false>::PtxSelectIfPolicyT, at_cuda_detail::cub::CountingInputIterator<long, long>, "
    "at::native::(anonymous namespace)::NonZeroOp<bool>*, long*, int*, at_cuda_detail::cub::"
    "ScanTileState<int, true>, at_cuda_detail::cub::NullType, at_cuda_detail::cub::NullType, int, "
    "false>(...)")


class Forward(RunState):
    """The model's forward pass, eager (the compiled one is `CompiledRegions.compiled_forward`)."""

    def forward(self) -> None:
        cfg, e = self.cfg, self.eng
        ann = e.begin(e.main, "DistributedDataParallel.forward") if cfg.ddp else None
        if cfg.ddp:
            # DDP checks for unused params / rebuilt buckets each iteration: small host work
            e.idle(e.main, e.host(40.0))
            if cfg.broadcast_buffers:
                # broadcast_buffers=True (DDP's default): rank 0's BatchNorm statistics, coalesced
                bn_mb = sum(x.params_m for x in self.layers if x.op == "bn") * 4e6
                for chunk in (bn_mb * 0.9, bn_mb * 0.1 + 8.0):
                    self.blocking_collective(e.main, "Broadcast", chunk, "i8")
        if cfg.compiled:
            self.compiled_forward()
        else:
            at = self.forward_sync_layers()
            for i, layer in enumerate(self.layers):
                self.seq += 1
                # nn.Module.__call__ + the Python of forward(): host time outside any op
                e.idle(e.main, e.host(22.0))
                for call in ops.forward_ops(layer, self.ctx):
                    self.op(e.main, call, seq=self.seq if cfg.mode == "train" else None)
                for _ in range(at.count(i)):
                    self.nonzero(e.main)
        if ann:
            e.end(ann)

    def forward_sync_layers(self) -> list[int]:
        """The layers after which the forward runs a data-dependent op (the same every step)."""
        if self._sync_layers is None:
            n = self.cfg.forward_syncs
            self._sync_layers = sorted(int(x) for x in self.rng.integers(
                len(self.layers) // 4, len(self.layers), size=n)) if n and self.layers else []
        return self._sync_layers

    def nonzero(self, tid: int) -> None:
        """`aten::nonzero` (boolean masks, `torch.where(cond)`, box or point selection): a count
        kernel, its 8-byte result copied to the host and waited for, then the select kernels.
        Healthy models do this in their forward; the GPU idles only while the host relaunches."""
        e = self.eng
        x, t = e.next_ext(), e.clock[tid]
        e.clock[tid] += e.host(8.0)
        e.launch(tid, NONZERO_KERNELS[0], 3.0 * e.jit(), COMPUTE_STREAM, x, 256, 32)
        e.clock[tid] += e.host(3.0)
        e.memcpy(tid, "DtoH (Device -> Pinned)", 8, self.cfg.platform.h2d_pageable_gbs,
                 COMPUTE_STREAM, x, blocking=False)
        e.sync(tid, COMPUTE_STREAM, x)
        e.clock[tid] += e.host(6.0)
        for k in NONZERO_KERNELS[1:]:
            e.launch(tid, k, 2.5 * e.jit(), COMPUTE_STREAM, x, 128, 32)
            e.clock[tid] += e.host(2.0)
        e.cpu_event(tid, "aten::nonzero", t, e.clock[tid] - t, x)
