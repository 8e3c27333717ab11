"""Shared fixtures: the bundled real traces, and the whole ../shared set where present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
#: The README's sample: DLRM training on A100 (rank 3 of 8) whose all-reduces are exposed with
#: the optimizer's kernels queued behind them (a genuine nccl_compute_no_overlap).
SAMPLE = REPO / "examples" / "dlrm_a100_rank3.json.gz"
#: DDP training of a small CNN on A100 (rank 0 of 2): launch-bound all through, its collectives
#: run while the host has not launched the next work (exposed-looking, holding nothing back).
CNN = REPO / "examples" / "ddp_cnn_a100_rank0.json.gz"
SHARED_TRACES = Path(os.environ.get("TRACEAP_SHARED", REPO.parent / "shared")) / "traces"


def shared_trace_files() -> list[Path]:
    """Every real trace in ../shared/traces (empty when the folder is absent)."""
    if not SHARED_TRACES.is_dir():
        return []
    return sorted(SHARED_TRACES.glob("*/*.json.gz"))


needs_shared = pytest.mark.skipif(not SHARED_TRACES.is_dir(),
                                  reason="../shared/traces is absent (outside the dev checkout)")


@pytest.fixture(scope="session")
def sample_trace():
    """The DDP CNN (launch-bound, no finding)."""
    import traceap
    return traceap.load(CNN)


@pytest.fixture(scope="session")
def readme_sample():
    """The README's sample: exposed all-reduces, findings to report."""
    import traceap
    return traceap.load(SAMPLE)
