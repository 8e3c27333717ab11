"""`TraceapCallback` for Hugging Face's `Trainer`: K optimizer steps profiled after a warm-up,
then the trace, its analysis JSON and HTML report written to `out` and one line printed.

    trainer = transformers.Trainer(..., callbacks=[TraceapCallback(steps=5, out="traceap")])
"""

from __future__ import annotations

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError("traceap.integrations.transformers needs transformers, which is not "
                      "installed here: pip install 'traceap[integrations]'") from None

from ._steps import StepsCallback


class TraceapCallback(StepsCallback, TrainerCallback):
    """Profile `steps` training steps after `skip_first` untouched ones and `warmup` profiler
    warm-up ones (`traceap.integrations._steps.StepsConfig`); report them with
    `traceap.trace_handler` (`html`, `windows`; the analysis runs in a background process
    unless `background` is False).  A step is the Trainer's (one optimizer step: with gradient
    accumulation, several batches).  Each rank writes its own files."""

    def on_train_begin(self, args, state, control, **kwargs):
        self.profiler.start("traceap's Hugging Face callback")

    def on_step_end(self, args, state, control, **kwargs):
        self.profiler.step()

    def on_train_end(self, args, state, control, **kwargs):
        self.profiler.stop()
