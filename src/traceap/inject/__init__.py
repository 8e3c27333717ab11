"""Real traces as ground truth: anti-patterns planted by their mechanism, and natural labels.

    from traceap.inject import build, InjectConfig, validate, natural_anomalies
    build(["../shared/traces"], "datasets/real", InjectConfig(seed=0, jobs=2))

`edit` (the trace as editable events), `physics` (the delay model), `dialect` (the trace's
own names), `mechanisms/` (one module per anti-pattern), `core` (one output), `validate`
(structural checks), `natural` (labels a trace shows by itself), `dataset` (the writer).
See docs/INJECT.md.
"""

from __future__ import annotations

from .core import Invalid, Output, inject_one
from .dataset import InjectConfig, InjectReport, build
from .edit import Doc
from .mechanisms import Base, Unusable, mechanisms
from .natural import NaturalConfig, natural_anomalies
from .validate import validate

__all__ = ["Base", "Doc", "InjectConfig", "InjectReport", "Invalid", "NaturalConfig", "Output",
           "Unusable", "build", "inject_one", "mechanisms", "natural_anomalies", "validate"]
