"""Speaking a trace's own dialect: its category names, runtime names, stream ids, args, flows.

New events are cloned from events of the same kind in the same trace (`Dialect.templates`)
and renamed and re-timed; only where a trace has no such event are names synthesised, from
what the trace is (2021-style `Operator`/`Runtime`/`Kernel` categories or today's
`cpu_op`/`cuda_runtime`/`kernel`; CUDA or HIP runtime names; ROCm's `Host` memcpy names).
`Factory` makes the events of one output and keeps its new ids unique.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..synth.ops import nccl_allreduce
from ..trace import Kind
from .edit import PH_FLOW_END, PH_FLOW_START, PH_X, Doc, Event, args_of, clone

#: Category spellings per kind when a trace has no event of that kind (old = 2021 Kineto).
_NEW_CATS = {Kind.CPU_OP: "cpu_op", Kind.USER_ANNOTATION: "user_annotation",
             Kind.PYTHON_FUNCTION: "python_function", Kind.CUDA_RUNTIME: "cuda_runtime",
             Kind.KERNEL: "kernel", Kind.GPU_MEMCPY: "gpu_memcpy", Kind.GPU_MEMSET: "gpu_memset"}
_OLD_CATS = {Kind.CPU_OP: "Operator", Kind.USER_ANNOTATION: "Operator",
             Kind.PYTHON_FUNCTION: "python_function", Kind.CUDA_RUNTIME: "Runtime",
             Kind.KERNEL: "Kernel", Kind.GPU_MEMCPY: "Memcpy", Kind.GPU_MEMSET: "Memset"}
#: Args keys worth keeping from a template: the rest describe the template's own op.
_KEEP_ARGS = {
    Kind.CPU_OP: ("Device",), Kind.USER_ANNOTATION: ("Device",), Kind.PYTHON_FUNCTION: (),
    Kind.CUDA_RUNTIME: (), Kind.CUDA_DRIVER: (),
    Kind.KERNEL: ("queued", "device", "context", "stream", "registers per thread",
                  "shared memory", "blocks per SM", "warps per SM", "grid", "block",
                  "est. achieved occupancy %", "theoretical occupancy %"),
    Kind.GPU_MEMCPY: ("device", "context", "stream"),
    Kind.GPU_MEMSET: ("device", "context", "stream"),
}


@dataclass
class Dialect:
    """What one trace calls things."""

    old: bool
    amd: bool
    cats: dict
    templates: dict                  # Kind -> template Event (host kinds from the main thread)
    runtime_by_name: dict            # runtime name -> template Event (keeps its cbid)
    launch_name: str
    memcpy_name: str                 # runtime call of async copies
    with_stack: bool
    flow_templates: tuple | None     # (start, end) ac2g / legacy launch flow events, or None
    ext_key: str                     # "External id" or "external id" on GPU events
    stream_tid: str                  # "int" (tid = stream) or "text" (tid = "stream 7")
    nccl_style: str                  # "new", "old" or "rccl"
    gpu_pid: object = 0

    # names ---------------------------------------------------------------------------------
    def rt(self, call: str) -> str:
        """A runtime call in this trace's API (`StreamSynchronize` -> cuda/hip...)."""
        return ("hip" if self.amd else "cuda") + call

    def memcpy(self, direction: str, pinned: bool) -> str:
        """The GPU memcpy name: CUDA says Pageable/Pinned, ROCm says Host."""
        if direction == "HtoD":
            host = "Host" if self.amd else ("Pinned" if pinned else "Pageable")
            return f"Memcpy HtoD ({host} -> Device)"
        host = "Host" if self.amd else ("Pinned" if pinned else "Pageable")
        return f"Memcpy DtoH (Device -> {host})"

    def nccl_kernel(self, nbytes: float) -> str:
        """An all-reduce kernel name as this trace's NCCL / RCCL generation writes it."""
        if self.nccl_style == "rccl":
            # RCCL >= 2.18 (ROCm 6) runs every collective through one generic kernel
            return "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
        return nccl_allreduce("fp32", nbytes, old_names=self.nccl_style == "old")


def dialect_of(doc: Doc, main_thread: int, compute_stream: int) -> Dialect:
    """Read the dialect of a parsed trace."""
    tr = doc.trace
    ev = doc.row_event
    cats_seen = {c.lower() for c in doc.cat_names}
    old = "operator" in cats_seen or "runtime" in cats_seen
    rt_rows = np.flatnonzero(tr.kind == Kind.CUDA_RUNTIME)
    rt_names = Counter(tr.names[i] for i in tr.name[rt_rows].tolist())
    amd = any(n.startswith("hip") for n in rt_names)
    cats = dict(_OLD_CATS if old else _NEW_CATS)
    templates: dict = {}
    main_pid = doc.thread_pid[main_thread] if main_thread >= 0 else None
    for kind in (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION, Kind.CUDA_RUNTIME,
                 Kind.KERNEL, Kind.GPU_MEMCPY, Kind.GPU_MEMSET):
        rows = np.flatnonzero(tr.kind == kind)
        if not len(rows):
            continue
        e_idx = ev[rows]
        if kind in (Kind.KERNEL, Kind.GPU_MEMCPY, Kind.GPU_MEMSET):
            pref = e_idx[doc.gpu_stream[e_idx] == compute_stream]
        else:
            pref = e_idx[doc.thread[e_idx] == main_thread]
        pick = int(pref[0] if len(pref) else e_idx[0])
        templates[kind] = doc.events[pick]
        cats[kind] = doc.events[pick].cat
    if Kind.USER_ANNOTATION not in templates:
        steps = [i for i, n in enumerate(doc.names) if n.startswith("ProfilerStep#")]
        st = np.flatnonzero(np.isin(doc.name, steps) & (doc.ph == PH_X))
        if len(st):
            templates[Kind.USER_ANNOTATION] = doc.events[int(st[0])]
            cats[Kind.USER_ANNOTATION] = doc.events[int(st[0])].cat
    runtime_by_name = {}
    for r in rt_rows.tolist():
        e = doc.events[int(ev[r])]
        if e.name not in runtime_by_name and (main_pid is None or doc.thread_pid[doc.thread[ev[r]]] == main_pid):
            runtime_by_name[e.name] = e
    launch_rows = tr.launch[tr.gpu_work_rows]
    kern = tr.kind[tr.gpu_work_rows] == Kind.KERNEL
    copy = tr.kind[tr.gpu_work_rows] == Kind.GPU_MEMCPY
    launch_name = _most_common(tr, launch_rows[kern & (launch_rows >= 0)],
                               "hipLaunchKernel" if amd else "cudaLaunchKernel")
    memcpy_name = _most_common(tr, launch_rows[copy & (launch_rows >= 0)],
                               "hipMemcpyAsync" if amd else "cudaMemcpyAsync")
    if memcpy_name not in ("cudaMemcpyAsync", "hipMemcpyAsync", "hipMemcpyWithStream"):
        memcpy_name = "hipMemcpyAsync" if amd else "cudaMemcpyAsync"
    with_stack = Kind.PYTHON_FUNCTION in templates and bool(
        np.any((doc.kind == Kind.PYTHON_FUNCTION) & (doc.thread == main_thread)))
    flow_templates = _flow_templates(doc)
    gpu_t = templates.get(Kind.KERNEL) or templates.get(Kind.GPU_MEMCPY)
    ext_key = "External id"
    stream_tid = "int"
    gpu_pid = 0
    if gpu_t is not None:
        a = args_of(gpu_t)
        if "external id" in a and "External id" not in a:
            ext_key = "external id"
        stream_tid = "text" if isinstance(gpu_t.tid, str) else "int"
        gpu_pid = gpu_t.pid
    nccl_names = [n for n in doc.names if n.startswith(("ncclDevKernel", "ncclKernel"))]
    if nccl_names:
        nccl_style = "new" if any(n.startswith("ncclDevKernel") for n in nccl_names) else "old"
        if amd:
            nccl_style = "rccl"
    else:
        nccl_style = "rccl" if amd else ("old" if old else "new")
    return Dialect(old=old, amd=amd, cats=cats, templates=templates,
                   runtime_by_name=runtime_by_name, launch_name=launch_name,
                   memcpy_name=memcpy_name, with_stack=with_stack,
                   flow_templates=flow_templates, ext_key=ext_key, stream_tid=stream_tid,
                   nccl_style=nccl_style, gpu_pid=gpu_pid)


def _most_common(tr, rows: np.ndarray, default: str) -> str:
    if not len(rows):
        return default
    return tr.names[int(np.bincount(tr.name[rows]).argmax())]


def _flow_templates(doc: Doc):
    """A launch flow pair (`ac2g`, or 2021's `async`/`launch`) whose end sits on a GPU op."""
    starts = np.flatnonzero(doc.ph == PH_FLOW_START)
    ends = np.flatnonzero(doc.ph == PH_FLOW_END)
    if not len(starts) or not len(ends):
        return None
    gpu_threads = set(doc.thread[doc.is_gpu_work].tolist())
    for e in ends.tolist():
        if doc.thread[e] in gpu_threads:
            fid = doc.flow_id[e]
            s = starts[doc.flow_id[starts] == fid]
            if len(s):
                return doc.events[int(s[0])], doc.events[e]
    return None


# -- making the events of one output -----------------------------------------------------------
@dataclass
class Factory:
    """Creates the new events of one output (unique ids, the trace's dialect, its columns)."""

    doc: Doc
    dialect: Dialect
    t0: float                                  # absolute time of relative 0
    events: list = field(default_factory=list)
    rows: list = field(default_factory=list)   # (kind, ph, thread key, stream key, corr, flow key)

    def __post_init__(self):
        ids = self.doc.max_ids
        self._corr = ids["correlation"]
        self._ext = ids["external_id"]
        self._py = _max_python_id(self.doc)

    # ids -----------------------------------------------------------------------------------
    def new_ext(self) -> int:
        """A fresh External id (one per new cpu_op / annotation)."""
        self._ext += 1
        return self._ext

    def new_corr(self) -> int:
        """A fresh correlation id (also the flow id of its launch arrow)."""
        self._corr += 1
        return self._corr

    def new_python_id(self) -> int:
        """A fresh Python id for a python_function frame."""
        self._py += 1
        return self._py

    # times ---------------------------------------------------------------------------------
    def _times(self, t0: float, t1: float) -> tuple:
        """(ts, dur) as written, from relative times (rounded relative, like `new_times`)."""
        if self.doc.ts_is_int:
            a, b = int(np.rint(t0)), int(np.rint(t1))
            return a + int(self.t0), max(b - a, 0)
        a = float(round(round(float(t0), 3) + self.t0, 3))
        b = float(round(round(float(t1), 3) + self.t0, 3))
        return a, max(float(round(b - a, 3)), 0.0)

    def _add(self, e: Event, kind: Kind, thread, stream=None, corr: int = -1, flow=None,
             ph: int = PH_X) -> Event:
        self.events.append(e)
        self.rows.append((int(kind), ph, thread, stream, corr, flow))
        return e

    # host events ---------------------------------------------------------------------------
    def host(self, kind: Kind, name: str, t0: float, t1: float, thread_key, ext: int | None = None,
             args: dict | None = None) -> Event:
        """A cpu_op / user_annotation / python_function on a host thread."""
        tmpl = self.dialect.templates.get(kind) or self.dialect.templates.get(Kind.CPU_OP)
        ts, dur = self._times(t0, t1)
        a = {k: v for k, v in args_of(tmpl).items() if k in _KEEP_ARGS.get(kind, ())} if tmpl else {}
        if kind != Kind.PYTHON_FUNCTION:
            # the profiler's own bookkeeping ids ("Record function id", "Ev Idx") are left out
            a["External id"] = self.new_ext() if ext is None else ext
        a.update(args or {})
        pid, tid = thread_key
        cat = self.dialect.cats.get(kind, "cpu_op")
        if tmpl is None:
            e = Event(ph="X", cat=cat, name=name, pid=pid, tid=tid, ts=ts, dur=dur)
            e = clone(e, args=a)
        else:
            e = clone(tmpl, cat=cat, name=name, pid=pid, tid=tid, ts=ts, dur=dur, args=a)
        return self._add(e, kind, thread_key)

    def runtime(self, name: str, t0: float, t1: float, thread_key, ext: int,
                corr: int | None = None) -> tuple[Event, int]:
        """A runtime call (cloned from one of the same name where the trace has it)."""
        tmpl = self.dialect.runtime_by_name.get(name) or self.dialect.templates.get(Kind.CUDA_RUNTIME)
        corr = self.new_corr() if corr is None else corr
        ts, dur = self._times(t0, t1)
        a = {}
        ta = args_of(tmpl) if tmpl is not None else {}
        if "cbid" in ta and tmpl is not None and tmpl.name == name:
            a["cbid"] = ta["cbid"]
        if "cid" in ta and tmpl is not None and tmpl.name == name:
            a["cid"] = ta["cid"]
        a["correlation"] = corr
        if "external id" in ta and "External id" not in ta:
            a["external id"] = ext
        else:
            a["External id"] = ext
        pid, tid = thread_key
        cat = self.dialect.cats.get(Kind.CUDA_RUNTIME, "cuda_runtime")
        base = tmpl if tmpl is not None else Event(ph="X", cat=cat)
        e = clone(base, cat=cat, name=name, pid=pid, tid=tid, ts=ts, dur=dur, args=a)
        self._add(e, Kind.CUDA_RUNTIME, thread_key, corr=corr)
        return e, corr

    # GPU events ----------------------------------------------------------------------------
    def stream_key(self, stream: tuple) -> tuple:
        """The (pid, tid) of a GPU stream (device, stream) in this trace's spelling."""
        device, s = stream
        pid = device if isinstance(self.dialect.gpu_pid, int) else self.dialect.gpu_pid
        tid = f"stream {s}" if self.dialect.stream_tid == "text" else s
        return (pid, tid)

    def gpu(self, kind: Kind, name: str, t0: float, t1: float, stream: tuple, corr: int,
            ext: int, args: dict | None = None) -> Event:
        """A kernel / memcpy / memset on GPU stream `stream` = (device, stream id)."""
        tmpl = self.dialect.templates.get(kind) or self.dialect.templates.get(Kind.KERNEL)
        ts, dur = self._times(t0, t1)
        a = {k: v for k, v in args_of(tmpl).items() if k in _KEEP_ARGS.get(kind, ())} if tmpl else {}
        a[self.dialect.ext_key] = ext
        a["device"] = stream[0]
        a["stream"] = stream[1]
        a["correlation"] = corr
        a.update(args or {})
        pid, tid = self.stream_key(stream)
        cat = self.dialect.cats.get(kind, _NEW_CATS.get(kind))
        base = tmpl if tmpl is not None else Event(ph="X", cat=cat)
        e = clone(base, cat=cat, name=name, pid=pid, tid=tid, ts=ts, dur=dur, args=a)
        return self._add(e, kind, (pid, tid), stream=stream, corr=corr)

    def flows(self, rt: Event, op: Event, corr: int) -> None:
        """The launch arrow from a runtime call to its GPU op, where the trace draws them."""
        if self.dialect.flow_templates is None:
            return
        s_t, f_t = self.dialect.flow_templates
        s = clone(s_t, pid=rt.pid, tid=rt.tid, ts=rt.ts, id=corr)
        f = clone(f_t, pid=op.pid, tid=op.tid, ts=op.ts, id=corr)
        self._add(s, Kind.OTHER, (rt.pid, rt.tid), flow=(s_t.cat, corr), ph=PH_FLOW_START)
        self._add(f, Kind.OTHER, (op.pid, op.tid), flow=(f_t.cat, corr), ph=PH_FLOW_END)


_PYTHON_ID = re.compile(rb'"Python id":\s*(\d+)')


def _max_python_id(doc: Doc) -> int:
    """The largest "Python id" of the trace's python_function frames (0 without any)."""
    rows = np.flatnonzero(doc.kind == Kind.PYTHON_FUNCTION)
    if not len(rows):
        return 0
    blob = b"".join(bytes(doc.events[r].args) for r in rows.tolist())
    return max((int(m) for m in _PYTHON_ID.findall(blob)), default=0)


__all__ = ["Dialect", "Factory", "dialect_of"]
