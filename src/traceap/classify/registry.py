"""The classifier registry: every classifier registers itself here, and everything builds it by
name, as detectors do (`traceap.detectors.registry`; both are a `traceap._registry.Registry`).

A classifier module ends with `register_classifier(name, Class)`; `make_classifier` builds any
of them.  The built-in ones are known by name before they are imported (`BUILTIN`: "llm" is
imported only when asked for; a missing one is a clear `TraceapError`).  Every classifier is
rebuilt from (name, options) in worker processes (`traceap.parallel`).
"""

from __future__ import annotations

from .._registry import Registry
from .base import Classifier

#: The built-in classifiers: name -> the module that registers it when imported.
BUILTIN = {
    "offline": "traceap.classify.offline",
    "llm": "traceap.classify.llm",
}

_CLASSIFIERS = Registry("classifier", BUILTIN)


def register_classifier(name: str, cls: type) -> type:
    """Register a classifier class under `name`; returns it."""
    # a classifier learns nothing after its constructor: a worker rebuilds it from its options
    return _CLASSIFIERS.register(name, cls, built_from_options=True)


def classifier_names() -> tuple[str, ...]:
    """Every classifier name: the built-in ones, then any registered later."""
    return _CLASSIFIERS.names()


def make_classifier(name: str, **options) -> Classifier:
    """A classifier by name with constructor options, e.g. "offline" (expert rules) or "llm"."""
    from ..parallel import buildable

    cls = _CLASSIFIERS.entry(name).cls
    return buildable(cls(**options), make_classifier, name, options)


__all__ = ["BUILTIN", "classifier_names", "make_classifier", "register_classifier"]
