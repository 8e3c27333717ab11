"""traceap: find performance anti-patterns in PyTorch profiler traces, and say how to fix them."""

from .errors import TraceapError, TraceFormatError
from .load import Job, load, load_job
from .trace import Kind, Trace

__version__ = "0.1.0"
__all__ = ["Job", "Kind", "Trace", "TraceFormatError", "TraceapError", "load", "load_job"]
