"""`traceap.analyze`: a trace or a job analysed for a notebook, where the result shows as its
HTML report.

    import traceap
    traceap.analyze("trace.json.gz")      # a cell's value: the report inline (Jupyter, VS Code)
    traceap.analyze("ranks/")             # a folder of per-rank traces: the job's report

The results are the pipeline's own `Analysis` and `JobAnalysis`, as subclasses that add
`_repr_html_` (IPython's rich display): the facade and the job stay free of outputs, and
everything else about the results is unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from .analysis import Analysis
from .analysis import analyze as analyze_trace
from .errors import TraceapError
from .job import JobAnalysis, analyze_job
from .load import load
from .report.html import notebook_html, trace_details
from .trace import Trace
from .windows import DEFAULT_WINDOWS


@dataclass
class ShownAnalysis(Analysis):
    """An `Analysis` that a notebook shows as its HTML report."""

    def _repr_html_(self) -> str:
        """The report inline: summary, where the GPU's idle time goes, time lost per pattern,
        the window timeline and the findings; self-contained (`report.html.notebook_html`)."""
        return notebook_html(self)


@dataclass
class ShownJob(JobAnalysis):
    """A `JobAnalysis` that a notebook shows as its HTML report."""

    def _repr_html_(self) -> str:
        """The job's report inline: the ranks, the findings across ranks, each rank."""
        return notebook_html(self)


def analyze(path: str | os.PathLike | Trace, windows: int = DEFAULT_WINDOWS,
            detector: str | None = None, *, workers: int = 1) -> ShownAnalysis | ShownJob:
    """Analyse a trace (a file or a loaded `Trace`) or a folder of per-rank traces (its ranks
    on `workers` local processes), as `traceap analyze` does.

    What the report needs from each trace (hover digests, proving events) is computed while
    the trace is loaded, so showing the result reads no trace again."""
    if not isinstance(path, Trace) and os.path.isdir(path):
        return _as(ShownJob, analyze_job(path, windows, detector, workers=workers,
                                         details=trace_details))
    if workers != 1:
        raise TraceapError("workers spread the ranks of a folder; a single trace is analysed "
                           "in this process")
    trace = path if isinstance(path, Trace) else load(path)
    result = analyze_trace(trace, windows, detector)
    result.trace_details = trace_details(result, trace)
    return _as(ShownAnalysis, result)


def _as(cls, result):
    """`result` as an instance of its subclass `cls` (the same field values, not copied)."""
    return cls(**{f.name: getattr(result, f.name) for f in fields(result)})
