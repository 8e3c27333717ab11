"""Phase 3 of a step: the loss, metrics, and the host code between forward and backward that
syncs or keeps the interpreter busy (`.item()`, per-sample copies, Python loops of tiny ops)."""

from __future__ import annotations

from .. import ops
from ..ops import Kern, OpCall
from ._state import COMPUTE_STREAM, RunState


class LossAndSyncs(RunState):
    """The loss, running metrics, `.item()` syncs, and the excessive_memcpy / cpu_bound mechanisms."""

    def item_sync(self, tid: int, name: str = "aten::item") -> None:
        """`.item()` / `.cpu()`: a D2H copy of a few bytes and a stream sync."""
        e = self.eng
        x0, t0 = e.next_ext(), e.clock[tid]
        e.clock[tid] += e.host(3.0)
        x1, t1 = e.next_ext(), e.clock[tid]
        e.clock[tid] += e.host(2.5)
        e.memcpy(tid, "DtoH (Device -> Pageable)", 4 if name == "aten::item" else 4096,
                 self.cfg.platform.h2d_pageable_gbs, COMPUTE_STREAM, x1, blocking=False)
        e.sync(tid, COMPUTE_STREAM, x1)
        e.clock[tid] += e.host(2.0)
        if name == "aten::item":
            e.cpu_event(tid, "aten::_local_scalar_dense", t1, e.clock[tid] - t1, x1)
        else:
            e.cpu_event(tid, "aten::copy_", t1, e.clock[tid] - t1, x1)
            name = "aten::to"
        e.clock[tid] += e.host(1.0)
        e.cpu_event(tid, name, t0, e.clock[tid] - t0, x0)

    def loss(self) -> None:
        cfg, e = self.cfg, self.eng
        dt = cfg.dt
        mb = cfg.batch * 0.004
        if cfg.ddp and cfg.gather_features:
            # contrastive losses gather every rank's embeddings (torch.distributed.nn.all_gather)
            self.blocking_collective(e.main, "AllGather", cfg.batch * 256 * 4.0 * cfg.world_size)
        if cfg.compiled and cfg.compiled_loss:
            self.compiled_loss_region()
        elif cfg.model.task == "image_classification" or cfg.model.task == "action_recognition":
            lsm, nll, _, _ = ops.loss_kernels(dt)
            self.op(e.main, OpCall(("aten::cross_entropy_loss", "aten::log_softmax", "aten::_log_softmax"),
                                   (Kern(lsm, 1.0, True),), 0.0, mb, 20.0))
            self.op(e.main, OpCall(("aten::nll_loss_nd", "aten::nll_loss", "aten::nll_loss_forward"),
                                   (Kern(nll, 1.0, True),), 0.0, mb, 16.0))
        else:
            # task losses: elementwise + reductions per term (L1 / GIoU / focal / dice / MSE),
            # vectorised over the batch: dozens of small kernels, no sync
            terms = 3 if not cfg.model.python_loss else 8
            kinds = cfg.loss_kinds or ("add",)
            for i in range(terms * len(kinds)):
                # autocast runs losses in fp32
                self.small_op(e.main, kinds[i % len(kinds)], 4.0 * cfg.batch * 0.05, dt="fp32")
            if cfg.model.python_loss:
                # target assignment per image (matching, masks): a short loop of small ops
                for _ in range(min(cfg.batch, 6)):
                    self.small_op(e.main, "index", 0.2, dt="fp32")
                    self.small_op(e.main, "mul", 0.1, dt="fp32")
        if self.step_index in cfg.sync_steps and cfg.item_syncs:
            self.excessive_memcpy()
        if self.step_index in cfg.cpu_bound_steps and cfg.python_ops:
            self.python_heavy()

    def excessive_memcpy(self) -> None:
        """Per-sample `.item()` / `.cpu()` / `torch.tensor(..., device="cuda")` in the loop."""
        cfg, e = self.cfg, self.eng
        t0 = e.clock[e.main]
        backlog = e.stream_free(COMPUTE_STREAM)
        first_gpu = None
        for i in range(cfg.item_syncs):
            r = i % 3
            if r == 0:
                self.item_sync(e.main, "aten::item")
            elif r == 1:
                self.item_sync(e.main, "aten::cpu")
            else:
                x = e.next_ext()
                ts, gs, ge = e.memcpy(e.main, "HtoD (Pageable -> Device)", 256 * (1 + i % 7),
                                      cfg.platform.h2d_pageable_gbs, COMPUTE_STREAM, x, blocking=True)
                e.cpu_event(e.main, "aten::copy_", ts - 1.0, e.clock[e.main] - ts + 1.0, x)
                first_gpu = gs if first_gpu is None else first_gpu
            self.simple(e.main, "aten::mul", ops.elementwise("mul", "fp32"), 0.05)
            e.idle(e.main, e.host(25.0))
        # the first sync drains the backlog; from then on every call makes the GPU wait
        e.mark("excessive_memcpy", min(max(t0, backlog), e.clock[e.main]),
               max(e.clock[e.main], e.stream_free(COMPUTE_STREAM)))

    def python_heavy(self) -> None:
        """A Python loop issuing tiny ops: the GPU waits on the interpreter (cpu_bound)."""
        cfg, e = self.cfg, self.eng
        t0 = e.clock[e.main]
        backlog = e.stream_free(COMPUTE_STREAM)
        kinds = cfg.python_kinds or ("add",)
        for i in range(cfg.python_ops):
            self.small_op(e.main, kinds[i % len(kinds)], 0.02 + 0.03 * e.jit(), cpu_mult=1.8, dt="fp32")
            e.idle(e.main, e.host(cfg.python_gap_us))
        self.starvation("cpu_bound", t0, e.clock[e.main], backlog)

    def metrics(self) -> None:
        """Running accuracy / loss meters: argmax, eq, sum, add_ (tiny kernels, no sync)."""
        e = self.eng
        mb = self.cfg.batch * 0.004
        self.simple(e.main, "aten::argmax", ops.elementwise("sum", "fp32"), mb)
        self.simple(e.main, "aten::eq", ops.elementwise("mul", "fp32"), mb * 0.2)
        self.small_op(e.main, "sum", mb * 0.2, dt="fp32")
        self.small_op(e.main, "add_", 0.001, dt="fp32")
