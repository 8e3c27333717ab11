"""Ranks, test traces and training traces spread over local worker processes give the results
of the serial run, byte for byte; an unreadable rank is named and the others are analysed.

Ray runs the same tasks: tests/test_parallel_ray.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

import traceap
from traceap.job import analyze_job
from traceap.classify import make_classifier
from traceap.classify.redetect import RedetectConfig, RedetectingClassifier
from traceap.cli import app
from traceap.detectors.registry import make_detector
from traceap.errors import TraceapError
from traceap.load import load_job
from traceap.parallel import Execution, dumps, ordered, run
from traceap.windows import Windows

from .conftest import DATA, CNN, SHARED_TRACES, needs_shared

JOB = DATA / "dlrm_job"
PARAM = SHARED_TRACES / "facebookresearch__param"
runner = CliRunner()


def as_json(job) -> bytes:
    return orjson.dumps(job.to_json(), option=orjson.OPT_SERIALIZE_NUMPY)


def eight_dlrm_ranks(folder: Path) -> Path:
    files = sorted(PARAM.glob("dlrm_kineto*worker*.json.gz"))
    if len(files) != 8:
        pytest.skip("the 8 DLRM ranks of facebookresearch/param are absent")
    for f in files:
        (folder / f.name).symlink_to(f)
    return folder


def with_truncated_rank(folder: Path) -> Path:
    """The bundled job plus a third rank file cut in half (a copy that did not finish)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in sorted(JOB.glob("*.json.gz")):
        shutil.copy(f, folder / f.name)
    data = (JOB / "worker1.pt.trace.json.gz").read_bytes()
    (folder / "worker2.pt.trace.json.gz").write_bytes(data[: len(data) // 2])
    return folder


# -- the engine ----------------------------------------------------------------------------------
def _square_plus(shared: int, item: int) -> int:
    return item * item + shared


def test_run_returns_every_item_once_in_any_engine():
    items = list(range(7))
    want = [i * i + 3 for i in items]
    assert ordered(run(_square_plus, items, 3), len(items)) == want
    assert ordered(run(_square_plus, items, 3, Execution(workers=2)), len(items)) == want


def test_a_model_detector_crosses_as_its_checkpoint_path_not_its_weights(sample_trace):
    det = make_detector("hybrid")
    blob = dumps({"detector": det, "head": det.pattern_probabilities})
    assert len(blob) < 2000          # the spec, not the ~1 MB of weights and name embeddings
    import pickle
    back = pickle.loads(blob)
    assert back["head"].__self__ is back["detector"]      # one detector, rebuilt once
    w = Windows(sample_trace, 50)
    np.testing.assert_array_equal(back["detector"].score_windows(w), det.score_windows(w))


def test_execution_is_checked_at_the_boundary():
    with pytest.raises(TraceapError, match="at least 1"):
        Execution(workers=0)
    assert not Execution().parallel and Execution(workers=2).parallel
    assert Execution(ray="auto").parallel


# -- analyze_job -----------------------------------------------------------------------------------
def test_workers_give_the_serial_json_on_the_bundled_job():
    serial = analyze_job(JOB, n_windows=50)                       # the default detector
    parallel = analyze_job(JOB, n_windows=50, workers=2)
    loaded = analyze_job(load_job(JOB), n_windows=50)             # the load-everything path
    assert as_json(parallel) == as_json(serial) == as_json(loaded)
    assert [a.summary["rank"] for a in parallel.ranks] == [0, 1]
    assert parallel.summaries == serial.summaries
    assert parallel.run["worker_peak_rss_bytes"] > 0 and len(parallel.run["rank_seconds"]) == 2


def test_what_comes_back_per_rank_is_small_and_does_not_grow_with_the_trace():
    import pickle

    job = analyze_job(JOB, n_windows=100, detector="expert", workers=2)
    a = job.ranks[0]
    assert len(pickle.dumps(a)) < 100_000 and len(pickle.dumps(job.summaries[0])) < 5_000
    # The idle account's per-segment arrays (O(events)) stayed in the worker; totals came back.
    assert not a.idle.has_segments and len(a.idle.seg_start) == 0
    assert a.idle.total_us == pytest.approx(sum(a.idle.by_cause.values()))
    with pytest.raises(ValueError, match="totals only"):
        a.idle.time_in("not_explained", [0.0], [1e18])


def test_redetection_notes_come_back_from_the_workers_in_rank_order():
    def job(workers):
        det = make_detector("expert")
        clf = RedetectingClassifier(make_classifier("offline"), det, 0.3,
                                    RedetectConfig(max_rounds=1))
        j = analyze_job(JOB, n_windows=30, detector=det, classifier=clf, threshold=0.3,
                        workers=workers)
        return j, clf.notes

    (serial, serial_notes), (parallel, parallel_notes) = job(1), job(2)
    assert as_json(parallel) == as_json(serial)
    assert parallel_notes == serial_notes


def test_copies_and_repeated_rank_ids_are_handled_as_in_the_serial_path(tmp_path):
    for name in ("rank0.json.gz", "rank1.json.gz"):
        shutil.copy(CNN, tmp_path / name)
    shutil.copy(JOB / "worker1.pt.trace.json.gz", tmp_path / "rank2.json.gz")
    loaded = analyze_job(load_job(tmp_path), n_windows=20, detector="expert")
    parallel = analyze_job(tmp_path, n_windows=20, detector="expert", workers=2)
    assert as_json(parallel) == as_json(loaded)
    assert len(parallel.copies) == 1 and len(parallel.ranks) == 2
    # A 2-GPU and an 8-GPU trace are not one job: each keeps its own rank, none renumbered.
    assert parallel.not_one_job == ["world sizes 2 and 8", "time ranges do not overlap"]
    assert not any("renumbered" in n for a in parallel.ranks for n in a.notes)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_unreadable_rank_is_named_and_the_others_are_analysed(tmp_path, workers):
    folder = with_truncated_rank(tmp_path)
    job = analyze_job(folder, n_windows=20, detector="expert", workers=workers)
    assert [Path(a.trace_path).name for a in job.ranks] == ["worker0.pt.trace.json.gz",
                                                            "worker1.pt.trace.json.gz"]
    assert [Path(u["path"]).name for u in job.unreadable] == ["worker2.pt.trace.json.gz"]
    assert job.unreadable[0]["error"].startswith("truncated gzip file")
    said = [n for n in job.notes if "worker2.pt.trace.json.gz" in n]
    assert len(said) == 1 and "could not be read" in said[0]
    assert job.to_json()["unreadable"] == job.unreadable


def test_a_folder_with_no_readable_rank_is_one_error(tmp_path):
    data = (JOB / "worker0.pt.trace.json.gz").read_bytes()
    (tmp_path / "a.json.gz").write_bytes(data[:100])
    with pytest.raises(TraceapError, match="none of the 1 rank file"):
        analyze_job(tmp_path, workers=2)


@pytest.mark.slow
@needs_shared
def test_eight_real_dlrm_ranks_in_two_workers_match_the_serial_run(tmp_path):
    folder = eight_dlrm_ranks(tmp_path)
    serial = analyze_job(folder, n_windows=50)
    parallel = analyze_job(folder, n_windows=50, workers=2)
    assert as_json(parallel) == as_json(serial)
    assert [a.summary["rank"] for a in parallel.ranks] == list(range(8))
    assert {f.pattern for f in parallel.findings} >= {"rank_imbalance"}


# -- the command line ------------------------------------------------------------------------------
def test_cli_workers_write_the_same_json_html_and_annotated_traces(tmp_path):
    outs = {}
    for mode, extra in (("serial", []), ("parallel", ["--workers", "2"])):
        d = tmp_path / mode
        r = runner.invoke(app, ["analyze", str(JOB), "--windows", "40", "--json", str(d / "a.json"),
                                "--html", str(d / "a.html"), "--annotate", str(d / "ann"), "-q",
                                *extra])
        assert r.exit_code == 0, r.output
        outs[mode] = {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}
    assert outs["parallel"] == outs["serial"]
    assert len(outs["serial"]) == 4          # JSON, HTML, one annotated trace per rank
    html = outs["serial"][Path("a.html")].decode()
    assert "Events that prove it" in html and "trace file was not available" not in html


def test_cli_names_an_unreadable_rank_in_one_line(tmp_path):
    folder = with_truncated_rank(tmp_path / "job")
    p = subprocess.run([sys.executable, "-m", "traceap", "analyze", str(folder), "-q",
                        "--workers", "2", "--detector", "expert", "--windows", "20"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "worker2.pt.trace.json.gz" in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_cli_cpu_only_job_in_workers_still_points_to_a_gpu_recording(tmp_path):
    # The parent of a job analysed by workers holds no Trace: the ranks' analyses say.
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(DATA / "cpu_only_zoology.json.gz", job / "rank0.json.gz")
    r = runner.invoke(app, ["analyze", str(job), "--workers", "2", "--detector", "expert",
                            "--windows", "20"])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "CPU-only trace" in flat and "bash scripts/gpu_collect.sh" in flat


def test_cli_without_ray_says_how_to_install_it(tmp_path):
    fake = tmp_path / "no_ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('Ray is absent in this test')\n")
    env_path = f"{fake.parent}:{Path(traceap.__file__).parents[1]}"
    for args in (["analyze", str(JOB), "--ray"], ["eval", "--dataset", str(tmp_path),
                                                  "--ray-address", "auto"]):
        p = subprocess.run([sys.executable, "-m", "traceap", *args], capture_output=True,
                           text=True, timeout=120, env={"PYTHONPATH": env_path, "PATH": "/usr/bin"})
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.strip() == "traceap: error: Ray is not installed: pip install traceap[ray]"


def test_cli_workers_need_a_folder():
    r = runner.invoke(app, ["analyze", str(CNN), "--workers", "2"])
    assert isinstance(r.exception, TraceapError) and "folder" in str(r.exception)


# -- eval and train ----------------------------------------------------------------------------------
def test_eval_in_two_workers_gives_the_serial_records(tmp_path):
    from traceap.eval import EvalConfig, evaluate

    from .test_eval import build

    ds = build(tmp_path / "ds", missing=True)
    dets = {"expert": make_detector("expert"), "clustering": make_detector("clustering",
                                                                           n_windows=50)}
    clfs = {"offline": make_classifier("offline")}
    cfg = EvalConfig(windows=(50,), splits=("test_seen",))

    def records(workers):
        warned = []
        res = evaluate(ds, dets, clfs, cfg, fit=["clustering"], on_warning=warned.append,
                       workers=workers)
        return [(r.id, r.n, r.labels.tolist(), {k: v.tolist() for k, v in r.scores.items()},
                 r.calls) for r in res.records], warned

    serial, parallel = records(1), records(2)
    assert parallel == serial
    assert len(serial[0]) == 4 and len(serial[1]) == 1 and "gone" in serial[1][0]


def test_featurising_in_two_workers_gives_the_same_features(tmp_path):
    from dataclasses import fields, replace

    from traceap.manifest import read_manifest
    from traceap.model.config import preset
    from traceap.model.train import featurize_entries

    from .test_eval import build

    ds = build(tmp_path / "ds")
    cfg = replace(preset("small"), max_events=16, windows=(20, 40))
    entries = [e for e in read_manifest(ds) if e.split != "train"][:4]
    serial = featurize_entries(ds, entries, cfg.windows, cfg, tmp_path / "c1")
    parallel = featurize_entries(ds, entries, cfg.windows, cfg, tmp_path / "c2", workers=2)
    assert serial.keys() == parallel.keys()
    for key in serial:
        for n in cfg.windows:
            a, b = serial[key][n], parallel[key][n]
            for f in fields(a):
                np.testing.assert_array_equal(np.asarray(getattr(a, f.name)),
                                              np.asarray(getattr(b, f.name)))
    assert len(list((tmp_path / "c2" / "features").glob("*.npz"))) == 8


def test_cli_unreachable_ray_cluster_is_one_line_not_minutes_of_retries():
    pytest.importorskip("ray", reason="Ray is not installed")
    import socket

    with socket.socket() as s:          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.run([sys.executable, "-m", "traceap", "analyze", str(JOB), "-q",
                        "--ray-address", f"127.0.0.1:{port}"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"traceap: error: cannot reach the Ray cluster at 127.0.0.1:{port} "
        f"([Errno 111] Connection refused)"]
