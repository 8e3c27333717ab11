"""recompilation: torch.compile compiles a frame again in a later, steady-state step.

Mechanism: a guard of the compiled model fails at the start of a later step's forward (a new
batch shape), so Dynamo misses its cache (`TorchDynamo Cache Lookup`), traces the frame again
and Inductor compiles it (`_compile.compile_inner` > `OutputGraph.call_user_compiler` >
`create_aot_dispatcher_function` > `compile_fx_inner` > `GraphLowering.compile_to_module`, the
`(dynamo_timed)` ranges PyTorch records; `torch/_dynamo/convert_frame.py` and
`torch/_inductor/compile_fx.py` frames too in a with_stack trace), all on the host, before the
forward's launches; the forward then runs as `Torch-Compiled Region: F/C` with C > 0.  The GPU
drains its queue and idles for the rest of the compile.  Label: where the GPU waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...measures.compile_regions import FRAME
from ...patterns._registry import register_piece
from ...trace import Kind
from ..dialect import Factory
from .base import NEST_US, Base, Block, Busy, Instance, Plan, Unusable

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "recompilation"

#: The compile phases PyTorch's `dynamo_timed` records, outermost first, with where each
#: starts and ends as a share of the compile (Dynamo's tracing first, Inductor's codegen and
#: Triton compilation last: the phase split TORCH_LOGS=dynamo reports for a ResNet block).
PHASES = (("_compile.compile_inner (dynamo_timed)", 0.0, 1.0),
          ("OutputGraph.call_user_compiler (dynamo_timed)", 0.18, 0.985),
          ("create_aot_dispatcher_function (dynamo_timed)", 0.2, 0.98),
          ("compile_fx_inner (dynamo_timed)", 0.35, 0.97),
          ("GraphLowering.compile_to_module (dynamo_timed)", 0.6, 0.96))
#: The python frames of the same phases in a with_stack trace (PyTorch 2.5 line numbers).
FRAMES = (("torch/_dynamo/convert_frame.py(1126): _compile", 0.0, 1.0),
          ("torch/_dynamo/output_graph.py(1446): call_user_compiler", 0.18, 0.985),
          ("torch/_inductor/compile_fx.py(731): compile_fx_inner", 0.35, 0.97))


@dataclass(frozen=True)
class Config:
    """Sizes of a planted recompile."""

    #: The compile's length in median steps: a recompile of a vision model takes 1-60 s on
    #: real hardware (tens to thousands of steps); planted at 0.5-3 steps it stays
    #: proportionate to a few-step trace and still dwarfs any graph break.
    steps: tuple = (0.5, 3.0)
    #: ... and in absolute terms (us): at least 2 ms, at most 3 s.
    min_us: float = 2000.0
    max_us: float = 3e6
    #: `TorchDynamo Cache Lookup` (us) that misses: 22.5 us in ../shared's
    #: torch_compile_triton trace, up to ~100 us with many guards.
    lookup_us: tuple = (15.0, 100.0)
    #: Recompiles are rare: at most this many steps get one.
    max_instances: int = 2


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """A recompile at the start of a later step's first top-level op (its forward)."""
    steps = base.step_spans()
    if len(steps) < 2:
        raise Unusable("fewer than two profiler steps: a compile in the only step is warm-up")
    med = float(np.median([hi - lo for _r, lo, hi, _k in steps]))
    frame, cid = _next_compile_id(base)
    thread = base.main_key
    top = base.top_rows(base.tl.main_thread)
    top_at = base.start_rel(top)
    # a step whose ops are not its children (another thread's step range, a flat trace): the
    # main thread's top-level ops inside it
    later = [(r, lo, hi, kids if len(kids) else top[(top_at >= lo) & (top_at < hi)])
             for r, lo, hi, kids in steps[1:]]
    later = [s for s in later if len(s[3])]
    if not later:
        raise Unusable("no later profiler step has top-level ops to compile before")
    picks = sorted(rng.choice(len(later), size=min(config.max_instances, len(later)),
                              replace=False).tolist())
    instances = []
    for n, i in enumerate(picks):
        _row, lo, hi, kids = later[i]
        first = kids[np.argmin(base.start_rel(kids))]
        T = float(base.start_rel(np.array([first]))[0])
        D = float(np.clip(rng.uniform(*config.steps) * med, config.min_us, config.max_us))
        block = Block(T=T, thread=base.tl.main_thread)
        lookup = block.add(Busy(rng.uniform(*config.lookup_us)))
        comp = block.add(Busy(D))
        name = f"Torch-Compiled Region: {frame}/{cid + n}"

        def emit(f: Factory, lookup=lookup, comp=comp):
            f.host(Kind.CPU_OP, "TorchDynamo Cache Lookup", lookup.t0, lookup.t1, thread)
            d = comp.t1 - comp.t0
            for depth, (nm, a, b) in enumerate(PHASES):
                f.host(Kind.USER_ANNOTATION, nm, comp.t0 + a * d + depth * NEST_US,
                       comp.t0 + b * d - depth * NEST_US, thread)
            if base.dialect.with_stack:
                parent = None
                for depth, (nm, a, b) in enumerate(FRAMES):
                    pid = f.new_python_id()
                    f.host(Kind.PYTHON_FUNCTION, nm, comp.t0 + a * d + (depth + 0.5) * NEST_US,
                           comp.t0 + b * d - (depth + 0.5) * NEST_US, thread,
                           args={"Python parent id": parent, "Python id": pid})
                    parent = pid
            return []

        # the recompiled graph runs the op the compile preceded
        instances.append(Instance([block], emit, min_idle_us=0.3 * D,
                                  wrap=[(int(first), int(first), name)]))
    return Plan(PATTERN, instances)


def _next_compile_id(base: Base) -> tuple[int, int]:
    """(frame F, next compile id C) for a new `Torch-Compiled Region: F/C`: the base's first
    compiled frame and one past its highest compile id, or frame 0, compile 1."""
    ids = [(int(m.group(1)), int(m.group(2))) for n in base.doc.trace.names
           if (m := FRAME.match(n))]
    if not ids:
        return 0, 1
    frame = min(f for f, _ in ids)
    return frame, max(c for f, c in ids if f == frame) + 1


# -- the natural label: where a real trace shows the pattern by itself ----------------------
#: A compile span counts when it lasts >= 1 ms (a compile of the smallest graph takes longer)
#: and the GPU runs no kernel for at least half of it.
MIN_COMPILE_US = 1000.0
IDLE_SHARE = 0.5


def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Compile work after the first profiler step while the GPU idles (`traceap label`)."""
    from ...measures.compile_regions import recompile_rows
    tr = c.tr
    rows = recompile_rows(tr)
    if not len(rows):
        return
    o = rows[np.argsort(tr.ts[rows], kind="stable")]
    reach = np.maximum.accumulate(tr.end[o])
    outer = o[np.r_[True, tr.ts[o[1:]] >= reach[:-1]]]
    for r in outer.tolist():
        s, e = float(tr.ts[r]), float(tr.end[r])
        if e - s < MIN_COMPILE_US:
            continue
        gs, ge = c.idle_in(s, e)
        if (ge - gs).sum() >= IDLE_SHARE * (e - s):
            yield gs[0], ge[-1]


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
