"""The default detector: the trained model and the expert rules, averaged."""

from __future__ import annotations

import numpy as np

import traceap
from traceap.analysis import analyze
from traceap.detectors.expert import ExpertDetector
from traceap.detectors.hybrid import HybridDetector
from traceap.detectors.model import ModelDetector
from traceap.detectors.registry import make_detector
from traceap.windows import Windows

from .conftest import SAMPLE


def test_hybrid_is_the_weighted_mean_of_model_and_rules(sample_trace):
    w = Windows(sample_trace, 100)
    model = ModelDetector().score_windows(w)
    rules = ExpertDetector(nearby_reach=0).score_windows(w)
    assert np.allclose(HybridDetector().score_windows(w), (model + rules) / 2)
    assert np.allclose(HybridDetector(model_weight=1.0).score_windows(w), model)
    assert np.allclose(HybridDetector(model_weight=0.0).score_windows(w), rules)


def test_default_analysis_uses_the_hybrid_and_finds_the_exposed_allreduce():
    a = analyze(traceap.load(SAMPLE))
    assert a.detector == "hybrid"
    assert isinstance(make_detector("hybrid"), HybridDetector)
    # The sample's known problem: all-reduce with little compute overlap (rank 0 of 2-GPU DDP).
    assert "nccl_compute_no_overlap" in {f.pattern for f in a.findings}
    assert all(f.time_lost_us > 0 for f in a.findings)
