"""The GPU idle account in sentences: the analysis' idle note, its launch-bound note, and the
cause split a finding's evidence quotes.

A layer of its own, below `traceap.patterns` (tests/test_architecture.py, docs/ARCHITECTURE.md):
the rules' evidence (`AntiPattern.evidence`, through `cause_split`) and the analysis' notes are
written into the analysis JSON where they are measured, so the words they quote cannot wait for
the report layer above them.  It reads the account (`traceap.idle`) and nothing above it.
"""

from __future__ import annotations

from ..idle import CAUSE_TITLES, MECHANISM_TITLES, MECHANISMS, IdleAccount
from ..units import fmt_us

#: The framework's dispatch holding this share of the idle time makes the run launch-bound.
LAUNCH_BOUND_RUN = 0.5


def describe(account: IdleAccount, limit: int = 4) -> str:
    """One sentence: how much of the GPU span is idle and the biggest causes."""
    if account.span_us <= 0:
        return "no GPU activity in this trace"
    by = account.by_cause
    named = [(c, v) for c, v in by.items() if c != "not_explained" and v > 0]
    named.sort(key=lambda cv: -cv[1])
    tot = account.total_us
    parts = [f"{CAUSE_TITLES[c]} {fmt_us(v)}" for c, v in named[:limit]]
    text = (f"GPU idle {fmt_us(tot)} of {fmt_us(account.span_us)} "
            f"({account.idle_pct}% of the GPU span)")
    if parts:
        text += ": " + ", ".join(parts)
    if by["not_explained"] > 0:
        text += (f"; not explained {fmt_us(by['not_explained'])} "
                 f"({100 * by['not_explained'] / max(tot, 1e-9):.0f}% of the idle time)")
    return text


def launch_bound_note(account: IdleAccount) -> str | None:
    """A sentence when the run's steady state is launch-bound: the GPU waits for the framework
    to dispatch its kernels (the `launch_bound` mechanism) for most of its idle time.  That is
    the nature of the workload (a small model, a small batch), not an anomaly of some windows,
    so it is said once, here, rather than raised as a finding."""
    if account.total_us <= 0:
        return None
    share = account.by_mechanism["launch_bound"] / account.total_us
    if share < LAUNCH_BOUND_RUN:
        return None
    return (f"launch-bound run: {fmt_us(account.by_mechanism['launch_bound'])} "
            f"({100 * share:.0f}% of the idle time) the GPU waits for the framework to dispatch "
            f"the next kernel{cause_split(account, 'launch_bound')}, all through the run: the "
            f"workload's steady state, not an anomaly "
            f"of some windows; fewer, bigger launches remove it (CUDA graphs with "
            f"torch.compile(model, mode=\"reduce-overhead\"), a larger batch, fused optimizers)")


def cause_split(account: IdleAccount, mechanism: str) -> str:
    """' (of the 24.2 ms host<->device copies and syncs: also large pinned input uploads (no
    anti-pattern) 15.9 ms)': how a mechanism's idle time relates to its cause's total, the number
    the idle summary prints, whenever the two print differently; '' otherwise.  Lets a
    finding's time lost and the summary's cause read as one account."""
    cause = next((m.cause for m in MECHANISMS if m.id == mechanism), "not_explained")
    total = account.by_cause[cause]
    others = [(m.id, account.by_mechanism[m.id]) for m in MECHANISMS
              if m.cause == cause and m.id != mechanism and account.by_mechanism[m.id] > 0]
    if cause == "not_explained" and mechanism != "not_explained":
        others.append(("not_explained", account.by_mechanism["not_explained"]))
    if total <= 0 or fmt_us(total) == fmt_us(account.by_mechanism[mechanism]):
        return ""
    parts = ", ".join(f"{MECHANISM_TITLES[k]} {fmt_us(v)}" for k, v in
                      sorted(others, key=lambda kv: -kv[1]))
    return f" (of the {fmt_us(total)} {CAUSE_TITLES[cause]}: also {parts})"


__all__ = ["LAUNCH_BOUND_RUN", "cause_split", "describe", "launch_bound_note"]
