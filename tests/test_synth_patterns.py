"""Each anti-pattern of the simulator acts by its mechanism, where its ground truth says.

A trace is simulated twice with the same workload and seed: once as a careful user would run
it, once with one pattern switched on.  The tests read the written Kineto file back with
`traceap.load`, as every other stage does.
"""

from __future__ import annotations

import numpy as np
import pytest

import traceap
from traceap.synth import switches
from traceap.synth.workloads import resnet50
from traceap.synth.platforms import PLATFORMS
from traceap.synth.simulator import COMPUTE_STREAM, RunConfig, simulate
from traceap.synth.writer import trace_document, write_trace
from traceap.trace import CopyKind, Kind, MemKind, merged_intervals

MODEL = resnet50()


def _run(tmp_path, pattern: str | None, world_size: int = 1, platform: str = "a100",
         after=None, **kw):
    """Simulate and reload one rank; `after(cfg)` edits the config once the pattern is set."""
    cfg = RunConfig(MODEL, PLATFORMS[platform], batch=32, res=160, world_size=world_size,
                    steps=3, seed=11, t0_us=2.0e12, **kw)
    switches.healthy(cfg, np.random.default_rng(3))
    cfg.benign_idle_us = 0.0
    if pattern:
        switches.apply(pattern, cfg, np.random.default_rng(5))
    if after:
        after(cfg)
    res = simulate(cfg)
    path = tmp_path / f"{pattern or 'good'}_{world_size}.pt.trace.json.gz"
    write_trace(path, trace_document(res, 1_700_000_000_000_000_000))
    return traceap.load(path), res


def _intervals(res, pattern):
    return [(a, b) for a, b, p in res.anomalies if p == pattern]


def _busy_in(trace, rows, a, b):
    """Time in [a, b) covered by the given GPU rows."""
    s = np.clip(trace.ts[rows], a, b)
    e = np.clip(trace.end[rows], a, b)
    ms, me = merged_intervals(s, e)
    return float((me - ms).sum())


def _compute_rows(trace):
    return np.flatnonzero((trace.kind == Kind.KERNEL) & ~trace.is_nccl)


def _compute_utilisation(trace):
    """Compute-kernel busy time over the profiled span (what the paper's good/bad label reads)."""
    rows = _compute_rows(trace)
    lo, hi = trace.span
    return _busy_in(trace, rows, lo, hi) / (hi - lo)


def _names(trace, rows):
    return [trace.names[c] for c in trace.name[rows]]


def _grad_allreduces(trace, res):
    """DDP's gradient all-reduce kernels (not the buffer broadcasts or logging collectives)."""
    rows = np.flatnonzero(trace.is_nccl)
    names = np.array(_names(trace, rows), dtype=object)
    grad = np.array(["AllReduce" in n for n in names], bool) & (trace.comm_nelems[rows] > 1)
    return rows[grad]


_LOADERS = ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__")


def _loader_rows(trace):
    return np.flatnonzero(np.isin(trace.name, [trace.code_of(n) for n in _LOADERS]))


def _assert_loader_starves_the_gpu(t, res):
    ivs = _intervals(res, "single_process_dataloading")
    assert len(ivs) >= 2          # the stall repeats every step the loader falls behind
    dl = _loader_rows(t)
    assert len(dl) == 3
    work = t.gpu_work_rows
    step = np.median([s.end_us - s.start_us for s in t.steps])
    for a, b in ivs:
        assert any(t.ts[r] <= a + 1 and t.end[r] >= b - 10 for r in dl)   # inside the __next__
        assert _busy_in(t, work, a, b) < 0.05 * (b - a)                   # the GPU waits
        assert b - a >= 0.05 * step                                       # and it matters


def test_single_process_dataloading_gpu_idles_under_the_dataloader(tmp_path):
    def main_process(cfg):
        cfg.num_workers, cfg.loader, cfg.load_us_per_sample = 0, "decode", 900.0

    t, res = _run(tmp_path, "single_process_dataloading", after=main_process)
    assert t.code_of(_LOADERS[0]) >= 0
    _assert_loader_starves_the_gpu(t, res)
    good, _ = _run(tmp_path, None)
    assert good.code_of(_LOADERS[1]) >= 0


def test_multi_worker_loader_that_falls_behind_starves_the_gpu(tmp_path):
    """Data loading starves the GPU whichever the loader: two workers for a heavy pipeline."""
    def few_workers(cfg):
        cfg.num_workers, cfg.loader_behind, cfg.loader_phase = 2, True, 0.8
        cfg.loader, cfg.load_us_per_sample = "decode", 9000.0

    t, res = _run(tmp_path, "single_process_dataloading", after=few_workers)
    assert t.code_of(_LOADERS[1]) >= 0 and t.code_of(_LOADERS[0]) < 0
    _assert_loader_starves_the_gpu(t, res)


def test_fast_single_process_loader_is_not_an_anomaly(tmp_path):
    """A cached dataset loaded in the main process: the same loader name, no stall, no label."""
    def cached(cfg):
        cfg.num_workers, cfg.loader, cfg.load_us_per_sample = 0, "cached", 5.0

    t, res = _run(tmp_path, None, after=cached)
    assert len(np.flatnonzero(t.name == t.code_of(_LOADERS[0]))) == 3
    assert not res.anomalies


def test_no_pin_memory_pageable_copies_hold_the_host(tmp_path):
    def no_extra(cfg):
        cfg.pageable_copies = 0

    t, res = _run(tmp_path, "no_pin_memory", after=no_extra)
    ivs = _intervals(res, "no_pin_memory")
    assert ivs
    cp = np.flatnonzero((t.copy_kind == CopyKind.HTOD))
    assert (t.copy_src[cp] == MemKind.PAGEABLE).all()
    for r in cp:
        rt = t.launch[r]
        assert t.names[t.name[rt]] == "cudaMemcpyAsync"
        assert t.end[rt] >= t.end[r]            # the call returns only after the copy
        assert any(a <= t.ts[rt] and t.end[r] <= b + 1 for a, b in ivs)
    good, _ = _run(tmp_path, None, after=no_extra)
    gcp = np.flatnonzero(good.copy_kind == CopyKind.HTOD)
    assert (good.copy_src[gcp] == MemKind.PINNED).all()
    assert np.median(good.dur[good.launch[gcp]]) < 0.2 * np.median(t.dur[t.launch[cp]])


def test_healthy_pageable_copies_are_small_and_unlabelled(tmp_path):
    """Labels and boxes copied from pageable memory: the pattern's memcpy name, no anomaly."""
    def labels(cfg):
        cfg.pageable_copies = 6

    t, res = _run(tmp_path, None, after=labels)
    cp = np.flatnonzero(t.copy_kind == CopyKind.HTOD)
    pageable = cp[t.copy_src[cp] == MemKind.PAGEABLE]
    pinned = cp[t.copy_src[cp] == MemKind.PINNED]
    assert len(pageable) == 3 * 6 and not res.anomalies
    assert t.bytes[pageable].max() <= 256e3 < t.bytes[pinned].max()     # the batch is pinned
    # all of them together cost a few percent of a step at most
    step = np.median([s.end_us - s.start_us for s in t.steps])
    assert t.dur[t.launch[pageable]].sum() / 3 < 0.03 * step


def test_excessive_memcpy_syncs_and_small_copies_in_the_interval(tmp_path):
    t, res = _run(tmp_path, "excessive_memcpy")
    ivs = _intervals(res, "excessive_memcpy")
    assert ivs
    d2h = np.flatnonzero(t.copy_kind == CopyKind.DTOH)
    syncs = np.flatnonzero(t.is_sync)
    inside = lambda rows: sum(any(a <= t.ts[r] <= b for a, b in ivs) for r in rows)  # noqa: E731
    assert inside(d2h) >= 30 and inside(syncs) >= 30
    assert t.code_of("aten::_local_scalar_dense") >= 0
    good, good_res = _run(tmp_path, None)
    # logging: a few .item()s per step at most, and they leave no anomaly
    assert 3 <= len(np.flatnonzero(good.copy_kind == CopyKind.DTOH)) <= 3 * 4
    assert not good_res.anomalies


def test_healthy_forward_syncs_are_one_offs_the_rules_pass(tmp_path):
    """`aten::nonzero` in the forward (a mask, `torch.where(cond)`): an 8-byte copy to the host
    and a sync per call, a short relaunch wait on the GPU, no label, and the rules name nothing
    (the one-off sync of a healthy real forward pass is not excessive_memcpy)."""
    def masks(cfg):
        cfg.forward_syncs = 2
        cfg.log_item, cfg.log_syncs, cfg.timing_sync = False, 0, False

    t, res = _run(tmp_path, None, after=masks, mode="infer")
    nz = np.flatnonzero(t.name == t.code_of("aten::nonzero"))
    assert len(nz) == 3 * 2 and not res.anomalies
    d2h = np.flatnonzero(t.copy_kind == CopyKind.DTOH)
    small = d2h[t.bytes[d2h] == 8]
    assert len(small) == 3 * 2
    # each one waits: its sync is nested in the op
    syncs = np.flatnonzero(t.is_sync)
    assert sum(any(t.ts[z] <= t.ts[s] <= t.end[z] for s in syncs) for z in nz) == len(nz)
    from traceap.analysis import analyze
    a = analyze(t, detector="expert")
    assert not [f for f in a.findings if f.severity in ("medium", "high")]


def test_graph_break_splits_the_compiled_forward(tmp_path):
    t, res = _run(tmp_path, "graph_break")
    regions = [n for n in t.names if n.startswith("Torch-Compiled Region: ")]
    assert len(regions) >= 2
    assert any(n.startswith("triton_") for n in t.names)
    ivs = _intervals(res, "graph_break")
    assert ivs
    reg_rows = np.flatnonzero(np.isin(t.name, [t.code_of(n) for n in regions]) &
                              (t.kind == Kind.USER_ANNOTATION))
    # eager aten ops run between compiled regions, inside the marked stretches
    eager = np.flatnonzero((t.kind == Kind.CPU_OP) & (t.depth == 1) &
                           np.array([n.startswith("aten::") for n in t.names])[t.name])
    in_region = np.zeros(len(eager), bool)
    for r in reg_rows:
        in_region |= (t.ts[eager] >= t.ts[r]) & (t.ts[eager] <= t.end[r])
    assert (~in_region).any()
    per_step = len(reg_rows) / 3

    def two_parts(cfg):
        cfg.compiled_parts, cfg.compiled_optimizer, cfg.compiled_loss = 2, True, False

    good, good_res = _run(tmp_path, None, compiled=True, after=two_parts)
    # no break: backbone and head compiled one by one (frames 0 and 1) and a compiled
    # optimizer step (frame 2): the region names a break also produces, without a label
    ann = np.flatnonzero((good.kind == Kind.USER_ANNOTATION) &
                         np.array([n.startswith("Torch-Compiled Region: ") for n in good.names])[good.name])
    names = _names(good, ann)
    assert [names.count(f"Torch-Compiled Region: {i}/0") for i in range(4)] == [3, 3, 3, 0]
    opt = np.flatnonzero(good.name == good.code_of("Optimizer.step#SGD.step"))
    for r in ann[np.array(names) == "Torch-Compiled Region: 2/0"]:
        assert any(good.ts[o] <= good.ts[r] and good.end[r] <= good.end[o] for o in opt)
    # between the two forward regions of a step: no eager op, no idle GPU worth a label
    first = ann[np.array(names) == "Torch-Compiled Region: 0/0"]
    second = ann[np.array(names) == "Torch-Compiled Region: 1/0"]
    eager = np.flatnonzero((good.kind == Kind.CPU_OP) & (good.depth == 1) &
                           np.array([n.startswith("aten::") for n in good.names])[good.name])
    for a, b in zip(first, second):
        assert not ((good.ts[eager] > good.end[a]) & (good.ts[eager] < good.ts[b])).any()
        assert good.ts[b] - good.end[a] < 200.0
    assert per_step >= 2 and not good_res.anomalies


def test_cpu_bound_loop_starves_the_gpu(tmp_path):
    t, res = _run(tmp_path, "cpu_bound")
    ivs = _intervals(res, "cpu_bound")
    assert ivs
    k = _compute_rows(t)
    for a, b in ivs:
        inside = k[(t.ts[k] >= a) & (t.ts[k] < b)]
        assert len(inside) > 50
        assert np.median(t.dur[inside]) < 10.0                      # tiny kernels
        assert _busy_in(t, k, a, b) < 0.3 * (b - a)                 # mostly idle GPU


def test_small_nccl_kernels_many_small_allreduces(tmp_path):
    t, res = _run(tmp_path, "small_nccl_kernels", world_size=2)
    good, _ = _run(tmp_path, None, world_size=2)
    bad_ar, good_ar = _grad_allreduces(t, res), _grad_allreduces(good, None)
    assert len(bad_ar) > 4 * len(good_ar)
    assert np.median(t.comm_nelems[bad_ar]) < 0.1 * np.median(good.comm_nelems[good_ar])
    ivs = _intervals(res, "small_nccl_kernels")
    assert all(any(a - 0.01 <= t.ts[r] and t.end[r] <= b + 0.01 for a, b in ivs) for r in bad_ar)
    assert t.meta.world_size == 2 and t.meta.rank == 0


def test_nccl_on_the_compute_stream_serialises(tmp_path):
    t, res = _run(tmp_path, "nccl_blocks_compute_stream", world_size=2)
    nccl = _grad_allreduces(t, res)
    assert (t.stream[nccl] == COMPUTE_STREAM).all()
    assert len(_intervals(res, "nccl_blocks_compute_stream")) == len(nccl)
    good, _ = _run(tmp_path, None, world_size=2)
    gn = np.flatnonzero(good.is_nccl)
    assert (good.stream[gn] != COMPUTE_STREAM).all()
    # healthy DDP overlaps the all-reduces with backward compute
    ar = _grad_allreduces(good, None)
    assert _busy_in(good, _compute_rows(good), good.ts[ar].min(), good.end[ar].max()) > 0


def test_healthy_ddp_has_small_collectives_of_every_kind(tmp_path):
    """Buffer broadcasts, a logging all-reduce, gathered embeddings: small NCCL kernels of
    several collectives and protocols in a healthy run, none of them an anomaly."""
    def chatty(cfg):
        cfg.broadcast_buffers = cfg.log_allreduce = cfg.gather_features = True

    t, res = _run(tmp_path, None, world_size=2, after=chatty)
    names = set(_names(t, np.flatnonzero(t.is_nccl)))
    for coll in ("AllReduce", "Broadcast", "AllGather", "ReduceScatter"):
        assert any(n.startswith(f"ncclDevKernel_{coll}_") for n in names), coll
    assert any("_LL(" in n for n in names)
    assert not res.anomalies


def test_allreduce_after_backward_does_not_overlap(tmp_path):
    t, res = _run(tmp_path, "nccl_compute_no_overlap", world_size=4, platform="rtx4090")
    nccl = np.flatnonzero(t.is_nccl)
    comp = _compute_rows(t)
    overlap = sum(_busy_in(t, comp, t.ts[r], t.end[r]) for r in nccl)
    assert overlap < 0.02 * t.dur[nccl].sum()
    ivs = _intervals(res, "nccl_compute_no_overlap")
    assert len(ivs) == 3


@pytest.mark.parametrize("pattern,ws", [(p, 4 if p in switches.MULTI_GPU else 1)
                                        for p in switches.TABLE2_WEIGHTS])
def test_good_trace_has_higher_utilisation_than_bad(tmp_path, pattern, ws):
    """Paper 4.1: good = high GPU utilisation / throughput; each pattern lowers it."""
    plat = "rtx4090" if pattern in switches.MULTI_GPU else "a100"
    same = {"compiled": True} if pattern == "graph_break" else {}   # compiled without breaks
    good, _ = _run(tmp_path, None, world_size=ws, platform=plat, **same)
    bad, _ = _run(tmp_path, pattern, world_size=ws, platform=plat)
    assert _compute_utilisation(good) > _compute_utilisation(bad)
    # and fewer steps per second
    assert (good.span[1] - good.span[0]) < (bad.span[1] - bad.span[0])


def test_no_channels_last_switch_marks_the_transposes_the_rule_measures(tmp_path):
    """Beyond the paper: NCHW convolutions wrapped in cuDNN transposes, marked as busy time."""
    from traceap.analysis import analyze
    from traceap.measures.layout import conv_transpose_rows
    from traceap.measures.signals import steady_rows
    tr, res = _run(tmp_path, "no_channels_last", dt="bf16", channels_last=True)
    marks = _intervals(res, "no_channels_last")
    rows = steady_rows(tr, conv_transpose_rows(tr))  # the first step is warm-up: not marked
    assert len(marks) == len(rows) > 0 and len(conv_transpose_rows(tr)) > len(rows)
    lost = sum(b - a for a, b in marks)
    a = analyze(tr, detector="expert")
    f = next(f for f in a.findings if f.pattern == "no_channels_last")
    assert f.time_lost_us == pytest.approx(lost, rel=0.05)
    good, res = _run(tmp_path, None, dt="bf16", channels_last=True)
    assert not len(conv_transpose_rows(good)) and not _intervals(res, "no_channels_last")
