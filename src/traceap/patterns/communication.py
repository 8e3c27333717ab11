"""What both NCCL rules can gain: the GPU compute per step communication could hide under.

It reads the idle account (`traceap.idle`), so it lives above it, beside the rules; the NCCL
rows both rules and the idle account measure (`blocking_nccl`, `small_nccl`) are in
`traceap.measures.communication`.
"""

from __future__ import annotations

from ..idle import measure as idle_account


def compute_per_step(trace, n_steps: int) -> float:
    """GPU busy (compute) time per steady step, or in total without steps: the most that
    communication could hide under."""
    acc = idle_account(trace)
    return acc.busy_in_steady_us / n_steps if n_steps else acc.busy_us
