"""no_mixed_precision: FP32 GEMMs on a GPU with tensor cores, found in real traces (natural and
planted), its time lost (GPU time spent inefficiently) against the planted cost, and a window
that also holds a data-loading stall listing both patterns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import traceap
from traceap.analysis import analyze
from traceap.inject.core import inject_one
from traceap.inject.edit import Doc
from traceap.inject.mechanisms import Base, Unusable
from traceap.inject.natural import natural_labels
from traceap.measures.precision import fp32_matmul_rows, speedup

from .conftest import CNN, DATA, SHARED_TRACES, needs_shared

ID = "no_mixed_precision"
#: A V100 DLRM run in FP32 (volta_sgemm_*: 31% of the GPU busy time), HTA's trace_diff test.
V100_FP32 = SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis" / "trace_diff__test__test.json.gz"
DLRM = Path(CNN).parent / "dlrm_a100_rank3.json.gz"   # A100, 6 steps, TF32 GEMMs
HEALTHY = [CNN, DATA / "particle_transformer_bs8.json.gz", DATA / "amd_mi300_gemm.json.gz",
           DLRM, DATA / "kineto2021_v100.json.gz",
           DATA / "amd_mi250_train.json.gz"]


def _finding(a, pid=ID):
    return next((f for f in a.findings if f.pattern == pid), None)


def _plant(path: Path, pattern: str, seed: int, tmp: Path, name: str | None = None):
    """(output, its trace loaded) of one plant into a base given as a path."""
    o = inject_one(Base.of(Doc(path), path.name), pattern, np.random.default_rng(seed))
    f = tmp / (name or f"{pattern}.json")
    f.write_bytes(o.data)
    return o, traceap.load(f)


def test_kernel_names_fp32_and_not():
    tr = traceap.load(CNN)  # A100: TF32 s1688gemm (tensor cores) and a few ampere_sgemm
    names = {tr.names[c] for c in tr.name[fp32_matmul_rows(tr)]}
    assert any("ampere_sgemm" in n for n in names)
    assert not any("s1688gemm" in n or "tf32" in n for n in names)
    assert speedup(tr) == 3.0  # A100: TF32 8x the FP32 peak, credited 3x at most
    pt = traceap.load(DATA / "particle_transformer_bs8.json.gz")  # fp16 (ampere_fp16_sgemm_fp16)
    assert not len(fp32_matmul_rows(pt))


@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: p.name)
def test_healthy_real_traces_have_no_medium_or_high_finding(path):
    f = _finding(analyze(path, detector="expert"))
    assert f is None or f.severity == "low"


@needs_shared
def test_a_real_v100_fp32_run_is_found_with_its_time_lost():
    a = analyze(V100_FP32, detector="expert")
    f = _finding(a)
    assert f is not None and f.severity == "high"
    fp32 = f.numbers["fp32_matmul_us"]
    assert fp32 > 150_000 and f.numbers["credited_speedup"] == 3.0
    assert f.time_lost_us == pytest.approx(fp32 * (1 - 1 / 3), rel=0.01)
    assert "FP32 time x (1 - 1/3.0)" in f.evidence and "GPU time spent inefficiently" in f.evidence
    # the busy side of the account: the finding's time, a part of the busy time
    assert a.inefficient.by_pattern[ID] == pytest.approx(f.time_lost_us)
    assert a.inefficient.total_us < a.idle.busy_us
    assert "Of the GPU busy time" in a.inefficient.describe()
    nat = natural_labels(traceap.load(V100_FP32), [ID])
    assert nat.anomalies and nat.gain_pct[ID] > 3.0


@pytest.mark.parametrize("base,seed", [(DLRM, 1),
                                       (DATA / "kineto2021_v100.json.gz", 2)],
                         ids=["a100", "v100"])
def test_planted_fp32_is_found_and_its_time_lost_matches_the_plant(base, seed, tmp_path):
    before = analyze(base, detector="expert")
    o, tr = _plant(base, ID, seed, tmp_path)
    planted = sum(b - a for a, b in o.anomalies)
    assert planted > 0
    a = analyze(tr, detector="expert")
    f = _finding(a)
    assert f is not None and f.severity in ("medium", "high")
    got = a.inefficient.by_pattern[ID] - before.inefficient.by_pattern[ID]
    assert got == pytest.approx(planted, rel=0.3)
    # the labels are inside the planted FP32 kernels, the windows holding them are flagged
    flagged = {w.index for w in a.windows if ID in w.patterns}
    starts = np.array([w.start_us for w in a.windows])
    labelled = {int(np.searchsorted(starts, (x + y) / 2, side="right") - 1) for x, y in o.anomalies}
    assert len(labelled & flagged) >= 0.8 * len(labelled)
    nat = natural_labels(tr, [ID])
    assert nat.anomalies or nat.below_cut


def test_no_tensor_cores_no_plant():
    gp100 = SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis" / \
        "with_gpu_user_annotation__step_based_trace_2543932.json.gz"
    if not gp100.is_file():
        pytest.skip("../shared/traces not present")
    with pytest.raises(Unusable, match="no tensor cores"):
        inject_one(Base.of(Doc(gp100), gp100.name), ID, np.random.default_rng(0))


def test_a_window_with_a_stall_in_an_fp32_run_lists_both(tmp_path):
    """The issue's example: an FP32 run with a data-loading stall reads as a stall where the
    stall is, with the FP32 work listed beside it."""
    o, _ = _plant(DLRM, ID, 3, tmp_path, "fp32.json")
    f = tmp_path / "fp32.json"
    o2 = inject_one(Base.of(Doc(f), f.name), "single_process_dataloading",
                    np.random.default_rng(4))
    g = tmp_path / "both.json"
    g.write_bytes(o2.data)
    a = analyze(traceap.load(g), detector="expert")
    j = a.to_json()
    assert {ID, "single_process_dataloading"} <= {x["pattern"] for x in j["findings"]}
    stall = [w for w in j["windows"] if w["pattern"] == "single_process_dataloading"]
    assert stall
    both = [w for w in stall if ID in w["patterns"]]
    assert both, "a stall window of the FP32 run lists the FP32 pattern too"
    assert all(w["patterns"][0] == "single_process_dataloading" for w in stall)
    assert any(w["patterns"] == [ID] for w in j["windows"])
