"""`traceap profile -- CMD...`: run a script unchanged under torch.profiler, then analyse it."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from ..errors import TraceapError
from ..windows import DEFAULT_WINDOWS, MAX_WINDOWS, check_windows


def register(app: typer.Typer) -> None:
    app.command("profile", context_settings={"allow_interspersed_args": False,
                                             "ignore_unknown_options": True})(profile)


def profile(
    command: list[str] = typer.Argument(None, metavar="-- CMD...", help="The command to run, unchanged: python train.py --lr 0.1, python -m pkg.train, torchrun --nproc-per-node=N train.py."),
    steps: int = typer.Option(3, "--steps", "-k", help="Steps to record (the paper's traces hold 2-3)."),
    skip: int = typer.Option(5, "--skip", "-s", help="Steps to skip first (warm-up: cuDNN autotuning, worker start-up; the last one warms the profiler up)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Folder for the traces, one per rank (default: traceap-profile/<script>-<time>)."),
    html: bool = typer.Option(False, "--html", help="Also write the HTML report to OUT/report.html."),
    activities: str | None = typer.Option(None, "--activities", help="cpu, cuda or cpu,cuda (default: cpu,cuda when CUDA is available to the script, else cpu)."),
    with_stack: bool = typer.Option(False, "--with-stack", help="Record Python call stacks (bigger traces, more overhead)."),
    exit_after: bool = typer.Option(False, "--exit-after", help="Stop the run once the trace is written (exit code 0 from each stopped process)."),
    period: float = typer.Option(1.0, "--period", help="Seconds per step when the script never steps (no optimizer step, no DataLoader): a time-based schedule."),
    windows: int = typer.Option(DEFAULT_WINDOWS, "--windows", "-w", help=f"Windows for the analysis, 1 to {MAX_WINDOWS} (as traceap analyze)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the traces and report of an earlier profile run in --out (only those), or record beside traces profile did not write (never deleting them)."),
    no_analysis: bool = typer.Option(False, "--no-analysis", help="Record only; do not analyse."),
) -> None:
    """Run a command with torch.profiler on from outside; record steps S+1..S+K; analyse them.

    The command runs unchanged: its output, arguments and exit code are its own (traceap's
    messages go to stderr), and traceap exits with the command's exit code.  Steps are the
    optimizer's steps, else DataLoader batches, else SECONDS of time (--period)."""
    from ..profile import ProfileConfig, default_out, describe, run
    from ..profile.runner import steps_text

    command = list(command or [])
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise TraceapError("give the command to profile after --, e.g. "
                           "traceap profile -- python train.py --lr 0.1")
    check_windows(windows)
    acts = None
    if activities is not None:
        acts = tuple(a.strip().lower() for a in activities.split(",") if a.strip())
    cfg = ProfileConfig(out=out or default_out(command), steps=steps, skip=skip,
                        activities=acts, with_stack=with_stack, exit_after=exit_after,
                        period_s=period, overwrite=overwrite)
    cfg.validate()

    console = _console()
    r = run(command, cfg, on_start=lambda: _say(
        console, f"{_NAME}: recording {steps_text(skip + 1, steps)} of `{_quote(command)}` "
                 f"-> {cfg.out}", indent=""), reports=("report.html",) if html else ())
    how = ("stopped after its trace (--exit-after)" if r.stopped_by_traceap and r.exit_code == 0
           else f"exited with code {r.exit_code}")
    _say(console, f"{_NAME}: the command {how} after {r.seconds:.1f} s; {len(r.traces)} "
                  f"trace(s) in {cfg.out}", indent="")
    for line in describe(r, cfg):
        _say(console, line)
    if r.stopped_by is not None:
        # a stop (Ctrl-C, `timeout`) ends the run here: no analysis after the deadline; one
        # unwrapped line, as traceap's other ends
        import signal
        typer.echo(f"traceap: interrupted ({signal.Signals(r.stopped_by).name}); "
                   f"{len(r.traces)} complete trace(s) kept in {cfg.out}, not analysed "
                   f"(traceap analyze {cfg.out})", err=True)
        raise typer.Exit(128 + r.stopped_by)
    if r.traces and not no_analysis:
        try:
            _analyse(r, cfg, windows, html, console)
        except TraceapError as exc:
            _say(console, f"traceap: error: analysing the recording: {exc}", indent="")
    raise typer.Exit(r.exit_code)


def _analyse(r, cfg, windows: int, html: bool, console) -> None:
    from ..job import analyze_path
    from ..progress import status
    from ..report.terminal import render, render_job
    from ..units import fmt_us

    with status("analysing the recording"):
        # One trace is analysed as a trace; several as the ranks of a job (only the traces
        # this run wrote: the folder may hold others, --overwrite keeps them).
        one = len(r.traces) == 1
        details = None
        if html:
            from ..report.html import trace_details as details
        result, loaded = analyze_path(r.traces[0] if one else cfg.out, windows,
                                      files=None if one else r.traces, details=details)
    ranks = [result] if one else result.ranks
    console.print()
    (render if one else render_job)(result, console)
    for a in ranks:
        m = a.steps   # the trace's step numbers, measured where it was analysed
        who = "" if one else f"rank {a.summary.get('rank')}: "
        if not m["step_us"]:
            continue
        loading = "no DataLoader"
        if m["loader_calls"]:
            share = (m["dataloader_us_per_step"] or 0.0) / m["step_us"]
            loading = (f"DataLoader.__next__ {fmt_us(m['dataloader_us_per_step'])} per step "
                       f"({100 * share:.0f}% of the step, on the host)")
        _say(console, f"{who}median step {fmt_us(m['step_us'])}, {loading}")
    if r.cpu_only:
        _say(console, "CPU-only recording: no GPU activity was recorded, so the eight GPU "
                      "anti-patterns cannot show here; the step time and the data loading per "
                      "step above are what `traceap diff` compares. Run on a GPU (or "
                      "--activities cpu,cuda) to see them.")
    if html:
        from ..report.html import write_html
        path = write_html(result, Path(cfg.out) / "report.html", loaded)
        r.owned.add(["report.html"])
        _say(console, f"HTML report: {path}", style="dim")
    _say(console, f"compare with another run: traceap diff {cfg.out} OTHER_DIR", style="dim")


#: How traceap's own lines start (in bold), so they stand out from the command's output.
_NAME = "traceap profile"


def _say(console, text: str, indent: str = "  ", style: str = "") -> None:
    """One message, broken between words to fit the console (80 columns in a pipe) with its
    continuation lines indented; a path longer than a line stays whole, so it can be copied."""
    from rich.text import Text

    from ..report.terminal import console_width, wrap_words

    lines = wrap_words(text, console_width(console), indent, indent + "  ")
    out = Text("\n".join(lines), style=style)
    if text.startswith(_NAME):
        out.stylize("bold", len(indent), len(indent) + len(_NAME))
    console.print(out, highlight=False, soft_wrap=True)


def _console():
    from rich.console import Console
    return Console(stderr=True)


def _quote(command: list[str]) -> str:
    return " ".join(shlex.quote(c) for c in command)
