"""benchmarks/planted_cost.py's --out folder: its own rows are rewritten, a file it did not
write is never replaced."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import REPO

SCRIPT = REPO / "benchmarks" / "planted_cost.py"
ROW = {"id": "b__cpu_bound__c0", "split": "validation", "base": "b", "pattern": "cpu_bound",
       "cost_us": 2000.0, "lost_us": 1800.0, "severity": "medium", "ratio": 0.9,
       "label_us": 2400.0}


def _run(tmp_path, out):
    """The script re-printing stored rows (--rows) into --out OUT."""
    ds = tmp_path / "ds"
    ds.mkdir(exist_ok=True)
    (ds / "manifest.jsonl").write_text("")
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([ROW]))
    return subprocess.run([sys.executable, str(SCRIPT), "--dataset", str(ds), "--rows",
                           str(rows), "--patterns", "cpu_bound", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)


def test_its_rows_never_replace_a_file_it_did_not_write(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    mine = out / "planted_cost.json"
    mine.write_text("the user's own notes\n")
    (out / "other.txt").write_text("kept\n")
    r = _run(tmp_path, out)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "planted_cost.json" in r.stderr
    assert mine.read_text() == "the user's own notes\n"
    assert (out / "other.txt").read_text() == "kept\n"
    assert not (out / ".planted-cost.json").exists()


def test_a_rerun_replaces_its_own_rows_beside_other_files(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "other.txt").write_text("kept\n")
    for _ in range(2):
        r = _run(tmp_path, out)
        assert r.returncode == 0, r.stderr
        assert "cpu_bound" in r.stdout and "0.90" in r.stdout and "1.20" in r.stdout
        assert json.loads((out / "planted_cost.json").read_text()) == [ROW]
    assert (out / "other.txt").read_text() == "kept\n"
