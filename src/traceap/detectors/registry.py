"""The detector registry: every detector registers itself here, and everything builds it by name.

A detector module (`traceap/detectors/<module>.py`) ends with `register_detector(name, Class)`,
as a pattern module ends with `register_pattern` (`traceap.patterns._registry`); `make_detector`
builds any of them, so the CLI, evaluation and notebooks build them the same way.  The built-in
ones are known by name before they are imported (`BUILTIN`: "model" and "llm" need a checkpoint
or a server and are imported only when asked for; a missing one is a clear `TraceapError`).
The table is a `traceap._registry.Registry`, the shape the classifiers' registry shares.
"""

from __future__ import annotations

from .._registry import Registry
from ..errors import TraceapError
from .base import Detector

#: The built-in detectors: name -> the module that registers it when imported (in the order
#: the CLI lists them).
BUILTIN = {
    "hybrid": "traceap.detectors.hybrid",
    "expert": "traceap.detectors.expert",
    "rule": "traceap.detectors.rule",
    "clustering": "traceap.detectors.clustering",
    "model": "traceap.detectors.learned",
    "llm": "traceap.detectors.llm",
}

_DETECTORS = Registry("detector", BUILTIN)


def register_detector(name: str, cls: type, *, built_from_options: bool = False) -> type:
    """Register a detector class under `name`; returns it.  `built_from_options`: its whole
    state comes from its constructor's options (nothing learnt by `fit`), so it crosses to
    worker processes as (name, options) and is rebuilt there (`traceap.parallel`)."""
    return _DETECTORS.register(name, cls, built_from_options=built_from_options)


def detector_names() -> tuple[str, ...]:
    """Every detector name: the built-in ones, then any registered later."""
    return _DETECTORS.names()


def make_detector(name: str, **options) -> Detector:
    """A detector by name with constructor options (e.g. `make_detector("model", path=...)`)."""
    entry = _DETECTORS.entry(name)
    try:
        det = entry.cls(**options)
    except TypeError as exc:
        raise TraceapError(f"detector {name!r}: bad option ({exc})") from None
    if entry.built_from_options:
        from ..parallel import buildable
        buildable(det, make_detector, name, options)
    return det


__all__ = ["BUILTIN", "detector_names", "make_detector", "register_detector"]
