"""Callbacks for the training frameworks: K steps profiled and analysed through
`traceap.trace_handler`.

    from traceap.integrations.lightning import TraceapCallback      # Lightning's Trainer
    from traceap.integrations.transformers import TraceapCallback   # Hugging Face's Trainer

Each module imports its framework (an optional extra: ``pip install 'traceap[integrations]'``);
``import traceap`` imports none of them.  The profiling itself is framework-free and lives in
`traceap.integrations._steps.StepProfiler`; both callbacks take their constructor and `traces`
from `_steps.StepsCallback`.
"""
