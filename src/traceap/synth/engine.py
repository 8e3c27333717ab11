"""The event engine: host threads, CUDA streams, a launch queue, and what Kineto records.

`Engine` keeps a clock per host thread and a "free at" time per GPU stream.  A launch is a
runtime call on a thread (`cudaLaunchKernel`, `cuLaunchKernel` for Triton, ...) whose kernel
starts on its stream when both the launch has reached the GPU and the stream is free; a full
launch queue blocks the thread.  Blocking calls (`cudaStreamSynchronize`, pageable memcpys)
move the thread clock to the stream's free time.  Every event is written as Kineto writes it:
cpu_op / user_annotation / cuda_runtime / cuda_driver on (pid, tid), kernel / gpu_memcpy /
gpu_memset / gpu_user_annotation on (device, stream), and an `ac2g` flow per launch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

#: CUDA's launch queue holds this many pending kernels per stream before launches block.
LAUNCH_QUEUE_DEPTH = 1024
#: Runtime callback ids Kineto writes in `cbid` (CUPTI's cudaLaunchKernel_v7000 etc.).
CBID = {"cudaLaunchKernel": 211, "cudaMemcpyAsync": 41, "cudaStreamSynchronize": 131,
        "cudaMemsetAsync": 51, "cudaEventRecord": 135, "cudaStreamWaitEvent": 147,
        "cudaFuncSetAttribute": 239, "cudaStreamIsCapturing": 317, "cudaLaunchKernelExC": 430,
        "cudaDeviceSynchronize": 165, "cudaEventQuery": 137, "cuLaunchKernel": 307,
        "cudaStreamGetPriority": 203, "cudaDeviceGetStreamPriorityRange": 205,
        "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags": 251}


@dataclass
class Interval:
    """A ground-truth anomaly occurrence (trace clock, us)."""

    start: float
    end: float
    pattern: str


@dataclass
class _Span:
    """An open annotation: where it started and the GPU range of what launched inside."""

    name: str
    tid: int
    start: float
    ext: int
    cat: str
    gpu_lo: float = float("inf")
    gpu_hi: float = float("-inf")
    gpu_stream: int = -1
    args: dict = field(default_factory=dict)


class Engine:
    """Clocks, streams and the event list of one rank's trace."""

    def __init__(self, rng: np.random.Generator, t0: float, pid: int, main_tid: int,
                 bw_tid: int, device: int, sms: int, threads_per_sm: int, cpu_speed: float,
                 corr0: int = 1):
        self.rng = rng
        self.events: list[dict] = []
        self.pid, self.device = pid, device
        self.main, self.bw = main_tid, bw_tid
        self.clock = {main_tid: t0, bw_tid: t0}
        self.free: dict[int, float] = {}
        self.queues: dict[int, deque] = {}
        self.ext = 0
        self.corr = corr0
        self.seq = 0
        self.sms, self.tpsm = sms, threads_per_sm
        self.cpu_speed = cpu_speed
        #: multiplies every host cost (a slow Python loop, a loaded machine)
        self.cpu_scale = 1.0
        self.open: list[_Span] = []
        self.anomalies: list[Interval] = []
        # jitter factors drawn once: numpy scalar draws per event would dominate the run time
        self._jit = rng.lognormal(0.0, 0.22, 1 << 15)
        self._ji = 0
        # driver calls have a long tail (page faults, preemption, lock contention): real
        # cudaLaunchKernel p50 5-9 us, p99 12-50 us over the shared A100/H100/V100 traces
        self._tail = np.where(rng.random(1 << 12) < 0.045, rng.uniform(1.6, 6.0, 1 << 12), 1.0)
        self._ti = 0
        self.n_launch = 0
        #: the NCCL stream and its last kernel: NCCL kernels hold SMs (one block per channel)
        #: and memory bandwidth, so compute kernels running beside one are slowed
        self.comm_stream = -1
        self.comm_busy = (0.0, 0.0)
        self.contention = 1.15

    # -- small helpers ------------------------------------------------------------------------
    def jit(self) -> float:
        """A multiplicative jitter factor (lognormal, median 1)."""
        self._ji = (self._ji + 1) & 0x7FFF
        return float(self._jit[self._ji])

    def host(self, us: float) -> float:
        """Host cost of `us` typical-core microseconds on this machine, jittered."""
        return us * self.jit() * self.cpu_scale / self.cpu_speed

    def rt_cost(self, us: float) -> float:
        """Cost of a CUDA runtime call: driver work, not Python, so no host-slowness factor."""
        self._ti = (self._ti + 1) & 0xFFF
        return us * self.jit() * float(self._tail[self._ti]) / self.cpu_speed

    def next_ext(self) -> int:
        self.ext += 1
        return self.ext

    def stream_free(self, stream: int) -> float:
        """When a stream has finished everything queued so far."""
        return self.free.get(stream, 0.0)

    def mark(self, pattern: str, start: float, end: float) -> None:
        """Record a ground-truth occurrence of an anti-pattern."""
        if end > start:
            self.anomalies.append(Interval(float(start), float(end), pattern))

    # -- CPU-side events ------------------------------------------------------------------------
    def cpu_event(self, tid: int, name: str, ts: float, dur: float, ext: int,
                  cat: str = "cpu_op", extra: dict | None = None) -> None:
        args = {"External id": ext, "Record function id": 0}
        if extra:
            args.update(extra)
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid,
                            "ts": round(ts, 3), "dur": round(dur, 3), "args": args})

    def begin(self, tid: int, name: str, cat: str = "user_annotation", gpu: bool = True,
              args: dict | None = None) -> _Span:
        """Open an annotation (record_function) on a thread; close it with `end`."""
        s = _Span(name, tid, self.clock[tid], self.next_ext(), cat, args=args or {})
        if not gpu:
            s.gpu_stream = -2  # no gpu_user_annotation for this one
        self.open.append(s)
        self.clock[tid] += self.host(1.5)
        return s

    def end(self, s: _Span) -> None:
        """Close an annotation: its CPU span, and the GPU span of the kernels it launched."""
        self.clock[s.tid] += self.host(1.0)
        self.open.remove(s)
        self.cpu_event(s.tid, s.name, s.start, self.clock[s.tid] - s.start, s.ext, s.cat, s.args)
        if s.gpu_stream >= 0 and s.gpu_hi > s.gpu_lo:
            self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": s.name,
                                "pid": self.device, "tid": s.gpu_stream, "ts": round(s.gpu_lo, 3),
                                "dur": round(s.gpu_hi - s.gpu_lo, 3), "args": {"External id": s.ext}})

    def idle(self, tid: int, us: float) -> None:
        """Host time that leaves no event (Python between ops, with_stack off)."""
        self.clock[tid] += us

    def runtime(self, tid: int, name: str, dur: float, ext: int, cat: str = "cuda_runtime") -> int:
        """A CUDA runtime/driver call without GPU work; returns its correlation id."""
        self.corr += 1
        t = self.clock[tid]
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid,
                            "ts": round(t, 3), "dur": round(dur, 3),
                            "args": {"External id": ext, "cbid": CBID.get(name, 0),
                                     "correlation": self.corr}})
        self.clock[tid] = t + dur
        return self.corr

    # -- GPU work -------------------------------------------------------------------------------
    def _gpu_start(self, tid: int, stream: int, not_before: float) -> tuple[float, float]:
        """(host time the launch is issued, GPU start) honouring the launch queue."""
        t = self.clock[tid]
        q = self.queues.get(stream)
        if q is None:
            q = self.queues[stream] = deque(maxlen=LAUNCH_QUEUE_DEPTH)
        if len(q) == LAUNCH_QUEUE_DEPTH and q[0] > t:
            t = q[0]  # queue full: the launch call spins until a slot frees
        # a launch reaches an idle GPU ~6-12 us after the call starts (real traces: median
        # 8-13 us); back-to-back kernels on a busy stream leave ~1-2 us between them (real
        # GPU-bound windows: mean log(1 + gap) 0.9, i.e. ~1.5 us)
        start = max(t + 4.0 + 4.0 * self.jit(), self.free.get(stream, 0.0) + 0.5 + 1.0 * self.jit() ** 2,
                    not_before)
        q.append(start)
        return t, start

    def _note_gpu(self, start: float, end: float, stream: int) -> None:
        for s in self.open:
            if s.gpu_stream == -2:
                continue
            if start < s.gpu_lo:
                s.gpu_lo = start
            if end > s.gpu_hi:
                s.gpu_hi = end
            if s.gpu_stream < 0:
                s.gpu_stream = stream

    def launch(self, tid: int, name: str, gpu_us: float, stream: int, ext: int,
               block: int = 256, regs: int = 32, smem: int = 0, runtime: str = "cudaLaunchKernel",
               not_before: float = 0.0, extra_args: dict | None = None) -> tuple[float, float]:
        """Launch one kernel; returns its (start, end) on the GPU."""
        issued, start = self._gpu_start(tid, stream, not_before)
        if stream == self.comm_stream:
            self.comm_busy = (start, start + gpu_us)
        elif self.comm_busy[0] <= start < self.comm_busy[1]:
            gpu_us *= self.contention
        # cudaLaunchKernel: median 8 us over the shared real traces (5-10 us per trace)
        rt = self.rt_cost(7.5 if runtime != "cuLaunchKernel" else 4.5)
        rt_dur = (issued - self.clock[tid]) + rt
        ts = self.clock[tid]
        self.corr += 1
        corr = self.corr
        cat = "cuda_driver" if runtime.startswith("cu") and not runtime.startswith("cuda") else "cuda_runtime"
        self.events.append({"ph": "X", "cat": cat, "name": runtime, "pid": self.pid, "tid": tid,
                            "ts": round(ts, 3), "dur": round(rt_dur, 3),
                            "args": {"External id": ext, "cbid": CBID.get(runtime, 0),
                                     "correlation": corr}})
        self.clock[tid] = ts + rt_dur
        end = start + gpu_us
        self.free[stream] = end
        grid = max(1, int(self.sms * min(64.0, max(0.02, gpu_us / 12.0)) * (0.6 + 0.8 * self.jit() / 2)))
        bps = grid / self.sms
        wps = bps * max(1, block // 32)
        args = {"External id": ext, "queued": 0, "device": self.device, "context": 1,
                "stream": stream, "correlation": corr, "registers per thread": regs,
                "shared memory": smem, "blocks per SM": round(bps, 6), "warps per SM": round(wps, 6),
                "grid": [grid, 1, 1], "block": [block, 1, 1],
                "est. achieved occupancy %": int(min(100.0, 100.0 * wps / (self.tpsm / 32)))}
        if extra_args:
            args.update(extra_args)
        k_ts = round(start, 3)
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": self.device,
                            "tid": stream, "ts": k_ts, "dur": round(gpu_us, 3), "args": args})
        self.events.append({"ph": "s", "id": corr, "pid": self.pid, "tid": tid, "ts": round(ts, 3),
                            "cat": "ac2g", "name": "ac2g"})
        self.events.append({"ph": "f", "id": corr, "pid": self.device, "tid": stream, "ts": k_ts,
                            "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self._note_gpu(start, end, stream)
        self.n_launch += 1
        return start, end

    def memcpy(self, tid: int, kind: str, nbytes: float, gbs: float, stream: int, ext: int,
               blocking: bool, runtime: str = "cudaMemcpyAsync") -> tuple[float, float, float]:
        """A copy (`kind` like "HtoD (Pinned -> Device)"); blocking copies hold the thread.

        Returns (host call start, GPU start, GPU end).
        """
        issued, start = self._gpu_start(tid, stream, 0.0)
        ts = self.clock[tid]
        dur_gpu = 1.8 + nbytes / (gbs * 1e3)
        end = start + dur_gpu
        self.free[stream] = end
        rt_dur = (issued - ts) + self.rt_cost(6.0)
        if blocking:
            rt_dur = max(rt_dur, end - ts + self.rt_cost(3.0))
        self.corr += 1
        corr = self.corr
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": runtime, "pid": self.pid,
                            "tid": tid, "ts": round(ts, 3), "dur": round(rt_dur, 3),
                            "args": {"External id": ext, "cbid": CBID.get(runtime, 41),
                                     "correlation": corr}})
        self.clock[tid] = ts + rt_dur
        self.events.append({"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy {kind}",
                            "pid": self.device, "tid": stream, "ts": round(start, 3),
                            "dur": round(dur_gpu, 3),
                            "args": {"External id": ext, "device": self.device, "context": 1,
                                     "stream": stream, "correlation": corr, "bytes": int(nbytes),
                                     "memory bandwidth (GB/s)": round(nbytes / dur_gpu / 1e3, 6)}})
        self.events.append({"ph": "s", "id": corr, "pid": self.pid, "tid": tid, "ts": round(ts, 3),
                            "cat": "ac2g", "name": "ac2g"})
        self.events.append({"ph": "f", "id": corr, "pid": self.device, "tid": stream,
                            "ts": round(start, 3), "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self._note_gpu(start, end, stream)
        return ts, start, end

    def memset(self, tid: int, nbytes: float, gbs: float, stream: int, ext: int) -> None:
        """cudaMemsetAsync and its `Memset (Device)` (zeros, gradient buckets)."""
        issued, start = self._gpu_start(tid, stream, 0.0)
        ts = self.clock[tid]
        dur = 1.5 + nbytes / (gbs * 1e3)
        self.free[stream] = start + dur
        rt = (issued - ts) + self.rt_cost(4.0)
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemsetAsync",
                            "pid": self.pid, "tid": tid, "ts": round(ts, 3), "dur": round(rt, 3),
                            "args": {"External id": ext, "cbid": 51, "correlation": self.corr}})
        self.clock[tid] = ts + rt
        self.events.append({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)",
                            "pid": self.device, "tid": stream, "ts": round(start, 3),
                            "dur": round(dur, 3),
                            "args": {"External id": ext, "device": self.device, "context": 1,
                                     "stream": stream, "correlation": self.corr,
                                     "bytes": int(nbytes),
                                     "memory bandwidth (GB/s)": round(nbytes / dur / 1e3, 6)}})
        self.events.append({"ph": "s", "id": self.corr, "pid": self.pid, "tid": tid,
                            "ts": round(ts, 3), "cat": "ac2g", "name": "ac2g"})
        self.events.append({"ph": "f", "id": self.corr, "pid": self.device, "tid": stream,
                            "ts": round(start, 3), "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self._note_gpu(start, start + dur, stream)

    def sync(self, tid: int, stream: int | None, ext: int) -> tuple[float, float]:
        """cudaStreamSynchronize (or cudaDeviceSynchronize): the thread waits for the GPU."""
        t = self.clock[tid]
        if stream is None:
            done = max(self.free.values(), default=t)
            name = "cudaDeviceSynchronize"
        else:
            done = self.free.get(stream, t)
            name = "cudaStreamSynchronize"
        dur = max(done - t, 0.0) + self.rt_cost(2.5)
        self.runtime(tid, name, dur, ext)
        return t, t + dur
