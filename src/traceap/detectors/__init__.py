"""Stage 4: detectors score windows.  All share the `Detector` protocol (see base.py) and are
built by name from the registry (`make_detector`, registry.py)."""

from .base import DEFAULT_THRESHOLD, BaseDetector, Detector, clip01
from .registry import detector_names, make_detector, register_detector

__all__ = ["BaseDetector", "DEFAULT_THRESHOLD", "Detector", "clip01", "detector_names",
           "make_detector", "register_detector"]
