"""`traceap analyze TRACE|DIR`: find anti-patterns window by window, say where and how to fix."""

from __future__ import annotations

import importlib
from pathlib import Path

import orjson
import typer
from rich.console import Console

from ..errors import TraceapError
from ..outputs import check_writable, failing_write

#: Most windows a trace may be cut into.  The model's relation module attends over all pairs of
#: windows: N^2 x heads x 4 bytes per attention map (5000 windows, 4 heads: 0.4 GB, 100000:
#: 160 GB), and the paper's settings are 50-200 windows (a few tens per profiler step).
MAX_WINDOWS = 5000
#: Where a user records traces with GPU events (a CPU recording has none).
GPU_COLLECT = "scripts/gpu_collect.sh"


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)


def _report_module(name: str, what: str):
    try:
        return importlib.import_module(f"traceap.report.{name}")
    except ModuleNotFoundError as exc:
        if exc.name and f"traceap.report.{name}".startswith(exc.name):
            raise TraceapError(f"{what} is not available in this installation "
                               f"(traceap.report.{name} is missing)") from None
        raise


def _make_parent(path: Path, what: str) -> None:
    """Create a missing output folder, and say so (a typo in a path should not go unnoticed)."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True)
        typer.echo(f"traceap: created folder {path.parent} for {what}", err=True)


#: Help panels for the options that only some runs need.
_LLM, _RANKS = "LLM (--classifier llm, --detector llm)", "A folder of ranks"


def analyze(
    trace: Path = typer.Argument(..., help="A trace (.json / .json.gz) or a folder of per-rank traces."),
    windows: int = typer.Option(100, "--windows", "-w", help=f"Number of equal time windows (1 to {MAX_WINDOWS})."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the traceap.analysis/v1 JSON (docs/FORMATS.md) here ('-' = stdout)."),
    detector: str | None = typer.Option(None, "--detector", help="hybrid, expert, rule, clustering, model or llm (default: hybrid = the bundled model and the expert rules, stacked; expert when no model is bundled). model alone ranks whole traces better than it places anomalies inside one (docs/RESULTS.md)."),
    model: Path | None = typer.Option(None, "--model", help="A trained model checkpoint (implies --detector model unless --detector hybrid)."),
    classifier: str = typer.Option("offline", "--classifier", help="offline (expert rules) or llm."),
    llm_url: str | None = typer.Option(None, "--llm-url", rich_help_panel=_LLM, help="OpenAI-compatible server (else $TRACEAP_LLM_URL / $OPENAI_BASE_URL)."),
    llm_model: str | None = typer.Option(None, "--llm-model", rich_help_panel=_LLM, help="Model name on that server; without a server, a fetched model (smollm2, qwen0.5b, qwen1.5b) or .gguf run in-process (else $TRACEAP_LLM_MODEL)."),
    redetect: int = typer.Option(0, "--redetect", help="Rounds of finer re-detection (window width halved each round) for windows the classifier calls false alarms; 0 = off."),
    threshold: float | None = typer.Option(None, "--threshold", help="Flag windows scoring at least this (default: the detector's)."),
    html: Path | None = typer.Option(None, "--html", help="Also write a self-contained HTML report."),
    annotate: Path | None = typer.Option(None, "--annotate", help="Also write the trace with a findings track (open in Perfetto); for a folder, a folder of them."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No terminal summary."),
    workers: int = typer.Option(1, "--workers", rich_help_panel=_RANKS, help="Analyse this many ranks at once, each in its own process (memory: one rank's trace each)."),
    ray: bool = typer.Option(False, "--ray", rich_help_panel=_RANKS, help="Analyse ranks on a local Ray instance (--workers CPUs; default all); needs pip install traceap[ray]."),
    ray_address: str | None = typer.Option(None, "--ray-address", rich_help_panel=_RANKS, help="Analyse ranks on this Ray cluster ('auto', HOST:PORT or ray://HOST:PORT); the folder must be at the same path on every node."),
) -> None:
    """Find performance anti-patterns, window by window, with evidence and fixes."""
    # Every option is checked before the (possibly long) load of the trace.
    _check_options(trace, windows, threshold, detector, classifier, json_out, html, annotate)
    det, clf = _stages(detector, model, classifier, llm_url, llm_model, redetect, threshold)
    # Fail on a missing report module before the (possibly long) analysis.
    html_mod = _report_module("html", "--html") if html else None
    ann_mod = _report_module("annotate", "--annotate") if annotate else None

    is_job = trace.is_dir()
    execution = _execution(workers, ray, ray_address, is_job)
    result, loaded = _run(trace, windows, det, clf, threshold, execution, html is not None)
    _add_notes(result, det, clf, is_job)

    if json_out is not None:
        data = orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
        if str(json_out) == "-":
            typer.echo(data.decode())
            quiet = True
        else:
            with failing_write(json_out, "--json"):
                _make_parent(json_out, "the analysis JSON")
                json_out.write_bytes(data)
    if html_mod is not None:
        with failing_write(html, "--html"):
            _make_parent(html, "the HTML report")
            html_mod.write_html(result, html, loaded)
    if ann_mod is not None:  # for a folder: OUT is a folder, one annotated trace per rank
        with failing_write(annotate, "--annotate"):
            _make_parent(annotate, "the annotated trace" + ("s" if is_job else ""))
            ann_mod.write_annotated(result, loaded, annotate)
    if not quiet:
        from ..report.terminal import render, render_job
        console = Console()
        (render_job if is_job else render)(result, console)
        for path, what in ((json_out, "analysis JSON"), (html, "HTML report"),
                           (annotate, "annotated trace")):
            if path is not None and str(path) != "-":
                console.print(f"  [dim]{what}: {path}[/dim]")


def _check_options(trace: Path, windows: int, threshold: float | None, detector: str | None,
                   classifier: str, json_out: Path | None, html: Path | None,
                   annotate: Path | None) -> None:
    """The checks that need nothing loaded: the input exists, numbers in range, known names,
    output paths that can be written (a failed write after a long analysis wastes it)."""
    from ..classify import CLASSIFIER_NAMES
    from ..detectors.registry import DETECTOR_NAMES

    if not trace.exists():
        raise TraceapError(f"{trace}: no such file or folder")
    if not 1 <= windows <= MAX_WINDOWS:
        raise TraceapError(f"--windows must be between 1 and {MAX_WINDOWS}, not {windows} (the "
                           f"paper uses 50-200; the model compares every pair of windows)")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise TraceapError("--threshold must be between 0 and 1")
    if detector is not None and detector not in DETECTOR_NAMES:
        raise TraceapError(f"unknown detector {detector!r}; choose one of "
                           f"{', '.join(DETECTOR_NAMES)}")
    if classifier not in CLASSIFIER_NAMES:
        raise TraceapError(f"unknown classifier {classifier!r}; choose one of "
                           f"{', '.join(CLASSIFIER_NAMES)}")
    for path, what in ((json_out, "--json"), (html, "--html"), (annotate, "--annotate")):
        if path is None:
            continue
        if what == "--annotate" and trace.is_dir():   # a folder of annotated traces
            check_writable(path / "rank.json.gz", what)
        else:
            check_writable(path, what)
            if str(path) != "-" and path.exists() and path.resolve() == trace.resolve():
                raise TraceapError(f"{what} {path}: is the trace being analysed; give another "
                                   f"file name (traceap never overwrites its input)")


def _stages(detector: str | None, model: Path | None, classifier: str, llm_url: str | None,
            llm_model: str | None, redetect: int, threshold: float | None):
    """(detector, classifier) as the options ask: a name the analysis resolves, or an object
    built here so that a broken checkpoint or LLM option fails before the trace is read."""
    from ..detectors.registry import make_detector

    if model is not None:
        if detector not in (None, "model", "hybrid"):
            raise TraceapError("--model goes with --detector model or hybrid")
        if not model.exists():
            raise TraceapError(f"{model}: no such model checkpoint")
        det = make_detector(detector or "model", path=str(model))
    else:
        det = detector
    clf, llm_opts = classifier, {"url": llm_url, "model": llm_model}
    if (llm_url or llm_model) and "llm" not in (classifier, detector):
        raise TraceapError("--llm-url / --llm-model go with --classifier llm or --detector llm")
    if detector == "llm":
        det = make_detector("llm", **llm_opts)
    elif model is None and detector in ("model", "hybrid"):
        det = make_detector(detector)  # a broken checkpoint fails here, before the load
    if classifier == "llm":
        from ..classify import make_classifier
        clf = make_classifier("llm", **llm_opts)
    if redetect < 0:
        raise TraceapError("--redetect must be 0 or more")
    if redetect:
        from ..analysis import resolve_classifier, resolve_detector
        from ..classify.redetect import RedetectConfig, RedetectingClassifier
        det = resolve_detector(det, [])
        clf = RedetectingClassifier(resolve_classifier(clf, det), det, threshold,
                                    RedetectConfig(max_rounds=redetect))
    return det, clf


def _run(trace: Path, windows: int, det, clf, threshold: float | None, execution,
         for_html: bool):
    """(the `Analysis` or `JobAnalysis`, the loaded `Trace` or None for a folder)."""
    if trace.is_dir():
        from ..job import analyze_job

        # Each rank is read by the process that analyses it, one at a time; the reports
        # read what they need per rank (the HTML's parts come back with the ranks).
        details = None
        if for_html:
            from ..report.html import trace_details as details
        result = analyze_job(trace, windows, det, clf, threshold, workers=execution.workers,
                             ray=execution.ray, details=details)
        for bad in result.unreadable:
            typer.echo(f"traceap: warning: rank file {Path(bad['path']).name} could not be read "
                       f"({bad['error']}); the other ranks were analysed", err=True)
        return result, None
    from ..analysis import analyze
    from ..load import load
    from ..progress import status

    with status(f"loading {trace.name}"):
        loaded = load(trace)
    with status("analysing"):
        return analyze(loaded, windows, det, clf, threshold), loaded


def _add_notes(result, det, clf, is_job: bool) -> None:
    """What the stages have to say after the run: the classifier's notes, a detector that
    failed, no GPU in the trace, how many windows the LLM named."""
    result.notes.extend(getattr(clf, "notes", []))
    failed = getattr(det, "failure_note", None)
    if failed is not None and failed():
        result.notes.append(failed())
    # A job's ranks were read where they were analysed: each rank's analysis says.
    if not any(a.has_gpu for a in (result.ranks if is_job else [result])):
        result.notes.append(f"to find them, record the run on a GPU: bash {GPU_COLLECT} (or "
                            f"traceap collect --device cuda)")
    llm_clf = getattr(clf, "inner", clf)
    if getattr(llm_clf, "name", "") == "llm":
        st = llm_clf.stats
        result.notes.append(f"classifier: {llm_clf.describe}: {st['answered_by_llm']} of "
                            f"{st['windows']} window(s) named by the LLM, {st['fell_back']} by "
                            f"the offline rules" + (f" ({st['backend_down']})"
                                                    if st["backend_down"] else ""))


def _execution(workers: int, ray: bool, ray_address: str | None, is_job: bool):
    """Where the ranks of a folder are analysed (`traceap.parallel.Execution`)."""
    from ..parallel import Execution

    execution = Execution.from_options(workers, ray, ray_address)
    if execution.parallel and not is_job:
        raise TraceapError("--workers / --ray spread the ranks of a folder; give a folder of "
                           "per-rank traces")
    return execution
