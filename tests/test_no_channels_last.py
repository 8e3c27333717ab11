"""no_channels_last: layout transposes around convolutions, found in a real NCHW CNN (the DDP CNN
sample), planted into real traces with its cost measured back, absent from traces without it."""

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
from traceap.measures.signals import steady_rows
from traceap.measures.layout import conv_transpose_rows

from .conftest import CNN, DATA, SHARED_TRACES

ID = "no_channels_last"
#: A ResNet-style training run on MI210 in NHWC bf16 with MIOpen's batched transposes (GPU only).
MI210 = SHARED_TRACES / "AMD-AGI__TraceLens" / "mi210__gpu_only_trace__gpu_only_trace.json.gz"
WITHOUT = [DATA / "particle_transformer_bs8.json.gz", DATA / "amd_mi300_gemm.json.gz",
           Path(CNN).parent / "dlrm_a100_rank3.json.gz", DATA / "kineto2021_v100.json.gz",
           DATA / "amd_mi250_train.json.gz"]


def _finding(a):
    return next((f for f in a.findings if f.pattern == ID), None)


def test_the_ddp_cnn_sample_is_a_natural_case_its_time_lost_the_transposes():
    """The sample runs its convolutions on NCHW tensors: cuDNN wraps them in 633 transposes,
    211 in its first profiler step (warm-up: autotuning) and 422 in the two steady ones."""
    tr = traceap.load(CNN)
    every = conv_transpose_rows(tr)
    rows = steady_rows(tr, every)
    names = {tr.names[c] for c in tr.name[every]}
    assert all("nchwToNhwc" in n or "nhwcToNchw" in n for n in names)
    a = analyze(tr, detector="expert")
    f = _finding(a)
    assert len(every) == 633 and f is not None and f.numbers["n_transposes"] == len(rows) == 422
    assert f.time_lost_us == pytest.approx(float(tr.dur[rows].sum()), rel=0.01)
    # launch-bound (GPU busy 18%): 2.3% of the step, a low finding, not medium/high
    assert f.severity == "low"
    assert a.inefficient.by_pattern[ID] == pytest.approx(f.time_lost_us)
    nat = natural_labels(tr, [ID])
    assert not nat.anomalies and nat.below_cut and 1.0 < nat.gain_pct[ID] < 3.0


@pytest.mark.parametrize("path", WITHOUT, ids=lambda p: p.name)
def test_traces_without_nchw_convolutions_have_no_medium_or_high_finding(path):
    f = _finding(analyze(path, detector="expert"))
    assert f is None or f.severity == "low"


def test_planted_transposes_are_found_and_their_time_lost_matches_the_plant(tmp_path):
    before = analyze(CNN, detector="expert")
    o = inject_one(Base.of(Doc(CNN), CNN.name), ID, np.random.default_rng(5))
    planted = sum(b - a for a, b in o.anomalies)
    f = tmp_path / "nchw.json"
    f.write_bytes(o.data)
    tr = traceap.load(f)
    a = analyze(tr, detector="expert")
    got = a.inefficient.by_pattern[ID] - before.inefficient.by_pattern[ID]
    assert planted > 1000.0 and got == pytest.approx(planted, rel=0.3)
    assert _finding(a) is not None
    # every planted transpose sits next to a convolution, launched from its convolution op
    rows = conv_transpose_rows(tr)
    assert len(rows) > len(conv_transpose_rows(traceap.load(CNN)))


def test_a_base_without_convolutions_is_unusable():
    base = DATA / "kineto2021_v100.json.gz"
    with pytest.raises(Unusable, match="no convolution"):
        inject_one(Base.of(Doc(base), base.name), ID, np.random.default_rng(0))


def test_gpu_only_traces_count_transposes_when_they_run_convolutions():
    if not MI210.is_file():
        pytest.skip("../shared/traces not present")
    tr = traceap.load(MI210)
    rows = conv_transpose_rows(tr)
    assert len(rows) and all(tr.names[c].startswith("batched_transpose_") for c in tr.name[rows])
