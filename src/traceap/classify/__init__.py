"""Stage 5: classifiers name the anti-pattern of flagged windows (offline rules, or an LLM)."""

from __future__ import annotations

import importlib

from ..errors import TraceapError
from .base import Classifier, PatternCall

CLASSIFIER_NAMES = ("offline", "llm")


def make_classifier(name: str, **options) -> Classifier:
    """A classifier by name: "offline" (expert rules) or "llm" (imported only when asked for).

    Both are rebuilt from (name, options) in worker processes (`traceap.parallel`)."""
    from ..parallel import buildable

    if name == "offline":
        from .offline import OfflineClassifier
        return buildable(OfflineClassifier(**options), make_classifier, name, options)
    if name == "llm":
        try:
            mod = importlib.import_module("traceap.classify.llm")
        except ModuleNotFoundError as exc:
            if exc.name and "traceap.classify.llm".startswith(exc.name):
                raise TraceapError("the 'llm' classifier is not available in this installation "
                                   "(traceap.classify.llm is missing)") from None
            raise
        return buildable(mod.LLMClassifier(**options), make_classifier, name, options)
    raise TraceapError(f"unknown classifier {name!r}; choose one of {', '.join(CLASSIFIER_NAMES)}")


__all__ = ["CLASSIFIER_NAMES", "Classifier", "PatternCall", "make_classifier"]
