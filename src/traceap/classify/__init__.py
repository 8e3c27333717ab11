"""Stage 5: classifiers name the anti-pattern of flagged windows (offline rules, or an LLM).

All share the `Classifier` protocol (base.py) and are built by name from the registry
(`make_classifier`, registry.py)."""

from __future__ import annotations

from .base import BaseClassifier, Classifier, PatternCall
from .registry import classifier_names, make_classifier, register_classifier

__all__ = ["BaseClassifier", "Classifier", "PatternCall", "classifier_names", "make_classifier",
           "register_classifier"]
