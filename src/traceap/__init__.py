"""traceap: find performance anti-patterns in PyTorch profiler traces, and say how to fix them.

    import traceap
    traceap.analyze("trace.json.gz")             # an Analysis (a job's folder: a JobAnalysis);
                                                  # shown as the HTML report in a notebook
    torch.profiler.profile(..., on_trace_ready=traceap.trace_handler("traces"))

Importing traceap imports neither torch nor the analysis stages: both come on first use.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .errors import TraceapError, TraceFormatError
from .load import Job, load, load_job
from .trace import Kind, Trace

if TYPE_CHECKING:  # pragma: no cover
    from .analysis import Analysis
    from .handler import TraceHandler
    from .job import JobAnalysis

__version__ = "0.1.0"
__all__ = ["Job", "Kind", "Trace", "TraceFormatError", "TraceapError", "analyze", "load",
           "load_job", "trace_handler"]


def analyze(path: str | os.PathLike | Trace, windows: int = 100, detector: str | None = None,
            *, workers: int = 1) -> Analysis | JobAnalysis:
    """Analyse a trace file (-> `Analysis`) or a folder of per-rank traces (-> `JobAnalysis`,
    its ranks on `workers` local processes), as `traceap analyze` does; in a notebook the
    result shows as the HTML report (`traceap.notebook`)."""
    from .notebook import analyze as analyze_for_notebook
    return analyze_for_notebook(path, windows, detector, workers=workers)


def trace_handler(dir_name: str | os.PathLike, worker_name: str | None = None,
                  use_gzip: bool = False, use_python_export: bool = False, *,
                  html: bool = True, windows: int = 100, **options) -> TraceHandler:
    """A drop-in for `torch.profiler.tensorboard_trace_handler(dir_name, worker_name,
    use_gzip, use_python_export)`: each profiled cycle's trace written with the same name, then
    analysed (JSON, HTML report, one printed line) in a background process (`background`,
    `detector`: see `traceap.handler.TraceHandler`)."""
    from .handler import TraceHandler
    return TraceHandler(dir_name, worker_name, use_gzip, use_python_export, html=html,
                        windows=windows, **options)
