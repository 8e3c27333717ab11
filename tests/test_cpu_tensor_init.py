"""cpu_tensor_init: a tensor made on the host (zeros / arange / randn, no kernel under it) and
uploaded right after inside the step, while the GPU waits.

Planted into real traces by `traceap inject`; found where planted with the time the plant
costs, and only once: the copy rules (`no_pin_memory`, `excessive_memcpy`) leave its copies out.
"""

from __future__ import annotations

import numpy as np
import pytest

import traceap
from traceap import idle
from traceap.analysis import analyze
from traceap.inject import Base, Doc, inject_one
from traceap.measures.host_init import init_copies
from traceap.patterns import get_pattern, patterns
from traceap.windows import Windows

from .conftest import CNN, DATA, SAMPLE

PARTICLE = DATA / "particle_transformer_bs8.json.gz"   # forward passes, no profiler steps
MI250 = DATA / "amd_mi250_train.json.gz"               # HTA's ROCm toy: random inputs made on the host


def _planted(path, tmp_path_factory, seed=5):
    out = inject_one(Base.of(Doc(path), path.name), "cpu_tensor_init", np.random.default_rng(seed))
    f = tmp_path_factory.mktemp("init") / f"{path.name.split('.')[0]}.json"
    f.write_bytes(out.data)
    # The plant's cost: the GPU idle it added (the rest of the trace replays as it was).
    tr = traceap.load(f)
    cost = idle.measure(tr).total_us - idle.measure(traceap.load(path)).total_us
    return tr, out.anomalies, cost


@pytest.mark.parametrize("path", [CNN, PARTICLE], ids=["ddp_cnn_steps", "particle_no_steps"])
def test_planted_host_tensors_are_found_once_with_the_time_they_cost(path, tmp_path_factory):
    tr, anomalies, cost = _planted(path, tmp_path_factory)
    fac, op, cp = init_copies(tr)
    assert len(cp) and {"aten::to"} == set(tr.names_array[tr.name[op]])
    assert set(tr.names_array[tr.name[fac]]) <= {"aten::zeros", "aten::ones", "aten::full",
                                                 "aten::arange", "aten::randn"}
    lost = idle.measure(tr).by_mechanism["cpu_tensor_init"]
    assert 0.7 * cost <= lost <= 1.3 * cost, (lost, cost)
    w = Windows(tr, 100)
    flagged = np.flatnonzero(get_pattern("cpu_tensor_init").score_windows(w) >= 0.5)
    inside = np.zeros(w.n, bool)
    for a, b in anomalies:
        inside[w.overlapping(a, b)] = True
    assert len(flagged) and inside[flagged].all()
    # the same copies are not the copy rules' too: no other pattern flags a window here
    for p in patterns():
        if p.id != "cpu_tensor_init":
            assert not (p.score_windows(w)[inside] >= 0.5).any(), p.id
    found = {f.pattern: f for f in analyze(tr).findings}["cpu_tensor_init"]
    assert found.time_lost_us == pytest.approx(lost, rel=1e-3) and found.numbers["n_uploads"] == len(cp)
    assert 'device=' in found.fix


def test_a_pinned_batch_after_a_small_factory_op_is_an_input_upload():
    """DLRM's `## load_batch ##` calls aten::zeros (4 us) 85 us before uploading the batch from
    pinned memory: the batch, not a tensor made on the host."""
    assert len(init_copies(traceap.load(SAMPLE))[2]) == 0


def test_random_inputs_made_on_the_host_each_step():
    """HTA's ROCm toy makes its inputs with torch.randn on the CPU and uploads them each step:
    the pattern's mechanism, found and costing a few tens of us (below the reporting cut)."""
    tr = traceap.load(MI250)
    fac, _, cp = init_copies(tr)
    assert len(cp) == 2 and set(tr.names_array[tr.name[fac]]) == {"aten::randn"}
    f = {x.pattern: x for x in analyze(tr).findings}.get("cpu_tensor_init")
    assert f is None or f.severity == "low"


@pytest.mark.parametrize("path", [CNN, SAMPLE, PARTICLE, DATA / "kineto2021_v100.json.gz"],
                         ids=lambda p: p.name.split(".")[0])
def test_healthy_real_traces_have_no_host_tensor_finding(path):
    tr = traceap.load(path)
    assert idle.measure(tr).by_mechanism["cpu_tensor_init"] == 0.0
    assert "cpu_tensor_init" not in {f.pattern for f in analyze(tr).findings}
