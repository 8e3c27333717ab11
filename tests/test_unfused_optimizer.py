"""unfused_optimizer: an optimizer step (or zero_grad) launching tiny kernels parameter by
parameter, the GPU waiting for each launch; GPU time spent inefficiently (BusyInefficient).

Planted into real traces by `traceap inject` (a step split into per-parameter SGD kernels);
found where planted, its time lost the GPU idle the split added; real foreach / fused steps
stay quiet, and the single-tensor Adagrad of the PARAM DLRM traces is found.
"""

from __future__ import annotations

import numpy as np
import pytest

import traceap
from traceap import idle
from traceap.analysis import analyze
from traceap.inject import Base, Doc, inject_one
from traceap.inject.natural import natural_labels
from traceap.measures.optimizer import optimizer_kernels, per_parameter_runs
from traceap.patterns import BusyInefficient, get_pattern
from traceap.windows import Windows

from .conftest import CNN, DATA, SAMPLE, SHARED_TRACES, needs_shared

PARTICLE = DATA / "particle_transformer_bs8.json.gz"   # inference: no optimizer of its own
DLRM = DATA / "dlrm_job" / "worker0.pt.trace.json.gz"  # PARAM DLRM: single-tensor Adagrad


def _planted(path, tmp_path_factory, seed=11):
    out = inject_one(Base.of(Doc(path), path.name), "unfused_optimizer", np.random.default_rng(seed))
    f = tmp_path_factory.mktemp("opt") / f"{path.name.split('.')[0]}.json"
    f.write_bytes(out.data)
    tr = traceap.load(f)
    # The plant's cost: the GPU idle it added (the rest of the trace replays as it was).
    cost = idle.measure(tr).total_us - idle.measure(traceap.load(path)).total_us
    return tr, out.anomalies, cost


@pytest.mark.parametrize("path", [CNN, PARTICLE], ids=["ddp_cnn_foreach_sgd", "particle_no_optimizer"])
def test_planted_per_parameter_step_is_found_with_the_time_it_costs(path, tmp_path_factory):
    tr, anomalies, cost = _planted(path, tmp_path_factory)
    runs = per_parameter_runs(tr, 5)
    assert runs and all(len(r) >= 4 * 24 for r, _ in runs)  # >= 24 parameters x 4 SGD ops
    rule = get_pattern("unfused_optimizer")
    assert isinstance(rule.account, BusyInefficient)
    w = Windows(tr, 100)
    m = rule.measures(w)
    lost = float(m["lost_us"].sum())
    assert 0.7 * cost <= lost <= 1.3 * cost, (lost, cost)
    flagged = np.flatnonzero(m["score"] >= 0.5)
    inside = np.zeros(w.n, bool)
    for a, b in anomalies:
        inside[w.overlapping(a, b)] = True
    assert len(flagged) and inside[flagged].all()
    found = {f.pattern: f for f in analyze(tr).findings}["unfused_optimizer"]
    assert found.time_lost_us == pytest.approx(lost, rel=1e-3)
    assert found.numbers["n_launches"] == sum(len(r) for r, _ in runs)
    assert "GPU time spent inefficiently" in found.evidence
    assert "foreach=True" in found.fix and "set_to_none=True" in found.fix


def test_foreach_and_fused_steps_are_not_per_parameter():
    """The DDP CNN's SGD runs foreach (multi_tensor_apply), the DLRM sample's FusedAdam one
    fused kernel per chunk: no per-parameter run, no finding."""
    for path in (CNN, SAMPLE):
        tr = traceap.load(path)
        k, _, multi = optimizer_kernels(tr)
        assert multi.any() and not per_parameter_runs(tr, 5)
        assert "unfused_optimizer" not in {f.pattern for f in analyze(tr).findings}


def test_a_four_parameter_toy_is_below_the_launch_count():
    """The 2021 V100 toy's SGD has 4 parameters: 4 add_ and 4 fill_ launches per call."""
    tr = traceap.load(DATA / "kineto2021_v100.json.gz")
    k, _, multi = optimizer_kernels(tr)
    assert len(k) == 8 and not multi.any() and not per_parameter_runs(tr, 5)


def test_single_tensor_adagrad_of_real_dlrm_is_found_without_its_syncs():
    """PARAM's DLRM steps Adagrad parameter by parameter (64 kernels, 16 `.item()` syncs):
    found, and the idle after those syncs stays excessive_memcpy's (never lost twice)."""
    tr = traceap.load(DLRM)
    runs = per_parameter_runs(tr, 5)
    assert [len(r) for r, _ in runs] == [64]
    w = Windows(tr, 100)
    m = get_pattern("unfused_optimizer").measures(w)
    acc = idle.measure(tr)
    rows = runs[0][0]
    lo, hi = float(tr.ts[rows].min()), float(tr.end[rows].max())
    owned = sum(acc.time_in(mid, [lo], [hi]) for mid in idle.MECHANISM_IDS if idle.pattern_of(mid))
    idle_there = sum(acc.time_in(mid, [lo], [hi]) for mid in idle.MECHANISM_IDS)
    assert owned > 0 and 0 < m["lost_us"].sum() <= idle_there - owned + 1e-6
    assert [p for _, _, p in natural_labels(tr).below_cut].count("unfused_optimizer") == 1
    assert {f.pattern: f for f in analyze(tr).findings}["unfused_optimizer"].severity == "low"


@needs_shared
def test_shampoos_host_work_between_its_kernels_is_not_launch_time():
    """HTA's sampled rank runs Shampoo: 28-29 kernels per call (median 16 us, mean 94 us) with
    59 ms of GPU idle between them, the host computing preconditioners.  Only the launch-sized
    part of each gap counts (<= 100 us): about 1 ms, not 59 ms, and no medium finding."""
    path = SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis/timeline_analysis__sampled_rank-0.json.gz"
    if not path.exists():
        pytest.skip("HTA's sampled rank is absent")
    tr = traceap.load(path)
    runs = per_parameter_runs(tr, 5)
    n = sum(len(r) for r, _ in runs)
    assert n == 57
    lost = get_pattern("unfused_optimizer").measures(Windows(tr, 100))["lost_us"].sum()
    assert 0 < lost <= 100.0 * n
    found = {f.pattern: f for f in analyze(tr).findings}.get("unfused_optimizer")
    assert found is None or found.severity == "low"


@needs_shared
def test_label_and_analyze_judge_busy_time_by_one_cut():
    """`traceap label` judges a busy-but-slow pattern by its rule's time lost, as analyze does:
    rank 4 of PARAM's DLRM loses 4.7% of its step to the per-parameter Adagrad: a medium
    finding, and a natural anomaly (before: natural labels gave such patterns 0%)."""
    path = SHARED_TRACES / ("facebookresearch__param/"
                            "dlrm_kineto.tar.gz__dlrm_kineto__worker4_step_12.1694128201547.pt.trace.json.gz")
    if not path.exists():
        pytest.skip("PARAM's DLRM rank 4 is absent")
    tr = traceap.load(path)
    lab = natural_labels(tr)
    found = {f.pattern: f for f in analyze(tr).findings}["unfused_optimizer"]
    assert found.severity == "medium" and "unfused_optimizer" in {p for _, _, p in lab.anomalies}
    assert lab.gain_pct["unfused_optimizer"] == pytest.approx(found.gain_pct, abs=1e-3)
