"""allocator_churn: cudaMalloc / cudaFree (hipMalloc / hipFree) or empty_cache inside steady
steps, the host blocked in them, the GPU idle meanwhile.

Planted into real traces by `traceap inject` (its own mechanism, the trace's API), found where
planted with the time the plant costs; the allocator growth of a run's start stays warm-up.
"""

from __future__ import annotations

import numpy as np
import pytest

import traceap
from traceap import idle
from traceap.analysis import analyze
from traceap.inject import Base, Doc, inject_one
from traceap.inject.natural import natural_labels
from traceap.patterns import get_pattern
from traceap.windows import Windows

from .conftest import CNN, DATA, SAMPLE, SHARED_TRACES, needs_shared

PARTICLE = DATA / "particle_transformer_bs8.json.gz"   # forward passes, no profiler steps


def _planted(path, tmp_path_factory, seed=3):
    """The trace with allocator churn planted, its labels and the host time the plant took."""
    out = inject_one(Base.of(Doc(path), path.name), "allocator_churn",
                     np.random.default_rng(seed))
    f = tmp_path_factory.mktemp("churn") / f"{path.name.split('.')[0]}.json"
    f.write_bytes(out.data)
    # The plant's cost: the GPU idle it added (the rest of the trace replays as it was).
    tr = traceap.load(f)
    cost = idle.measure(tr).total_us - idle.measure(traceap.load(path)).total_us
    return tr, out.anomalies, cost


@pytest.mark.parametrize("path", [CNN, PARTICLE], ids=["ddp_cnn_steps", "particle_no_steps"])
def test_planted_churn_is_found_with_the_time_it_costs(path, tmp_path_factory):
    tr, anomalies, cost = _planted(path, tmp_path_factory)
    names = set(tr.names_array[tr.name])
    assert {"cudaMalloc", "cudaFree"} <= names  # the trace's own API (CUDA here)
    acc = idle.measure(tr)
    lost = acc.by_mechanism["allocator_churn"]
    assert 0.7 * cost <= lost <= 1.3 * cost, (lost, cost)
    # the idle goes to the churn, not to warm-up (whose calls name every cudaMalloc)
    base_warm = idle.measure(traceap.load(path)).by_mechanism["warmup"]
    assert acc.by_mechanism["warmup"] <= base_warm + 0.05 * cost
    w = Windows(tr, 100)
    rule = get_pattern("allocator_churn")
    flagged = np.flatnonzero(rule.score_windows(w) >= 0.5)
    assert len(flagged)
    inside = np.zeros(w.n, bool)
    for a, b in anomalies:
        inside[w.overlapping(a, b)] = True
    assert inside[flagged].all()  # flagged only where planted
    found = {f.pattern: f for f in analyze(tr).findings}["allocator_churn"]
    assert found.numbers["n_free"] > 0 and found.time_lost_us == pytest.approx(lost, rel=1e-3)
    assert "empty_cache()" in found.fix and "expandable_segments" in found.fix


@pytest.mark.parametrize("path", [CNN, SAMPLE, PARTICLE, DATA / "amd_mi250_train.json.gz",
                                  DATA / "kineto2021_v100.json.gz"],
                         ids=lambda p: p.name.split(".")[0])
def test_healthy_real_traces_have_no_churn(path):
    tr = traceap.load(path)
    assert idle.measure(tr).by_mechanism["allocator_churn"] == 0.0
    assert "allocator_churn" not in {f.pattern for f in analyze(tr).findings}


def _shared(name):
    path = SHARED_TRACES / name
    if not path.exists():
        pytest.skip(f"{name} is absent")
    return traceap.load(path)


@needs_shared
def test_a_growing_cache_without_frees_stays_warm_up():
    """Particle Transformer at batch 512 calls cudaMalloc 77 times as its cache grows, and never
    frees: start-up, not churn."""
    tr = _shared("harryjmoss__particle_transformer/gpu_working_chrome_trace.json.gz")
    acc = idle.measure(tr)
    assert acc.by_mechanism["allocator_churn"] == 0.0 and acc.by_mechanism["warmup"] > 0


@needs_shared
def test_natural_churn_between_benchmark_runs():
    """HTA's AlexNet critical-path benchmark frees (cudaFree 525 ms) and allocates again
    (cudaMalloc 0.26-0.76 s) between its runs: `traceap label` and `analyze` agree on it."""
    tr = _shared("facebookresearch__HolisticTraceAnalysis/"
                 "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz")
    lab = natural_labels(tr)
    assert "allocator_churn" in {p for _, _, p in lab.anomalies}
    found = {f.pattern: f for f in analyze(tr).findings}["allocator_churn"]
    assert found.gain_pct == pytest.approx(lab.gain_pct["allocator_churn"], abs=1e-3)
