"""The classifier registry: every classifier registers itself here, and everything builds it by
name, as detectors do (`traceap.detectors.registry`).

A classifier module ends with `register_classifier(name, Class)`; `make_classifier` builds any
of them.  The built-in ones are known by name before they are imported (`BUILTIN`: "llm" is
imported only when asked for; a missing one is a clear `TraceapError`).  Every classifier is
rebuilt from (name, options) in worker processes (`traceap.parallel`).
"""

from __future__ import annotations

import importlib

from ..errors import TraceapError
from .base import Classifier

#: The built-in classifiers: name -> the module that registers it when imported.
BUILTIN = {
    "offline": "traceap.classify.offline",
    "llm": "traceap.classify.llm",
}

_CLASSIFIERS: dict[str, type] = {}


def register_classifier(name: str, cls: type) -> type:
    """Register a classifier class under `name`; returns it."""
    old = _CLASSIFIERS.get(name)
    if old is not None and old.__qualname__ != cls.__qualname__:
        raise ValueError(f"classifier name {name!r} is registered twice ({old!r}, {cls!r})")
    _CLASSIFIERS[name] = cls
    return cls


def classifier_names() -> tuple[str, ...]:
    """Every classifier name: the built-in ones, then any registered later."""
    return tuple(BUILTIN) + tuple(n for n in _CLASSIFIERS if n not in BUILTIN)


def make_classifier(name: str, **options) -> Classifier:
    """A classifier by name with constructor options, e.g. "offline" (expert rules) or "llm"."""
    from ..parallel import buildable

    if name not in _CLASSIFIERS and name in BUILTIN:
        module = BUILTIN[name]
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                raise TraceapError(f"the {name!r} classifier is not available in this "
                                   f"installation ({module} is missing)") from None
            raise
    if name not in _CLASSIFIERS:
        raise TraceapError(f"unknown classifier {name!r}; choose one of "
                           f"{', '.join(classifier_names())}")
    return buildable(_CLASSIFIERS[name](**options), make_classifier, name, options)


__all__ = ["BUILTIN", "classifier_names", "make_classifier", "register_classifier"]
