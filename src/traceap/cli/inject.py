"""`traceap inject` (real traces with planted anti-patterns) and `traceap label` (natural labels)."""

from __future__ import annotations

from pathlib import Path

import typer


def _ids_help(what: str) -> str:
    """'Comma-separated pattern ids to WHAT (default: all): a, b, c.' from the registry."""
    from ..patterns import pattern_ids
    return f"Comma-separated pattern ids to {what} (default: all): {', '.join(pattern_ids())}."


def register(app: typer.Typer) -> None:
    @app.command()
    def inject(
        traces: list[Path] = typer.Argument(..., help="Real Kineto traces, or folders of them."),
        out: Path = typer.Option(..., "--out", "-o", help="Dataset folder to write (manifest.jsonl + traces/)."),
        patterns: str = typer.Option("all", "--patterns",
                                     help=_ids_help("plant")),
        copies: int = typer.Option(1, "--copies", min=1, help="Injected traces per base and pattern (different draws)."),
        seed: int = typer.Option(0, "--seed", help="Random seed: the same seed gives the same bytes."),
        jobs: int = typer.Option(1, "--jobs", min=1, help="Bases processed in parallel processes."),
        split: str = typer.Option("test_unseen", "--split", help="Split written in the manifest for every trace."),
        split_plan: Path | None = typer.Option(None, "--split-plan",
                                               help="YAML: split -> globs of base paths (by project folder), and copies per split; overrides --split (see benchmarks/real_splits.yaml)."),
        task: str = typer.Option("other", "--task", help="Task written in the manifest (docs/FORMATS.md task ids)."),
        overwrite: bool = typer.Option(False, "--overwrite",
                                       help="Replace an earlier inject output of another configuration (only the files inject wrote), or write beside the files of a folder inject did not write (never replacing one)."),
    ) -> None:
        """Plant each anti-pattern into real traces by its mechanism; write a labelled dataset.

        Per base: one unmodified copy (label good, or bad with its natural anomalies) and one
        trace per pattern and copy.  Bases without GPU work or without a usable insertion
        point are skipped with one line each.
        """
        from ..inject.dataset import InjectConfig, SplitPlan, build
        from ..patterns import pattern_ids

        chosen = pattern_ids() if patterns.strip() in ("", "all") else tuple(
            p.strip() for p in patterns.split(",") if p.strip())
        config = InjectConfig(patterns=chosen, copies=copies, seed=seed, jobs=jobs, split=split,
                              task=task, overwrite=overwrite)
        plan = SplitPlan.read(split_plan) if split_plan is not None else None
        rep = build([str(t) for t in traces], out, config, log=lambda line: typer.echo(line, err=True),
                    plan=plan)
        for note in rep.notes:
            typer.echo(f"traceap: {note}", err=True)
        counts = rep.counts()
        bases = counts.get("good", 0) + counts.get("natural", 0)
        mix = ", ".join(f"{p}={counts[p]}" for p in pattern_ids() if p in counts)
        typer.echo(f"wrote {len(rep.entries)} traces from {bases} bases to {rep.out} in "
                   f"{rep.seconds:.1f} s ({counts.get('good', 0)} good, "
                   f"{counts.get('natural', 0)} with natural anomalies); skipped {len(rep.skipped)}")
        typer.echo(f"injected per pattern: {mix or 'none'}")
        if plan is not None:
            per = {}
            for e in rep.entries:
                per[e.split] = per.get(e.split, 0) + 1
            typer.echo("per split: " + ", ".join(f"{k}={v}" for k, v in per.items()))

    @app.command()
    def label(
        traces: list[Path] = typer.Argument(..., help="Kineto traces to label."),
        patterns: str = typer.Option("all", "--patterns", help=_ids_help("label")),
        json_out: bool = typer.Option(False, "--json", help="One JSON object per trace (anomalies in the manifest's form)."),
    ) -> None:
        """Natural labels: anomaly intervals a real trace shows by itself (see docs/INJECT.md).

        A pattern makes the trace bad when it costs at least the medium cut of `traceap
        analyze` (3% of the step, the same measure and cut analyze reports by); windows of a
        pattern costing less are listed apart, under "below the cut"."""
        import json

        from .. import load
        from ..errors import DatasetError
        from ..inject.natural import natural_labels
        from ..patterns import pattern_ids

        known = pattern_ids()
        chosen = known if patterns.strip() in ("", "all") else tuple(
            p.strip() for p in patterns.split(",") if p.strip())
        bad = [p for p in chosen if p not in known]
        if bad:
            raise DatasetError(f"unknown pattern {bad[0]!r}; choose from {', '.join(known)}")
        for path in traces:
            tr = load(path)
            lab = natural_labels(tr, chosen)
            found = lab.anomalies
            if json_out:
                typer.echo(json.dumps({"trace": str(path), "label": "bad" if found else "good",
                                       "patterns": sorted({p for _, _, p in found}),
                                       "anomalies": [{"start_us": a, "end_us": b, "pattern": p}
                                                     for a, b, p in found],
                                       "below_cut": [{"start_us": a, "end_us": b, "pattern": p}
                                                     for a, b, p in lab.below_cut],
                                       "gain_pct": lab.gain_pct, "cut_pct": lab.cut_pct}))
                continue
            t0 = tr.span[0]
            if found:
                typer.echo(f"{path}: {len(found)} natural anomalies")
            else:
                typer.echo(f"{path}: no natural anomaly")
            for a, b, p in found:
                typer.echo(f"  {p:28s} {a - t0:12.1f} .. {b - t0:12.1f} us from start ({b - a:.1f} us)")
            if lab.below_cut:
                per = {}
                for _, _, p in lab.below_cut:
                    per[p] = per.get(p, 0) + 1
                typer.echo(f"  below the cut ({lab.cut_pct:g}% of the step, as traceap analyze "
                           f"reports): " + ", ".join(
                               f"{p} {n} interval(s), {lab.gain_pct[p]:.2f}%" for p, n in per.items()))
            for p, pct in lab.gain_pct.items():
                if any(q == p for _, _, q in found):
                    typer.echo(f"  {p}: costs {pct:.1f}% of the step")
