"""NCCL measurements both NCCL rules (and the idle account) use.

`blocking_nccl`: NCCL kernels on a stream that carries the model's compute, the signature of
`nccl_blocks_compute_stream` and the collectives `nccl_compute_no_overlap` leaves to it.
`compute_per_step`: the GPU compute per step communication could hide under, the most either
rule can gain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..idle import measure as idle_account
from .signals import cached, compute_streams, nccl_rows


@dataclass(frozen=True)
class BlockConfig:
    """Thresholds: share of a window a compute stream spends in NCCL."""

    time_lo: float = 0.02
    time_hi: float = 0.15
    #: Score of a window holding any such kernel, however short: each one stalls the stream...
    presence: float = 0.55
    #: ... once the trace holds this many (one stray all-gather of metrics is not a habit).
    presence_min: int = 3
    #: A stream is a compute stream when it carries this share of compute-kernel time.
    compute_share: float = 0.1


def blocking_nccl(trace, config: BlockConfig) -> np.ndarray:
    """NCCL kernel rows on a compute stream."""
    def make():
        n = nccl_rows(trace)
        return n[np.isin(trace.stream[n], compute_streams(trace, config.compute_share))]
    return cached(trace, f"blocking_nccl:{config}", make)


def compute_per_step(trace, n_steps: int) -> float:
    """GPU busy (compute) time per steady step, or in total without steps: the most that
    communication could hide under."""
    acc = idle_account(trace)
    return acc.busy_in_steady_us / n_steps if n_steps else acc.busy_us
