"""The reader: every real trace loads, counts match a plain json.load, links are right."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import traceap
from traceap.info import summarize
from traceap.trace import CopyKind, Kind, MemKind

from .conftest import DATA, CNN, needs_shared, shared_trace_files

_STEP = re.compile(r"^ProfilerStep#\d+$")


def independent_counts(path) -> dict:
    """Counts from a plain stdlib json.load, written without any traceap code."""
    with gzip.open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    cats: dict[str, int] = {}
    n_events = steps = nccl = 0
    for e in events:
        ph = e.get("ph")
        if ph in ("X", "i", "I", "s", "f", "t"):
            n_events += 1
        if ph != "X":
            continue
        cat = (e.get("cat") or "").lower()
        cats[cat] = cats.get(cat, 0) + 1
        name = e.get("name", "")
        if cat == "kernel" and ("nccl" in name.lower() or "rccl" in name.lower()):
            nccl += 1
        if _STEP.match(name) and cat != "gpu_user_annotation":
            steps += 1
    return {
        "n_events": n_events,
        "n_kernels": cats.get("kernel", 0),
        "n_memcpy": cats.get("gpu_memcpy", 0) + cats.get("memcpy", 0),
        "n_memset": cats.get("gpu_memset", 0) + cats.get("memset", 0),
        "n_cpu_ops": cats.get("cpu_op", 0) + cats.get("operator", 0),
        "n_runtime_calls": cats.get("cuda_runtime", 0) + cats.get("runtime", 0),
        "n_nccl_kernels": nccl,
        "n_profiler_steps": steps,
    }


@needs_shared
@pytest.mark.parametrize("path", shared_trace_files(), ids=lambda p: p.name[:60])
def test_every_shared_trace_matches_plain_json_counts(path):
    info = summarize(traceap.load(path))
    expected = independent_counts(path)
    assert {k: info[k] for k in expected} == expected


@pytest.mark.parametrize("name", ["kineto2021_v100.json.gz", "amd_mi300_gemm.json.gz",
                                  "amd_mi250_train.json.gz", "particle_transformer_bs8.json.gz"])
def test_bundled_fixtures_match_plain_json_counts(name):
    path = DATA / name
    info = summarize(traceap.load(path))
    expected = independent_counts(path)
    assert {k: info[k] for k in expected} == expected


def test_old_category_names_map_to_the_same_kinds():
    t = traceap.load(DATA / "kineto2021_v100.json.gz")
    kinds = set(int(k) for k in t.kind)
    assert {Kind.CPU_OP, Kind.CUDA_RUNTIME, Kind.KERNEL, Kind.GPU_MEMCPY} <= kinds
    # GPU threads were named "stream 7": the stream number still comes through.
    assert t.gpu_streams == [7]
    assert t.gpu_name == "Tesla V100-DGXS-32GB"  # from the 2021 "computeProperties"


def test_amd_runtime_calls_with_hex_streams_keep_their_events_and_link_by_flow():
    t = traceap.load(DATA / "amd_mi300_gemm.json.gz")
    kernels = t.rows(Kind.KERNEL)
    assert len(kernels) == 20
    launchers = t.launch[kernels]
    assert (launchers >= 0).all()
    assert all(t.name_of(r).startswith("hip") for r in launchers)


def test_kernels_link_to_their_runtime_call_and_enclosing_cpu_op(sample_trace):
    t = sample_trace
    k = t.rows(Kind.KERNEL)
    rt = t.launch[k]
    assert (rt >= 0).mean() > 0.99
    ok = rt >= 0
    assert (t.correlation[rt[ok]] == t.correlation[k[ok]]).all()
    assert np.isin(t.kind[rt[ok]], (Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER)).all()
    # The kernel runs after its launch started.
    assert (t.launch_delay[k[ok]] >= -1.0).all()
    # The parent CPU op encloses the runtime call on the same thread.
    op = t.cpu_op[k[ok]]
    has = op >= 0
    r, o = rt[ok][has], op[has]
    assert (t.kind[o] == Kind.CPU_OP).all()
    assert (t.tid[o] == t.tid[r]).all()
    assert (t.ts[o] <= t.ts[r] + 1e-3).all() and (t.end[o] >= t.end[r] - 1e-3).all()


def test_call_stack_parents_enclose_children(sample_trace):
    t = sample_trace
    child = np.flatnonzero(t.parent >= 0)
    p = t.parent[child]
    assert len(child) > 1000
    assert (t.tid[p] == t.tid[child]).all()
    assert (t.ts[p] <= t.ts[child]).all()
    assert (t.depth[child] == t.depth[p] + 1).all()
    enclosed = t.end[p] >= t.end[child] - 1.0
    assert enclosed.mean() > 0.999


def test_backward_thread_nesting_is_per_thread():
    t = traceap.load(DATA / "backward_thread.json.gz")
    for row in np.flatnonzero(t.parent >= 0):
        assert t.tid[t.parent[row]] == t.tid[row]


def test_metadata_steps_distributed_info(sample_trace):
    t = sample_trace
    assert [s.number for s in t.steps] == [4, 5, 6]
    assert t.meta.rank == 0 and t.meta.world_size == 2 and t.meta.backend == "nccl"
    assert t.meta.base_time_ns is not None
    assert t.gpu_name.startswith("NVIDIA A100")


def test_memcpy_kinds_parsed(sample_trace):
    t = sample_trace
    m = t.rows(Kind.GPU_MEMCPY)
    assert (t.copy_kind[m] == CopyKind.DTOD).all()
    old = traceap.load(DATA / "kineto2021_v100.json.gz")
    m = old.rows(Kind.GPU_MEMCPY)
    assert CopyKind.HTOD in set(old.copy_kind[m]) and MemKind.PAGEABLE in set(old.copy_src[m])


def test_nccl_kernels_and_exposed_comm(sample_trace):
    info = summarize(sample_trace)
    assert info["n_nccl_kernels"] == 21
    assert info["nccl"]["streams"] == [40]
    assert 0 < info["nccl"]["exposed_fraction"] <= 1
    assert 0 < info["gpu_busy_fraction"] < 1


def test_job_folder_loads_ranks_in_order():
    job = traceap.load_job(DATA / "dlrm_job")
    assert [t.meta.rank for t in job] == [0, 1]
    assert job.world_size == 8  # distributedInfo says 8 though only 2 files are here


def test_cpu_only_trace_warns_but_summarises():
    t = traceap.load(DATA / "cpu_only_zoology.json.gz")
    assert not t.has_gpu
    info = summarize(t)
    assert info["n_kernels"] == 0 and info["gpu_busy_fraction"] is None
    assert any("CPU-only" in w for w in info["warnings"])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "traceap", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("content,needle", [
    (b"hello", "not JSON"),
    (b'{"traceEvents": [{"ph": "X", "ts": 1', "truncated JSON"),
    (b'{"foo": 1}', "no 'traceEvents'"),
    (b'{"traceEvents": []}', "no timed events"),
    (b"", "empty file"),
])
def test_bad_input_gives_one_line_and_exit_2(tmp_path, content, needle):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    r = _cli("info", str(p))
    assert r.returncode == 2
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_truncated_gzip_is_a_clear_error(tmp_path):
    data = CNN.read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[: len(data) // 2])
    r = _cli("info", str(p))
    assert r.returncode == 2 and "truncated gzip" in r.stderr and "Traceback" not in r.stderr


def test_missing_file_is_a_clear_error(tmp_path):
    r = _cli("info", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "no such file" in r.stderr


def test_odd_events_are_kept_with_warnings(tmp_path):
    doc = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": -5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 20},
        {"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 1, "dur": 3},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": "30", "dur": "2.5",
         "args": {"stream": "7", "correlation": 1, "device": 0}},
    ]}
    p = tmp_path / "odd.json"
    p.write_text(json.dumps(doc))
    t = traceap.load(p)
    assert len(t) == 3
    assert any("negative durations" in w for w in t.meta.warnings)
    assert any("without a timestamp" in w for w in t.meta.warnings)
    assert t.gpu_streams == [7]
    r = _cli("info", str(p), "--json")
    assert r.returncode == 0
    out = json.loads(r.stdout)
    assert out["schema"] == "traceap.info/v1" and out["n_kernels"] == 1


def test_info_json_has_the_formats_keys():
    r = _cli("info", str(CNN), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("schema", "trace", "span_us", "n_events", "events_per_kind", "n_cpu_ops",
                "n_runtime_calls", "n_kernels", "n_memcpy", "n_memset", "n_nccl_kernels",
                "gpu_streams", "n_profiler_steps", "gpu_name", "rank", "world_size",
                "gpu_busy_fraction", "warnings"):
        assert key in out
    assert out["span_us"][0] < out["span_us"][1]


def test_info_on_a_job_folder():
    r = _cli("info", str(DATA / "dlrm_job"), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [x["rank"] for x in out["ranks"]] == [0, 1]


def test_info_top_kernels_table_shows_every_count():
    """A kernel name that no middle cut tells apart (DLRM's two CatArrayBatchedCopy variants)
    wraps in its own column; the count column is never squeezed to nothing."""
    dlrm = Path(__file__).parents[1] / "examples" / "dlrm_a100_rank3.json.gz"
    s = summarize(traceap.load(dlrm), top=10)
    for columns in ("80", "120"):
        r = subprocess.run([sys.executable, "-m", "traceap", "info", str(dlrm)], capture_output=True,
                           text=True, env={**os.environ, "COLUMNS": columns})
        assert r.returncode == 0, r.stderr
        header = next(line for line in r.stdout.splitlines() if "share" in line and "kernel" in line)
        assert re.search(r"\bcount\b", header), header
        rows = [line for line in r.stdout.splitlines() if re.match(r"\s*\d+\.\d%\s", line)]
        assert [int(row.split("│")[2]) for row in rows] == [k["count"] for k in s["top_kernels"]]
