"""The trace simulator and the TorchTraceAP-like dataset generator (`traceap synth`).

    from traceap.synth import SynthConfig, generate
    generate("datasets/torchtraceap", SynthConfig(traces=610, seed=0, jobs=2))

Lower level: `simulator.RunConfig` + `simulator.simulate` play one rank's profiled steps;
`writer.trace_document` / `writer.write_trace` write them as Kineto JSON.
"""

from .dataset import MIN_TRACES_ALL_PATTERNS, SynthConfig, SynthReport, generate, plan, split_counts
from .simulator import RunConfig, RunResult, simulate

__all__ = ["MIN_TRACES_ALL_PATTERNS", "RunConfig", "RunResult", "SynthConfig", "SynthReport", "generate", "plan",
           "simulate", "split_counts"]
