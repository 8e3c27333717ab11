"""`traceap eval --dataset DIR`: the paper's tables (3, 4, 5) and more, on any dataset."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import typer

from ..errors import TraceapError
from ..outputs import failing_write
from ..windows import MAX_WINDOWS

DEFAULT_DETECTORS = "rule,clustering,expert,model"
#: Detectors fitted on the train split (trace-level labels); the model brings its checkpoint.
FIT = ("rule", "clustering")
#: Detectors whose window features depend on the window width: one instance per N.
PER_N = ("clustering",)
ABLATION_FLAGS = ("no_event_adapter", "no_transformer", "no_relation", "names_masked")
MAX_SHOWN_WARNINGS = 10


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_)


def _names(text: str, what: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names and what != "classifier":
        raise TraceapError(f"--{what}: give at least one name")
    return list(dict.fromkeys(names))


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise TraceapError(f"--{what}: expected comma-separated integers, not {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise TraceapError(f"--{what}: expected positive integers, not {text!r}")
    return tuple(dict.fromkeys(values))


def build_detectors(names: list[str], explicit: bool, model: Path | None,
                    warn) -> dict[str, object]:
    """Detectors (or per-N factories) by name; a default one that is unavailable is dropped."""
    from ..detectors import detector_names, make_detector
    from ..stages import detector_options

    unknown = [n for n in names if n not in detector_names()]
    if unknown:
        raise TraceapError(f"unknown detector {unknown[0]!r}; choose from "
                           f"{', '.join(detector_names())}")
    out: dict[str, object] = {}
    for name in names:
        # --model is the checkpoint of every detector built on the trained model (the one
        # builder of `traceap analyze`'s options: `traceap.stages.detector_options`)
        options = detector_options(name, model)
        try:
            det = make_detector(name, **options)
        except TraceapError as exc:
            if explicit:
                raise
            warn(f"detector {name!r} skipped: {exc}")
            continue
        if name in PER_N:
            out[name] = (lambda n, _name=name, _o=options: make_detector(_name, n_windows=n, **_o))
        else:
            out[name] = det
    return out


def build_classifiers(names: list[str], explicit: bool, model: Path | None, warn,
                      model_detector: object | None = None) -> dict[str, object]:
    """Pattern classifiers by name; a default one that is unavailable is dropped.

    Beside "offline" and "llm", "offline+model" is the offline rules blended with the learned
    pattern head of the model detector (`model_detector` when given, else one loaded from
    --model or the bundled checkpoint).
    """
    from ..classify import classifier_names, make_classifier

    known = classifier_names() + ("offline+model",)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise TraceapError(f"unknown classifier {unknown[0]!r}; choose from {', '.join(known)}")
    out: dict[str, object] = {}
    for name in names:
        try:
            if name == "offline+model":
                from ..detectors import make_detector
                from ..stages import detector_options
                head = model_detector or make_detector("model", **detector_options("model", model))
                out[name] = make_classifier("offline", pattern_head=head.pattern_head)
            else:
                out[name] = make_classifier(name)
        except TraceapError as exc:
            if explicit:
                raise TraceapError(f"classifier {name!r} is not available ({exc})") from None
            warn(f"classifier {name!r} skipped: {exc}")
    return out


def _variant_label(config, path: Path) -> str:
    """"full" or the ablation switches a model checkpoint was trained with (`config`, the
    detector's `LearnedDetector.config`; its file name when it has none)."""
    if config is None:
        return path.stem
    off = [f for f in ABLATION_FLAGS if getattr(config, f)]
    return "+".join(off) if off else "full"


def build_ablation(folder: Path) -> dict[str, object]:
    """One model detector per checkpoint (*.pt) in `folder`, named by its ablation switches."""
    from ..detectors import make_detector

    if not folder.is_dir():
        raise TraceapError(f"--ablation: no folder of model checkpoints at {folder} "
                           f"(train them with `traceap train ... --ablation ...`)")
    files = sorted(folder.glob("*.pt"))
    if not files:
        raise TraceapError(f"--ablation: no *.pt checkpoints in {folder}")
    out: dict[str, object] = {}
    for f in files:
        det = make_detector("model", path=f)
        label = _variant_label(det.config, f)
        out[f"model[{label}]" if label not in out else f"model[{f.stem}]"] = det
    # The full model first, then one switch off, two, three (the paper's rows, reversed).
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "model[full]", kv[0].count("+"),
                                                    kv[0])))


def commit_of() -> str | None:
    """The git commit of this checkout (short hash; "+dirty" when tracked src/ files differ)."""
    try:
        root = Path(__file__).resolve().parent
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no", "--", ":(top)src"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


#: Help panel of the options that say where the scoring runs.
_COMPUTE = "Compute"
#: Help panel of the leave-one-source-out options.
_FOLDS = "Leave-one-source-out folds"


def eval_(
    dataset: Path = typer.Option(..., "--dataset", "-d", help="A dataset folder with manifest.jsonl (docs/FORMATS.md)."),
    detectors: str = typer.Option(DEFAULT_DETECTORS, "--detectors",
                                  help="Comma-separated: rule, clustering, expert, model, hybrid (model + expert "
                                       "rules, the default of analyze), llm."),
    windows: str = typer.Option("50,100,200", "--windows", help=f"Window counts N, comma-separated (each 1 to {MAX_WINDOWS})."),
    split: str = typer.Option("test_seen,test_unseen", "--split",
                              help="Splits to test on: test_seen, test_unseen (train for inspection)."),
    out: Path | None = typer.Option(None, "--out", "-o",
                                    help="Folder for eval.md, eval.json, scores.jsonl and PNG plots."),
    ablation: bool = typer.Option(False, "--ablation",
                                  help="Add the model-ablation table (paper Table 5) from --ablation-dir."),
    ablation_dir: Path = typer.Option(Path("benchmarks/out/ablation"), "--ablation-dir",
                                      help="Folder of ablation checkpoints (*.pt) for --ablation."),
    classifier: str = typer.Option("offline", "--classifier",
                                   help="Pattern classifiers: offline, offline+model, llm (comma-separated; '' for none)."),
    limit: int | None = typer.Option(None, "--limit", min=1,
                                     help="At most N test traces per split, spread over tasks and labels."),
    fit_limit: int | None = typer.Option(None, "--fit-limit", min=1,
                                         help="At most N train traces to fit rule/clustering on."),
    threshold: float = typer.Option(0.5, "--threshold", min=0.0, max=1.0,
                                    help="Flagging threshold (0 to 1) for detectors without their own."),
    model: Path | None = typer.Option(None, "--model", help="Checkpoint for the 'model' and 'hybrid' detectors and the offline+model classifier (default: the bundled one)."),
    plot_traces: str = typer.Option("", "--plot-traces",
                                    help="Trace ids for the score timelines (default: one bad trace per task)."),
    json_out: bool = typer.Option(False, "--json", help="Print the JSON summary instead of Markdown."),
    workers: int = typer.Option(1, "--workers", rich_help_panel=_COMPUTE, help="Score this many test traces at once, each in its own process."),
    ray: bool = typer.Option(False, "--ray", rich_help_panel=_COMPUTE, help="Score test traces on a local Ray instance (pip install traceap[ray])."),
    ray_address: str | None = typer.Option(None, "--ray-address", rich_help_panel=_COMPUTE, help="Score test traces on this Ray cluster ('auto' or HOST:PORT); the dataset must be at the same path on every node."),
    folds: Path | None = typer.Option(None, "--folds", rich_help_panel=_FOLDS, metavar="PLAN",
                                      help="Leave-one-source-out: score each fold of this plan "
                                           "(benchmarks/real_folds.yaml) with its own fold's "
                                           "detectors; per fold and pooled, per pattern."),
    fold_models: Path | None = typer.Option(None, "--fold-models", rich_help_panel=_FOLDS,
                                            metavar="DIR",
                                            help="With --folds: DIR/<fold>/model.pt (and "
                                                 "hybrid.json) of each fold, trained without "
                                                 "it; rules need none."),
    fold: list[str] = typer.Option([], "--fold", rich_help_panel=_FOLDS, metavar="NAME",
                                   help="With --folds: only these folds' held-out traces "
                                        "(repeatable; default: every fold)."),
) -> None:
    """Window AUC per task (Table 3), pattern accuracy (Table 4), ablation (Table 5), trace AUC."""
    from ..eval import EvalConfig, evaluate, plots, tables
    from ..eval.runner import GROUPS
    from ..eval.scores import write_scores
    from ..parallel import Execution

    execution = Execution.from_options(workers, ray, ray_address)

    warnings: list[str] = []

    def warn(msg: str) -> None:
        # All go to eval.json; the terminal gets the first few and a count.
        warnings.append(msg)
        if len(warnings) <= MAX_SHOWN_WARNINGS:
            typer.echo(f"traceap: warning: {msg}", err=True)

    if not (dataset / "manifest.jsonl").is_file():
        raise TraceapError(f"{dataset}: no manifest.jsonl (not a traceap dataset)")
    splits = tuple(_names(split, "split"))
    bad = [s for s in splits if s not in GROUPS]
    if bad:
        raise TraceapError(f"--split: unknown split {bad[0]!r}; choose from {', '.join(GROUPS)}")
    config = EvalConfig(windows=_ints(windows, "windows"), splits=splits, threshold=threshold,
                        limit=limit, fit_limit=fit_limit)
    if (fold_models is not None or fold) and folds is None:
        raise TraceapError("--fold-models and --fold go with --folds PLAN")
    if folds is not None:
        clash = [o for o, given in (("--model", model is not None), ("--ablation", ablation),
                                    ("--split", split != "test_seen,test_unseen"),
                                    ("--plot-traces", bool(plot_traces))) if given]
        if clash:
            raise TraceapError(f"{clash[0]} does not go with --folds (each fold's held-out "
                               f"traces are scored by that fold's --fold-models)")
        _eval_folds(dataset, folds, fold, fold_models, _names(detectors, "detectors"),
                    detectors != DEFAULT_DETECTORS, _names(classifier, "classifier"),
                    classifier != "offline", config, out, json_out, execution, warn, warnings)
        return
    if model is not None and not model.is_file():
        raise TraceapError(f"--model: no checkpoint at {model}")
    explicit = detectors != DEFAULT_DETECTORS
    dets = build_detectors(_names(detectors, "detectors"), explicit, model, warn)
    clfs = build_classifiers(_names(classifier, "classifier"), classifier != "offline", model,
                             warn, dets.get("model"))
    abl = build_ablation(ablation_dir) if ablation else {}
    if not dets and not abl and not clfs:
        raise TraceapError("nothing to evaluate: no detector or classifier is available")
    n_plot = min(config.windows, key=lambda n: (abs(n - 100), n))
    # a folder eval may not write is one line before the (long) evaluation
    owned = tables.prepare_out(out, config.windows, n_plot) if out is not None else None

    result = evaluate(dataset, dets, clfs, config, fit=[n for n in FIT if n in dets],
                      ablation=abl, on_warning=warn, workers=execution.workers,
                      ray=execution.ray)

    def write(summary: dict, out: Path) -> list[Path | None]:
        paths: list[Path | None] = list(tables.write(summary, out))
        write_scores(result.records, out / "scores.jsonl")
        paths.append(out / "scores.jsonl")
        paths += [plots.roc_curves(result, out, n) for n in config.windows]
        ids = [x for x in (s.strip() for s in plot_traces.split(",")) if x]
        try:
            paths.append(plots.timelines(result, out, n_plot, ids))
        except KeyError as exc:
            raise TraceapError(f"--plot-traces: {exc.args[0]}") from None
        return paths

    _finish(result.summary, warnings, out, owned, tables.out_files(config.windows, n_plot),
            write, tables.markdown, json_out, "eval.md, eval.json, scores.jsonl and plots")


def _finish(summary: dict, warnings: list[str], out: Path | None, owned, planned: list[str],
            write: Callable[[dict, Path], list[Path | None]], markdown: Callable[[dict], str],
            json_out: bool, wrote: str) -> None:
    """The end of `traceap eval`, with --folds or without: how many warnings the terminal did
    not show; the summary stamped with the commit, the command and every warning; under --out
    the files `write` writes (in the folder `owned` claimed for `planned`); the JSON or the
    Markdown on stdout; and the line that says what was written."""
    if len(warnings) > MAX_SHOWN_WARNINGS:
        typer.echo(f"traceap: warning: ... and {len(warnings) - MAX_SHOWN_WARNINGS} more "
                   f"(--out lists them all in eval.json)", err=True)
    summary["commit"] = commit_of()
    summary["command"] = "traceap " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    summary["warnings"] = warnings
    if out is not None:
        owned.begin(planned)
        with failing_write(out, "--out"):
            paths = write(summary, out)
        for note in owned.finish(Path(p).name for p in paths if p is not None):
            typer.echo(f"traceap: {note}", err=True)
    if json_out:
        typer.echo(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    else:
        typer.echo(markdown(summary))
    if out is not None:
        typer.echo(f"traceap: wrote {out}/{wrote}", err=True)


def fold_detectors(names: list[str], explicit: bool, folds: list[str],
                   fold_models: Path | None, warn) -> dict[str, dict[str, object]]:
    """Fold -> its detectors by name: the model-based ones from DIR/<fold>/model.pt (the hybrid
    with DIR/<fold>/hybrid.json), checked for every fold before anything is scored."""
    from ..detectors import make_detector
    from ..stages import MODEL_BASED

    needs = [n for n in names if n in MODEL_BASED]
    if needs and fold_models is None:
        if explicit:
            raise TraceapError(f"--detectors {needs[0]} with --folds needs --fold-models DIR "
                               f"(DIR/<fold>/model.pt{' and hybrid.json' if 'hybrid' in needs else ''}"
                               f" of each fold, trained without it)")
        warn(f"detector(s) {', '.join(needs)} skipped: with --folds they need --fold-models")
        names = [n for n in names if n not in MODEL_BASED]
        needs = []
    if fold_models is not None and not fold_models.is_dir():
        raise TraceapError(f"--fold-models: no folder at {fold_models}")
    out: dict[str, dict[str, object]] = {}
    for fold in folds:
        model = fold_models / fold / "model.pt" if needs else None
        if model is not None and not model.is_file():
            raise TraceapError(f"--fold-models: no checkpoint at {model} (fold {fold}'s model, "
                               f"trained without fold {fold})")
        dets = build_detectors([n for n in names if n != "hybrid"], explicit, model, warn)
        if "hybrid" in names:
            stack = fold_models / fold / "hybrid.json"
            if not stack.is_file():
                raise TraceapError(f"--fold-models: no hybrid stack at {stack} (fold {fold}'s, "
                                   f"fitted on its inner validation: traceap ship stack)")
            dets["hybrid"] = make_detector("hybrid", path=str(model), params=str(stack))
        out[fold] = {n: dets[n] for n in names if n in dets}
    if not any(out.values()):
        raise TraceapError("nothing to evaluate: no detector is available")
    return out


def _eval_folds(dataset: Path, plan_path: Path, only: list[str], fold_models: Path | None,
                det_names: list[str],
                explicit: bool, clf_names: list[str], clf_explicit: bool, config, out: Path | None,
                json_out: bool, execution, warn, warnings: list[str]) -> None:
    """`traceap eval --folds PLAN`: every fold's traces scored by that fold's detectors."""
    from ..eval import tables
    from ..eval.folds import FoldPlan, evaluate_folds
    from ..eval.scores import write_scores
    from ..outputs import claim

    plan = FoldPlan.read(plan_path)
    unknown = [f for f in only if f not in plan.names]
    if unknown:
        raise TraceapError(f"--fold: no fold {unknown[0]!r} in {plan_path}; it has "
                           f"{', '.join(plan.names)}")
    only = list(dict.fromkeys(only)) or plan.names
    if "offline+model" in clf_names and fold_models is None:
        # else the pattern head would be the bundled checkpoint's, trained on every fold
        raise TraceapError("--classifier offline+model with --folds needs --fold-models DIR "
                           "(each fold's pattern head)")
    dets = fold_detectors(det_names, explicit, only, fold_models, warn)

    def classifiers_for(fold: str, fold_dets: dict) -> dict:
        model = fold_models / fold / "model.pt" if fold_models is not None else None
        return build_classifiers(clf_names, clf_explicit, model, warn, fold_dets.get("model"))

    planned = ["eval.md", "eval.json", "scores.jsonl"]
    owned = claim(out, tables.OWNER, None, planned) if out is not None else None
    result = evaluate_folds(dataset, plan, dets.__getitem__, config, classifiers_for,
                            only=only, fit=[n for n in FIT if n in det_names], on_warning=warn,
                            workers=execution.workers, ray=execution.ray)

    def write(summary: dict, out: Path) -> list[Path | None]:
        paths: list[Path | None] = list(tables.write(summary, out, tables.folds_markdown))
        write_scores(result.pooled.records, out / "scores.jsonl")
        return paths + [out / "scores.jsonl"]

    _finish(dict(result.summary), warnings, out, owned, planned, write, tables.folds_markdown,
            json_out, "eval.md, eval.json and scores.jsonl")
