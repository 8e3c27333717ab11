"""The eight anti-patterns as settings of the training script, each acting by its mechanism.

A pattern never paints events: it changes what the simulated user wrote (a slow loader,
pin_memory=False, `.item()` in a loop, a graph break, Python-heavy code, a tiny DDP bucket,
NCCL on the compute stream, all-reduce after backward) and `simulator.py` (the step's phases
in `phases/`) plays the consequences, marking the ground-truth interval where the mechanism
makes the GPU wait:

| pattern | knob | where the interval lies | the same names in healthy runs |
|---|---|---|---|
| single_process_dataloading | loading slower than the step: num_workers=0 with decoding, or too few workers for the augmentation | the `__next__` wait (either loader kind), once the GPU ran dry, when it is at least 5% of a step and 0.5 ms | cached datasets loaded in the main process; multi-worker queue gets, an occasional slow batch |
| no_pin_memory | pin_memory=False | the input batch's pageable copies, from the `aten::to` to the end of the copy | labels / boxes copied from pageable memory (64 B - 256 KB, a few per step) |
| excessive_memcpy | per-sample `.item()`/`.cpu()`/`torch.tensor(..., device)` | the syncing loop | logging `.item()`s, GradScaler's found-inf check, `.cpu()` of predictions, 1-3 `aten::nonzero` per eager forward (masks, `torch.where(cond)`) |
| graph_break | torch.compile with breaks | the eager stretch between compiled regions (host and GPU) | modules compiled one by one, a compiled loss, a compiled optimizer step (more frames, no eager gap) |
| cpu_bound | a Python loop of tiny ops | the loop, once the GPU backlog drained | the same small ops in loss terms, metrics, box decoding, input normalisation |
| small_nccl_kernels | bucket_cap_mb < 1 | first to last all-reduce of the backward | buffer broadcasts, a logging all-reduce, gathered embeddings: small LL collectives |
| nccl_blocks_compute_stream | NCCL kernels on the compute stream | each all-reduce kernel | - |
| nccl_compute_no_overlap | all-reduce after backward | backward's last compute kernel to the last all-reduce | - |
| no_channels_last | channels_last=False (NCHW model and inputs) | each layout transpose cuDNN adds around a convolution (busy time, not a wait) | - (healthy runs draw NCHW too: `dataset.py`'s mix, 70%) |
| unfused_optimizer | `foreach=False`: per-parameter SGD / AdamW ops | the single-tensor step, once the backward's queue drained | `zero_grad(set_to_none=False)` of a foreach optimizer: one `_foreach_zero_` (`extra["zero_grad_fill"]`; with `foreach=False` it is one fill per gradient, part of the pattern) |
| allocator_churn | `torch.cuda.empty_cache()` after every step but the first, then re-allocation | the cudaFree / cudaMalloc round, once the GPU ran dry | - |
| cpu_tensor_init | `torch.zeros(...).cuda()` 1-3 times before the forward | the factory ops and their pageable uploads | labels copied from pageable memory (no factory op) |
| recompilation | torch.compile whose first frame compiles again in a later step (20-300 ms) | the compile span, once the GPU backlog drained | the first step's compile is not in the trace (profiling starts after warm-up) |

Beyond the paper's eight (not in `TABLE2_WEIGHTS`, so the synthetic dataset's plan is unchanged
until the model learns them): `no_channels_last`, `unfused_optimizer`, `allocator_churn`, `cpu_tensor_init` and
`recompilation` as above.  `no_mixed_precision` has no switch:
the simulator runs FP32 GEMMs at its platforms' `tflops_fp32` (a TF32-effective rate), so an
FP32 run would show SIMT kernel names without their slowness.

NCCL kernels are named by the dialect of the job's library version (2.10, 2.14-2.18, 2.19+),
whatever the pattern.
"""

from __future__ import annotations

import numpy as np

from ..measures.layout import TRANSPOSE
from .simulator import RunConfig

#: Occurrences per pattern in the paper's test split (Table 2): the mix we sample from.
TABLE2_WEIGHTS = {
    "single_process_dataloading": 221, "no_pin_memory": 193, "excessive_memcpy": 334,
    "graph_break": 74, "cpu_bound": 271, "small_nccl_kernels": 312,
    "nccl_blocks_compute_stream": 65, "nccl_compute_no_overlap": 103,
}
#: The patterns `apply` can switch on: Table 2's eight and those beyond the paper the simulator
#: expresses (grad_accum_allreduce and dataparallel are planted into real traces only).
EXPRESSED = (*TABLE2_WEIGHTS, "recompilation")
#: Patterns that only exist in data-parallel training.
MULTI_GPU = frozenset({"small_nccl_kernels", "nccl_blocks_compute_stream", "nccl_compute_no_overlap"})


def _some_steps(rng: np.random.Generator, steps: int, all_ok: bool = True) -> tuple[int, ...]:
    """A non-empty subset of the steps: most habits show in some iterations, not all."""
    k = int(rng.integers(1, steps + (1 if all_ok or steps == 1 else 0)))
    return tuple(sorted(int(i) for i in rng.choice(steps, size=k, replace=False)))


#: Small ops a Python loop issues (keys of `phases.host_ops.HostOps.SMALL_OPS`): a cpu_bound
#: loop uses a few of them, and healthy scripts use the same ops in loss terms, metrics and box decoding.
LOOP_OPS = ("add", "sub", "mul", "div", "sigmoid", "index", "cat", "sum", "mean", "add_")


def apply(pattern: str, cfg: RunConfig, rng: np.random.Generator, strength: float = 1.0) -> None:
    """Change `cfg` the way a user's script would contain `pattern` (strength > 1: worse)."""
    if pattern == "single_process_dataloading":
        # data loading starves the GPU: the loader cannot produce batches as fast as the step
        # consumes them, in the main process (num_workers=0) or with too few workers for a
        # heavy augmentation pipeline
        if rng.random() < 0.6:
            cfg.num_workers = 0
            cfg.loader = "decode"
            cfg.load_us_per_sample = float(rng.uniform(350, 1800)) * strength
        else:
            cfg.num_workers = int(rng.choice([1, 2, 2, 4]))
            cfg.loader = "decode"
            cfg.loader_behind = True
            cfg.loader_phase = float(rng.uniform(0.3, 1.0))
            cfg.load_us_per_sample = float(rng.uniform(1500, 6000)) * strength
    elif pattern == "no_pin_memory":
        cfg.pin_memory = False
    elif pattern == "excessive_memcpy":
        cfg.item_syncs = int(rng.integers(60, 320) * strength)
        cfg.sync_steps = _some_steps(rng, cfg.steps)
    elif pattern == "graph_break":
        cfg.compiled = True
        cfg.graph_breaks = int(rng.integers(1, 4) * max(1.0, strength))
    elif pattern == "cpu_bound":
        cfg.python_ops = int(rng.integers(250, 1200) * strength)
        cfg.python_gap_us = float(rng.uniform(40, 220))
        cfg.python_kinds = tuple(str(k) for k in rng.choice(LOOP_OPS, size=int(rng.integers(2, 7)),
                                                            replace=False))
        cfg.cpu_bound_steps = _some_steps(rng, cfg.steps, all_ok=False)
    elif pattern == "small_nccl_kernels":
        cfg.bucket_mb = float(rng.uniform(0.03, 0.6)) / strength
    elif pattern == "nccl_blocks_compute_stream":
        cfg.nccl_on_compute = True
    elif pattern == "nccl_compute_no_overlap":
        cfg.allreduce_after_backward = True
    elif pattern == "no_channels_last":
        # the model and its inputs left in NCHW: cuDNN wraps each convolution in layout
        # transposes (`ops.cudnn_transpose`), which are the ground truth
        cfg.channels_last = False
        cfg.busy_marks = (*cfg.busy_marks, (pattern, TRANSPOSE))
    elif pattern == "unfused_optimizer":
        cfg.extra["foreach"] = False
    elif pattern == "allocator_churn":
        cfg.extra["empty_cache"] = max(1, int(rng.integers(2, 7) * strength))
    elif pattern == "cpu_tensor_init":
        cfg.extra["host_tensors"] = max(1, int(rng.integers(1, 4) * strength))
    elif pattern == "recompilation":
        # a later step's batch has a new shape (the last, ragged batch; multi-scale training)
        cfg.compiled = True
        cfg.recompile_steps = (int(rng.integers(1, max(2, cfg.steps))),)
        cfg.recompile_us = float(rng.uniform(20_000, 300_000)) * strength
    else:
        raise KeyError(pattern)


def healthy(cfg: RunConfig, rng: np.random.Generator) -> None:
    """The settings of a careful user (what every pattern departs from), with natural variety.

    Careful is not spotless: the names every pattern's mechanism uses also occur here, at a
    cost that does not make the GPU wait (see the module table for what does).
    """
    cfg.num_workers = int(rng.choice([4, 8, 12, 16]))
    cfg.loader = "decode"
    cfg.load_us_per_sample = float(rng.uniform(300, 1500))
    # an occasional slow batch (a large image, a GC pause, the file system)
    cfg.loader_hiccup_p = float(rng.choice([0.0, 0.0, 0.0, 0.1, 0.2]))
    if rng.random() < 0.15:
        # a small dataset cached as tensors (CIFAR-style, pre-decoded features): loading in
        # the main process is indexing plus collate, fast enough for num_workers=0
        cfg.num_workers = 0
        cfg.loader = "cached"
        cfg.load_us_per_sample = float(rng.uniform(2.0, 12.0))
    cfg.pin_memory = True
    # labels / boxes built in the loop and copied from pageable memory (a few per step)
    cfg.pageable_copies = int(rng.choice([0, 0, 1, 2, 4, 8]))
    cfg.gpu_normalize = bool(rng.random() < 0.3)
    cfg.bucket_mb = float(rng.choice([25.0, 25.0, 25.0, 50.0, 100.0]))
    cfg.log_item = bool(rng.random() < 0.7)
    cfg.log_syncs = int(rng.choice([0, 0, 1, 2, 3]))
    # per-step timing with torch.cuda.synchronize() (benchmarking scripts, throughput meters)
    cfg.timing_sync = bool(rng.random() < 0.3)
    cfg.compiled_optimizer = bool(rng.random() < 0.35)
    # backbone / neck / head compiled one by one: several frames, no break between them
    cfg.compiled_parts = int(rng.choice([1, 1, 1, 2, 2, 3]))
    cfg.compiled_loss = bool(rng.random() < 0.3)
    # the task loss's terms (L1, GIoU, focal, dice, ...): small fp32 ops of the same vocabulary
    cfg.loss_kinds = tuple(str(k) for k in rng.choice(LOOP_OPS, size=int(rng.integers(4, 8)),
                                                      replace=False))
    cfg.ema = bool(rng.random() < (0.5 if cfg.model.task in ("object_detection", "pose_estimation")
                                   else 0.1))
    cfg.broadcast_buffers = any(x.op == "bn" for x in cfg.model.layers) and rng.random() < 0.8
    cfg.log_allreduce = bool(rng.random() < 0.5)
    cfg.gather_features = bool(rng.random() < 0.15)
    cfg.benign_idle_us = float(rng.uniform(500, 6000)) if rng.random() < 0.15 else 0.0
    # data-dependent ops in the forward (masks, `torch.where(cond)`, point or box selection):
    # each syncs once, the GPU waits only for the relaunch (real: a particle transformer's
    # one-off 338 us in a 55 ms forward)
    cfg.forward_syncs = int(rng.choice([1, 1, 2, 3])) if rng.random() < 0.35 else 0
