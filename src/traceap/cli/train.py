"""`traceap train --dataset DIR --out model.pt [--config paper|small] [--windows N] ...`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from ..errors import DatasetError, ModelError


def register(app: typer.Typer) -> None:
    app.command("train")(train)


def train(
    dataset: list[Path] = typer.Option(..., "--dataset", "-d",
                                       help="A traceap dataset (manifest.jsonl); repeat to train "
                                            "on the train splits of several."),
    mix: str = typer.Option("", "--mix",
                            help="Sampling weight of each --dataset for the planted/bad traces of "
                                 "a step, e.g. 0.5,0.5 (default: by their bad-trace counts)."),
    val: list[Path] = typer.Option([], "--val",
                                   help="Dataset whose validation split picks the best epoch "
                                        "(window AUC, false alarms); repeatable."),
    val_windows: int = typer.Option(100, "--val-windows", min=1,
                                    help="Window count N of the validation scoring."),
    out: Path = typer.Option(Path("model.pt"), "--out", "-o", help="Where to write the checkpoint."),
    config: str = typer.Option("small", "--config", "-c", help="Model size: small (CPU default) or paper."),
    windows: str = typer.Option("", "--windows", "-n",
                                help="Window count(s) N to train on, e.g. 100 or 50,100,200 "
                                     "(default: the config's)."),
    epochs: int = typer.Option(None, "--epochs", "-e", min=1, help="Epochs (default: the config's)."),
    steps_per_epoch: int = typer.Option(None, "--steps-per-epoch", min=1,
                                        help="Steps per epoch (default: enough pairs to show "
                                             "every bad trace once)."),
    ablation: list[str] = typer.Option([], "--ablation",
                                       help="Paper Table 5 ablation: no-event-adapter, "
                                            "no-transformer, no-relation; or names-masked "
                                            "(every event nameless) (repeatable)."),
    setting: list[str] = typer.Option([], "--set",
                                      help="Override a config field, e.g. --set epochs=5 "
                                           "--set trace_pool=topk (repeatable)."),
    threads: int = typer.Option(0, "--threads", min=0, help="Torch CPU threads (0 = torch default)."),
    workers: int = typer.Option(1, "--workers", min=1, help="Processes for featurising traces."),
    ray: bool = typer.Option(False, "--ray", help="Featurise traces as Ray tasks on a local Ray instance started for this command (needs pip install traceap[ray])."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Featurise traces as Ray tasks on this existing cluster ('auto' or HOST:PORT; implies --ray); the dataset must be readable at the same path on every node."),
    cache: Path = typer.Option(None, "--cache", help="Feature cache folder (default ~/.cache/traceap)."),
    limit: int = typer.Option(0, "--limit", min=0, help="Train on at most this many traces (half good, half bad)."),
    seed: int = typer.Option(None, "--seed", help="Random seed (default: the config's)."),
    pretrain_on: list[Path] = typer.Option([], "--pretrain-on",
                                           help="Unlabelled traces to pretrain the encoders on "
                                                "first (masked windows): a traceap dataset (its "
                                                "traces not planted, any split) or trace files / "
                                                "folders, e.g. your own; repeatable."),
    pretrain_steps: int = typer.Option(300, "--pretrain-steps", min=1,
                                       help="Self-supervised steps with --pretrain-on."),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="Replace a checkpoint an earlier train run wrote at --out (a file that is not a traceap checkpoint is never replaced)."),
) -> None:
    """Train the learned detector on a dataset's train split on CPU (trace labels; window labels
    too with --set w_window=... / w_window_pattern=...)."""
    import torch

    from ..model.checkpoint import prepare_out
    from ..model.config import preset
    from ..model.train import train as run_train
    from ..parallel import Execution

    execution = Execution.from_options(workers, ray, ray_address)
    for d in list(dataset) + list(val):
        if not (d / "manifest.jsonl").is_file():
            raise DatasetError(f"{d}: no manifest.jsonl (not a traceap dataset)")
    try:
        weights = [float(x) for x in mix.replace(" ", "").split(",") if x] if mix else None
        if weights is not None and (len(weights) != len(dataset) or min(weights) < 0):
            raise ValueError(f"--mix needs {len(dataset)} non-negative weights, one per --dataset")
        cfg = preset(config)
        ns = [int(x) for x in windows.replace(" ", "").split(",") if x] if windows else None
        if ns and min(ns) < 1:
            raise ValueError("--windows must be positive")
        if ablation:
            cfg = cfg.with_ablations(ablation)
        if setting:
            cfg = cfg.with_overrides(setting)
        if pretrain_on:   # without it, run_train refuses pretrain_steps from --set
            cfg = replace(cfg, pretrain_steps=pretrain_steps)
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    # before the featurising and the training: hours of work must not end in a refused write
    replaced = prepare_out(out, overwrite)
    if threads:
        torch.set_num_threads(threads)
    _, log = run_train(dataset, out, cfg, windows=ns, epochs=epochs,
                       cache=str(cache) if cache else None, workers=execution.workers,
                       limit=limit or None, seed=seed, log=typer.echo, mix=weights, val=val,
                       val_windows=val_windows, steps_per_epoch=steps_per_epoch, ray=execution.ray,
                       pretrain_on=pretrain_on)
    last = log.epochs[-1] if log.epochs else {}
    best = f"; best epoch on validation {log.best_epoch}" if log.best_epoch else ""
    if log.pretrain:
        typer.echo(f"pretrained {cfg.pretrain_steps} steps in {log.pretrain_seconds:.0f} s: hidden "
                   f"windows picked out {100 * log.pretrain[-1]['pick_acc']:.0f}% of the time at "
                   f"the end (loss {log.pretrain[-1]['loss']:.3f})")
    typer.echo(f"trained on {log.n_good} good + {log.n_bad} bad traces, {log.steps} steps in "
               f"{log.seconds:.0f} s wall / {log.cpu_seconds:.0f} s CPU (+{log.featurize_seconds:.0f} s "
               f"featurising); final loss {last.get('total', float('nan')):.4f}{best}; wrote {out}")
    if replaced:
        typer.echo(f"traceap: {replaced}", err=True)
