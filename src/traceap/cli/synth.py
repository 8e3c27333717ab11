"""`traceap synth --out DIR [--traces N] [--seed S] [--jobs J] [--overwrite]`: generate a dataset."""

from __future__ import annotations

from pathlib import Path

import typer

SPLIT_ORDER = ("train", "validation", "test_seen", "test_unseen")


def register(app: typer.Typer) -> None:
    @app.command()
    def synth(
        out: Path = typer.Option(..., "--out", help="Dataset folder to write (manifest.jsonl + "
                                 "traces/ + synth.json): new, empty, or an earlier synth output "
                                 "of the same settings."),
        traces: int = typer.Option(610, "--traces", help="Number of traces (the paper's 610 by default)."),
        seed: int = typer.Option(0, "--seed", help="Random seed: the same seed gives the same dataset."),
        jobs: int = typer.Option(1, "--jobs", help="Worker processes."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Write into a folder that holds "
                                       "something else (files traceap synth did not write are "
                                       "kept) or replace a synth dataset of other settings."),
    ) -> None:
        """Generate a TorchTraceAP-like dataset of simulated Kineto traces with ground truth."""
        from ..errors import DatasetError
        from ..synth import SynthConfig, generate

        if traces < 3:
            raise DatasetError("--traces must be at least 3 (one per split)")
        if jobs < 1:
            raise DatasetError("--jobs must be at least 1")
        rep = generate(out, SynthConfig(traces=traces, seed=seed, jobs=jobs), overwrite=overwrite)
        for note in rep.notes:
            typer.echo(f"traceap: {note}", err=True)
        typer.echo(f"wrote {rep.n_traces} traces ({rep.n_bad} bad) to {rep.out} in "
                   f"{rep.seconds:.1f} s, {rep.bytes / 2**20:.1f} MiB")
        typer.echo(split_table(rep.per_split))
        typer.echo(pattern_table(rep.pattern_counts))


def split_table(per_split: dict[str, dict[str, int]]) -> str:
    """Traces per split, good and bad, as an aligned plain-text table."""
    rows = [(s, per_split[s]) for s in SPLIT_ORDER if s in per_split]
    rows += [(s, v) for s, v in per_split.items() if s not in SPLIT_ORDER]
    total = {k: sum(v[k] for _, v in rows) for k in ("traces", "good", "bad")}
    lines = [f"  {'split':<12} {'traces':>6} {'good':>6} {'bad':>6}"]
    lines += [f"  {s:<12} {v['traces']:>6} {v['good']:>6} {v['bad']:>6}" for s, v in rows]
    lines.append(f"  {'total':<12} {total['traces']:>6} {total['good']:>6} {total['bad']:>6}")
    return "\n".join(lines)


def pattern_table(counts: dict[str, int]) -> str:
    """Labelled anomaly intervals per pattern, one line each."""
    width = max((len(p) for p in counts), default=7)
    lines = [f"  {'pattern':<{width}} {'anomaly intervals':>17}"]
    lines += [f"  {p:<{width}} {n:>17}" for p, n in counts.items()]
    return "\n".join(lines)
