"""`TraceapCallback` for Hugging Face's `Trainer`: K optimizer steps profiled after a warm-up,
then the trace, its analysis JSON and HTML report written to `out` and one line printed.

    trainer = transformers.Trainer(..., callbacks=[TraceapCallback(steps=5, out="traceap")])
"""

from __future__ import annotations

import os

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError("traceap.integrations.transformers needs transformers, which is not "
                      "installed here: pip install 'traceap[integrations]'") from None

from ._steps import StepProfiler, StepsConfig


class TraceapCallback(TrainerCallback):
    """Profile `steps` training steps after `skip_first` untouched ones and `warmup` profiler
    warm-up ones (`traceap.integrations._steps.StepsConfig`); report them with
    `traceap.trace_handler` (`html`, `windows`; the analysis runs in a background process
    unless `background` is False).  A step is the Trainer's (one optimizer step: with gradient
    accumulation, several batches).  Each rank writes its own files."""

    def __init__(self, steps: int = 5, out: str | os.PathLike = "traceap", *, skip_first: int = 5,
                 warmup: int = 1, html: bool = True, windows: int = 100, background: bool = True):
        self.profiler = StepProfiler(StepsConfig(steps, skip_first, warmup), out, html=html,
                                     windows=windows, background=background)

    @property
    def traces(self):
        """The traces written so far (their analyses: `traceap.handler.outputs_of`)."""
        return self.profiler.handler.traces

    def on_train_begin(self, args, state, control, **kwargs):
        self.profiler.start("traceap's Hugging Face callback")

    def on_step_end(self, args, state, control, **kwargs):
        self.profiler.step()

    def on_train_end(self, args, state, control, **kwargs):
        self.profiler.stop()
