"""The injection mechanisms, one module each, named by its pattern id.

Each module plants its pattern into a real trace (`plan(base, rng) -> Plan`) and registers
`plan` as the pattern's `inject` piece (`traceap.patterns._registry`); importing this package
imports every module in it, so a new mechanism is a new module here and nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil

from ...patterns._registry import pieces
from .base import Base, Instance, Plan, Unusable

for _m in pkgutil.iter_modules(__path__):
    if _m.name != "base" and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")


def mechanisms() -> dict:
    """Pattern id -> its `plan(base, rng) -> Plan`, for every pattern that can be planted, in
    pattern order."""
    return pieces("inject")


__all__ = ["Base", "Instance", "Plan", "Unusable", "mechanisms"]
