"""Stopping a long command cleanly on Ctrl-C (SIGINT) or SIGTERM (`timeout`, a batch system,
`kill`): the command unwinds as for Ctrl-C, removes what it had half written, and ends with
one line and the shell's code for the signal (130 for SIGINT, 143 for SIGTERM)."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager

import typer

from ..errors import raised_by_a_stop

#: The signal that stopped this process (None while none has).
_received: list[int] = []


def interrupt_here():
    """A SIGINT/SIGTERM handler that raises KeyboardInterrupt in this process only, once.

    In the owning process it first stops watching SIGCHLD: the signal usually
    reaches the whole process group, so DataLoader workers die of it too, and torch's SIGCHLD
    handler would turn their deaths into a RuntimeError ("DataLoader worker ... killed by
    signal: Terminated") raised while the stop unwinds, read as a failed recording.  A second
    signal while unwinding is ignored, so the clean-up is not cut short.

    Forked children inherit the handler: a DataLoader worker that the stopping parent
    terminates (its loader's shutdown, or multiprocessing's exit for a worker still starting
    up) would print a KeyboardInterrupt traceback after the one-line message.  In a child it
    ends the process as the signal's default does, silently.
    """
    owner = os.getpid()

    def interrupt(signum, frame) -> None:
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if _received:
            return
        _received.append(signum)
        # a Python no-op, not SIG_DFL: a SIGCHLD already pending would find no handler and
        # print "Signal 17 ignored due to race condition"
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        raise KeyboardInterrupt

    return interrupt


def stop_on_signals() -> None:
    """Install `interrupt_here` for SIGINT and SIGTERM."""
    handler = interrupt_here()
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def exit_code() -> int:
    """The shell's code for the signal that stopped the command (Ctrl-C's when none did)."""
    return 128 + (_received[0] if _received else signal.SIGINT)


def stopped(what: str) -> None:
    """One line for a stopped command and the shell's code for the signal, at once.

    Called once the command has removed what it had half written.  The process then ends
    without the interpreter's teardown: that joins what the stop left behind (a DataLoader's
    workers and its fd-sharing threads, multiprocessing's children), and on a loaded machine
    a worker killed in a hand-over kept a stopped sweep alive past 30 s after this line.  The
    workers got the signal too (or see their parent gone), so nothing outlives it for long."""
    name = signal.Signals(_received[0]).name if _received else "SIGINT"
    typer.echo(f"traceap: interrupted ({name}); {what}", err=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(exit_code())


@contextmanager
def stop_point(what: str):
    """Around work that a stop may cut short: an error raised while the stop unwound (a
    library's clean-up failing under it, `errors.raised_by_a_stop`) ends the command as the
    stop, with `stopped(what)`; any other error goes on up."""
    try:
        yield
    except BaseException as exc:
        if raised_by_a_stop(exc):
            stopped(what)
        raise
