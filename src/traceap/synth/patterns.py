"""The eight anti-patterns as settings of the training script, each acting by its mechanism.

A pattern never paints events: it changes what the simulated user wrote (num_workers=0,
pin_memory=False, `.item()` in a loop, a graph break, Python-heavy code, a tiny DDP bucket,
NCCL on the compute stream, all-reduce after backward) and `simulator.py` plays the
consequences, marking the ground-truth interval where the mechanism makes the GPU wait:

| pattern | knob | where the interval lies |
|---|---|---|
| single_process_dataloading | num_workers=0 | the `_SingleProcessDataLoaderIter.__next__` stall, once the GPU ran dry |
| no_pin_memory | pin_memory=False | pageable `cudaMemcpyAsync` call start to the end of its copies |
| excessive_memcpy | per-sample `.item()`/`.cpu()`/`torch.tensor(..., device)` | the syncing loop |
| graph_break | torch.compile with breaks | the eager stretch between compiled regions (host and GPU) |
| cpu_bound | a Python loop of tiny ops | the loop, once the GPU backlog drained |
| small_nccl_kernels | bucket_cap_mb < 1 | first to last all-reduce of the backward |
| nccl_blocks_compute_stream | NCCL kernels on the compute stream | each all-reduce kernel |
| nccl_compute_no_overlap | all-reduce after backward | backward's last compute kernel to the last all-reduce |
"""

from __future__ import annotations

import numpy as np

from ..dataset import PATTERNS
from .simulator import RunConfig

#: Occurrences per pattern in the paper's test split (Table 2): the mix we sample from.
TABLE2_WEIGHTS = {
    "single_process_dataloading": 221, "no_pin_memory": 193, "excessive_memcpy": 334,
    "graph_break": 74, "cpu_bound": 271, "small_nccl_kernels": 312,
    "nccl_blocks_compute_stream": 65, "nccl_compute_no_overlap": 103,
}
#: Patterns that only exist in data-parallel training.
MULTI_GPU = frozenset({"small_nccl_kernels", "nccl_blocks_compute_stream", "nccl_compute_no_overlap"})

assert set(TABLE2_WEIGHTS) == set(PATTERNS)


def _some_steps(rng: np.random.Generator, steps: int, all_ok: bool = True) -> tuple[int, ...]:
    """A non-empty subset of the steps: most habits show in some iterations, not all."""
    k = int(rng.integers(1, steps + (1 if all_ok or steps == 1 else 0)))
    return tuple(sorted(int(i) for i in rng.choice(steps, size=k, replace=False)))


def apply(pattern: str, cfg: RunConfig, rng: np.random.Generator, strength: float = 1.0) -> None:
    """Change `cfg` the way a user's script would contain `pattern` (strength > 1: worse)."""
    if pattern == "single_process_dataloading":
        cfg.num_workers = 0
        cfg.load_us_per_sample = float(rng.uniform(350, 1800)) * strength
    elif pattern == "no_pin_memory":
        cfg.pin_memory = False
    elif pattern == "excessive_memcpy":
        cfg.item_syncs = int(rng.integers(60, 320) * strength)
        cfg.sync_steps = _some_steps(rng, cfg.steps)
    elif pattern == "graph_break":
        cfg.compiled = True
        cfg.graph_breaks = int(rng.integers(1, 5) * max(1.0, strength))
    elif pattern == "cpu_bound":
        cfg.python_ops = int(rng.integers(250, 1200) * strength)
        cfg.python_gap_us = float(rng.uniform(40, 220))
        cfg.cpu_bound_steps = _some_steps(rng, cfg.steps, all_ok=False)
    elif pattern == "small_nccl_kernels":
        cfg.bucket_mb = float(rng.uniform(0.03, 0.6)) / strength
    elif pattern == "nccl_blocks_compute_stream":
        cfg.nccl_on_compute = True
    elif pattern == "nccl_compute_no_overlap":
        cfg.allreduce_after_backward = True
    else:
        raise KeyError(pattern)


def healthy(cfg: RunConfig, rng: np.random.Generator) -> None:
    """The settings of a careful user (what every pattern departs from), with natural variety."""
    cfg.num_workers = int(rng.choice([4, 8, 12, 16]))
    cfg.pin_memory = True
    cfg.bucket_mb = float(rng.choice([25.0, 25.0, 25.0, 50.0, 100.0]))
    cfg.log_item = bool(rng.random() < 0.6)
    cfg.benign_idle_us = float(rng.uniform(500, 6000)) if rng.random() < 0.15 else 0.0
