"""`traceap collect`: record real traces with each anti-pattern switched on by its real cause."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from ..errors import TraceapError
from ._stop import interrupt_here, stop_on_signals, stop_point  # noqa: F401 (interrupt_here: tests)


def register(app: typer.Typer) -> None:
    app.command("collect")(collect)


def collect(
    model: str = typer.Option(None, "--model", "-m", help="Model to run (--list shows them)."),
    pattern: str = typer.Option("none", "--pattern", "-p",
                                help="Anti-pattern to switch on: 'none' (a clean trace), a "
                                     "pattern id, or ids separated by commas."),
    out: Path = typer.Option(None, "--out", "-o", help="Dataset folder: traces/ and manifest.jsonl."),
    device: str = typer.Option(None, "--device", help="cuda or cpu (default: cuda when a GPU "
                               "is visible, else cpu; a CPU trace has no GPU events, so "
                               "traceap analyze finds none of the patterns in it)."),
    steps: int = typer.Option(3, help="Profiled (active) steps."),
    batch_size: int = typer.Option(None, "--batch-size", "-b",
                                   help="Batch size (default 32 on a GPU, 8 on the CPU)."),
    inference: bool = typer.Option(False, "--inference", help="Record inference, not training."),
    task: str = typer.Option(None, help="Task label in the manifest (default: the model's)."),
    split: str = typer.Option(None, help="Split in the manifest (default: test_seen for "
                                         "classification/detection/segmentation, else test_unseen)."),
    image_size: int = typer.Option(None, "--image-size", help="Input size in px (default: the model's)."),
    workers: int = typer.Option(2, help="DataLoader worker processes of the clean loader."),
    compile_backend: str = typer.Option("inductor", "--compile-backend",
                                        help="torch.compile backend for the graph-break cause."),
    plan: Path = typer.Option(None, "--plan", help="Sweep a PLAN.yaml (models x patterns x "
                                                   "batch sizes); resumes where it stopped."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Re-record an id already there; or record into a folder that is not a collect dataset, beside its files (a manifest there is kept under another name)."),
    list_models: bool = typer.Option(False, "--list", help="List the models and patterns."),
) -> None:
    """Record a real profiler trace, labelled, into a dataset (one recording or a --plan)."""
    from .._torch import require_torch

    torch = require_torch("traceap collect")

    # `timeout`, a batch system or `kill` stop a sweep with SIGTERM: end like Ctrl-C, so the
    # recording's temporary files are removed, the manifest stays whole, the sweep stops.
    stop_on_signals()
    quiet_fd_sharing()

    from ..collect import MODELS, CollectConfig, load_plan, parse_patterns, run_plan
    from ..collect import collect as record
    from ..collect.causes import GPU_ONLY
    from ..patterns import pattern_ids

    if list_models:
        for name, spec in MODELS.items():
            typer.echo(f"{name:24s} {spec.task:22s} {spec.image_size}px")
        typer.echo("patterns: none, " + ", ".join(
            p + (" (GPU)" if p in GPU_ONLY else "") for p in pattern_ids()))
        return
    chosen = device
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if plan is not None:
        p = load_plan(plan, out=out, device=chosen or (None if torch.cuda.is_available()
                                                        else "cpu"))
        _say_device(chosen, p.device)
        with stop_point("rerun the same command to record the rest"):
            res = run_plan(p, echo=typer.echo)
        typer.echo(f"plan: {len(res.recorded)} recorded, {len(res.existing)} already there, "
                   f"{len(res.unavailable)} skipped (not possible here), "
                   f"{len(res.failed)} failed -> {p.out}")
        if res.failed:
            raise typer.Exit(1)
        return
    if model is None or out is None:
        raise TraceapError("give --model and --out (or --plan PLAN.yaml; --list shows models)")
    cfg = CollectConfig(model=model, patterns=parse_patterns(pattern), out=out, device=device,
                        steps=steps, batch_size=batch_size, inference=inference, task=task,
                        split=split, image_size=image_size, workers=workers,
                        compile_backend=compile_backend, overwrite=overwrite)
    cfg.validate()  # a bad option is one line before anything is said or recorded
    _say_device(chosen, device)
    with stop_point("nothing of this recording was kept"):
        rec = record(cfg)
    for note in rec.notes:
        typer.echo(f"traceap: {note}", err=True)
    e = rec.entry
    typer.echo(f"recorded {e.id} ({e.label}, {len(e.anomalies)} anomaly intervals) in "
               f"{rec.seconds:.1f} s -> {rec.trace}")



def quiet_fd_sharing() -> None:
    """Drop the traceback of a DataLoader tensor hand-over cut short by a stop.

    A worker hands each batch's shared memory to the parent through multiprocessing's
    resource sharer: a thread in the worker that serves file descriptors.  When a stop
    ends the parent (or a worker) in the middle of a hand-over, that thread's connection
    is reset and it prints the exception with `sys.excepthook`, after the one-line message.
    Forked workers inherit this hook.  Only connection errors raised in the resource
    sharer are dropped; a worker that dies while the recording runs still fails it, through
    the DataLoader's own error in the recording loop.
    """
    previous = sys.excepthook

    def hook(exc_type, exc, tb) -> None:
        frames, t = [], tb
        while t is not None:
            frames.append(t.tb_frame.f_code.co_filename)
            t = t.tb_next
        if issubclass(exc_type, (ConnectionError, EOFError)) and any(
                f.endswith(os.path.join("multiprocessing", "resource_sharer.py")) for f in frames):
            return
        previous(exc_type, exc, tb)

    sys.excepthook = hook


def _say_device(asked: str | None, device: str) -> None:
    """Say which device records, and what a CPU recording cannot show (stderr, before the
    recording starts)."""
    if device != "cpu":
        return
    if asked is None:
        typer.echo("traceap: no --device given and no CUDA GPU visible: recording on the CPU",
                   err=True)
    typer.echo(f"traceap: note: {CPU_NOTE}", err=True)


#: What a CPU recording is good for (said by `collect` and, for CPU-only traces, by `analyze`).
CPU_NOTE = ("a CPU recording has no GPU events, so traceap analyze can find none of the eight "
            "GPU anti-patterns in it (its labels still test the recorder); record real traces "
            "on a GPU machine: bash scripts/gpu_collect.sh")
