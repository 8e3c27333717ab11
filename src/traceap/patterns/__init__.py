"""The anti-patterns, one module each: signature score, evidence in numbers, curated fix.

Each module `traceap/patterns/<id>.py` declares its pattern on its rule class (see
`traceap.patterns.base.AntiPattern`) and registers it (`_registry.register_pattern`); the
registry's accessors (`patterns`, `pattern_ids`, `get_pattern`, ...) are what the rest of
traceap reads.  `REGISTRY[id]` is the live id -> rule table.  A new anti-pattern is a new module
here, named in `BUILTIN` (docs/ARCHITECTURE.md, "Adding an anti-pattern").

This package's top is light on purpose: the low layers (manifest, idle, synth, collect) read
the registry, and the rules import the idle account, so the rules load at the first read,
not when `traceap.patterns` is imported.
"""

from __future__ import annotations

import numpy as np

from . import _registry
from ._registry import (BusyInefficient, IdleCause, NotApplicable, get_pattern, is_pattern,
                        pattern_ids, patterns, register_pattern, register_piece)

#: The built-in pattern modules (module name == pattern id), in report order: the order of the
#: ids in docs/FORMATS.md, of the JSON's per-pattern keys and of the model's pattern head.
BUILTIN = (
    "single_process_dataloading",
    "no_pin_memory",
    "excessive_memcpy",
    "graph_break",
    "cpu_bound",
    "small_nccl_kernels",
    "nccl_blocks_compute_stream",
    "nccl_compute_no_overlap",
    # beyond the paper (issue #34), in the order
    "no_mixed_precision",
    "no_channels_last",
    "unfused_optimizer",
    "allocator_churn",
    "recompilation",
    "grad_accum_allreduce",
    "dataparallel",
    "cpu_tensor_init",
)

#: The paper's eight (TorchTraceAP, Table 1): the first eight of `BUILTIN`, always.  The
#: patterns added beyond the paper follow them; a checkpoint trained on the eight predicts these.
PAPER = BUILTIN[:8]

_FROM_BASE = ("AntiPattern", "Evidence", "runs_of")


def __getattr__(name: str):
    # REGISTRY and the base classes load the rules (which import the idle account) on first use.
    if name == "REGISTRY":
        _registry._load_builtin()
        return _registry._PATTERNS
    if name in _FROM_BASE:
        from . import base
        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pattern_scores(windows) -> dict[str, np.ndarray]:
    """Every pattern's per-window score, by id."""
    return {p.id: p.score_windows(windows) for p in patterns()}


def nearby(scores: np.ndarray, weight: float, reach: int) -> np.ndarray:
    """Per window: its own score, or `weight**k` x the score k windows away (k <= reach) when
    that is higher.  A mechanism's cost spills over window edges (the collective launched just
    before, the relaunch after a stall, the tail of a gap), so evidence next door speaks for a
    window, more weakly; with weight under the flagging threshold it ranks windows, never flags
    them."""
    s = np.asarray(scores, dtype=np.float64)
    out = s.copy()
    n = len(s)
    for k in range(1, min(reach, n - 1) + 1):
        f = weight ** k
        out[:-k] = np.maximum(out[:-k], f * s[k:])
        out[k:] = np.maximum(out[k:], f * s[:-k])
    return out


__all__ = ["AntiPattern", "BUILTIN", "PAPER", "BusyInefficient", "Evidence", "IdleCause", "NotApplicable",
           "REGISTRY", "get_pattern", "is_pattern", "nearby", "pattern_ids", "pattern_scores",
           "patterns", "register_pattern", "register_piece", "runs_of"]
