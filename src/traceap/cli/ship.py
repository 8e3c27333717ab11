"""`traceap ship ensemble|model|stack`: make a retrained detector the one traceap ships.

The files under `traceap/data` are written by these commands and nothing else: `ship model`
(the checkpoint, `model.pt`: name table of the bundled traces, flag threshold calibrated on
validation scores) and `ship stack` (the hybrid stack, `hybrid.json`, fitted on validation
scores).  Each writes into `--out DIR` by default and into the package only with
`--into-package`; a file already at `--out` is replaced only when it is one of the same kind
and `--overwrite` is given (docs/DATASETS.md, "Retraining the shipped detector").
"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from ..errors import DatasetError, OutputError
from ..model.ship import MAX_HEALTHY_FLAGGED

ship_app = typer.Typer(help="Make a retrained detector the shipped default: join seeds, ship "
                            "a checkpoint, fit the hybrid stack.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(ship_app, name="ship")


_OUT_HELP = "Folder to write {file} into (not the package: see --into-package)."
_INTO_HELP = "Write traceap/data/{file} of this traceap (the shipped default) instead of --out."
_OVERWRITE_HELP = "Replace a {kind} already at the target (never a file of another kind)."


def _target(out: Path | None, into_package: bool, name: str, bundled: Path) -> Path:
    """The file to write: `bundled` with --into-package, else OUT/name (default ./shipped)."""
    if into_package and out is not None:
        raise OutputError("--out and --into-package: give one (where the file goes)")
    return bundled if into_package else (out or Path("shipped")) / name


def _check_target(path: Path, what: str, kind: str, is_kind, overwrite: bool,
                  into_package: bool = False) -> str | None:
    """Check before any work that `path` may be written (`traceap.outputs.check_replaceable`):
    a file that is not a `kind` is never replaced; one that is, only with --overwrite (or
    --into-package, which asks to replace the shipped one)."""
    from ..outputs import check_replaceable

    return check_replaceable(path, what, kind, is_kind, overwrite, command="traceap ship",
                             held=f"a {kind} already", replaced=f"the {kind}",
                             force=into_package)


def _is_checkpoint(path: Path) -> bool:
    from ..model.checkpoint import is_checkpoint

    return is_checkpoint(path)


def _is_stack(path: Path) -> bool:
    import json

    from ..detectors.hybrid import SCHEMA

    try:
        return json.loads(path.read_text()).get("schema") == SCHEMA
    except (OSError, ValueError, AttributeError):
        return False


def _say(note: str | None) -> None:
    if note:
        typer.echo(f"traceap: {note}", err=True)


@ship_app.command("ensemble")
def ensemble(
    first: Path = typer.Argument(..., metavar="FIRST.pt",
                                 help="Checkpoint whose config, platforms and record lead."),
    others: list[Path] = typer.Argument(..., metavar="OTHER.pt...",
                                        help="Checkpoints of the same recipe (other seeds)."),
    out: Path = typer.Option(..., "--out", "-o", metavar="FILE", help="The ensemble checkpoint."),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help=_OVERWRITE_HELP.format(kind="checkpoint")),
) -> None:
    """Join checkpoints of one recipe (seeds) into one ensemble checkpoint.

    A window's score is the sigmoid of the members' mean logit.  Score a validation split with
    it (traceap eval --detectors model --model FILE --out DIR), then `traceap ship model`.
    """
    from ..model.checkpoint import load_model
    from ..model.ship import join_ensemble

    note = _check_target(out, "--out", "traceap checkpoint", _is_checkpoint, overwrite)
    join_ensemble(out, first, others)
    ckpt = load_model(out)
    typer.echo(f"wrote {out}: {len(ckpt.states)} members, {len(ckpt.text_table)} names")
    _say(note)


@ship_app.command("model")
def model(
    checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT",
                                      help="A traceap train checkpoint."),
    calibrate: Path = typer.Option(None, "--calibrate", metavar="FILE",
                                   help="scores.jsonl of traceap eval --detectors model on a "
                                        "VALIDATION split, scored with CHECKPOINT: sets the "
                                        "model's flag threshold."),
    max_healthy_flagged: float = typer.Option(MAX_HEALTHY_FLAGGED, "--max-healthy-flagged",
                                              min=0.0, max=1.0, metavar="X",
                                              help="Windows of healthy traces the calibrated "
                                                   "threshold may flag at most."),
    names_from: list[Path] = typer.Option([], "--names-from", metavar="PATH",
                                          help="Traces whose event names join the checkpoint's "
                                               "name table (files or folders; repeatable; "
                                               "default: examples/ and tests/data/ of the "
                                               "checkout)."),
    names_masked_out: Path = typer.Option(None, "--names-masked-out", metavar="FILE",
                                          help="Also write the names-masked probe (the same "
                                               "weights scoring every event nameless) here."),
    out: Path = typer.Option(None, "--out", "-o", metavar="DIR", show_default="shipped",
                             help=_OUT_HELP.format(file="model.pt")),
    into_package: bool = typer.Option(False, "--into-package",
                                      help=_INTO_HELP.format(file="model.pt")),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help=_OVERWRITE_HELP.format(kind="checkpoint")),
) -> None:
    """Ship a checkpoint: add the bundled traces' event names, calibrate its flag threshold.

    Weights, config and training record are kept as they are: scores do not change.
    """
    from ..eval.scores import merge_scores
    from ..load import find_traces
    from ..model.checkpoint import bundled_model_path, load_model
    from ..model.ship import calibrate_threshold, checkout_traces, ship

    target = _target(out, into_package, "model.pt", bundled_model_path())
    kind = "traceap checkpoint"
    notes = [_check_target(target, "--out", kind, _is_checkpoint, overwrite, into_package)]
    if names_masked_out is not None:
        notes.append(_check_target(names_masked_out, "--names-masked-out", kind, _is_checkpoint,
                                   overwrite))
    load_model(checkpoint)                 # one line for a file that is not a checkpoint
    files = find_traces(names_from) if names_from else checkout_traces()
    if not files:   # an installed traceap has no examples/: the names are the user's to name
        notes.append("no traces for the name table (not a source checkout): give --names-from "
                     "to spare analyses of them the text encoder")
    cal = None
    if calibrate is not None:
        records = list(merge_scores([calibrate], ("validation",)).values())
        if any("model" not in r["scores"] for r in records):
            raise DatasetError(f"--calibrate {calibrate}: no model scores (traceap eval "
                               f"--detectors model)")
        cal = {**calibrate_threshold(records, max_healthy_flagged),
               "calibrated_on": str(calibrate), "max_healthy_flagged": max_healthy_flagged}
    shipped = ship(checkpoint, target, files, cal, names_masked_out)
    if cal:
        typer.echo(f"flag threshold {cal['flag_threshold']:.4f}: Youden J {cal['youden_j']:.3f}, "
                   f"healthy windows flagged {cal['healthy_flagged']:.1%} on {calibrate}")
    typer.echo(f"wrote {target} ({len(shipped['names'])} names, {len(shipped['added'])} added "
               f"from {len(files)} traces)")
    if names_masked_out is not None:
        typer.echo(f"wrote {names_masked_out} (names-masked probe)")
    for note in notes:
        _say(note)


@ship_app.command("stack")
def stack(
    dataset: Path = typer.Option(..., "--dataset", "-d", metavar="DIR",
                                 help="The dataset the scores come from (its manifest names "
                                      "the split of each trace)."),
    scores: list[Path] = typer.Option(..., "--scores", metavar="FILE",
                                      help="scores.jsonl of traceap eval with the model and "
                                           "expert detectors (repeatable: one run per detector)."),
    split: str = typer.Option("validation", "--split", help="The split to fit on (never test)."),
    windows: str = typer.Option("50,100,200", "--windows", "-n", metavar="N,..",
                                help="Window counts whose scores are pooled."),
    ratio_grid: str = typer.Option(None, "--ratio-grid", metavar="R,..",
                                   show_default="the shipped stack's, 0 to 4",
                                   help="Model/expert weight ratios to pick among (window AUC + "
                                        "trace AUC); '' for one logistic fit of both weights."),
    no_flag_bias: bool = typer.Option(False, "--no-flag-bias",
                                      help="Keep the fitted bias (default: raised while no more "
                                           "windows of healthy traces are flagged)."),
    warmup: bool = typer.Option(False, "--warmup",
                                help="Weigh each window's warm-up share too (reads the traces)."),
    model_name: str = typer.Option("bundled", "--model", metavar="CHECKPOINT",
                                   help="The checkpoint that scored --scores (recorded)."),
    out: Path = typer.Option(None, "--out", "-o", metavar="DIR", show_default="shipped",
                             help=_OUT_HELP.format(file="hybrid.json")),
    into_package: bool = typer.Option(False, "--into-package",
                                      help=_INTO_HELP.format(file="hybrid.json")),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help=_OVERWRITE_HELP.format(kind="hybrid stack")),
) -> None:
    """Fit the hybrid detector's stack of model and rules on a validation split's scores."""
    from ..detectors.hybrid import bundled_params_path
    from ..detectors.stack import (SHIPPED_RATIO_GRID, add_warmup, check_split, fit_stack,
                                   stack_numbers, tuned_on, write_params)
    from ..eval.scores import read_scores

    check_split(split)
    try:
        ns = [int(x) for x in windows.replace(" ", "").split(",") if x]
        grid = list(SHIPPED_RATIO_GRID) if ratio_grid is None else \
            [float(x) for x in ratio_grid.replace(" ", "").split(",") if x]
    except ValueError:
        raise DatasetError("--windows and --ratio-grid take comma-separated numbers") from None
    if not ns or min(ns) < 1:
        raise DatasetError("--windows must be positive")
    target = _target(out, into_package, "hybrid.json", bundled_params_path())
    note = _check_target(target, "--out", "hybrid stack", _is_stack, overwrite, into_package)
    rows = [r for r in read_scores(scores, dataset, split) if r["n_windows"] in ns]
    if not rows:
        raise DatasetError(f"no {split} trace of {dataset} has model and expert scores at N = "
                           f"{windows} in --scores")
    if warmup:
        add_warmup(rows, dataset)
    params = fit_stack(rows, ns, grid or None, not no_flag_bias, warmup, say=typer.echo)
    numbers = stack_numbers(params, rows, ns, warmup)
    typer.echo(f"fitted on {len(rows)} trace-N pairs of {dataset} [{split}]: "
               f"a = {params.model_coef:.4f} (model), b = {params.expert_coef:.4f} (expert), "
               f"c = {params.bias:.4f}, d = {params.warmup_coef:.4f} (warm-up share)")
    for n, per in numbers.items():
        typer.echo(f"N={n}: " + "; ".join(
            f"{k} window AUC {100 * m['window_auc']:.2f}" for k, m in per.items()
            if m["window_auc"] is not None))
    command = shlex.join(["traceap", "ship", "stack", "--dataset", str(dataset),
                          *[x for s in scores for x in ("--scores", str(s))], "--split", split,
                          "--windows", windows,
                          *(["--ratio-grid", ratio_grid] if ratio_grid is not None else []),
                          *(["--no-flag-bias"] if no_flag_bias else []),
                          *(["--warmup"] if warmup else []), "--model", model_name,
                          *(["--into-package"] if into_package else ["--out", str(target.parent)])])
    write_params(params, target, tuned_on(dataset, split, ns, model_name, command, numbers))
    typer.echo(f"wrote {target}")
    _say(note)

