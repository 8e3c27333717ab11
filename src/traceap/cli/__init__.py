"""The `traceap` command: a thin layer over the library.

Each sub-command lives in its own module here and exposes `register(app)`; modules are found
by name, so adding a command means adding a file.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import typer

from ..errors import TraceapError, raised_by_a_stop
from . import _help

# Libraries loaded on demand must not draw on stderr: the text encoder's weights load with a
# "Loading weights" bar (transformers, through huggingface_hub's switch).
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


_help.install()

app = typer.Typer(
    name="traceap",
    help="Find performance anti-patterns in PyTorch profiler traces, window by window, "
         "and say how to fix them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

def _version(value: bool) -> None:
    if value:
        from .. import __version__
        typer.echo(f"traceap {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Find performance anti-patterns in PyTorch profiler traces and say how to fix them."""


_ORDER = ["info", "analyze", "synth", "collect", "train", "eval", "llm"]


def _register_all() -> None:
    found = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    for name in sorted(found, key=lambda n: (_ORDER.index(n) if n in _ORDER else 99, n)):
        importlib.import_module(f"{__name__}.{name}").register(app)


_register_all()


def fail(message: str, code: int = 2) -> None:
    """Print one clear error line and exit."""
    typer.echo(f"traceap: error: {message}", err=True)
    raise typer.Exit(code)


def _interrupted() -> None:
    """The end of a command stopped by a signal (or Ctrl-C): one line, the signal's code."""
    from ._stop import exit_code
    typer.echo("traceap: interrupted", err=True)
    sys.exit(exit_code())


def main() -> None:
    """Entry point: run the app, turning expected errors into one line and exit code 2."""
    try:
        app()
    except TraceapError as exc:
        typer.echo(f"traceap: error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        _interrupted()
    except MemoryError:
        typer.echo("traceap: error: out of memory", err=True)
        sys.exit(2)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: never a traceback
        if os.environ.get("TRACEAP_DEBUG"):
            raise
        if raised_by_a_stop(exc):  # a library's clean-up failing under a stop is the stop
            _interrupted()
        typer.echo(f"traceap: internal error: {type(exc).__name__}: {exc} "
                   f"(set TRACEAP_DEBUG=1 for the traceback)", err=True)
        sys.exit(1)
