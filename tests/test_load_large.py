"""Large traces: the benchmark generator's output loads exactly, and chunked reading is exact."""

from __future__ import annotations

import importlib
import importlib.util
import json

import numpy as np
import pytest

import traceap
from traceap.info import summarize
from traceap.trace import Kind

from .conftest import DATA, REPO, CNN

kineto = importlib.import_module("traceap.load.kineto")


def _generator():
    spec = importlib.util.spec_from_file_location(
        "make_large_trace", REPO / "benchmarks" / "make_large_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _same(a, b) -> None:
    assert a.names == b.names
    for col in a.COLUMNS:
        x, y = getattr(a, col), getattr(b, col)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), col
    assert vars(a.meta) == vars(b.meta)
    assert [(s.number, s.start_us, s.end_us) for s in a.steps] == \
        [(s.number, s.start_us, s.end_us) for s in b.steps]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    out = tmp_path_factory.mktemp("large") / "replayed.json"
    info = _generator().write_large(CNN, out, target_bytes=0, copies=3)
    return out, info


def test_replayed_trace_has_exact_counts_and_links(replayed, sample_trace):
    path, info = replayed
    assert info["copies"] == 3
    big = traceap.load(path)
    one, three = summarize(sample_trace), summarize(big)
    for key in ("n_events", "n_kernels", "n_cpu_ops", "n_runtime_calls", "n_memcpy",
                "n_memset", "n_nccl_kernels", "n_profiler_steps"):
        assert three[key] == 3 * one[key], key
    assert [s.number for s in big.steps] == [4, 5, 6, 7, 8, 9, 10, 11, 12]
    # Ids renumbered per copy: every GPU event still finds its own launch, one per launch.
    gpu = big.rows(Kind.KERNEL, Kind.GPU_MEMCPY, Kind.GPU_MEMSET)
    assert (big.launch[gpu] >= 0).all()
    assert (big.correlation[big.launch[gpu]] == big.correlation[gpu]).all()
    assert len(np.unique(big.launch[gpu])) == len(gpu)
    assert (big.launch_delay[gpu] >= -1.0).all()
    # The meta file says what was written.
    meta = json.loads(path.with_name(path.name + ".meta.json").read_text())
    assert meta["copies"] == 3 and meta["bytes"] == path.stat().st_size


def test_small_chunks_read_exactly_like_one_chunk(monkeypatch, sample_trace):
    monkeypatch.setattr(kineto, "CHUNK_EVENTS", 97)
    _same(traceap.load(CNN), sample_trace)


def test_flow_links_and_odd_events_survive_chunk_edges(monkeypatch, tmp_path):
    doc = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": -5},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": "30", "dur": "2.5",
         "args": {"stream": "7", "correlation": 1, "device": 0}},
        {"ph": "X", "cat": "kernel", "name": "k3", "pid": 0, "tid": 7, "ts": 45, "dur": 2,
         "args": "not an object"},
        "not an event",
        {"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 1, "dur": 3},
    ]}
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(doc))
    for path in (DATA / "amd_mi300_gemm.json.gz", DATA / "kineto2021_v100.json.gz", odd):
        whole = traceap.load(path)
        monkeypatch.setattr(kineto, "CHUNK_EVENTS", 3)
        _same(traceap.load(path), whole)
        monkeypatch.setattr(kineto, "CHUNK_EVENTS", 1 << 13)
    t = traceap.load(odd)
    assert len(t) == 3
    assert any("1 events with malformed fields" in w for w in t.meta.warnings)  # "not an event"


def test_other_phases_are_counted_and_ignored_without_warnings(tmp_path):
    """Begin/end, counters, async and unknown phases, or no ph at all: raw events, not rows."""
    x = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5}
    others = [{"ph": "B", "name": "b", "pid": 1, "tid": 1, "ts": 11},
              {"ph": "E", "pid": 1, "tid": 1, "ts": 12},
              {"ph": "C", "name": "mem", "pid": 1, "ts": 13, "args": {"bytes": 5}},
              {"ph": "b", "cat": "async", "name": "a", "id": 3, "pid": 1, "ts": 14},
              {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "python"}}]
    odd = [{"ph": "Z", "name": "unknown phase", "pid": 1, "ts": 15},
           {"name": "no phase", "pid": 1, "ts": 16}]
    for extra, n_raw in ((others, 6), (others + odd, 8)):
        p = tmp_path / "phases.json"
        p.write_text(json.dumps({"traceEvents": [x, *extra]}))
        t = traceap.load(p)
        assert len(t) == 1 and t.meta.n_raw_events == n_raw and t.meta.n_metadata == 1
        assert not any("malformed" in w for w in t.meta.warnings)
