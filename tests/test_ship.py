"""`traceap ship ensemble|model|stack`: what writes `src/traceap/data`, run as a developer who
retrains the default runs it, on real validation scores of `traceap eval`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from traceap.model.checkpoint import bundled_model_path

from .conftest import CNN, REPO


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEAP_CACHE", str(tmp_path / "cache"))


def traceap(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run the real CLI entry point (errors: one line, exit 2); (exit code, stdout, stderr)."""
    from traceap.cli import main
    monkeypatch.setattr(sys, "argv", ["traceap", *map(str, args)])
    with pytest.raises(SystemExit) as exc:
        main()
    out, err = capsys.readouterr()
    return exc.value.code or 0, out, err


@pytest.fixture(scope="module")
def val_scores(tmp_path_factory):
    """(dataset, scores.jsonl): a generated dataset whose train traces are made validation
    ones (seven traces, good and bad, with window labels), scored by `traceap eval` with the
    bundled model and the rules at N = 20."""
    from typer.testing import CliRunner

    from traceap.cli import app
    from traceap.synth import SynthConfig, generate
    data = tmp_path_factory.mktemp("val")
    generate(data, SynthConfig(traces=10, seed=3, jobs=1, bad_fraction=0.5, world_sizes=(1,),
                               world_size_p=(1.0,)))
    rows = [json.loads(x) for x in (data / "manifest.jsonl").read_text().splitlines()]
    for r in rows:
        r["split"] = "validation" if r["split"] == "train" else r["split"]
    (data / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path_factory.mktemp("eval")
    res = CliRunner().invoke(app, ["eval", "--dataset", str(data), "--split", "validation",
                                   "--detectors", "model,expert", "--windows", "20",
                                   "--classifier", "", "--json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return data, out / "scores.jsonl"


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_ship_model_adds_the_traces_names_and_calibrates_into_a_folder(tmp_path, val_scores,
                                                                      monkeypatch, capsys):
    """The checkpoint lacking some names of a bundled trace gets them back (embedded by the text
    encoder), its flag threshold set on validation scores: the detector flags there, healthy
    windows stay under the limit; weights and scores unchanged; the package is not touched."""
    from traceap.detectors.learned import LearnedDetector
    from traceap.eval.scores import merge_scores
    from traceap.load import load
    from traceap.model.ship import trace_names
    from traceap.windows import Windows
    _, scores = val_scores
    bundled = torch.load(bundled_model_path(), weights_only=False)
    cnn_names = sorted(trace_names([CNN], LearnedDetector().predictor.cfg) & set(bundled["names"]))
    dropped = set(cnn_names[::10])
    keep = [i for i, n in enumerate(bundled["names"]) if n not in dropped]
    stripped = {**bundled, "names": [bundled["names"][i] for i in keep],
                "name_embeddings": bundled["name_embeddings"][keep]}
    torch.save(stripped, tmp_path / "retrained.pt")
    before = _sha(bundled_model_path())

    code, out, err = traceap(monkeypatch, capsys, "ship", "model", tmp_path / "retrained.pt",
                             "--names-from", CNN, "--calibrate", scores,
                             "--max-healthy-flagged", "0.1", "--out", tmp_path / "ship")
    assert code == 0, err
    shipped = torch.load(tmp_path / "ship" / "model.pt", weights_only=False)
    assert _sha(bundled_model_path()) == before
    assert shipped["names"] == bundled["names"] and len(dropped) >= 3
    assert f"{len(dropped)} added" in out
    rows = [bundled["names"].index(n) for n in sorted(dropped)]
    # re-embedded by the numpy MiniLM: the shipped table's vectors to float16 rounding
    assert torch.allclose(shipped["name_embeddings"][rows].float(),
                          bundled["name_embeddings"][rows].float(), atol=1e-3)
    meta = shipped["meta"]
    assert meta["bundled_trace_names"] == len(dropped)
    assert meta["shipped_from"] == str(tmp_path / "retrained.pt")
    cal = meta["calibration"]
    assert cal["calibrated_on"] == str(scores) and cal["max_healthy_flagged"] == 0.1
    # the threshold, checked on the validation scores themselves
    records = list(merge_scores([scores], ("validation",)).values())
    t = meta["flag_threshold"]
    s = [np.asarray(r["scores"]["model"]) for r in records]
    y = np.concatenate([r["labels"] for r in records]).astype(bool)
    allw = np.concatenate(s)
    healthy = [float((x >= t).mean()) for r, x in zip(records, s) if r["label"] == "good"]
    assert cal["healthy_traces"] == len(healthy) >= 1 and cal["windows"] == y.size
    assert cal["healthy_flagged"] == pytest.approx(np.mean(healthy))
    assert cal["healthy_flagged"] <= 0.1
    assert cal["youden_j"] == pytest.approx((allw[y] >= t).mean() - (allw[~y] >= t).mean())
    det = LearnedDetector(tmp_path / "ship" / "model.pt")
    assert det.threshold == t
    w = Windows(load(CNN), 50)
    assert np.allclose(det.score_windows(w), LearnedDetector().score_windows(w), atol=1e-6)


def test_ship_model_never_replaces_a_file_silently(tmp_path, monkeypatch, capsys):
    """An earlier shipped checkpoint is replaced only with --overwrite, a file that is not a
    checkpoint never; --out with --into-package, a calibration on no validation scores and a
    non-checkpoint are one line, exit 2, nothing written."""
    (tmp_path / "ship").mkdir()
    target = tmp_path / "ship" / "model.pt"
    shutil.copy(bundled_model_path(), target)
    notes = tmp_path / "notes" / "model.pt"
    notes.parent.mkdir()
    notes.write_text("my notes")
    test_only = tmp_path / "scores.jsonl"
    test_only.write_text(json.dumps({"id": "a", "split": "test_unseen", "n_windows": 2,
                                     "label": "bad", "labels": [0, 1],
                                     "scores": {"model": [0.1, 0.9]}}) + "\n")
    ckpt = bundled_model_path()
    for args, message in (
            ((ckpt, "--out", tmp_path / "ship"), "holds a traceap checkpoint already"),
            ((ckpt, "--out", tmp_path / "notes", "--overwrite"), "is not a traceap checkpoint"),
            ((ckpt, "--out", tmp_path / "x", "--into-package"), "give one"),
            ((ckpt, "--out", tmp_path / "x", "--calibrate", test_only),
             "no validation-split model scores"),
            ((notes, "--out", tmp_path / "x"), "not a readable model checkpoint")):
        code, _, err = traceap(monkeypatch, capsys, "ship", "model", *args)
        assert code == 2 and message in err, err
        assert len(err.strip().splitlines()) == 1
    assert notes.read_text() == "my notes" and not (tmp_path / "x").exists()
    code, _, err = traceap(monkeypatch, capsys, "ship", "model", ckpt, "--names-from", CNN,
                           "--out", tmp_path / "ship", "--overwrite")
    assert code == 0 and "replaced the traceap checkpoint" in err


def test_ship_ensemble_of_a_model_with_itself_scores_as_the_model(tmp_path, monkeypatch, capsys):
    """`ship ensemble`: the members' weights join the first checkpoint's (the bundled one is an
    ensemble of two already), and the mean of equal logits is the model's own score."""
    from traceap.detectors.learned import LearnedDetector
    from traceap.load import load
    from traceap.model.checkpoint import load_model
    from traceap.windows import Windows
    ens = tmp_path / "ens.pt"
    code, out, err = traceap(monkeypatch, capsys, "ship", "ensemble", bundled_model_path(),
                             bundled_model_path(), "--out", ens)
    assert code == 0, err
    ckpt = load_model(ens)
    assert len(ckpt.states) == 2 * len(load_model().states) and "4 members" in out
    assert ckpt.meta["ensemble_of"] == [str(bundled_model_path())] * 2
    w = Windows(load(CNN), 50)
    assert np.allclose(LearnedDetector(ens).score_windows(w), LearnedDetector().score_windows(w),
                       atol=1e-5)
    code, _, err = traceap(monkeypatch, capsys, "ship", "ensemble", bundled_model_path(),
                           bundled_model_path(), "--out", ens)
    assert code == 2 and "--overwrite" in err


def test_ship_model_calibrates_under_two_percent_of_healthy_windows_by_default(tmp_path, val_scores,
                                                                               monkeypatch, capsys):
    """Without --max-healthy-flagged the threshold flags at most 2% of the healthy traces'
    windows (issue 35's bound for the model alone), where Youden's J alone would flag more;
    the shipped checkpoint's threshold keeps that bound on its calibration split."""
    from traceap.eval.scores import merge_scores
    from traceap.model.ship import calibrate_threshold
    _, scores = val_scores
    records = list(merge_scores([scores], ("validation",)).values())
    free = calibrate_threshold(records, 1.0)
    assert free["healthy_flagged"] > 0.02      # the bound is what moves the threshold here
    code, _, err = traceap(monkeypatch, capsys, "ship", "model", bundled_model_path(),
                           "--calibrate", scores, "--out", tmp_path)
    assert code == 0, err
    cal = torch.load(tmp_path / "model.pt", weights_only=False)["meta"]["calibration"]
    assert cal["max_healthy_flagged"] == 0.02 and cal["healthy_flagged"] <= 0.02
    assert cal["flag_threshold"] > free["flag_threshold"]
    shipped = torch.load(bundled_model_path(), weights_only=False)["meta"]["calibration"]
    assert shipped["healthy_flagged"] <= 0.02


def test_ship_stack_fits_the_hybrid_stack_on_validation_scores(tmp_path, val_scores,
                                                               monkeypatch, capsys):
    """`ship stack` writes the stack `traceap.detectors.stack.fit_stack` fits (the shipped
    recipe: ratio grid, raised bias) with where it came from; `HybridDetector` reads it;
    benchmarks/tune_hybrid.py, with the same options, fits the same coefficients; a test split
    is refused."""
    from traceap.detectors.hybrid import HybridDetector, HybridParams
    from traceap.detectors.stack import SHIPPED_RATIO_GRID, fit_stack
    from traceap.eval.scores import read_scores
    data, scores = val_scores
    code, out, err = traceap(monkeypatch, capsys, "ship", "stack", "--dataset", data,
                             "--scores", scores, "--windows", "20", "--out", tmp_path / "ship")
    assert code == 0, err
    written = json.loads((tmp_path / "ship" / "hybrid.json").read_text())
    rows = read_scores([scores], data, "validation")
    want = fit_stack(rows, [20], SHIPPED_RATIO_GRID, bias=True)
    got = HybridParams.read(tmp_path / "ship" / "hybrid.json")
    assert (got.model_coef, got.expert_coef, got.bias) == \
        (want.model_coef, want.expert_coef, want.bias)
    tuned = written["tuned_on"]
    assert tuned["split"] == "validation" and tuned["windows"] == [20]
    assert tuned["command"].startswith("traceap ship stack --dataset")
    assert set(tuned["validation"]["20"]) == {"model", "expert", "mean", "stack"}
    assert HybridDetector(params=tmp_path / "ship" / "hybrid.json").params == got
    script = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "tune_hybrid.py"), "--dataset", str(data),
         "--scores", str(scores), "--windows", "20", "--flag-bias", "--ratio-grid",
         ",".join(f"{r:g}" for r in SHIPPED_RATIO_GRID), "--out", str(tmp_path / "script.json")],
        capture_output=True, text=True, env={**os.environ,
                                             "PYTHONPATH": str(REPO / "src")})
    assert script.returncode == 0, script.stderr
    by_script = json.loads((tmp_path / "script.json").read_text())
    assert {k: by_script[k] for k in ("model_coef", "expert_coef", "bias", "warmup_coef")} == \
        {k: written[k] for k in ("model_coef", "expert_coef", "bias", "warmup_coef")}
    assert by_script["tuned_on"]["validation"] == tuned["validation"]
    code, _, err = traceap(monkeypatch, capsys, "ship", "stack", "--dataset", data, "--scores",
                           scores, "--split", "test_unseen", "--out", tmp_path / "t")
    assert code == 2 and "never on a test split" in err and not (tmp_path / "t").exists()
    code, _, err = traceap(monkeypatch, capsys, "ship", "stack", "--dataset", data, "--scores",
                           scores, "--windows", "20", "--out", tmp_path / "ship")
    assert code == 2 and "holds a hybrid stack already" in err


def test_ship_stack_into_package_writes_the_package_it_runs_from(tmp_path, val_scores):
    """--into-package replaces traceap/data/hybrid.json of the traceap that runs (here a copy
    of the package, so the checkout's own file is left alone)."""
    data, scores = val_scores
    pkg = tmp_path / "src" / "traceap"
    shutil.copytree(REPO / "src" / "traceap", pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "model.pt"))
    before = _sha(REPO / "src" / "traceap" / "data" / "hybrid.json")
    res = subprocess.run([sys.executable, "-m", "traceap", "ship", "stack", "--dataset", str(data),
                          "--scores", str(scores), "--windows", "20", "--into-package"],
                         capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "src")})
    assert res.returncode == 0, res.stderr
    assert "replaced the hybrid stack" in res.stderr
    assert json.loads((pkg / "data" / "hybrid.json").read_text())["tuned_on"]["windows"] == [20]
    assert _sha(REPO / "src" / "traceap" / "data" / "hybrid.json") == before
    assert not (tmp_path / "shipped").exists()
