"""`traceap.trace_handler`: the profiler's `on_trace_ready` that analyses what it writes.

    with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=2),
                                on_trace_ready=traceap.trace_handler("traces")) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

A drop-in for `torch.profiler.tensorboard_trace_handler(dir_name, worker_name, use_gzip)`: each
completed cycle is exported as ``{worker_name}.{time_ns}.pt.trace.json[.gz]``, as that handler
names it, and beside it traceap writes ``{worker_name}.{time_ns}.traceap.json`` (the
traceap.analysis/v1 JSON of docs/FORMATS.md), ``{worker_name}.{time_ns}.traceap.html`` (the HTML
report) and prints one line: step time, GPU idle, the top finding with its gain.

What the training loop pays per cycle is the export (the same as TensorBoard's handler) plus
handing the path to a thread; the analysis runs in a child process (`python -m
traceap.handler`, one at a time, niced, numpy on one thread), so training is not held up
(benchmarks/handler_cost.py measures it).  A child process rather than a process pool: pool
workers started by spawn or forkserver import the user's ``__main__`` again (an unguarded
training script would start training again), and forking a process with CUDA and OpenMP
threads is unsafe.  Analyses still running when the training script ends are waited for at exit
(or at `close()` / the end of a ``with`` block), so every cycle's files are there afterwards.

Nothing here raises into the training loop: a trace that cannot be written or analysed is one
warning line on stderr (the trace is kept).  Under torchrun each rank names its files by its
rank (``rank{R}_{hostname}_{pid}``), which `traceap analyze DIR` reads back as the rank.
"""

from __future__ import annotations

import argparse
import atexit
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .load.job import NOT_TRACES

#: What traceap writes beside a trace ``X.pt.trace.json[.gz]``: ``X`` + these (a folder's
#: traces, `traceap.load.job.trace_files`, leave the analysis JSON out).
ANALYSIS_SUFFIX = NOT_TRACES[0]
HTML_SUFFIX = ".traceap.html"
TRACE_SUFFIX = ".pt.trace.json"
#: Threads a background analysis may use: one core, so the training loop keeps the others.
CHILD_THREADS = "1"
CHILD_NICE = 10


def default_worker_name() -> str:
    """``{hostname}_{pid}`` as TensorBoard's handler, prefixed ``rank{R}_`` when the process is
    one rank of a distributed job (torch.distributed initialised, else the RANK torchrun sets),
    so that each rank's files are its own and say which rank they are."""
    rank = process_rank()
    base = f"{socket.gethostname()}_{os.getpid()}"
    return base if rank is None else f"rank{rank}_{base}"


def process_rank() -> int | None:
    """This process's rank: torch.distributed's when it is initialised, else $RANK, else None.

    torch is only looked at when the training script already imported it."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # noqa: BLE001 - a half-initialised process group: fall back to the env
        pass
    env = os.environ.get("RANK", "")
    return int(env) if env.isdigit() else None


def outputs_of(trace_path: str | os.PathLike) -> tuple[Path, Path]:
    """(analysis JSON, HTML report) written beside a trace the handler exported."""
    p = Path(trace_path)
    name = p.name
    for suffix in (TRACE_SUFFIX + ".gz", TRACE_SUFFIX, ".json.gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return p.with_name(name + ANALYSIS_SUFFIX), p.with_name(name + HTML_SUFFIX)


class TraceHandler:
    """The `on_trace_ready` callable (see the module docstring); also a context manager, and
    `close()` waits for the analyses still running.  The positional arguments are those of
    `torch.profiler.tensorboard_trace_handler`, in its order.

    `background` False analyses in the training process itself (the loop waits for it);
    `detector` is `traceap analyze --detector` (None: the default)."""

    def __init__(self, dir_name: str | os.PathLike, worker_name: str | None = None,
                 use_gzip: bool = False, use_python_export: bool = False, *,
                 html: bool = True, windows: int = 100, background: bool = True,
                 detector: str | None = None):
        if windows < 1:
            raise ValueError("the number of windows must be at least 1")
        self.dir = Path(dir_name)
        #: As given; None: `default_worker_name()`, worked out at the first cycle (by then
        #: torch.distributed is initialised) and kept in `_name`.
        self.worker_name = worker_name
        self._name: str | None = worker_name
        self.html, self.windows, self.use_gzip = html, windows, use_gzip
        self.background, self.detector = background, detector
        self.use_python_export = use_python_export
        #: Every trace written, in order (the analysis files are `outputs_of` each).
        self.traces: list[Path] = []
        self._queue: queue.Queue[Path | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._closed = False
        self._at_exit = False

    # -- the profiler's side -------------------------------------------------------------------
    def __call__(self, prof) -> None:
        """Export this cycle's trace, then hand it to the analysis; never raises."""
        try:
            path = self._export(prof)
        except Exception as exc:  # noqa: BLE001 - the training loop must go on
            _warn(f"the profiler's trace could not be written to {self.dir} ({_why(exc)})")
            return
        self.traces.append(path)
        if not self.background:
            analyze_cycle(path, self.windows, self.html, self.detector)
            return
        try:
            self._start_worker()
            self._queue.put(path)
        except Exception as exc:  # noqa: BLE001 - e.g. no thread can be started
            _warn(f"{path.name}: not analysed ({_why(exc)}); the trace is kept")

    def _export(self, prof) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self._name:
            self._name = default_worker_name()
        # nanoseconds, as TensorBoard's handler: two cycles never share a name
        name = f"{self._name}.{time.time_ns()}{TRACE_SUFFIX}" + (".gz" if self.use_gzip else "")
        path = self.dir / name
        if self.use_python_export:
            prof.export_chrome_trace(str(path), use_python_export=True)
        else:
            prof.export_chrome_trace(str(path))
        return path

    # -- the background side -------------------------------------------------------------------
    def _start_worker(self) -> None:
        if self._worker is not None and self._worker.is_alive():
            return
        self._closed = False
        # A daemon thread that only waits on children; `close` (also run at exit) drains it.
        self._worker = threading.Thread(target=self._drain, name="traceap-handler", daemon=True)
        self._worker.start()
        if not self._at_exit:
            atexit.register(self.close)
            self._at_exit = True

    def _drain(self) -> None:
        while (path := self._queue.get()) is not None:
            try:
                subprocess.run(self._child_command(path), env=_child_env(),
                               stdin=subprocess.DEVNULL, check=False)
            except Exception as exc:  # noqa: BLE001 - e.g. the interpreter cannot be started
                _warn(f"{path.name}: not analysed ({_why(exc)}); the trace is kept")

    def _child_command(self, path: Path) -> list[str]:
        cmd = [sys.executable, "-m", "traceap.handler", str(path), "--windows", str(self.windows)]
        if not self.html:
            cmd.append("--no-html")
        if self.detector:
            cmd += ["--detector", self.detector]
        return cmd

    def close(self) -> None:
        """Wait until every trace handed over so far is analysed (idempotent)."""
        if self._worker is None or self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._worker.join()
        self._worker = None

    def __getstate__(self) -> dict:
        # Picklable (Lightning's ddp_spawn sends callbacks to its workers): the queue, the
        # thread and the default name (host, pid, rank) are this process's own; a copy makes
        # its own at its first cycle.
        return {k: v for k, v in self.__dict__.items() if k not in ("_queue", "_worker")} | {
            "_closed": False, "_at_exit": False, "_name": self.worker_name}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._queue, self._worker = queue.Queue(), None

    def __enter__(self) -> TraceHandler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = CHILD_THREADS
    # the child imports this very traceap, however the training script found it
    here = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


# -- one cycle's analysis (in the child, or in the loop with background=False) -------------------
def analyze_cycle(trace_path: str | os.PathLike, windows: int = 100, html: bool = True,
                  detector: str | None = None) -> bool:
    """Analyse one exported trace: write its analysis JSON (and HTML report) beside it and print
    the one line (`traceap.report.terminal.one_line`); a failure is one warning line on stderr.
    Returns whether it succeeded; never raises (but KeyboardInterrupt)."""
    path = Path(trace_path)
    try:
        import orjson

        from .analysis import analyze
        from .load import load
        from .report.terminal import one_line

        json_path, html_path = outputs_of(path)
        trace = load(path)
        result = analyze(trace, windows, detector)
        json_path.write_bytes(orjson.dumps(result.to_json(),
                                           option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
        if html:
            from .report.html import write_html
            write_html(result, html_path, trace)
        print(one_line(result), flush=True)
        return True
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback into training
        _warn(f"{path.name}: the analysis failed ({_why(exc)}); the trace is kept")
        return False


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _warn(message: str) -> None:
    print(f"traceap: warning: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m traceap.handler TRACE [--windows N] [--no-html] [--detector D]`: the
    background analysis of one cycle (exit 0 even when it fails: the warning says so)."""
    parser = argparse.ArgumentParser(prog="python -m traceap.handler")
    parser.add_argument("trace")
    parser.add_argument("--windows", type=int, default=100)
    parser.add_argument("--no-html", action="store_true")
    parser.add_argument("--detector", default=None)
    args = parser.parse_args(argv)
    try:
        os.nice(CHILD_NICE)  # training first
    except OSError:
        pass
    analyze_cycle(args.trace, args.windows, not args.no_html, args.detector)
    return 0


if __name__ == "__main__":  # pragma: no cover - run as the background child
    sys.exit(main())
