"""The same per-rank / per-trace tasks as Ray tasks give the serial results.

One local Ray instance (2 CPUs) serves the whole module; `traceap.parallel` joins an instance
this process already started instead of starting its own.  Skipped when Ray is not installed
(`pip install traceap[ray]`; scripts/setup.sh installs it).
"""

from __future__ import annotations

import logging

import pytest

from traceap.job import analyze_job
from traceap.classify import make_classifier
from traceap.detectors.registry import make_detector

from .conftest import needs_shared
from .test_parallel import JOB, as_json, eight_dlrm_ranks, with_truncated_rank

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install traceap[ray])")


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR)
    yield
    if started:
        ray.shutdown()


def test_ray_tasks_give_the_serial_json_on_the_bundled_job():
    serial = analyze_job(JOB, n_windows=50)
    on_ray = analyze_job(JOB, n_windows=50, ray="local")
    assert as_json(on_ray) == as_json(serial)
    assert on_ray.run["worker_peak_rss_bytes"] > 0


def test_an_unreadable_rank_on_ray_is_named_and_the_others_are_analysed(tmp_path):
    job = analyze_job(with_truncated_rank(tmp_path), n_windows=20, detector="expert",
                      ray="local")
    assert len(job.ranks) == 2
    assert [u["path"].rsplit("/", 1)[-1] for u in job.unreadable] == ["worker2.pt.trace.json.gz"]


@needs_shared
def test_eight_real_dlrm_ranks_on_ray_match_the_serial_run(tmp_path):
    folder = eight_dlrm_ranks(tmp_path)
    serial = analyze_job(folder, n_windows=50, detector="expert")
    on_ray = analyze_job(folder, n_windows=50, detector="expert", ray="local")
    assert as_json(on_ray) == as_json(serial)


def test_eval_on_ray_gives_the_serial_records(tmp_path):
    from traceap.eval import EvalConfig, evaluate

    from .test_eval import build

    ds = build(tmp_path / "ds")
    dets = {"hybrid": make_detector("hybrid")}
    clfs = {"offline": make_classifier("offline")}
    cfg = EvalConfig(windows=(50,), splits=("test_unseen",))

    def records(ray_address):
        res = evaluate(ds, dets, clfs, cfg, ray=ray_address)
        return [(r.id, {k: v.tolist() for k, v in r.scores.items()}, r.calls)
                for r in res.records]

    assert records("local") == records(None)
