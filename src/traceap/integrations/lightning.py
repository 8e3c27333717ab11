"""`TraceapCallback` for Lightning's Trainer: K training steps profiled after a warm-up, then
the trace, its analysis JSON and HTML report written to `out` and one line printed.

    trainer = lightning.Trainer(callbacks=[TraceapCallback(steps=5, out="traceap")])

Works with ``lightning`` (``lightning.pytorch``) or the older ``pytorch_lightning`` package.
"""

from __future__ import annotations

from ._steps import StepsCallback

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:
    try:  # the standalone package
        from pytorch_lightning.callbacks import Callback
    except ImportError:
        raise ImportError("traceap.integrations.lightning needs Lightning, which is not "
                          "installed here: pip install 'traceap[integrations]'") from None


class TraceapCallback(StepsCallback, Callback):
    """Profile `steps` training batches after `skip_first` untouched ones and `warmup` profiler
    warm-up ones (`traceap.integrations._steps.StepsConfig`); report them with
    `traceap.trace_handler` (`html`, `windows`; the analysis runs in a background process
    unless `background` is False).  Each rank writes its own files."""

    def on_train_start(self, trainer, pl_module) -> None:
        self.profiler.start("traceap's Lightning callback")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.profiler.step()

    def on_train_end(self, trainer, pl_module) -> None:
        self.profiler.stop()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.profiler.stop()
