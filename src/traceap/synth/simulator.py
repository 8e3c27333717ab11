"""The training (or inference) loop of one rank, played on the `Engine`, as the profiler sees it.

One profiler step is: `ProfilerStep#N` > DataLoader `__next__` > input H2D copies > forward
(eager ops, or `Torch-Compiled Region`s) > loss > backward on the autograd thread (DDP buckets
all-reduced on a NCCL stream as their gradients become ready) > optimizer step > zero_grad.
Every anti-pattern is a knob of `RunConfig` that changes the mechanism (see `switches.py`),
and the loop marks where each mechanism makes the GPU wait, which is the ground truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import ops
from .engine import Engine, _Span
from .workloads import ModelSpec
from .ops import Ctx, Kern, Layer, OpCall
from .platforms import Platform

COMPUTE_STREAM = 7
_COMPUTE_OPS = {"conv", "dwconv", "deconv", "linear", "attn"}
#: The light view / dtype bookkeeping ops real traces show inside eager ops.
_BOOKKEEPING = (("aten::empty", "aten::view"), ("aten::view",), ("aten::as_strided", "aten::result_type"),
                ("aten::empty", "aten::resize_", "aten::view"), ("aten::result_type", "aten::empty"),
                ("aten::view", "aten::empty"), ("aten::t", "aten::transpose", "aten::as_strided"))
_FUSE_NAMES = {"bn": "_native_batch_norm_legit_functional", "relu": "relu", "silu": "silu",
               "gelu": "gelu", "sigmoid": "sigmoid", "add": "add", "mul": "mul",
               "ln": "native_layer_norm", "gn": "native_group_norm", "maxpool": "max_pool2d_with_indices",
               "avgpool": "mean", "upsample": "_unsafe_index", "cat": "cat", "softmax": "_softmax",
               "index": "index"}


@dataclass
class RunConfig:
    """Everything that decides one rank's trace: workload, platform, settings, anti-patterns."""

    model: ModelSpec
    platform: Platform
    batch: int
    res: int
    dt: str = "fp32"                 # compute dtype (fp16/bf16 = AMP autocast)
    channels_last: bool = False
    compiled: bool = False
    mode: str = "train"              # train | infer
    world_size: int = 1
    rank: int = 0
    steps: int = 3
    first_step: int = 5
    seed: int = 0
    t0_us: float = 0.0
    # data loading
    num_workers: int = 8             # 0: the main process loads (single-process DataLoader)
    load_us_per_sample: float = 900.0   # decode + augment on one core
    loader: str = "decode"           # decode (images from disk) | cached (tensors in memory)
    loader_behind: bool = False      # workers cannot keep up: no prefetched batch in the queue
    loader_phase: float = 0.5        # where in a batch's production profiling started (0-1)
    loader_hiccup_p: float = 0.0     # chance per step of a slow batch (big image, GC, disk)
    pin_memory: bool = True          # False -> no_pin_memory
    # per-step habits of the training script
    pageable_copies: int = 0         # small tensors made in the loop and copied (labels, boxes)
    gpu_normalize: bool = False      # (x - mean) / std on the GPU after the copy
    log_item: bool = True            # one loss.item() per step (normal)
    log_syncs: int = 0               # further .item()s for logging, after the first (cost nothing)
    timing_sync: bool = False        # torch.cuda.synchronize() before reading the step time
    forward_syncs: int = 0           # data-dependent ops in the eager forward (nonzero, masks)
    item_syncs: int = 0              # excessive_memcpy: .item()/.cpu()/torch.tensor(...) per step
    sync_steps: tuple[int, ...] = ()
    graph_breaks: int = 0            # graph_break: number of breaks in the compiled forward
    compiled_parts: int = 1          # modules compiled separately (backbone, neck, head): frames
    compiled_optimizer: bool = False  # torch.compile(optimizer.step): its own compiled region
    compiled_loss: bool = False      # torch.compile(criterion): the loss as its own frame
    ema: bool = False                # an exponential moving average of the weights each step
    python_ops: int = 0              # cpu_bound: tiny ops in a Python loop per affected step
    python_gap_us: float = 0.0
    python_kinds: tuple[str, ...] = ("add", "mul", "index", "sigmoid", "div", "cat")
    loss_kinds: tuple[str, ...] = ("sub", "mul", "add", "sigmoid", "mean")   # task-loss terms
    cpu_bound_steps: tuple[int, ...] = ()
    # DDP
    bucket_mb: float = 25.0          # tiny -> small_nccl_kernels
    nccl_on_compute: bool = False    # nccl_blocks_compute_stream
    allreduce_after_backward: bool = False   # nccl_compute_no_overlap
    old_nccl_names: bool = False     # shorthand for an NCCL 2.12-2.18 version
    nccl_version: str = ""           # "" -> 2.21.5 (or 2.14.3 with old_nccl_names)
    nccl_ll_max: float = 64 * 1024   # protocol thresholds of NCCL's tuner for this topology
    nccl_ll128_max: float = 8 * 2**20
    broadcast_buffers: bool = False  # DDP broadcasts BatchNorm buffers before each forward
    log_allreduce: bool = False      # dist.all_reduce(loss) for logging, once per step
    gather_features: bool = False    # all_gather of embeddings for a contrastive loss
    # natural variety
    benign_idle_us: float = 0.0
    efficiency: float = 0.7          # how well kernels reach the roofline
    host_factor: float = 1.0         # slower host (cloud vCPU, profiler with record_shapes...)
    optimizer: str | None = None     # None: the model's usual one (AdamW or SGD)
    tf32_matmul: bool = False        # torch.backends.cuda.matmul.allow_tf32
    algo_salt: int = 0               # cuDNN/cuBLAS versions: which kernels they pick
    extra: dict = field(default_factory=dict)

    @property
    def ddp(self) -> bool:
        return self.world_size > 1 and self.mode == "train"


@dataclass
class RunResult:
    """A simulated rank: its events, metadata for the writer, and ground truth."""

    events: list[dict]
    device_properties: list[dict]
    distributed_info: dict | None
    anomalies: list[tuple[float, float, str]]
    span: tuple[float, float]
    n_kernels: int
    pid: int
    main_tid: int
    bw_tid: int
    device: int
    streams: list[int]


@dataclass
class _Reduction:
    """DDP's gradient buckets during one backward: what is filled, sent and left for later."""

    stream: int                     # where the all-reduces run
    first_cap: float                # bytes: DDP's first bucket
    cap: float                      # bytes: every later bucket (bucket_cap_mb)
    filled: float = 0.0
    n_buckets: int = 0
    pending: list[float] = field(default_factory=list)   # all-reduces after backward
    spans: list[tuple[float, float]] = field(default_factory=list)  # NCCL kernels sent

    @property
    def limit(self) -> float:
        """The size at which the current bucket is sent."""
        return self.first_cap if self.n_buckets == 0 else self.cap


class _Run:
    """One rank's loop.  Methods follow the order of a training step."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        p = cfg.platform
        pid = int(self.rng.integers(20000, 4_000_000))
        main_tid = pid
        bw_tid = pid + int(self.rng.integers(7, 9000))
        self.eng = Engine(self.rng, cfg.t0_us, pid, main_tid, bw_tid, cfg.rank, p.sms,
                          p.threads_per_sm, p.cpu_speed * float(self.rng.uniform(0.85, 1.15)),
                          corr0=int(self.rng.integers(1000, 90000)))
        self.nccl_stream = int(self.rng.choice([20, 24, 28, 36, 56]))
        self.eng.comm_stream = self.nccl_stream
        scale = cfg.batch * (cfg.res / cfg.model.base_res) ** 2
        self.ctx = Ctx(cfg.dt, cfg.channels_last, p, scale, train=cfg.mode == "train",
                       tf32_matmul=cfg.tf32_matmul, algo=cfg.algo_salt)
        self.eff = cfg.efficiency
        self.nccl_version = cfg.nccl_version or ("2.14.3" if cfg.old_nccl_names else "2.21.5")
        self.batch_ready: float | None = None      # when the DataLoader's next batch is ready
        self.step_spans: list[tuple[float, float]] = []
        self.frame_ids = 0                         # torch.compile frames seen so far
        self.eng.cpu_scale = cfg.host_factor
        self.layers = cfg.model.layers
        self.param_tensors = sum(1 for layer in self.layers if layer.params_m > 0) * 2
        self.seq = int(self.rng.integers(100, 5000))
        self.step_index = 0
        self._sync_layers: list[int] | None = None   # drawn at the first eager forward

    # -- small building blocks ----------------------------------------------------------------
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

    def starvation(self, pattern: str, cpu_start: float, cpu_end: float, backlog_end: float) -> None:
        """Mark where a host-side stall leaves the GPU without work: after its backlog drains."""
        start = max(cpu_start, backlog_end)
        if cpu_end - start > 20.0:
            self.eng.mark(pattern, start, cpu_end + 8.0)

    # -- the step -----------------------------------------------------------------------------
    def run(self) -> RunResult:
        cfg, e = self.cfg, self.eng
        e.clock[e.main] += 50.0 + 400.0 * float(self.rng.random())
        e.clock[e.bw] = e.clock[e.main]
        for i in range(cfg.steps):
            self.step_index = i
            step = e.begin(e.main, f"ProfilerStep#{cfg.first_step + i}", gpu=False)
            self.dataloader()
            self.h2d()
            if cfg.mode == "train":
                self.train_step()
            else:
                self.infer_step()
            if cfg.benign_idle_us and i == cfg.steps - 1:
                e.idle(e.main, cfg.benign_idle_us * e.jit())     # e.g. a checkpoint or logging
            if cfg.timing_sync:
                # torch.cuda.synchronize(); time.time(): a bare runtime call, no cpu_op around it
                e.idle(e.main, e.host(10.0))
                e.sync(e.main, None, e.next_ext())
            e.end(step)
            self.step_spans.append((step.start, e.clock[e.main]))
        # profiler.stop() synchronises the device before it disables itself: every real trace
        # ends with a cudaDeviceSynchronize on the main thread covering the GPU's tail
        e.idle(e.main, e.host(30.0))
        e.sync(e.main, None, e.next_ext())
        t_end = max(max(e.clock.values()), max(e.free.values(), default=0.0))
        anomalies = [(a.start, min(a.end, t_end), a.pattern) for a in self._significant(e.anomalies)]
        di = None
        if cfg.world_size > 1:
            di = {"backend": "nccl", "rank": cfg.rank, "world_size": cfg.world_size, "pg_count": 1,
                  "pg_config": [{"pg_name": "0", "pg_desc": "default_pg",
                                 "backend_config": "cuda:nccl", "pg_size": cfg.world_size,
                                 "ranks": list(range(cfg.world_size))}],
                  "nccl_version": self.nccl_version}
        n_dev = max(cfg.world_size, 1) if cfg.world_size <= 8 else 8
        props = [cfg.platform.device_properties(d) for d in range(n_dev)]
        return RunResult(e.events, props, di, anomalies, (cfg.t0_us, t_end), e.n_launch,
                         e.pid, e.main, e.bw, e.device, sorted(e.free))

    def _significant(self, found: list) -> list:
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

    # -- forward ------------------------------------------------------------------------------
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

    def enter_compiled_region(self, frame: int) -> _Span:
        """Dynamo's guard check (`TorchDynamo Cache Lookup`), then the frame's
        `Torch-Compiled Region` annotation opens on the main thread."""
        e = self.eng
        t = e.clock[e.main]
        d = e.host(14.0)
        e.cpu_event(e.main, "TorchDynamo Cache Lookup", t, d, e.next_ext())
        e.clock[e.main] = t + d + e.host(8.0)
        return e.begin(e.main, f"Torch-Compiled Region: {frame}/0")

    def leave_compiled_function(self, ann: _Span, cf_start: float, cf_ext: int) -> None:
        """`CompiledFunction` closes over the launches since cf_start, then the region."""
        e = self.eng
        e.clock[e.main] += e.host(10.0)
        e.cpu_event(e.main, "CompiledFunction", cf_start, e.clock[e.main] - cf_start, cf_ext,
                    extra={"Sequence number": self.seq, "Fwd thread id": 0})
        e.end(ann)

    def compiled_region(self, lo: int, hi: int, region: int) -> None:
        """One `Torch-Compiled Region`: a cache lookup, then CompiledFunction's launches."""
        cfg, e = self.cfg, self.eng
        ann = self.enter_compiled_region(region)
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

    # -- loss, syncs, Python-heavy code -------------------------------------------------------
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

    # -- backward and DDP ---------------------------------------------------------------------
    #: per collective: c10d op, annotation, `Collective name`, bus-traffic factor per rank count
    _COLL = {"AllReduce": ("c10d::allreduce_", "nccl:all_reduce", "allreduce", lambda n: 2 * (n - 1) / n),
             "Broadcast": ("c10d::broadcast_", "nccl:broadcast", "broadcast", lambda n: 1.0),
             "AllGather": ("c10d::_allgather_base_", "nccl:_all_gather_base", "_allgather_base",
                           lambda n: (n - 1) / n),
             "ReduceScatter": ("c10d::_reduce_scatter_base_", "nccl:_reduce_scatter_base",
                               "_reduce_scatter_base", lambda n: (n - 1) / n)}

    def allreduce(self, tid: int, nbytes: float, stream: int) -> tuple[float, float]:
        """One bucket: c10d::allreduce_ > record_param_comms > nccl:all_reduce > NCCL kernel."""
        return self.collective(tid, "AllReduce", nbytes, stream)

    def collective(self, tid: int, coll: str, nbytes: float, stream: int,
                   dt: str = "fp32") -> tuple[float, float]:
        """One NCCL collective as c10d issues it: event wait on the NCCL stream, then the kernel."""
        cfg, e = self.cfg, self.eng
        p = cfg.platform
        c10d, ann_name, coll_name, traffic = self._COLL[coll]
        nel = int(nbytes // (4 if dt == "fp32" else 1))
        ranks = str(list(range(cfg.world_size)))
        comms = {"Process Group Name": "0", "Process Group Description": "default_pg",
                 "Process Group Ranks": ranks, "Group size": cfg.world_size,
                 "In msg nelems": nel, "Out msg nelems": nel,
                 "dtype": "Float" if dt == "fp32" else "Byte",
                 "In split size": "[]", "Out split size": "[]", "Collective name": coll_name}
        outer = e.begin(tid, c10d, cat="cpu_op", gpu=False)
        e.clock[tid] += e.host(6.0)
        rpc = e.begin(tid, "record_param_comms", cat="cpu_op", gpu=False,
                      args={**comms, "Global rank start": 0, "Global rank stride": 1})
        # c10d's host path per collective (work object, events, watchdog) is ~100-200 us in
        # real traces (record_param_comms 190 us in the A100 DDP trace): tiny buckets pay it often
        e.clock[tid] += e.host(25.0)
        ann = e.begin(tid, ann_name)
        e.clock[tid] += e.host(40.0)
        if stream != COMPUTE_STREAM:
            e.runtime(tid, "cudaEventRecord", e.rt_cost(2.5), ann.ext)
            e.runtime(tid, "cudaStreamWaitEvent", e.rt_cost(2.0), ann.ext)
        ws = cfg.world_size
        bus = traffic(ws) * nbytes / (p.nccl_bus_gbs * 1e3)
        # ring latency (2(n-1) steps) + waiting for the slowest peer to arrive
        lat = 8.0 + 2 * (ws - 1) * p.nccl_hop_us + float(self.rng.exponential(25.0))
        dur = bus + lat
        proto = ops.nccl_protocol(nbytes, cfg.nccl_ll_max, cfg.nccl_ll128_max)
        name = ops.nccl_kernel(coll, dt if coll != "Broadcast" else "i8", proto, self.nccl_version)
        s, en = e.launch(tid, name, dur, stream, ann.ext, 544, 96, 87568,
                         not_before=e.stream_free(COMPUTE_STREAM), extra_args=comms)
        e.clock[tid] += e.host(35.0)
        e.end(ann)
        e.clock[tid] += e.host(20.0)
        e.end(rpc)
        e.clock[tid] += e.host(4.0)
        e.end(outer)
        return s, en

    def blocking_collective(self, tid: int, coll: str, nbytes: float,
                            dt: str = "fp32") -> tuple[float, float]:
        """A collective whose result the next compute op needs (work.wait() on the stream):
        the compute stream waits for it, the host does not.  Returns its (start, end)."""
        e = self.eng
        s, en = self.collective(tid, coll, nbytes, self.nccl_stream, dt)
        e.runtime(tid, "cudaStreamWaitEvent", e.rt_cost(2.0), e.next_ext())
        e.free[COMPUTE_STREAM] = max(e.stream_free(COMPUTE_STREAM), en)
        return s, en

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

    def ddp_finalize(self) -> None:
        """DDP's finalize: gradients become views of the reduced buckets, and the compute
        stream waits for the communication stream."""
        e = self.eng
        main = e.main
        n_par = sum(1 for x in self.layers if x.params_m > 0)
        for _ in range(min(n_par, 400)):
            x, t = e.next_ext(), e.clock[main]
            e.clock[main] += e.host(2.0)
            for child in ("aten::narrow", "aten::slice", "aten::view"):
                e.cpu_event(main, child, e.clock[main], e.host(1.5), e.next_ext())
                e.clock[main] += e.host(2.0)
            e.cpu_event(main, "torch.distributed.ddp.reducer::copy_bucket_to_grad", t,
                        e.clock[main] - t, x)
            e.clock[main] += e.host(1.0)
        e.runtime(main, "cudaStreamWaitEvent", e.rt_cost(2.0), e.next_ext())
        e.free[COMPUTE_STREAM] = max(e.stream_free(COMPUTE_STREAM), e.stream_free(self.nccl_stream))

    def copy_into_bucket(self, tid: int, nbytes: float) -> None:
        """DDP copies each gradient into its flat bucket (gradient_as_bucket_view=False)."""
        e = self.eng
        x, t = e.next_ext(), e.clock[tid]
        e.clock[tid] += e.host(4.0)
        e.memcpy(tid, "DtoD (Device -> Device)", nbytes, self.cfg.platform.hbm_gbs * 0.4,
                 COMPUTE_STREAM, x, blocking=False)
        e.clock[tid] += e.host(2.0)
        e.cpu_event(tid, "aten::copy_", t, e.clock[tid] - t, x)

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

    def optimizer_step(self) -> None:
        cfg, e = self.cfg, self.eng
        opt = cfg.optimizer or cfg.model.optimizer
        params_mb = self.cfg.model.params_m * 4.0
        s = e.begin(e.main, f"Optimizer.step#{opt}.step")
        chunks = max(1, math.ceil(self.param_tensors / 110))     # multi_tensor_apply chunking
        if cfg.compiled and cfg.compiled_optimizer:
            self.compiled_optimizer_step(params_mb * (14.0 if opt == "AdamW" else 8.0))
        elif opt == "AdamW" and cfg.extra.get("fused_adam", False):
            self.simple(e.main, "aten::_foreach_add_", ops.foreach("add_scalar"), 0.01)  # step count
            self.op(e.main, OpCall(("aten::_fused_adamw_",),
                                   tuple(Kern(ops.foreach("adam"), 1.0 / chunks, True, 512, 64)
                                         for _ in range(chunks)), 0.0, params_mb * 7, 60.0))
        elif opt == "AdamW":
            # torch.optim.AdamW's default foreach path (fused=True is opt-in)
            self.simple(e.main, "aten::_foreach_add_", ops.foreach("add_scalar"), 0.01)
            for name, kind, mult in (("aten::_foreach_mul_", "mul_scalar", 2),
                                     ("aten::_foreach_lerp_", "add_list", 3),
                                     ("aten::_foreach_mul_", "mul_scalar", 2),
                                     ("aten::_foreach_addcmul_", "add_list", 3),
                                     ("aten::_foreach_sqrt", "mul_scalar", 2),
                                     ("aten::_foreach_div_", "mul_scalar", 2),
                                     ("aten::_foreach_add_", "add_scalar", 2),
                                     ("aten::_foreach_addcdiv_", "add_list", 4)):
                self.op(e.main, OpCall((name,), tuple(Kern(ops.foreach(kind), 1.0 / chunks, True, 512, 32)
                                                      for _ in range(chunks)), 0.0, params_mb * mult, 30.0))
        else:
            for name, kind, mult in (("aten::_foreach_add_", "add_list", 3),
                                     ("aten::_foreach_mul_", "mul_scalar", 2),
                                     ("aten::_foreach_add_", "add_list", 3),
                                     ("aten::_foreach_add_", "add_list", 3)):
                self.op(e.main, OpCall((name,), tuple(Kern(ops.foreach(kind), 1.0 / chunks, True, 512, 32)
                                                      for _ in range(chunks)), 0.0, params_mb * mult, 30.0))
        e.end(s)
        z = e.begin(e.main, f"Optimizer.zero_grad#{opt}.zero_grad", gpu=False)
        if cfg.extra.get("zero_grad_fill", False):
            # zero_grad(set_to_none=False), older code: one fill kernel per gradient
            for layer in self.layers:
                if layer.params_m > 0:
                    self.op(e.main, OpCall(("aten::zero_", "aten::fill_"),
                                           (Kern(ops.elementwise("fill", "fp32"), 1.0, True),),
                                           0.0, layer.params_m * 4, 8.0))
        else:
            e.idle(e.main, e.host(20.0 + self.param_tensors * 0.4))    # set_to_none: no kernels
        e.end(z)
        if cfg.ema:
            # ModelEMA.update: ema = d * ema + (1 - d) * params, two foreach ops over the weights
            for name, kind, mult in (("aten::_foreach_mul_", "mul_scalar", 2), ("aten::_foreach_add_", "add_list", 3)):
                self.op(e.main, OpCall((name,), tuple(Kern(ops.foreach(kind), 1.0 / chunks, True, 512, 32)
                                                      for _ in range(chunks)), 0.0, params_mb * mult, 30.0))

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

    def metrics(self) -> None:
        """Running accuracy / loss meters: argmax, eq, sum, add_ (tiny kernels, no sync)."""
        e = self.eng
        mb = self.cfg.batch * 0.004
        self.simple(e.main, "aten::argmax", ops.elementwise("sum", "fp32"), mb)
        self.simple(e.main, "aten::eq", ops.elementwise("mul", "fp32"), mb * 0.2)
        self.small_op(e.main, "sum", mb * 0.2, dt="fp32")
        self.small_op(e.main, "add_", 0.001, dt="fp32")

    def train_step(self) -> None:
        cfg, e = self.cfg, self.eng
        e.idle(e.main, e.host(120.0))         # the loop body's own Python (unpacking, meters)
        self.forward()
        self.loss()
        if cfg.model.task in ("image_classification", "action_recognition"):
            self.metrics()
        self.backward()
        if cfg.dt == "fp16":
            self.grad_scaler_check()
        self.optimizer_step()
        if cfg.dt == "fp16":
            self.op(e.main, OpCall(("aten::_amp_update_scale_",), (Kern(AMP_UPDATE, 1.0, True, 1, 16),),
                                   0.0, 0.0001, 12.0))
        if cfg.ddp and cfg.log_allreduce:
            # dist.all_reduce(loss) so every rank logs the mean loss
            self.blocking_collective(e.main, "AllReduce", 4.0)
        if cfg.log_item:
            self.item_sync(e.main, "aten::item")
            for _ in range(cfg.log_syncs):
                # further meters (accuracy, grad norm, lr): the queue is already empty
                e.idle(e.main, e.host(15.0))
                self.item_sync(e.main, "aten::item")

    def grad_scaler_check(self) -> None:
        """GradScaler.unscale_ and the found-inf check: one foreach kernel and one `.item()`."""
        e = self.eng
        chunks = max(1, math.ceil(self.param_tensors / 110))
        self.op(e.main, OpCall(("aten::_amp_foreach_non_finite_check_and_unscale_",),
                               tuple(Kern(AMP_UNSCALE, 1.0 / chunks, True, 512, 32) for _ in range(chunks)),
                               0.0, self.cfg.model.params_m * 8.0, 40.0))
        self.item_sync(e.main, "aten::item")

    def infer_step(self) -> None:
        cfg, e = self.cfg, self.eng
        repeats = 4 if cfg.model.task == "image_generation" else 1      # sampler timesteps
        for _ in range(repeats):
            self.forward()
        dt = cfg.dt
        self.simple(e.main, "aten::softmax", ops.softmax(True, dt), 0.01 * cfg.batch)
        if cfg.model.task in ("object_detection", "image_segmentation", "pose_estimation"):
            # decode boxes / masks: sigmoid scores, scale offsets, concatenate the levels, select
            for kind in ("sigmoid", "mul", "add", "cat", "index", "mul", "cat"):
                self.small_op(e.main, kind, 0.002 * cfg.batch, dt="fp32")
        if self.step_index in cfg.sync_steps and cfg.item_syncs:
            self.excessive_memcpy()
        if self.step_index in cfg.cpu_bound_steps and cfg.python_ops:
            self.python_heavy()
        self.item_sync(e.main, "aten::cpu")          # predictions back to the host (normal)
        for _ in range(cfg.log_syncs if cfg.log_item else 0):
            e.idle(e.main, e.host(15.0))
            self.item_sync(e.main, "aten::item")     # a score or a count printed per batch


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

#: GradScaler kernels (ATen's AMP kernels).
AMP_UNSCALE = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
               "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::"
               "UnaryOpFunctor<float, 1, 1, 0>, at::native::_amp_foreach_non_finite_check_and_unscale_"
               "cuda_(c10::ArrayRef<at::Tensor>, at::Tensor&, at::Tensor const&)::{lambda()#1}::"
               "operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}>(at::native::"
               "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::"
               "UnaryOpFunctor<float, 1, 1, 0>, at::native::_amp_foreach_non_finite_check_and_unscale_"
               "cuda_(c10::ArrayRef<at::Tensor>, at::Tensor&, at::Tensor const&)::{lambda()#1}::"
               "operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1})")
AMP_UPDATE = "void at::native::amp_update_scale_cuda_kernel(float*, int*, float const*, double, double, int)"


def simulate(cfg: RunConfig) -> RunResult:
    """Play one rank's profiled steps; events in Kineto form plus ground-truth intervals."""
    return _Run(cfg).run()
