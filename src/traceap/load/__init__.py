"""Stage 1: files -> `Trace` (columns).  Everything reads traces through here."""

from .job import Job, find_traces, load_job, trace_files
from .kineto import load, load_bytes, read_bytes

__all__ = ["Job", "find_traces", "load", "load_bytes", "load_job", "read_bytes", "trace_files"]
