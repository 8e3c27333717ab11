"""Progress bars for long work (loading big traces, synth, train, eval, collect).

Drawn on stderr only when it is a terminal; silent in pipes, CI and tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


def enabled() -> bool:
    """True when progress should be drawn (stderr is a TTY and TRACEAP_PROGRESS != 0)."""
    if os.environ.get("TRACEAP_PROGRESS") == "0":
        return False
    if os.environ.get("TRACEAP_PROGRESS") == "1":
        return True
    return sys.stderr.isatty()


def track(iterable: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar on a terminal; a plain iteration otherwise."""
    if not enabled():
        yield from iterable
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    from rich.console import Console

    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in iterable:
            yield item
            bar.advance(task)


_SPINNING: list[str] = []   # the messages of the spinners running now (one is drawn)


@contextmanager
def status(message: str):
    """A spinner with a message while a block runs (terminal only).  Inside another spinner
    (a command's "comparing" around the analysis' "loading"), the outer one stays: a terminal
    shows one live display at a time."""
    if not enabled() or _SPINNING:
        yield
        return
    from rich.console import Console

    _SPINNING.append(message)
    try:
        with Console(stderr=True).status(message):
            yield
    finally:
        _SPINNING.pop()
