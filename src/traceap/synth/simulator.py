"""The training (or inference) loop of one rank, played on the `Engine`, as the profiler sees it.

One profiler step is: `ProfilerStep#N` > DataLoader `__next__` > input H2D copies > forward
(eager ops, or `Torch-Compiled Region`s) > loss > backward on the autograd thread (DDP buckets
all-reduced on a NCCL stream as their gradients become ready) > optimizer step > zero_grad.
Every anti-pattern is a knob of `RunConfig` that changes the mechanism (see `switches.py`),
and the loop marks where each mechanism makes the GPU wait, which is the ground truth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import ops
from .engine import Engine
from .ops import Ctx, Kern, OpCall
from .phases._state import COMPUTE_STREAM
from .phases.backward import Backward
from .phases.communication import Communication
from .phases.compiled import CompiledRegions
from .phases.data_loading import DataLoading
from .phases.forward import Forward
from .phases.host_ops import HostOps
from .phases.loss import LossAndSyncs
from .phases.optimizer import AMP_UPDATE, Optimizer
from .platforms import Platform
from .workloads import ModelSpec

__all__ = ["COMPUTE_STREAM", "RunConfig", "RunResult", "simulate"]


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
    recompile_steps: tuple[int, ...] = ()  # recompilation: steps whose forward compiles again
    recompile_us: float = 0.0        # ... for this long on the host (Dynamo + Inductor)
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
    #: Busy-but-slow patterns switched on (`switches.apply`): (pattern, kernel-name regex); the
    #: kernels whose names match are the pattern's ground truth (slow GPU work, not a wait).
    busy_marks: tuple = ()
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


class _Run(HostOps, DataLoading, Forward, CompiledRegions, LossAndSyncs, Backward, Communication,
           Optimizer):
    """One rank's loop: the state and the order of a step's phases.

    Each phase is a mixin in `synth/phases/` (bases listed in the order of a step after the
    building blocks); `run` plays the steps, `train_step` / `infer_step` call the phases.
    """

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
        self._mark_busy()
        anomalies = [(a.start, min(a.end, t_end), a.pattern) for a in self.significant_waits(e.anomalies)]
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

    def _mark_busy(self) -> None:
        """Mark the kernels of the busy-but-slow patterns switched on (`RunConfig.busy_marks`):
        their time is the pattern's ground truth, from the second profiler step on when there
        are two or more (the first is warm-up: `traceap.measures.signals.steady_from`, where the
        rules and natural labels start too)."""
        import re
        first = self.step_spans[1][0] if len(self.step_spans) >= 2 else -np.inf
        for pattern, names in self.cfg.busy_marks:
            rx = re.compile(names)
            for ev in self.eng.events:
                if ev.get("cat") == "kernel" and ev["ts"] >= first and rx.search(ev["name"]):
                    self.eng.mark(pattern, ev["ts"], ev["ts"] + ev["dur"])

    def train_step(self) -> None:
        cfg, e = self.cfg, self.eng
        e.idle(e.main, e.host(120.0))         # the loop body's own Python (unpacking, meters)
        if cfg.extra.get("host_tensors", 0):  # cpu_tensor_init: masks / noise made on the host
            self.host_tensors(int(cfg.extra["host_tensors"]))
        self.forward()
        self.loss()
        if cfg.model.task in ("image_classification", "action_recognition"):
            self.metrics()
        self.backward()
        if cfg.dt == "fp16":
            self.grad_scaler_check()
        self.optimizer_step()
        if cfg.extra.get("empty_cache", 0) and self.step_index >= 1:
            # allocator_churn: torch.cuda.empty_cache() in the loop (the first step is growth)
            self.allocator_round(int(cfg.extra["empty_cache"]))
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


def simulate(cfg: RunConfig) -> RunResult:
    """Play one rank's profiled steps; events in Kineto form plus ground-truth intervals."""
    return _Run(cfg).run()
