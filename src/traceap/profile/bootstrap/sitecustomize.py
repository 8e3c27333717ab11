"""traceap profile's bootstrap: switch torch.profiler on from outside the user's script.

Python imports `sitecustomize` at start-up from the first folder on sys.path that has one;
`traceap profile` puts this folder first on PYTHONPATH.  It does nothing unless the
`TRACEAP_PROFILE` environment variable is set, and it always runs the `sitecustomize` this one
shadows (a distribution's or a virtual environment's), so the interpreter behaves as before.
"""

import os
import sys


def _chain_to_shadowed() -> None:
    """Run the next `sitecustomize` on sys.path, the one this file hides."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    if os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _activate() -> None:
    if not os.environ.get("TRACEAP_PROFILE"):
        return
    try:
        import _traceap_profile_child
        _traceap_profile_child.install_from_env()
    except Exception as exc:  # noqa: BLE001 - profiling must never break the user's program
        print(f"traceap profile: not profiling this process: {type(exc).__name__}: {exc}",
              file=sys.stderr)


try:
    _activate()
finally:
    _chain_to_shadowed()
