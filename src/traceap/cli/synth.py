"""`traceap synth --out DIR [--traces N] [--seed S] [--jobs J]`: generate a dataset."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def synth(
        out: Path = typer.Option(..., "--out", help="Dataset folder to write (manifest.jsonl + traces/)."),
        traces: int = typer.Option(610, "--traces", help="Number of traces (the paper's 610 by default)."),
        seed: int = typer.Option(0, "--seed", help="Random seed: the same seed gives the same dataset."),
        jobs: int = typer.Option(1, "--jobs", help="Worker processes."),
    ) -> None:
        """Generate a TorchTraceAP-like dataset of simulated Kineto traces with ground truth."""
        from ..dataset import read_manifest
        from ..errors import DatasetError
        from ..synth import SynthConfig, generate

        if traces < 3:
            raise DatasetError("--traces must be at least 3 (one per split)")
        if jobs < 1:
            raise DatasetError("--jobs must be at least 1")
        if out.exists() and not out.is_dir():
            raise DatasetError(f"{out}: exists and is not a folder")
        rep = generate(out, SynthConfig(traces=traces, seed=seed, jobs=jobs))
        # regenerating in place: each trace was replaced atomically while readers may still be
        # at work; only now drop the files the new manifest no longer lists
        keep = {Path(e.path).name for e in read_manifest(out)}
        for f in (out / "traces").glob("*.pt.trace.json.gz"):
            if f.name not in keep:
                f.unlink()
        mix = ", ".join(f"{k}={v}" for k, v in rep.pattern_counts.items())
        typer.echo(f"wrote {rep.n_traces} traces ({rep.n_bad} bad) to {rep.out} in "
                   f"{rep.seconds:.1f} s, {rep.bytes / 2**20:.1f} MiB; splits {rep.split_counts}")
        typer.echo(f"anomaly intervals per pattern: {mix}")
