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
