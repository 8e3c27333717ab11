"""K training steps profiled after a warm-up, the part the framework callbacks share."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .._torch import require_torch
from ..handler import TraceHandler
from ..windows import DEFAULT_WINDOWS


@dataclass(frozen=True)
class StepsConfig:
    """Which steps are profiled: `skip_first` steps run untouched (compilation, cuDNN autotuning,
    allocator growth: start-up cost, not the steady loop), then `warmup` steps with the profiler
    on but discarded (its own start-up), then `steps` steps recorded: one trace."""

    steps: int = 5
    skip_first: int = 5
    warmup: int = 1

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError("steps must be at least 1")
        if self.skip_first < 0 or self.warmup < 0:
            raise ValueError("skip_first and warmup must be 0 or more")

    @property
    def total(self) -> int:
        """Steps from the start until the trace is complete."""
        return self.skip_first + self.warmup + self.steps


class StepProfiler:
    """torch.profiler over `StepsConfig`'s steps, reporting through a `TraceHandler` (trace,
    analysis JSON, HTML report and the one line in `out`).  `start()` at the start of training,
    `step()` after every training step, `stop()` at its end (waits for the analysis)."""

    def __init__(self, config: StepsConfig, out: str | os.PathLike, *, html: bool = True,
                 windows: int = DEFAULT_WINDOWS, background: bool = True, worker_name: str | None = None):
        self.config = config
        self.handler = TraceHandler(out, worker_name, html=html, windows=windows,
                                    background=background)
        self.done = 0
        self._prof = None

    def start(self, purpose: str) -> None:
        """Switch the profiler on (`purpose` names the callback in a missing-torch error)."""
        if self._prof is not None:
            return
        torch = require_torch(purpose)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        c = self.config
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(skip_first=c.skip_first, wait=0, warmup=c.warmup,
                                             active=c.steps, repeat=1),
            on_trace_ready=self.handler)
        self._prof.start()

    def step(self) -> None:
        """One training step done; the profiler goes off once its steps are recorded."""
        if self._prof is None:
            return
        self._prof.step()
        self.done += 1
        if self.done >= self.config.total:
            self._finish()

    def stop(self) -> None:
        """Training ended: a cycle cut short is still written and analysed; wait for it."""
        self._finish()
        self.handler.close()

    def _finish(self) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.stop()


class StepsCallback:
    """What both frameworks' `TraceapCallback` share: the constructor (the steps, where the
    files go, and the handler's options) and `traces`.  Mixed in before the framework's own
    callback class, whose hooks each subclass maps to `profiler.start/step/stop`."""

    def __init__(self, steps: int = 5, out: str | os.PathLike = "traceap", *, skip_first: int = 5,
                 warmup: int = 1, html: bool = True, windows: int = DEFAULT_WINDOWS, background: bool = True):
        super().__init__()   # the framework's callback class
        self.profiler = StepProfiler(StepsConfig(steps, skip_first, warmup), out, html=html,
                                     windows=windows, background=background)

    @property
    def traces(self):
        """The traces written so far (their analyses: `traceap.handler.outputs_of`)."""
        return self.profiler.handler.traces
