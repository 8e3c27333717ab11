"""Phase 1 of a step: the DataLoader's `__next__` (single-process loading or a queue get) and
the input batch's host-to-device copies (pinned or pageable)."""

from __future__ import annotations

import numpy as np

from ._state import COMPUTE_STREAM, RunState


class DataLoading(RunState):
    """`enumerate(DataLoader)` and the input copies: where loading and pageable copies make the GPU wait."""

    def dataloader(self) -> None:
        """`enumerate(DataLoader)#..._Iter.__next__`: loading in the main process or a queue get.

        Multi-worker: W workers each build a whole batch (batch x per-sample cost on one core),
        so a batch is ready every batch_us / W; while they keep up, the prefetch queue is full
        and `__next__` is a queue get.  When they cannot (`loader_behind`: too few workers for
        the augmentation), `__next__` waits for the batch in production.  Single-process: the
        main thread decodes (or, for a cached dataset, indexes) every sample, then collates.
        Either way the wait is "data loading starves the GPU" once the GPU's backlog drained.
        """
        cfg, e = self.cfg, self.eng
        backlog = e.stream_free(COMPUTE_STREAM)
        frames = cfg.model.video_frames
        if cfg.loader == "cached":
            per = cfg.load_us_per_sample * frames
        else:
            per = cfg.load_us_per_sample * (cfg.res / 224.0) ** 2 * frames
        if cfg.num_workers == 0:
            s = e.begin(e.main, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", gpu=False)
            shown = min(cfg.batch, 24)
            sample_ops = (("aten::select",) if cfg.loader == "cached"
                          else ("aten::to", "aten::div", "aten::sub"))
            for _ in range(shown):
                e.idle(e.main, e.host(per * cfg.batch / shown * 0.8))
                for name in sample_ops:
                    t = e.clock[e.main]
                    d = e.host(max(per * 0.05, 1.5))
                    e.cpu_event(e.main, name, t, d, e.next_ext())
                    e.clock[e.main] = t + d
            t = e.clock[e.main]
            d = e.host(30.0 + 2.0 * cfg.batch)
            e.cpu_event(e.main, "aten::stack", t, d, e.next_ext())
            e.clock[e.main] = t + d
            e.end(s)
            self.starvation("single_process_dataloading", s.start, e.clock[e.main], backlog)
            return
        s = e.begin(e.main, "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", gpu=False)
        t = e.clock[e.main]
        interval = per * cfg.batch / cfg.num_workers * e.jit() ** 0.5
        if self.batch_ready is None:
            self.batch_ready = t + cfg.loader_phase * interval if cfg.loader_behind else t
        wait = max(0.0, self.batch_ready - t) if cfg.loader_behind else 0.0
        if cfg.loader_hiccup_p and self.rng.random() < cfg.loader_hiccup_p:
            wait += float(self.rng.uniform(100.0, 1500.0))      # one slow batch (big image, GC)
        # the queue get itself: unpickling the batch's handles, pin-memory thread hand-off
        e.idle(e.main, e.host(60.0 + 25.0 * float(self.rng.random() < 0.3) * e.jit() * 10) + wait)
        e.end(s)
        if cfg.loader_behind:
            self.batch_ready += interval       # busy workers: one batch per interval
        self.starvation("single_process_dataloading", s.start, e.clock[e.main], backlog)

    def significant_waits(self, found: list) -> list:
        """Drop data-loading waits too short to matter.

        Any loader makes the GPU wait a little at a step boundary when the previous step ended
        in a sync (a queue get from workers: 60-300 us; a cached single-process loader: well
        under a millisecond).  A wait counts as "data loading starves the GPU" when it is at
        least 5% of the median step and 0.5 ms: a window at the paper's N=100 over a 2-3 step
        trace is 2-3% of a step, so a labelled wait fills at least one window, and the host
        jitter of healthy runs alone moves a step by a few percent.
        """
        if not self.step_spans:
            return found
        step_us = float(np.median([b - a for a, b in self.step_spans]))
        floor = max(500.0, 0.05 * step_us)
        return [a for a in found
                if a.pattern != "single_process_dataloading" or a.end - a.start >= floor]

    def h2d(self) -> None:
        """Input batch (and targets) to the GPU: pinned + non_blocking, or pageable and blocking.

        Healthy scripts also copy a few small tensors they build in the loop from pageable
        memory (`torch.as_tensor(labels).cuda()`, per-image boxes): blocking but tiny, they are
        not the `pin_memory=False` mechanism and carry no label.
        """
        cfg, e = self.cfg, self.eng
        p = cfg.platform
        nbytes = cfg.batch * 3 * cfg.res * cfg.res * 4 * cfg.model.video_frames
        n_targets = 1 if cfg.model.task == "image_classification" else min(cfg.batch, 8) + 1
        copies = [nbytes] + [max(64.0, cfg.batch * 8.0 * float(self.rng.integers(1, 200)))
                             for _ in range(n_targets)]
        t_first = None
        last_end = 0.0
        for nb in copies:
            ts, gs, ge = self.to_device(nb, pinned=cfg.pin_memory)
            t_first = ts if t_first is None else t_first
            last_end = max(last_end, ge)
        if not cfg.pin_memory:
            e.mark("no_pin_memory", t_first, last_end)
        for _ in range(cfg.pageable_copies):
            # 64 B (a label) to 256 KB (a few boxes or a small mask), log-uniform
            self.to_device(float(np.exp(self.rng.uniform(np.log(64.0), np.log(256e3)))), pinned=False)
        if cfg.gpu_normalize:
            mb = nbytes / 1e6
            self.small_op(e.main, "sub", mb * 3, dt="fp32")
            self.small_op(e.main, "div", mb * 3, dt="fp32")

    def to_device(self, nbytes: float, pinned: bool) -> tuple[float, float, float]:
        """`tensor.to("cuda", non_blocking=True)`: a pinned copy is async, a pageable one blocks.

        Returns (start of the `aten::to`, GPU start, GPU end) of the copy."""
        cfg, e = self.cfg, self.eng
        p = cfg.platform
        ext = e.next_ext()
        t0 = e.clock[e.main]
        e.clock[e.main] += e.host(8.0)
        e.cpu_event(e.main, "aten::empty_strided", e.clock[e.main], e.host(2.0), e.next_ext())
        e.clock[e.main] += e.host(3.0)
        e.runtime(e.main, "cudaStreamIsCapturing", e.rt_cost(0.8), ext)
        if pinned:
            ts, gs, ge = e.memcpy(e.main, "HtoD (Pinned -> Device)", nbytes, p.h2d_pinned_gbs,
                                  COMPUTE_STREAM, ext, blocking=False)
        else:
            ts, gs, ge = e.memcpy(e.main, "HtoD (Pageable -> Device)", nbytes, p.h2d_pageable_gbs,
                                  COMPUTE_STREAM, ext, blocking=True)
        e.clock[e.main] += e.host(2.0)
        t1 = e.clock[e.main]
        e.cpu_event(e.main, "aten::copy_", ts - 1.0, t1 - ts + 1.0, ext)
        e.cpu_event(e.main, "aten::_to_copy", t0 + 2.0, t1 - t0 - 1.0, e.next_ext())
        e.cpu_event(e.main, "aten::to", t0, t1 - t0 + 1.5, e.next_ext())
        e.clock[e.main] = t1 + 2.0
        return t0, gs, ge

    def host_tensors(self, n: int) -> None:
        """`torch.zeros(shape).cuda()` and kin, `n` times: a factory op fills the tensor on the
        host (no kernel), then a blocking pageable upload (cpu_tensor_init's interval)."""
        e = self.eng
        t0, backlog = e.clock[e.main], e.stream_free(COMPUTE_STREAM)
        for _ in range(n):
            nbytes = float(np.exp(self.rng.uniform(np.log(1e5), np.log(8e6))))
            e.idle(e.main, e.host(6.0))
            ts = e.clock[e.main]
            fill = e.host(5.0 + nbytes / 4e3)                # a host memset at ~4 GB/s
            e.cpu_event(e.main, "aten::zeros", ts, fill, e.next_ext())
            e.cpu_event(e.main, "aten::zero_", ts + 1.0, fill - 2.0, e.next_ext())
            e.clock[e.main] = ts + fill
            e.idle(e.main, e.host(4.0))
            self.to_device(nbytes, pinned=False)
        self.starvation("cpu_tensor_init", t0, e.clock[e.main], backlog)
