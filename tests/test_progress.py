"""Progress bars and spinners: drawn on a terminal, silent in pipes, CI and tests."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from traceap import progress
from traceap.load import kineto

from .conftest import CNN


class FakeTerminal(io.StringIO):
    """A stderr that says it is a terminal, and keeps what was drawn."""

    def isatty(self) -> bool:
        return True


def on_terminal(monkeypatch) -> FakeTerminal:
    """Make stderr a terminal for the rest of the test (pytest swaps it back between phases)."""
    monkeypatch.delenv("TRACEAP_PROGRESS", raising=False)
    term = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", term)
    return term


def test_silent_when_stderr_is_a_pipe():
    # A real pipe, in a real process: no bar, no spinner, not even for a "big" trace.
    code = (
        "from traceap.progress import track, status\n"
        "from traceap.load import kineto\n"
        "kineto.SPINNER_BYTES = 0\n"
        "items = list(track(range(300), 'counting'))\n"
        "with status('thinking'):\n"
        "    pass\n"
        f"t = kineto.load({str(CNN)!r})\n"
        "print(len(items), len(t) > 0)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRACEAP_PROGRESS"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr.decode()
    assert res.stdout.split() == [b"300", b"True"]
    assert res.stderr == b""


def test_track_draws_a_bar_on_a_terminal_and_yields_everything(monkeypatch):
    terminal = on_terminal(monkeypatch)
    assert list(progress.track(range(5), "crunching")) == [0, 1, 2, 3, 4]
    drawn = terminal.getvalue()
    assert "crunching" in drawn and "5/5" in drawn


def test_environment_switch_overrides_the_terminal_check(monkeypatch):
    terminal = on_terminal(monkeypatch)
    monkeypatch.setenv("TRACEAP_PROGRESS", "0")
    assert list(progress.track(range(3), "quiet")) == [0, 1, 2]
    with progress.status("quiet too"):
        pass
    assert terminal.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal ...
    assert not progress.enabled()
    monkeypatch.setenv("TRACEAP_PROGRESS", "1")  # ... but asked for
    assert progress.enabled()


def test_loading_a_big_trace_shows_a_spinner(monkeypatch):
    terminal = on_terminal(monkeypatch)
    kineto.load(CNN)  # 0.75 MB gzip: under the threshold, nothing drawn
    assert terminal.getvalue() == ""
    monkeypatch.setattr(kineto, "SPINNER_BYTES", 0)
    trace = kineto.load(CNN)
    assert len(trace) > 0
    assert f"loading {CNN.name}" in terminal.getvalue()
