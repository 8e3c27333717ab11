"""The benchmark reports read datasets that hold the patterns beyond the paper's eight: the per
pattern report prints a confusion column for each registered pattern, and the planted-cost
report measures a plant's time lost against its cost (issue 34's +-30%).  A real trace planted
with the real `traceap inject`, the scripts run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from traceap.cli import app

from .conftest import CNN, REPO

BENCH = REPO / "benchmarks"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The DDP CNN sample with unfused_optimizer planted (and its unmodified copy)."""
    out = tmp_path_factory.mktemp("real16")
    res = CliRunner().invoke(app, ["inject", str(CNN), "-o", str(out),
                                   "--patterns", "unfused_optimizer", "--seed", "1"])
    assert res.exit_code == 0, res.output
    return out


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / script), *args],
                          capture_output=True, text=True, timeout=600)


def test_rules_report_names_every_registered_pattern(dataset, tmp_path):
    out = tmp_path / "rr.json"
    r = _run("real_rules_report.py", "--dataset", str(dataset), "--split", "test_unseen",
             "--detectors", "expert", "--no-findings", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    # the confusion matrix has a column for the new patterns (a KeyError before)
    assert "UFO" in r.stdout and "CTI" in r.stdout
    per = json.loads(out.read_text())["expert"]["per_pattern"]
    assert per["unfused_optimizer"]["n"] > 0 and per["unfused_optimizer"]["auc"] > 0.5


def test_planted_cost_of_a_plant_is_its_time_lost(dataset, tmp_path):
    r = _run("planted_cost.py", "--dataset", str(dataset), "--split", "test_unseen",
             "--patterns", "unfused_optimizer", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads((tmp_path / "planted_cost.json").read_text())
    assert len(rows) == 1 and rows[0]["severity"] is not None
    assert rows[0]["ratio"] == pytest.approx(1.0, abs=0.3)


def test_the_h200_training_sets_replace_only_what_they_wrote(tmp_path):
    """`h200_train_sets.py` into a folder whose h200_train holds someone else's manifest:
    refused in one line, that file and the folder untouched, nothing injected; into an empty
    folder it writes both sets, and a second run rewrites its own files."""
    h200 = tmp_path / "h200"
    h200.mkdir()
    (h200 / "traces").symlink_to(REPO / "benchmarks" / "h200" / "traces")
    keep = ("resnet50-train-clean-bs128-nvidia-h200",
            "resnet50-train-no_pin_memory-bs128-nvidia-h200")
    rows = [r for r in (REPO / "benchmarks" / "h200" / "manifest.jsonl").read_text().splitlines()
            if json.loads(r)["id"] in keep]
    (h200 / "manifest.jsonl").write_text("\n".join(rows) + "\n")
    theirs = tmp_path / "theirs"
    (theirs / "h200_train").mkdir(parents=True)
    (theirs / "h200_train" / "manifest.jsonl").write_text("their dataset\n")
    r = _run("h200_train_sets.py", "--h200", str(h200), "--out", str(theirs), "--copies", "1")
    assert r.returncode == 2 and "did not write" in r.stderr
    assert (theirs / "h200_train" / "manifest.jsonl").read_text() == "their dataset\n"
    assert sorted(p.name for p in theirs.rglob("*")) == ["h200_train", "manifest.jsonl"]
    mine = tmp_path / "mine"
    for _ in range(2):
        r = _run("h200_train_sets.py", "--h200", str(h200), "--out", str(mine), "--copies", "1",
                 "--jobs", "1")
        assert r.returncode == 0, r.stderr
    train = [json.loads(x)
             for x in (mine / "h200_train" / "manifest.jsonl").read_text().splitlines()]
    assert [(x["id"], x["split"]) for x in train] == [(keep[1], "train")]
    planted = (mine / "h200_inj" / "manifest.jsonl").read_text().splitlines()
    assert len(planted) > 10 and all(json.loads(x)["split"] == "train" for x in planted)
