"""Typed errors; the CLI turns each into one clear line and exit code 2."""


class TraceapError(Exception):
    """Base of every error traceap raises on purpose."""


class TraceFormatError(TraceapError):
    """The file is not a readable Kineto / Chrome trace."""


class EmptyTraceError(TraceFormatError):
    """The trace holds no timed events."""


class DatasetError(TraceapError):
    """A dataset folder or manifest is missing or malformed."""


class OutputError(TraceapError):
    """An output file or folder cannot be written, or holds files traceap must not replace."""


class ModelError(TraceapError):
    """A model checkpoint is missing, corrupt or incompatible."""


class TorchMissingError(TraceapError):
    """A command that needs torch (training, recording) runs where torch is absent or too old."""


def raised_by_a_stop(exc: BaseException | None) -> bool:
    """Whether `exc` is a stop (Ctrl-C, or SIGTERM turned into KeyboardInterrupt) or was raised
    while one unwound.

    A stop can land inside a library's own bookkeeping and leave it half done; its clean-up
    then raises an error of its own with the KeyboardInterrupt as context.  torch's profiler
    is one: a stop inside `record_function.__enter__` (each ProfilerStep opens one) makes the
    profiler's exit raise "AssertionError: Expected record to be set".  That error is the
    stop, not a failed recording."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__context__
    return False
