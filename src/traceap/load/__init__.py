"""Stage 1: files -> `Trace` (columns).  Everything reads traces through here."""

from .job import Job, load_job, trace_files
from .kineto import load, read_bytes

__all__ = ["Job", "load", "load_job", "read_bytes", "trace_files"]
