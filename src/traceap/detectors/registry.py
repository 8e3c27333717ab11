"""The detector registry: every detector registers itself here, and everything builds it by name.

A detector module (`traceap/detectors/<module>.py`) ends with `register_detector(name, Class)`,
as a pattern module ends with `register_pattern` (`traceap.patterns._registry`); `make_detector`
builds any of them, so the CLI, evaluation and notebooks build them the same way.  The built-in
ones are known by name before they are imported (`BUILTIN`: "model" and "llm" need a checkpoint
or a server and are imported only when asked for; a missing one is a clear `TraceapError`).
"""

from __future__ import annotations

import importlib

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

_DETECTORS: dict[str, tuple[type, bool]] = {}   # name -> (class, built from its options)


def register_detector(name: str, cls: type, *, built_from_options: bool = False) -> type:
    """Register a detector class under `name`; returns it.  `built_from_options`: its whole
    state comes from its constructor's options (nothing learnt by `fit`), so it crosses to
    worker processes as (name, options) and is rebuilt there (`traceap.parallel`)."""
    old = _DETECTORS.get(name)
    if old is not None and old[0].__qualname__ != cls.__qualname__:
        raise ValueError(f"detector name {name!r} is registered twice ({old[0]!r}, {cls!r})")
    _DETECTORS[name] = (cls, built_from_options)
    return cls


def detector_names() -> tuple[str, ...]:
    """Every detector name: the built-in ones, then any registered later."""
    return tuple(BUILTIN) + tuple(n for n in _DETECTORS if n not in BUILTIN)


def _registered(name: str) -> tuple[type, bool]:
    if name not in _DETECTORS and name in BUILTIN:
        module = BUILTIN[name]
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                raise TraceapError(f"the {name!r} detector is not available in this "
                                   f"installation ({module} is missing)") from None
            raise
    if name not in _DETECTORS:
        raise TraceapError(f"unknown detector {name!r}; choose one of "
                           f"{', '.join(detector_names())}")
    return _DETECTORS[name]


def make_detector(name: str, **options) -> Detector:
    """A detector by name with constructor options (e.g. `make_detector("model", path=...)`)."""
    cls, from_options = _registered(name)
    try:
        det = cls(**options)
    except TypeError as exc:
        raise TraceapError(f"detector {name!r}: bad option ({exc})") from None
    if from_options:
        from ..parallel import buildable
        buildable(det, make_detector, name, options)
    return det


__all__ = ["BUILTIN", "detector_names", "make_detector", "register_detector"]
