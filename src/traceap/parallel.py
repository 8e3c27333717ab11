"""Running one task over many traces at once: in this process, in local processes, or on Ray.

    from traceap.parallel import Execution, run
    for i, result in run(task, items, shared, Execution(workers=4)):   # in completion order
        ...

A task is a module-level function `task(shared, item) -> result`: it reads one trace from the
path in `item`, works on it and returns something small (an `Analysis`, a record, a path), so
no trace is ever shipped between processes and memory holds at most one trace per worker.
`shared` (the detector, the classifier, the settings) goes to each worker once, not with every
item.

Engines (existing ones, no home-made scheduler):

* **local processes**: `concurrent.futures.ProcessPoolExecutor` with the ``forkserver`` start
  method.  Chosen over joblib/loky because the standard library is enough here (module-level
  tasks, one `initializer` for the shared part, `as_completed` for per-item progress, a
  `BrokenProcessPool` when a worker dies) and adds no dependency; ``forkserver`` rather than
  ``fork`` because the parent may run threads (the progress spinner, BLAS pools) that must not
  be forked, and rather than ``spawn`` because the server imports traceap once (the `preload`
  modules) and every worker then starts as a cheap fork of it.
* **Ray**: the same task as Ray tasks (`num_cpus=1`, no retries) on an existing cluster
  (``"auto"`` or an address) or on a local instance started and stopped with the command
  (``"local"``).  The shared part is put in the object store once.  Ray is an optional extra:
  ``pip install traceap[ray]``.

Detectors and classifiers cross to the workers as a *spec* (registry name + options) where
they were made by `make_detector` / `make_classifier` (`buildable`), so a trained model is
loaded from its checkpoint in each worker rather than pickled; anything else (a fitted
clustering detector, a config) is pickled as it is.
"""

from __future__ import annotations

import logging
import os
import pickle
import resource
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from io import BytesIO
from typing import Any, TypeVar

from .errors import TraceapError

R = TypeVar("R")
RAY_MISSING = "Ray is not installed: pip install traceap[ray]"
#: Items handed to Ray at once per CPU of the cluster: enough to keep every CPU busy while
#: results come back, few enough that finished results do not pile up in the object store.
RAY_IN_FLIGHT_PER_CPU = 2
#: Modules the forkserver imports once, so that each worker starts warm (a fork of it).
PRELOAD = ("traceap.parallel", "traceap.patterns", "traceap.idle", "traceap.load")
_SPEC = "_traceap_spec"
#: Set only while the forkserver starts: "key:path" of the shared part it should build once.
_WARM_ENV = "TRACEAP_FORKSERVER_SHARED"
#: Thread counts of the numeric libraries, set for the workers unless the user set them.
_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class Execution:
    """Where per-trace work runs: `workers` local processes (1 = this process), or Ray.

    `ray`: None (no Ray), ``"local"`` (start a Ray instance with `workers` CPUs, or every CPU
    when `workers` is 1, and stop it afterwards), ``"auto"`` or an address such as
    ``"10.0.0.5:6379"`` / ``"ray://head:10001"`` (an existing cluster; every CPU of it)."""

    workers: int = 1
    ray: str | None = None

    def __post_init__(self):
        if self.workers < 1:
            raise TraceapError("--workers must be at least 1")
        if self.ray is not None and not str(self.ray).strip():
            raise TraceapError("--ray-address must not be empty")

    @classmethod
    def from_options(cls, workers: int = 1, ray: bool = False,
                     ray_address: str | None = None) -> "Execution":
        """From the command line's --workers, --ray and --ray-address (which implies --ray);
        a missing Ray is one clear error, before any work starts."""
        address = ray_address if ray_address is not None else ("local" if ray else None)
        if address is not None and not ray_available():
            raise TraceapError(RAY_MISSING)
        return cls(workers, address)

    @property
    def parallel(self) -> bool:
        """True when work leaves this process."""
        return self.workers > 1 or self.ray is not None

    def describe(self) -> str:
        """In words, for notes and logs."""
        if self.ray == "local":
            return f"a local Ray instance ({self.workers if self.workers > 1 else 'all'} CPUs)"
        if self.ray is not None:
            return f"the Ray cluster at {self.ray}"
        return f"{self.workers} local processes" if self.workers > 1 else "this process"


# -- specs: rebuilding detectors and classifiers in a worker --------------------------------
def buildable(obj: Any, builder: Callable[..., Any], name: str, options: dict) -> Any:
    """Mark `obj` as made by ``builder(name, **options)``: it crosses to workers as that call
    (e.g. a model detector is loaded from its checkpoint there).  `builder` must be importable
    by name (a module-level function), so that a worker can find it.  Returns `obj`.

    Only for objects whose whole state comes from these options (not fitted afterwards)."""
    try:
        setattr(obj, _SPEC, (builder, name, dict(options)))
    except (AttributeError, TypeError):  # __slots__ or a frozen object: pickled as it is
        pass
    return obj


def rebuild(builder: Callable[..., Any], name: str, options: dict) -> Any:
    """The worker's side of `buildable`."""
    return builder(name, **options)


class _SpecPickler(pickle.Pickler):
    def reducer_override(self, obj):
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict) and _SPEC in state:
            return rebuild, state[_SPEC]
        return NotImplemented


def dumps(obj: Any) -> bytes:
    """Pickle `obj`, with every `buildable` object inside it replaced by its spec."""
    buf = BytesIO()
    try:
        _SpecPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise TraceapError(f"cannot send this detector/classifier to worker processes ({exc}); "
                           f"build it with make_detector/make_classifier or run without "
                           f"--workers/--ray") from None
    return buf.getvalue()


# -- in the worker ------------------------------------------------------------------------------
_SHARED: dict[str, Any] = {}


def _install(key: str, blob: bytes) -> None:
    """Unpickle the shared part once per worker process (only the latest is kept)."""
    if key not in _SHARED:
        _SHARED.clear()
        _SHARED[key] = pickle.loads(blob)


def _warm_in_forkserver() -> None:
    """In a freshly started forkserver: unpickle the shared part and let it build what it
    needs (`shared.warm()`, e.g. load the detector) once, so that every worker forked from the
    server starts with it instead of building its own.  Any failure leaves the building to
    the workers, which then report it like any other error."""
    spec = os.environ.pop(_WARM_ENV, None)
    if not spec:
        return
    key, _, path = spec.partition(":")
    try:
        with open(path, "rb") as fh:
            _install(key, fh.read())
        warm = getattr(_SHARED[key], "warm", None)
        if callable(warm):
            warm()
    except Exception:  # noqa: BLE001 - an optimisation only; the workers retry and report
        _SHARED.clear()


def _call(task: Callable, key: str, item: Any) -> Any:
    return task(_SHARED[key], item)


def _ray_call(task: Callable, key: str, blob_ref: list, item: Any) -> Any:
    if key not in _SHARED:
        import ray
        _install(key, ray.get(blob_ref[0]))
    return task(_SHARED[key], item)


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far.

    `VmHWM` of /proc/self/status where there is one: unlike `getrusage`'s ru_maxrss, which
    Linux carries across exec (a fresh `python` started by a big process would report that
    process's peak), it belongs to this process image alone."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


# -- the engines --------------------------------------------------------------------------------
def run(task: Callable[[Any, Any], R], items: Sequence[Any], shared: Any = None,
        execution: Execution = Execution(), preload: Sequence[str] = ()
        ) -> Iterator[tuple[int, R]]:
    """(position in `items`, result) for every item, in the order they finish.

    `task(shared, item)` runs in this process (`workers` 1, no Ray), in local worker processes
    or as Ray tasks.  An exception a task raises ends the run (tasks report expected failures,
    such as an unreadable trace, in their result instead).  `preload`: modules the local
    workers' server imports once."""
    items = list(items)
    if not items:
        return iter(())
    if execution.ray is not None:
        return _run_ray(task, items, shared, execution)
    if execution.workers > 1:
        return _run_local(task, items, shared, execution.workers, preload)
    return ((i, task(shared, item)) for i, item in enumerate(items))


def _run_local(task, items, shared, workers: int, preload: Sequence[str]):
    import multiprocessing as mp
    import tempfile
    from multiprocessing import forkserver

    key, blob = uuid.uuid4().hex, dumps(shared)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(dict.fromkeys([*PRELOAD, *preload])))
    warm_file = None
    server = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", 0) is None:
        # The server is about to start: hand it the shared part to build once (see
        # `_warm_in_forkserver`); the environment is read only by the process started now.
        with tempfile.NamedTemporaryFile("wb", prefix="traceap-shared-", delete=False) as fh:
            fh.write(blob)
            warm_file = fh.name
        # One BLAS/OpenMP thread per worker when workers fill the cores (as loky does): the
        # numeric libraries read these when the server imports them.
        threads = str(max(1, (os.cpu_count() or 1) // workers))
        added = {k: threads for k in _THREAD_ENV if k not in os.environ}
        added[_WARM_ENV] = f"{key}:{warm_file}"
        os.environ.update(added)
        try:
            forkserver.ensure_running()
        finally:
            for k in added:
                os.environ.pop(k, None)
    pool = ProcessPoolExecutor(min(workers, len(items)), mp_context=ctx, initializer=_install,
                               initargs=(key, blob))
    try:
        futures = {pool.submit(_call, task, key, item): i for i, item in enumerate(items)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=futures.get):
                try:
                    yield futures[f], f.result()
                except BrokenProcessPool:
                    raise TraceapError(
                        f"a worker process died while working on {_label(items[futures[f]])} "
                        f"(out of memory? try fewer --workers; a script that starts workers "
                        f"needs `if __name__ == \"__main__\":`)") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if warm_file is not None:
            with suppress(OSError):
                os.unlink(warm_file)


def _label(item: Any) -> str:
    for x in (item if isinstance(item, tuple) else (item,)):
        if isinstance(x, (str, os.PathLike)):
            return os.path.basename(str(x))
    return repr(item)[:80]


def _run_ray(task, items, shared, execution: Execution):
    with ray_session(execution) as ray:
        key = uuid.uuid4().hex
        blob_ref = [ray.put(dumps(shared))]
        remote = ray.remote(num_cpus=1, max_retries=0)(_ray_call)
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        limit = RAY_IN_FLIGHT_PER_CPU * cpus
        queue = iter(enumerate(items))
        running: dict = {}

        def submit() -> None:
            for i, item in queue:
                running[remote.remote(task, key, blob_ref, item)] = i
                if len(running) >= limit:
                    return

        submit()
        try:
            while running:
                done, _ = ray.wait(list(running), num_returns=1)
                for ref in done:
                    i = running.pop(ref)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        raise TraceapError(f"a Ray task failed on {_label(items[i])}: "
                                           f"{_first_line(exc)}") from None
                    yield i, result
                submit()
        finally:
            for ref in running:
                ray.cancel(ref, force=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # Ray's task errors end with the original exception's message.
    return (lines[-1] if lines else type(exc).__name__)[:300]


@contextmanager
def ray_session(execution: Execution):
    """Ray, connected for the duration: an instance this process already joined is reused;
    ``"local"`` starts one (no dashboard, workers' logs kept off the terminal) and stops it;
    an address connects to that cluster and disconnects afterwards."""
    try:
        import ray
    except ImportError:
        raise TraceapError(RAY_MISSING) from None
    if ray.is_initialized():
        yield ray
        return
    # No usage-statistics banner and no C++ warnings on the terminal of a command-line tool.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
    quiet = dict(log_to_driver=False, logging_level=logging.ERROR, configure_logging=True)
    try:
        if execution.ray == "local":
            cpus = execution.workers if execution.workers > 1 else os.cpu_count() or 1
            ray.init(num_cpus=cpus, include_dashboard=False, **quiet)
        else:
            _check_reachable(execution.ray)
            ray.init(address=execution.ray, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise TraceapError(f"cannot start or reach Ray at {execution.ray}: "
                           f"{_first_line(exc)}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


#: Seconds to wait for a cluster's port to answer (Ray itself retries for minutes).
RAY_CONNECT_TIMEOUT_S = 10.0


def _check_reachable(address: str) -> None:
    """A cluster address (HOST:PORT or ray://HOST:PORT) whose port does not answer is one
    clear error now, instead of `ray.init` retrying for minutes."""
    import socket

    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto": Ray finds the running cluster (or says there is none) itself
    try:
        socket.create_connection((host or "127.0.0.1", int(port)),
                                 timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise TraceapError(f"cannot reach the Ray cluster at {address} ({exc})") from None


def ray_available() -> bool:
    """True when Ray can be imported."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def ordered(results: Iterable[tuple[int, R]], n: int) -> list[R]:
    """Results of `run` back in item order."""
    out: list = [None] * n
    for i, r in results:
        out[i] = r
    return out


__all__ = ["Execution", "RAY_MISSING", "buildable", "dumps", "ordered", "peak_rss_bytes",
           "ray_available", "ray_session", "rebuild", "run"]


_warm_in_forkserver()
