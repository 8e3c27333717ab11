"""The one door to torch, for the commands that need it (`train`, `collect`, the torch engine).

`import traceap`, `info`, `diff` and `analyze` (the bundled model runs in numpy,
`traceap/model/inference.py`) never import torch: importing it costs about two seconds, and a
user's own torch (any release from TORCH_MIN on, a nightly, a vendor build) is theirs to pick.
Only training and recording need it; they come through here, so a missing or too old torch is
one clear line instead of a traceback.
"""

from __future__ import annotations

import re
from types import ModuleType

from .errors import TorchMissingError

#: The oldest torch release traceap is tested with (pyproject.toml's `torch>=` says the same;
#: tests/test_torch_free.py checks that they agree).
TORCH_MIN = (2, 6)


def torch_requirement() -> str:
    """The pip requirement for a torch traceap works with, e.g. "torch>=2.12"."""
    return "torch>=%d.%d" % TORCH_MIN


def release_of(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string: "2.14.0.dev20261201+cpu" -> (2, 14)."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def require_torch(purpose: str) -> ModuleType:
    """Import torch for `purpose` ("traceap train", ...); TorchMissingError if absent or too old."""
    try:
        import torch
    except ImportError:
        raise TorchMissingError(
            f"{purpose} needs torch, which is not installed here: pip install "
            f"'{torch_requirement()}' (analyze, info and diff work without it)") from None
    release = release_of(getattr(torch, "__version__", ""))
    if release is not None and release < TORCH_MIN:
        raise TorchMissingError(
            f"{purpose} needs {torch_requirement()}; this environment has torch "
            f"{torch.__version__}: pip install '{torch_requirement()}'")
    return torch
