"""Each anti-pattern of the simulator acts by its mechanism, where its ground truth says.

A trace is simulated twice with the same workload and seed: once as a careful user would run
it, once with one pattern switched on.  The tests read the written Kineto file back with
`traceap.load`, as every other stage does.
"""

from __future__ import annotations

import numpy as np
import pytest

import traceap
from traceap.synth import patterns as pat
from traceap.synth.models import resnet50
from traceap.synth.platforms import PLATFORMS
from traceap.synth.simulator import COMPUTE_STREAM, RunConfig, simulate
from traceap.synth.writer import trace_document, write_trace
from traceap.trace import CopyKind, Kind, MemKind, merged_intervals

MODEL = resnet50()


def _run(tmp_path, pattern: str | None, world_size: int = 1, platform: str = "a100", **kw):
    cfg = RunConfig(MODEL, PLATFORMS[platform], batch=32, res=160, world_size=world_size,
                    steps=3, seed=11, t0_us=2.0e12, **kw)
    pat.healthy(cfg, np.random.default_rng(3))
    cfg.benign_idle_us = 0.0
    if pattern:
        pat.apply(pattern, cfg, np.random.default_rng(5))
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


def test_single_process_dataloading_gpu_idles_under_the_dataloader(tmp_path):
    t, res = _run(tmp_path, "single_process_dataloading")
    ivs = _intervals(res, "single_process_dataloading")
    assert len(ivs) == 3  # every step starts with the stall
    dl = np.flatnonzero(t.name == t.code_of("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"))
    assert len(dl) == 3
    work = t.gpu_work_rows
    for a, b in ivs:
        assert any(t.ts[r] <= a + 1 and t.end[r] >= b - 10 for r in dl)   # inside the __next__
        assert _busy_in(t, work, a, b) < 0.05 * (b - a)                   # the GPU waits
    good, _ = _run(tmp_path, None)
    assert good.code_of("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__") >= 0


def test_no_pin_memory_pageable_copies_hold_the_host(tmp_path):
    t, res = _run(tmp_path, "no_pin_memory")
    ivs = _intervals(res, "no_pin_memory")
    assert ivs
    cp = np.flatnonzero((t.copy_kind == CopyKind.HTOD))
    assert (t.copy_src[cp] == MemKind.PAGEABLE).all()
    for r in cp:
        rt = t.launch[r]
        assert t.names[t.name[rt]] == "cudaMemcpyAsync"
        assert t.end[rt] >= t.end[r]            # the call returns only after the copy
        assert any(a <= t.ts[rt] and t.end[r] <= b + 1 for a, b in ivs)
    good, _ = _run(tmp_path, None)
    gcp = np.flatnonzero(good.copy_kind == CopyKind.HTOD)
    assert (good.copy_src[gcp] == MemKind.PINNED).all()
    assert np.median(good.dur[good.launch[gcp]]) < 0.2 * np.median(t.dur[t.launch[cp]])


def test_excessive_memcpy_syncs_and_small_copies_in_the_interval(tmp_path):
    t, res = _run(tmp_path, "excessive_memcpy")
    ivs = _intervals(res, "excessive_memcpy")
    assert ivs
    d2h = np.flatnonzero(t.copy_kind == CopyKind.DTOH)
    syncs = np.flatnonzero(t.is_sync)
    inside = lambda rows: sum(any(a <= t.ts[r] <= b for a, b in ivs) for r in rows)  # noqa: E731
    assert inside(d2h) >= 30 and inside(syncs) >= 30
    assert t.code_of("aten::_local_scalar_dense") >= 0
    good, _ = _run(tmp_path, None)
    assert len(np.flatnonzero(good.copy_kind == CopyKind.DTOH)) <= 3   # one loss.item() per step


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
    good, _ = _run(tmp_path, None, compiled=True)
    assert sum(n.startswith("Torch-Compiled Region: ") for n in good.names) == 1


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
    n_bad, n_good = int(t.is_nccl.sum()), int(good.is_nccl.sum())
    assert n_bad > 4 * n_good
    assert np.median(t.comm_nelems[t.is_nccl]) < 0.1 * np.median(good.comm_nelems[good.is_nccl])
    ivs = _intervals(res, "small_nccl_kernels")
    nccl = np.flatnonzero(t.is_nccl)
    assert all(any(a - 0.01 <= t.ts[r] and t.end[r] <= b + 0.01 for a, b in ivs) for r in nccl)
    assert t.meta.world_size == 2 and t.meta.rank == 0


def test_nccl_on_the_compute_stream_serialises(tmp_path):
    t, res = _run(tmp_path, "nccl_blocks_compute_stream", world_size=2)
    nccl = np.flatnonzero(t.is_nccl)
    assert (t.stream[nccl] == COMPUTE_STREAM).all()
    assert len(_intervals(res, "nccl_blocks_compute_stream")) == len(nccl)
    good, _ = _run(tmp_path, None, world_size=2)
    gn = np.flatnonzero(good.is_nccl)
    assert (good.stream[gn] != COMPUTE_STREAM).all()
    # healthy DDP overlaps the all-reduces with backward compute
    assert _busy_in(good, _compute_rows(good), good.ts[gn].min(), good.end[gn].max()) > 0


def test_allreduce_after_backward_does_not_overlap(tmp_path):
    t, res = _run(tmp_path, "nccl_compute_no_overlap", world_size=4, platform="rtx4090")
    nccl = np.flatnonzero(t.is_nccl)
    comp = _compute_rows(t)
    overlap = sum(_busy_in(t, comp, t.ts[r], t.end[r]) for r in nccl)
    assert overlap < 0.02 * t.dur[nccl].sum()
    ivs = _intervals(res, "nccl_compute_no_overlap")
    assert len(ivs) == 3


@pytest.mark.parametrize("pattern,ws", [(p, 4 if p in pat.MULTI_GPU else 1) for p in pat.TABLE2_WEIGHTS])
def test_good_trace_has_higher_utilisation_than_bad(tmp_path, pattern, ws):
    """Paper 4.1: good = high GPU utilisation / throughput; each pattern lowers it."""
    plat = "rtx4090" if pattern in pat.MULTI_GPU else "a100"
    same = {"compiled": True} if pattern == "graph_break" else {}   # compiled without breaks
    good, _ = _run(tmp_path, None, world_size=ws, platform=plat, **same)
    bad, _ = _run(tmp_path, pattern, world_size=ws, platform=plat)
    assert _compute_utilisation(good) > _compute_utilisation(bad)
    # and fewer steps per second
    assert (good.span[1] - good.span[0]) < (bad.span[1] - bad.span[0])
