"""`traceap train --dataset DIR --out model.pt [--config paper|small] [--windows N] ...`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from ..errors import DatasetError, ModelError


def register(app: typer.Typer) -> None:
    app.command("train")(train)


#: Help panels of `train --help` after the main "Options" (None), in the order they print.
_MAIN, _TUNE, _PRETRAIN, _COMPUTE = None, "Training mix and schedule", "Pretraining", "Compute"


def train(
    dataset: list[Path] = typer.Option(..., "--dataset", "-d", metavar="DIR", rich_help_panel=_MAIN,
                                       help="A traceap dataset (manifest.jsonl); repeatable: "
                                            "trains on each one's train split."),
    val: list[Path] = typer.Option([], "--val", metavar="DIR", rich_help_panel=_MAIN,
                                   help="Dataset whose validation split picks the best epoch; "
                                        "repeatable."),
    out: Path = typer.Option(Path("model.pt"), "--out", "-o", metavar="FILE", rich_help_panel=_MAIN,
                             help="Where to write the checkpoint."),
    config: str = typer.Option("small", "--config", "-c", metavar="NAME", rich_help_panel=_MAIN,
                               help="Model size: small (CPU) or paper."),
    windows: str = typer.Option("", "--windows", "-n", metavar="N,..", rich_help_panel=_MAIN,
                                help="Window count(s) N to train on, e.g. 100 or 50,100,200 "
                                     "(default: the config's)."),
    epochs: int = typer.Option(None, "--epochs", "-e", min=1, metavar="N", rich_help_panel=_MAIN,
                               help="Epochs (default: the config's)."),
    mix: str = typer.Option("", "--mix", metavar="W,W,..", rich_help_panel=_TUNE,
                            help="Sampling weight of each --dataset, e.g. 0.5,0.5 (default: by "
                                 "bad-trace count)."),
    val_windows: int = typer.Option(100, "--val-windows", min=1, metavar="N", rich_help_panel=_TUNE,
                                    help="Window count N of the validation scoring."),
    limit: int = typer.Option(0, "--limit", min=0, metavar="N", show_default=False,
                              rich_help_panel=_TUNE,
                              help="Train on at most N traces, half good, half bad (0 = all)."),
    steps_per_epoch: int = typer.Option(None, "--steps-per-epoch", min=1, metavar="N",
                                        rich_help_panel=_TUNE,
                                        help="Steps per epoch (default: each bad trace once)."),
    ablation: list[str] = typer.Option([], "--ablation", metavar="NAME", rich_help_panel=_TUNE,
                                       help="Paper Table 5: no-event-adapter, no-transformer, "
                                            "no-relation, or names-masked; repeatable."),
    setting: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", rich_help_panel=_TUNE,
                                      help="Override a config field, e.g. epochs=5; repeatable."),
    seed: int = typer.Option(None, "--seed", rich_help_panel=_TUNE,
                             help="Random seed (default: the config's)."),
    pretrain_on: list[Path] = typer.Option([], "--pretrain-on", metavar="PATH",
                                           rich_help_panel=_PRETRAIN,
                                           help="Unlabelled traces to pretrain the encoders on "
                                                "first (masked windows): a dataset, trace files "
                                                "or folders; repeatable."),
    pretrain_steps: int = typer.Option(300, "--pretrain-steps", min=1, metavar="N",
                                       rich_help_panel=_PRETRAIN,
                                       help="Self-supervised steps with --pretrain-on."),
    threads: int = typer.Option(0, "--threads", min=0, metavar="N", show_default=False,
                                rich_help_panel=_COMPUTE,
                                help="Torch CPU threads (0 = torch's default)."),
    workers: int = typer.Option(1, "--workers", min=1, metavar="N", rich_help_panel=_COMPUTE,
                                help="Processes for featurising traces."),
    ray: bool = typer.Option(False, "--ray", rich_help_panel=_COMPUTE,
                             help="Featurise on a local Ray instance (pip install traceap[ray])."),
    ray_address: str | None = typer.Option(None, "--ray-address", metavar="ADDR",
                                           rich_help_panel=_COMPUTE,
                                           help="Featurise on this Ray cluster ('auto' or "
                                                "HOST:PORT); the dataset must be at the same "
                                                "path on every node."),
    cache: Path = typer.Option(None, "--cache", metavar="DIR", rich_help_panel=_COMPUTE,
                               help="Feature cache (default ~/.cache/traceap)."),
    overwrite: bool = typer.Option(False, "--overwrite", rich_help_panel=_MAIN,
                                   help="Replace a checkpoint an earlier train run wrote at "
                                        "--out (never a file that is not a checkpoint)."),
) -> None:
    """Train the learned detector on a dataset's train split, on CPU.

    Trace labels by default; window labels too with --set w_window=... / w_window_pattern=...
    """
    from .._torch import require_torch

    torch = require_torch("traceap train")
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
