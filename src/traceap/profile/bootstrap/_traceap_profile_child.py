"""The recorder `traceap profile` installs in the Python processes of the profiled command.

Nothing here runs until the script imports torch (a one-shot import watcher; importing torch
ourselves would change what the script sees, e.g. environment variables it sets first).  Then
the step boundary is found without the script's help, in this order:

1. optimizer steps: torch.optim's global optimizer step post hook (any optimizer, any loop;
   with several optimizers, the first one that steps marks the steps);
2. otherwise DataLoader batches: `_BaseDataLoaderIter.__next__` wrapped (inference loops);
   a batch starts a step, and only batches of the first data set iterated count;
3. otherwise time: a SIGALRM every `period_s` seconds, in the command's main process or in
   torchrun workers only (never in DataLoader or compile worker processes, never in the torchrun
   launcher), and only while SIGALRM is unused.

Steps 1..S are skipped (step S is the profiler's warm-up) and S+1..S+K recorded with
torch.profiler (`record_shapes`, `with_stack` on request), written where and as
`tensorboard_trace_handler` writes; then the profiler is stopped and the hooks go inert, so the
run goes on at full speed, or with `exit_after` the process raises SystemExit(0) once its trace
is written (finally blocks and context managers still run).

A time-based recording is a fallback: it starts only while no optimizer step or batch has been
seen, is thrown away when one is seen during it, and is deleted when a step-based recording
completes later (a slow start-up is not a script that never steps).  It never stops the run.

Each process that recorded, or that is the command's main process or a torchrun worker, leaves
a JSON record in the state folder for `traceap profile` to read.  Standard library and torch
only: the command may run an interpreter without traceap installed.
"""

import atexit
import contextlib
import gc
import glob
import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import weakref

ENV = "TRACEAP_PROFILE"
#: pid of the first process of the command that imported torch (set for its children).
TOP_ENV = "TRACEAP_PROFILE_TOP"
#: Modules only a torchrun-style launcher imports: such a process is never profiled by time.
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch",
                    "torch.distributed.elastic.agent.server.local_elastic_agent")

#: Retry delay of the time fallback while the script is importing a module.
QUIET_RETRY_S = 0.05

#: A libkineto USDT probe message, which libkineto also prints to stderr whenever the profiler
#: starts or stops: "USDT:2026-12-02 17:56:35 13008:13008 SyncActivityProfilerHandler.cpp:52]
#: profiler_start".  Its level (USDT = 5) sits above ERROR (4), so KINETO_LOG_LEVEL cannot
#: silence it without silencing libkineto's errors too: these lines are dropped instead.
_USDT_LINE = re.compile(rb"USDT:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [\w.]+:\d+\] ")

_controller = None


def install_from_env() -> None:
    """Read the configuration from TRACEAP_PROFILE and wait for torch to be imported."""
    cfg = json.loads(os.environ[ENV])
    if "torch" in sys.modules:
        _on_torch_imported(cfg)
    else:
        sys.meta_path.insert(0, _TorchWatcher(cfg))


class _TorchWatcher:
    """A meta path finder that lets torch import normally, then installs the controller."""

    def __init__(self, cfg: dict):
        self.cfg = cfg

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(name, path, target)
                if spec is not None:
                    break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        inner, cfg = loader.exec_module, self.cfg

        def exec_module(module):
            try:
                inner(module)
            finally:
                loader.__dict__.pop("exec_module", None)
            _on_torch_imported(cfg)

        loader.exec_module = exec_module
        return spec


def _on_torch_imported(cfg: dict) -> None:
    global _controller
    if _controller is not None:
        return
    try:
        _controller = Controller(cfg, _role())
        _controller.install()
    except Exception as exc:  # noqa: BLE001 - profiling must never break the user's program
        _say(f"not profiling this process: {type(exc).__name__}: {exc}")


def _say(message: str) -> None:
    print(f"traceap profile: {message}", file=sys.stderr, flush=True)


_DEBUG = bool(os.environ.get("TRACEAP_PROFILE_DEBUG"))


def _debug(message: str) -> None:
    if _DEBUG:
        print(f"traceap profile [{os.getpid()} {time.monotonic():.3f}]: {message}",
              file=sys.stderr, flush=True)


@contextlib.contextmanager
def _without_usdt_lines():
    """Run a profiler call with stderr (fd 2, where libkineto writes) caught, then pass on all
    it printed except libkineto's USDT lines: errors, warnings and the script's own output from
    other threads still reach the user, in their order, just after the call."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (AttributeError, OSError, ValueError):  # no stderr to guard
        saved = None
    if saved is None:
        yield
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(AttributeError, OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = b"".join(line for line in caught.read().splitlines(keepends=True)
                            if not _USDT_LINE.match(line))
            while kept:
                kept = kept[os.write(2, kept):]


def _role() -> str:
    """'main' (the command's first torch process), 'rank' (a torchrun worker) or 'helper'."""
    me = os.getpid()
    top = os.environ.get(TOP_ENV)
    if not top:
        os.environ[TOP_ENV] = str(me)  # inherited by every process started from here on
        return "main"
    if top == str(me):
        return "main"
    if (top == str(os.getppid()) and "TORCHELASTIC_RUN_ID" in os.environ
            and "LOCAL_RANK" in os.environ):
        return "rank"
    return "helper"


def _is_launcher() -> bool:
    return any(m in sys.modules for m in LAUNCHER_MODULES)


def _importing() -> bool:
    """True while a module is half initialised: a signal handler that imports (the profiler
    does) would then meet a circular import, so the time fallback waits for a quiet moment."""
    for module in list(sys.modules.values()):
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            return True
    return False


class _Recording:
    """One torch.profiler session over absolute steps skip+1 .. skip+steps (skip = warm-up)."""

    def __init__(self, ctl: "Controller", source: str, boundary: int):
        import torch
        import torch.autograd.profiler as autograd_profiler
        from torch.profiler import profile

        if getattr(autograd_profiler, "_is_profiler_enabled", False):
            # Two profilers cannot run at once; the script's own one wins.
            raise RuntimeError("the script runs torch.profiler itself; leaving it alone")
        self.ctl, self.source = ctl, source
        self.first = ctl.skip + 1
        self.last = ctl.skip + ctl.steps
        self.boundary = boundary
        self.path = None
        self.discard = False
        self.finished = False
        self.activities = ctl.activities()
        self.prof = profile(activities=[getattr(torch.profiler.ProfilerActivity, a.upper())
                                        for a in self.activities],
                            schedule=self._schedule, on_trace_ready=self._ready,
                            record_shapes=True, with_stack=ctl.cfg.get("with_stack", False))
        # Number the steps as the run does: the profiler enters step boundary+1 next, so the
        # trace's ProfilerStep#N is the run's N-th step.
        self.prof.step_num = boundary
        with _without_usdt_lines():
            self.prof.start()
            self.prof.step()
        _debug(f"{source} recording started at boundary {boundary}")

    def _schedule(self, n: int):
        from torch.profiler import ProfilerAction as A

        if n == self.first - 1:
            return A.WARMUP
        if self.first <= n < self.last:
            return A.RECORD
        if n == self.last:
            return A.RECORD_AND_SAVE
        return A.NONE

    def advance(self, boundary: int) -> bool:
        """Step `boundary` just ended; True once the last recorded step has been saved."""
        self.boundary = boundary
        with _without_usdt_lines():
            self.prof.step()
        _debug(f"{self.source} boundary {boundary}")
        if boundary >= self.last:
            with _without_usdt_lines():
                self.prof.stop()
            self._release()
        return self.finished

    def stop(self, discard: bool = False) -> None:
        """Stop now: save what was recorded (a partial trace), or throw it away."""
        self.discard = discard
        with _without_usdt_lines():
            self.prof.stop()
        self._release()

    def _release(self) -> None:
        # The stopped profiler holds every recorded event as Python objects linked in cycles
        # (parents, children): let them go now, or each later full garbage collection walks
        # them and the run after the recording pays for it.
        self.finished = True
        self.prof = None
        gc.collect()

    @property
    def steps_recorded(self) -> int:
        """Complete recorded steps so far."""
        return max(0, min(self.boundary, self.last) - self.first + 1)

    def _ready(self, prof) -> None:
        if self.discard:
            return
        from torch.profiler import tensorboard_trace_handler

        name = self.ctl.worker_name()
        pattern = os.path.join(self.ctl.out, f"{name}.*.pt.trace.json.gz")
        before = set(glob.glob(pattern))
        tensorboard_trace_handler(self.ctl.out, worker_name=name, use_gzip=True)(prof)
        new = sorted(set(glob.glob(pattern)) - before)
        self.path = new[-1] if new else None


class Controller:
    """Counts steps from the first source that ticks and runs the recordings."""

    def __init__(self, cfg: dict, role: str):
        self.cfg = cfg
        self.role = role
        self.out = cfg["out"]
        self.skip = int(cfg["skip"])
        self.steps = int(cfg["steps"])
        self.period_s = float(cfg.get("period_s", 1.0))
        #: The profiler starts at this boundary: one warm-up step before the first recorded one
        #: (no warm-up with skip 1 under optimizer steps: the first step's start is unknown).
        self.start_boundary = max(self.skip - 1, 1)
        self.lock = threading.Lock()
        self.ticks = {"optimizer": 0, "dataloader": 0}
        self.source = None
        self.rec = None            # the step-based recording
        self.time_rec = None       # the time-based fallback recording
        self.alarms = 0
        self.real_seen = False
        self.done = False
        self.disabled = False
        self.timer_on = False
        self.stopped_by_traceap = False
        self.notes = []
        self.error = None
        self._lead_optimizer = None
        self._lead_dataset = None
        self._hook = None
        self._next_orig = None

    # -- installing -----------------------------------------------------------------------
    def install(self) -> None:
        """Register the optimizer hook, wrap DataLoader.__next__, arm the time fallback."""
        import torch.optim.optimizer as optim
        import torch.utils.data.dataloader as dl

        self._hook = optim.register_optimizer_step_post_hook(self._on_optimizer_step)
        base = dl._BaseDataLoaderIter
        orig = base.__next__
        ctl = self

        def __next__(it):
            if not ctl.done:
                ctl._on_batch(it)
            return orig(it)

        __next__.__wrapped__ = orig
        self._next_orig = orig
        base.__next__ = __next__
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._in_forked_child)
        atexit.register(self._at_exit)
        if self.role in ("main", "rank") and self.period_s > 0:
            self._arm_timer()

    def _in_forked_child(self) -> None:
        # A forked DataLoader worker inherits this object: it must neither record nor report.
        self.disabled = self.done = True

    def _restore(self) -> None:
        import torch.utils.data.dataloader as dl

        cur = dl._BaseDataLoaderIter.__next__
        if self._next_orig is not None and getattr(cur, "__wrapped__", None) is self._next_orig:
            dl._BaseDataLoaderIter.__next__ = self._next_orig
        # The optimizer hook stays registered but returns at once: removing it from inside
        # Optimizer.step would mutate the dict torch is iterating.

    # -- the time fallback ----------------------------------------------------------------
    def _arm_timer(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None, self._on_alarm):
            self.notes.append("SIGALRM is in use by the script: no time-based fallback")
            return
        signal.signal(signal.SIGALRM, self._on_alarm)
        self.timer_on = True
        signal.setitimer(signal.ITIMER_REAL, self.period_s)

    def _timer_off(self) -> None:
        if self.timer_on:
            self.timer_on = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            if threading.current_thread() is threading.main_thread() and \
                    signal.getsignal(signal.SIGALRM) == self._on_alarm:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)  # SIGALRM is the script's again

    def _on_alarm(self, signum, frame) -> None:
        if self.disabled or not self.timer_on:
            return
        if _importing():
            signal.setitimer(signal.ITIMER_REAL, QUIET_RETRY_S)
            return
        if not self.lock.acquire(blocking=False):  # a step is being handled: try next period
            signal.setitimer(signal.ITIMER_REAL, self.period_s)
            return
        rearm = False
        try:
            if self.real_seen or self.done:
                return
            self.alarms += 1
            if self.time_rec is None:
                if _is_launcher():
                    self._timer_off()
                    return
                if self.alarms >= self.start_boundary:
                    self.time_rec = _Recording(self, "time", self.alarms)
                rearm = True
            elif not self.time_rec.advance(self.alarms):
                rearm = True
            else:
                self._timer_off()
                self._write_record()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        finally:
            self.lock.release()
        if rearm and self.timer_on:
            signal.setitimer(signal.ITIMER_REAL, self.period_s)

    # -- step sources ---------------------------------------------------------------------
    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self.done or self.disabled:
            return
        lead = self._lead_optimizer() if self._lead_optimizer is not None else None
        if lead is None:
            self._lead_optimizer = weakref.ref(optimizer)
        elif lead is not optimizer:
            return
        self._tick("optimizer")

    def _on_batch(self, it) -> None:
        if self.disabled or self.source == "optimizer":
            return
        dataset = getattr(it, "_dataset", None)
        if self._lead_dataset is None:
            self._lead_dataset = id(dataset)
        elif self._lead_dataset != id(dataset):
            return
        self._tick("dataloader")

    def _tick(self, source: str) -> None:
        stop = False
        try:
            with self.lock:
                if self.done:
                    return
                if not self.real_seen:
                    self.real_seen = True
                    self._timer_off()
                    if self.time_rec is not None and not self.time_rec.finished:
                        self.time_rec.stop(discard=True)
                        self.time_rec = None
                self.ticks[source] += 1
                if self.source is None:
                    if source == "optimizer":
                        self.source = "optimizer"
                    elif (self.ticks["optimizer"] == 0
                          and self.ticks["dataloader"] - 1 >= self.start_boundary):
                        self.source = "dataloader"
                    else:
                        return
                if source != self.source:
                    return
                # A batch starts step n, so batch n+1 ends it; an optimizer step ends its step.
                boundary = self.ticks[source] - (1 if source == "dataloader" else 0)
                if self.rec is None:
                    if boundary >= self.start_boundary:
                        self.rec = _Recording(self, source, boundary)
                    return
                if self.rec.advance(boundary):
                    self._finish()
                    stop = bool(self.cfg.get("exit_after"))
        except Exception as exc:  # noqa: BLE001 - never break the user's program
            self._fail(exc)
            return
        if stop:
            self.stopped_by_traceap = True
            self._write_record()
            # One step is "step 2", not "steps 2-2" (traceap.profile.runner.steps_text; this
            # file runs in the user's process and imports nothing of traceap).
            first, last = self.skip + 1, self.skip + self.steps
            steps = f"steps {first}-{last}" if last > first else f"step {first}"
            _say(f"trace written after {steps}; stopping the run (--exit-after)")
            raise SystemExit(0)

    def _finish(self) -> None:
        self.done = True
        self._timer_off()
        self._restore()
        if self.time_rec is not None and self.time_rec.path and self.rec.path:
            try:
                os.remove(self.time_rec.path)
            except OSError:
                pass
            self.time_rec = None
        self._write_record()

    def _fail(self, exc: BaseException) -> None:
        self.error = f"{type(exc).__name__}: {exc}"
        self.done = self.disabled = True
        self._timer_off()
        try:
            self._restore()
        except Exception:  # noqa: BLE001
            pass
        _say(f"profiling stopped in this process: {self.error}")
        self._write_record()

    # -- on the way out -------------------------------------------------------------------
    def _at_exit(self) -> None:
        if self.disabled and self.error is None:
            return  # a forked worker
        self._timer_off()
        try:
            for rec in (self.rec, self.time_rec):
                if rec is not None and not rec.finished:
                    rec.stop()  # save the steps recorded so far
            if self.rec is not None and self.rec.path and self.time_rec is not None \
                    and self.time_rec.path:
                os.remove(self.time_rec.path)  # real steps, even partial, beat the fallback
                self.time_rec = None
        except Exception as exc:  # noqa: BLE001
            self.error = self.error or f"{type(exc).__name__}: {exc}"
        self._write_record()

    # -- helpers --------------------------------------------------------------------------
    def activities(self) -> list:
        """The profiler activities: configured, or cpu+cuda when CUDA is available."""
        import torch

        want = self.cfg.get("activities", "auto")
        has_cuda = torch.cuda.is_available()
        if want == "auto":
            return ["cpu", "cuda"] if has_cuda else ["cpu"]
        if "cuda" in want and not has_cuda:
            self.notes.append("--activities cuda asked for, but CUDA is not available in this "
                              "process: recording the CPU only")
            want = [a for a in want if a != "cuda"] or ["cpu"]
        return list(want)

    def rank(self):
        """This process's rank: RANK from the launcher, else torch.distributed's, else None."""
        if os.environ.get("RANK", "").isdigit():
            return int(os.environ["RANK"])
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except Exception:  # noqa: BLE001
            pass
        return None

    def worker_name(self) -> str:
        """tensorboard_trace_handler's default worker name, with the rank in front for ranks."""
        name = f"{socket.gethostname()}_{os.getpid()}"
        rank = self.rank()
        return name if rank is None else f"rank{rank}_{name}"

    def _write_record(self) -> None:
        if self.role == "helper" and not (self.rec or self.time_rec or any(self.ticks.values())):
            return
        if self.role == "main" and _is_launcher() and not any(self.ticks.values()):
            return
        kept = self.rec if self.rec is not None and self.rec.path else self.time_rec
        if kept is not None and not kept.path:
            kept = None
        record = {
            "pid": os.getpid(), "role": self.role, "rank": self.rank(), "argv": sys.argv,
            "source": kept.source if kept else self.source,
            "trace": os.path.basename(kept.path) if kept else None,
            "steps_recorded": kept.steps_recorded if kept else 0,
            "steps_requested": self.steps, "skip": self.skip, "period_s": self.period_s,
            "activities": kept.activities if kept else None,
            "optimizer_steps": self.ticks["optimizer"], "batches": self.ticks["dataloader"],
            "time_steps": self.alarms,
            "stopped_by_traceap": self.stopped_by_traceap, "finished": self.done,
            "notes": self.notes, "error": self.error, "time": time.time(),
        }
        state = self.cfg["state"]
        tmp = os.path.join(state, f".{os.getpid()}.json.tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(record, f)
            os.replace(tmp, os.path.join(state, f"{os.getpid()}.json"))
        except OSError as exc:
            _say(f"could not write the run record: {exc}")
