"""Stage 4: detectors score windows.  All share the `Detector` protocol (see base.py)."""

from .base import Detector, clip01

__all__ = ["Detector", "clip01"]
