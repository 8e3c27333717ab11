"""`traceap diff BEFORE AFTER`: step time, GPU idle, data loading and findings, side by side."""

from __future__ import annotations

from pathlib import Path

import orjson
import typer

from ..errors import TraceapError
from ..outputs import check_writable, write_bytes
from ..windows import DEFAULT_WINDOWS, MAX_WINDOWS, check_windows


def register(app: typer.Typer) -> None:
    app.command("diff")(diff)


def diff(
    before: Path = typer.Argument(..., help="Trace, folder of per-rank traces, or analysis JSON (traceap analyze --json) of the run before the change."),
    after: Path = typer.Argument(..., help="The same for the run after the change."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the traceap.diff/v1 JSON here ('-' = stdout)."),
    fail_if_slower: float | None = typer.Option(None, "--fail-if-slower", metavar="PCT", help="Exit with code 3 when the median step time grew by more than PCT percent (a CI regression gate)."),
    windows: int = typer.Option(DEFAULT_WINDOWS, "--windows", "-w", help=f"Windows per trace when a trace or folder is analysed here (1 to {MAX_WINDOWS})."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the verdict."),
) -> None:
    """Compare two recordings: did the change make the steps faster, and which findings went away?

    Exit codes: 0, or 3 with --fail-if-slower when the step time grew by more than PCT percent;
    2 for unreadable input (or --fail-if-slower without profiler steps on both sides)."""
    from rich.console import Console

    from ..diff import EXIT_SLOWER, compare
    from ..progress import status
    from ..report.diff import render, render_verdict

    check_windows(windows)
    if fail_if_slower is not None and fail_if_slower < 0:
        raise TraceapError("--fail-if-slower must be 0 or more (percent)")
    if json_out is not None:
        check_writable(json_out, "--json")     # before the (possibly long) comparison
    with status("comparing"):
        d = compare(before, after, windows, fail_if_slower)
    if json_out is not None:
        data = orjson.dumps(d.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
        if str(json_out) == "-":
            typer.echo(data.decode())
        else:
            write_bytes(json_out, data, "--json")
    console = Console(stderr=str(json_out) == "-")
    if quiet:
        render_verdict(d, console)
    else:
        render(d, console)
    if fail_if_slower is not None:
        if d.step_pct is None:
            raise TraceapError("--fail-if-slower: the step time is unknown on one side (no "
                               "ProfilerStep annotations); nothing to gate on")
        if d.slower:
            console.print(f"step time grew {d.step_pct:+.1f}%, more than --fail-if-slower "
                          f"{fail_if_slower:g}%", style="bold red", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_SLOWER)
