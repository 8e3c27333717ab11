"""What every mechanism shares: the base trace's context, where to insert, and common call shapes.

A mechanism plans `Instance`s (blocks of new host activity at chosen points, see
`physics`), `physics.propagate` places them, then each instance emits its events in the
trace's dialect and says where the GPU waited (`label`).  Helpers here build the call shapes
that several mechanisms share: a cpu_op that launches one GPU op (`op_launch`), a scalar read
back to the host (`item_sync`), a collective (`collective`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...trace import Kind, merged_intervals
from ..dialect import Dialect, Factory, dialect_of
from ..edit import Doc
from ..physics import Barrier, Block, Busy, Launch, Sync, Timeline

#: Event nesting step (us): inner ranges start this much later / end this much earlier.
NEST_US = 1.0


@dataclass
class Base:
    """One base trace, parsed once and shared by every pattern and copy."""

    doc: Doc
    tl: Timeline
    dialect: Dialect
    name: str

    @classmethod
    def of(cls, doc: Doc, name: str) -> "Base":
        """Context for a parsed trace (raises nothing; usability is `Base.unusable`)."""
        tl = Timeline(doc)
        return cls(doc, tl, dialect_of(doc, tl.main_thread, tl.compute_stream), name)

    # -- identity ------------------------------------------------------------------------------
    @property
    def main_key(self) -> tuple:
        """(pid, tid) of the main thread as the trace writes them."""
        return self.doc.threads[self.tl.main_thread]

    def thread_key(self, thread: int) -> tuple:
        """(pid, tid) of a doc thread code."""
        return self.doc.threads[thread]

    def stream_key(self, code: int) -> tuple:
        """(device, stream) of a doc stream code."""
        return self.doc.gpu_stream_keys[code]

    @property
    def compute(self) -> tuple:
        """(device, stream) of the main compute stream."""
        return self.stream_key(self.tl.compute_stream)

    def nccl_stream(self) -> tuple[int, tuple]:
        """Code and (device, stream) of the trace's NCCL stream, or a new one beside compute."""
        tr = self.doc.trace
        rows = tr.gpu_work_rows[tr.is_nccl[tr.gpu_work_rows]]
        if len(rows):
            codes = self.doc.gpu_stream[self.doc.row_event[rows]]
            codes = codes[codes != self.tl.compute_stream]
            if len(codes):
                c = int(np.bincount(codes).argmax())
                return c, self.stream_key(c)
        device = self.compute[0]
        used = [s for d, s in self.doc.gpu_stream_keys if d == device]
        # NCCL's streams are created after PyTorch's pool ones: a higher id than any in use
        new = (device, max(used, default=7) + 1)
        return self.tl.n_streams, new

    def unusable(self) -> str | None:
        """Why this base cannot carry injected patterns (None when it can)."""
        if not self.doc.trace.has_gpu:
            return "no GPU kernels, memcpys or memsets"
        if self.tl.main_thread < 0:
            return "no host thread with CPU ops or runtime calls"
        if self.tl.linked_fraction < 0.5:
            return (f"only {self.tl.linked_fraction:.0%} of GPU ops link to a runtime call: "
                    "launch delays (and so the delay model) are unknown")
        return None

    # -- where things are -----------------------------------------------------------------------
    def rel(self, t):
        """Absolute trace time -> relative us."""
        return np.asarray(t, dtype=float) - self.tl.t0

    def step_rows(self) -> np.ndarray:
        """Trace rows of the main thread's ProfilerStep annotations, in time order."""
        tr = self.doc.trace
        codes = [i for i, n in enumerate(tr.names) if n.startswith("ProfilerStep#")]
        if not codes:
            return np.zeros(0, np.int64)
        rows = np.flatnonzero(np.isin(tr.name, codes) & (tr.dur > 0))
        rows = rows[self.doc.thread[self.doc.row_event[rows]] == self.tl.main_thread]
        return rows

    def children(self, row: int) -> np.ndarray:
        """Trace rows whose parent is `row` (time order)."""
        return np.flatnonzero(self.doc.trace.parent == row)

    def top_rows(self, thread: int) -> np.ndarray:
        """Rows at the top of a thread's call stacks (or just under its ProfilerStep).

        Python frames (traces recorded with_stack) wrap everything: they are looked through,
        not counted as a level.
        """
        tr = self.doc.trace
        on = self.doc.thread[self.doc.row_event] == thread
        nesting = np.isin(tr.kind, (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.CUDA_RUNTIME))
        steps = self.step_rows()
        par = self.effective_parent()
        top = on & nesting & ((par < 0) | np.isin(par, steps))
        top[steps] = False
        return np.flatnonzero(top)

    def effective_parent(self) -> np.ndarray:
        """Each row's nearest enclosing row that is not a Python frame (-1: none)."""
        cached = getattr(self, "_eff_parent", None)
        if cached is not None:
            return cached
        tr = self.doc.trace
        par = tr.parent.astype(np.int64).copy()
        todo = np.flatnonzero(par >= 0)
        while len(todo):
            py = tr.kind[par[todo]] == Kind.PYTHON_FUNCTION
            todo = todo[py]
            par[todo] = tr.parent[par[todo]]
            todo = todo[par[todo] >= 0]
        self._eff_parent = par
        return par

    def step_spans(self) -> list[tuple[int, float, float, np.ndarray]]:
        """(row, start, end, child rows) of each step, relative us; a pseudo-step when none."""
        tr = self.doc.trace
        out = []
        par = self.effective_parent()
        for r in self.step_rows().tolist():
            kids = np.flatnonzero(par == r)
            kids = kids[self.doc.thread[self.doc.row_event[kids]] == self.tl.main_thread]
            kids = kids[tr.kind[kids] != Kind.PYTHON_FUNCTION]
            out.append((r, float(tr.ts[r] - self.tl.t0), float(tr.ts[r] + tr.dur[r] - self.tl.t0),
                        kids))
        return out

    def pseudo_steps(self, n: int = 4) -> list[tuple[int, float, float, np.ndarray]]:
        """Without ProfilerSteps: the main thread's top-level rows cut into n stretches."""
        top = self.top_rows(self.tl.main_thread)
        if len(top) < 2:
            return []
        parts = np.array_split(top, min(n, len(top)))
        tr = self.doc.trace
        out = []
        for p in parts:
            if len(p):
                out.append((-1, float(tr.ts[p[0]] - self.tl.t0),
                            float((tr.ts[p] + tr.dur[p]).max() - self.tl.t0), p))
        return out

    def steps_or_stretches(self) -> list[tuple[int, float, float, np.ndarray]]:
        """Profiler steps, or stretches of top-level work when the trace has none."""
        return self.step_spans() or self.pseudo_steps()

    def steady_steps_or_stretches(self) -> list[tuple[int, float, float, np.ndarray]]:
        """`steps_or_stretches` less the first profiler step when there are two or more: the
        first is warm-up (`measures.signals.steady_from`), where rules and labels do not look."""
        steps = self.steps_or_stretches()
        return steps[1:] if len(steps) >= 2 and self.step_spans() else steps

    def batch_points(self, max_instances: int, what: str) -> list[float]:
        """Where the first `max_instances` steps (or stretches) start their first top-level op:
        where the loop gets its next batch.  Unusable when the trace has no steps to `what`."""
        steps = self.steps_or_stretches()
        if not steps:
            raise Unusable(f"no step or top-level work on the main thread to {what}")
        return [float(self.start_rel(kids[:1])[0]) if len(kids) else lo
                for _row, lo, _hi, kids in steps[:max_instances]]

    def quietest_start(self, lo: float, hi: float, kids: np.ndarray,
                       thread: int) -> float | None:
        """In a step (or stretch) [lo, hi] of `thread`, the start of the top-level op before
        which the least GPU work is queued: where a host-side plant makes the GPU wait most
        (None when the step starts no op).  A step whose ops did not nest under it (a writer
        that rounds each event alone lets the step start a ns late): its top-level ops by time."""
        if len(kids):
            starts = np.sort(self.start_rel(kids))
        else:
            top = self.start_rel(self.top_rows(thread))
            starts = top[(top >= lo) & (top < hi)]
        if not len(starts):
            return None
        return float(starts[int(np.argmin(self.tl.backlog_at(starts)))])

    def start_rel(self, rows: np.ndarray) -> np.ndarray:
        """Relative start times of trace rows."""
        return self.doc.trace.ts[rows] - self.tl.t0

    def backward_rows(self) -> np.ndarray:
        """Top-level autograd rows (`autograd::engine::evaluate_function: ...`), any thread."""
        tr = self.doc.trace
        codes = [i for i, n in enumerate(tr.names) if n.startswith("autograd::engine::evaluate_function")]
        if not codes:
            return np.zeros(0, np.int64)
        rows = np.flatnonzero(np.isin(tr.name, codes))
        par = tr.parent[rows]
        keep = (par < 0) | ~np.isin(tr.name[np.maximum(par, 0)], codes)
        return rows[keep]


@dataclass
class Instance:
    """One planted occurrence: its blocks, how it emits its events, how it is labelled."""

    blocks: list
    emit: Callable[[Factory], list]         # -> GPU spans [(t0, t1)] the label may need
    #: "idle": where the GPU waits during each block; "stretch": from the first to the last
    #: GPU idle over all blocks; "span": the GPU spans `emit` returned (collectives) and the
    #: idle around them; "work": exactly the GPU spans `emit` returned, GPU work that is the
    #: anomaly itself (FP32 kernels' extra time, layout transposes, per-parameter kernels).
    label: str = "idle"
    #: Each labelled interval must hold at least this much GPU idle, or the instance is dropped.
    min_idle_us: float = 50.0
    #: Whether a wait the plant caused later (the next step's work starting late) is labelled
    #: its too; False for plants that only make GPU work slower (FP32 kernels, transposes).
    causes_wait: bool = True
    #: The most caused wait (us, summed) the instance may be labelled with, the earliest first;
    #: None: no cap of its own.  A plant whose fix removes only part of what it delays
    #: (grad_accum's round, not the `loss.item()` beside it that drains the queue) caps it at
    #: that part.  Every instance is also held to the idle it added after it, net
    #: (`core._net_caps`).
    max_caused_us: float | None = None
    #: (first row, last row, name): cpu_op ranges over runs of base rows, placed once those
    #: rows have moved (a graph break's compiled regions).
    wrap: list | None = None
    spans: list = field(default_factory=list)
    intervals: list = field(default_factory=list)


@dataclass
class Plan:
    """A pattern's instances in one output, plus top-level keys it adds."""

    pattern: str
    instances: list
    top_changes: dict = field(default_factory=dict)

    @property
    def blocks(self) -> list:
        """Every block of every instance."""
        return [b for inst in self.instances for b in inst.blocks]


class Unusable(Exception):
    """This base has no point where the mechanism would show (the message says why)."""


# -- call shapes shared by mechanisms ----------------------------------------------------------
@dataclass
class OpCall:
    """A cpu_op stack around host work and launches: names outermost first."""

    names: list
    steps: list
    kind: Kind = Kind.CPU_OP


def op_launch(block: Block, names: list, pre: float, launch: Launch, post: float) -> OpCall:
    """A cpu_op stack (`aten::to` > `aten::_to_copy` > `aten::copy_`) that launches one op."""
    depth = len(names)
    s = [block.add(Busy(max(pre, NEST_US * depth + 1))), block.add(launch),
         block.add(Busy(max(post, NEST_US * depth + 1)))]
    return OpCall(names, s)


def host_op(block: Block, names: list, dur: float, kind: Kind = Kind.CPU_OP) -> OpCall:
    """A cpu_op stack that only keeps the host busy."""
    return OpCall(names, [block.add(Busy(max(dur, NEST_US * len(names) + 1)))], kind)


def item_sync(base: Base, block: Block, nbytes: float, gbs: float, python_us: float,
              name: str = "aten::item") -> OpCall:
    """`.item()` / `.cpu()`: a DtoH copy into pageable memory, then a stream sync.

    The host blocks until everything queued on the compute stream has run and the copy is
    done (`Sync`); the GPU then idles until the host launches again.
    """
    stream = base.tl.compute_stream
    pre = block.add(Busy(python_us))
    copy = block.add(Launch(rt_dur=6.0, stream=stream, gpu_dur=max(nbytes / (gbs * 1e3), 1.0)))
    sync = block.add(Sync(stream=stream, min_dur=3.0))
    post = block.add(Busy(2.0 + NEST_US * 3))
    names = [name, "aten::_local_scalar_dense"] if name == "aten::item" else [name, "aten::_to_copy", "aten::copy_"]
    return OpCall(names, [pre, copy, sync, post])


def emit_call(f: Factory, base: Base, call: OpCall, thread_key: tuple, memcpy: dict | None = None,
              kernel: dict | None = None) -> list:
    """The events of an `OpCall`: nested cpu_ops, runtime calls, GPU ops, launch arrows.

    `memcpy` / `kernel`: name and args of the GPU op each `Launch` runs.  Returns the GPU
    spans (relative us) of its launches.
    """
    t0 = call.steps[0].t0
    t1 = call.steps[-1].t1
    ext = None
    for d, name in enumerate(call.names):
        ext = f.new_ext()
        f.host(call.kind, name, t0 + d * NEST_US, t1 - d * NEST_US, thread_key, ext=ext)
    spans = []
    d = base.dialect
    for st in call.steps:
        if isinstance(st, Launch):
            gpu = kernel if kernel is not None else memcpy
            is_copy = kernel is None
            rt_name = d.memcpy_name if is_copy else d.launch_name
            rt, corr = f.runtime(rt_name, st.t0, st.t1, thread_key, ext)
            op = f.gpu(Kind.GPU_MEMCPY if is_copy else Kind.KERNEL, gpu["name"], st.gpu_t0,
                       st.gpu_t1, base.stream_key(st.stream) if st.stream < base.tl.n_streams
                       else gpu["stream_key"], corr, ext, gpu.get("args"))
            f.flows(rt, op, corr)
            spans.append((st.gpu_t0, st.gpu_t1))
        elif isinstance(st, Sync):
            f.runtime(d.rt("StreamSynchronize"), st.t0, st.t1, thread_key, ext)
    return spans


def copy_args(nbytes: float, dur_us: float) -> dict:
    """Args of a memcpy: bytes and the bandwidth they imply (as Kineto writes it)."""
    return {"bytes": int(nbytes), "memory bandwidth (GB/s)": float(nbytes / max(dur_us, 1e-3) / 1e3)}


def idle_intervals(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Gaps of the union of [starts, ends) inside [lo, hi] (the GPU idle there)."""
    s, e = merged_intervals(starts, ends)
    gs = np.r_[lo, e]
    ge = np.r_[s, hi]
    gs, ge = np.maximum(gs, lo), np.minimum(ge, hi)
    keep = ge > gs
    return gs[keep], ge[keep]


def loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    """A size drawn evenly on a log scale."""
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


__all__ = ["Base", "Instance", "NEST_US", "OpCall", "Plan", "Unusable", "Barrier", "Block",
           "Busy", "Launch", "Sync", "copy_args", "emit_call", "host_op", "idle_intervals",
           "item_sync", "loguniform", "op_launch"]


# -- collectives --------------------------------------------------------------------------------
#: Host cost of one eager all-reduce call (c10d::allreduce_ > record_param_comms >
#: nccl:all_reduce > launch): 47-86 us in the DLRM traces of ../shared (facebookresearch/param).
ALLREDUCE_HOST_US = (30.0, 80.0)


def collective(block: Block, stream: int, gpu_us: float, host_us: float,
               after_stream: int | None) -> OpCall:
    """An eager all-reduce: its cpu_op stack and the launch of its NCCL kernel."""
    launch = Launch(rt_dur=min(12.0, host_us / 4), stream=stream, gpu_dur=gpu_us,
                    after_stream=after_stream)
    pre = host_us * 0.6
    post = host_us - pre - launch.rt_dur
    return op_launch(block, ["c10d::allreduce_", "record_param_comms", "nccl:all_reduce"],
                     pre, launch, post)


def emit_collective(f: Factory, base: Base, call: OpCall, thread_key: tuple, nbytes: float,
                    world: int, stream_key: tuple, kernel_name: str | None = None) -> list:
    """Events of one all-reduce call: cpu_ops and annotation with comm args, kernel (named
    `kernel_name`, a clone of the base's own, or as the trace's NCCL generation names it),
    arrow."""
    t0, t1 = call.steps[0].t0, call.steps[-1].t1
    comm = {"Collective name": "allreduce", "In msg nelems": int(nbytes // 4),
            "Out msg nelems": int(nbytes // 4), "Group size": world, "dtype": "Float",
            "Process Group Name": "0", "Process Group Description": "default_pg"}
    ext = f.new_ext()
    f.host(Kind.CPU_OP, "c10d::allreduce_", t0, t1, thread_key, ext=ext)
    ext = f.new_ext()
    f.host(Kind.CPU_OP, "record_param_comms", t0 + NEST_US, t1 - NEST_US, thread_key, ext=ext,
           args=comm)
    ext = f.new_ext()
    f.host(Kind.USER_ANNOTATION, "nccl:all_reduce", t0 + 2 * NEST_US, t1 - 2 * NEST_US,
           thread_key, ext=ext)
    launch = call.steps[1]
    rt, corr = f.runtime(base.dialect.launch_name, launch.t0, launch.t1, thread_key, ext)
    grid = [max(1, min(32, int(nbytes // 65536) + 1)), 1, 1]
    op = f.gpu(Kind.KERNEL, kernel_name or base.dialect.nccl_kernel(nbytes), launch.gpu_t0,
               launch.gpu_t1, stream_key, corr, ext, dict(comm, grid=grid, block=[512, 1, 1]))
    f.flows(rt, op, corr)
    return [(launch.gpu_t0, launch.gpu_t1)]


def distributed_info(base: Base, world: int) -> dict:
    """`distributedInfo` for a single-GPU base that now runs NCCL (none when it has one)."""
    if base.doc.top is not None and "distributedInfo" in base.doc.top:
        return {}
    return {"distributedInfo": {
        "backend": "nccl", "rank": 0, "world_size": world, "pg_count": 1,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                       "pg_size": world, "ranks": list(range(world))}],
        "nccl_version": "2.20.5" if base.dialect.amd else "2.21.5"}}


def world_size(base: Base, rng: np.random.Generator) -> int:
    """The base's world size, or a drawn one (2, 4 or 8 GPUs of one node) for a single-GPU base."""
    ws = base.doc.trace.meta.world_size
    return int(ws) if ws and ws > 1 else int(rng.choice([2, 4, 8]))


def late_points(base: Base, lo: float, hi: float) -> tuple[np.ndarray, int]:
    """Insertion points in the backward of [lo, hi) (its thread), else the main thread's late half.

    Returns the relative times and the doc thread they are on.
    """
    bw = base.backward_rows()
    if len(bw):
        s = base.start_rel(bw)
        inside = bw[(s > lo) & (s < hi)]
        if len(inside) >= 2:
            thread = int(np.bincount(base.doc.thread[base.doc.row_event[inside]]).argmax())
            inside = inside[base.doc.thread[base.doc.row_event[inside]] == thread]
            if len(inside) >= 2:
                return base.start_rel(inside[1:]), thread
    top = base.top_rows(base.tl.main_thread)
    s = base.start_rel(top)
    inside = s[(s > lo + 0.5 * (hi - lo)) & (s < hi)]
    return inside, base.tl.main_thread
