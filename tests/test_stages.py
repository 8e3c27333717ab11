"""One path from options to stages (#33 part 2): one builder from options to (detector,
classifier), one "analyse this path", the window count checked once, the protocols declaring
what callers read, one registration style; and `traceap diff` reusing the analysis' windows."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

import traceap
from traceap.analysis import Analysis, analyze
from traceap.classify import BaseClassifier, PatternCall, classifier_names, register_classifier
from traceap.cli import app
from traceap.detectors import BaseDetector, detector_names, register_detector
from traceap.diff import compare
from traceap.errors import TraceapError
from traceap.job import JobAnalysis, analyze_job, analyze_path
from traceap.windows import DEFAULT_WINDOWS, MAX_WINDOWS

from .conftest import CNN, DATA, REPO, SAMPLE

SRC = REPO / "src" / "traceap"
runner = CliRunner()
CAP = f"--windows must be between 1 and {MAX_WINDOWS}"


# -- the window count: defined once, checked the same way everywhere ---------------------------
def test_the_window_count_is_defined_once():
    defined = {name: [] for name in ("DEFAULT_WINDOWS", "MAX_WINDOWS")}
    literal_defaults = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id in defined:
                        defined[t.id].append(path.relative_to(SRC).as_posix())
            # a --windows option (typer's, argparse's) or a `windows` / `n_windows` argument
            # defaults to the one constant, not to a number of its own
            where = f"{path.relative_to(SRC).as_posix()}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and any(
                    isinstance(a, ast.Constant) and a.value == "--windows" for a in node.args):
                given = [node.args[0]] + [k.value for k in node.keywords if k.arg == "default"]
                if any(isinstance(g, ast.Constant) and isinstance(g.value, int) for g in given):
                    literal_defaults.append(where)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                named = list(zip(a.args[len(a.args) - len(a.defaults):], a.defaults))
                named += [(x, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                literal_defaults += [where for x, d in named
                                     if x.arg in ("windows", "n_windows")
                                     and isinstance(d, ast.Constant) and isinstance(d.value, int)]
    assert defined == {"DEFAULT_WINDOWS": ["windows.py"], "MAX_WINDOWS": ["windows.py"]}
    assert literal_defaults == []


@pytest.mark.parametrize("n", [0, MAX_WINDOWS + 1, 10**9])
def test_library_calls_refuse_the_window_counts_the_cli_refuses(readme_sample, tmp_path, n):
    from traceap.handler import TraceHandler
    for call in (lambda: traceap.analyze(SAMPLE, windows=n),
                 lambda: traceap.analyze(readme_sample, windows=n),
                 lambda: TraceHandler(tmp_path, windows=n),
                 lambda: analyze(readme_sample, n_windows=n),
                 lambda: analyze_job(DATA / "dlrm_job", n),
                 lambda: analyze_path(SAMPLE, n),
                 lambda: compare(SAMPLE, CNN, n)):
        with pytest.raises(TraceapError) as err:
            call()
        assert str(err.value) == (f"{CAP}, not {n} (the paper uses 50-200; the model compares "
                                  f"every pair of windows)")


@pytest.mark.parametrize("command", [
    ["analyze", str(SAMPLE)],
    ["diff", str(SAMPLE), str(CNN)],
    ["profile", "--out", "{tmp}/p", "--", sys.executable, "-c", "open('{tmp}/ran', 'w')"],
])
def test_every_command_caps_the_window_count_with_one_line(tmp_path, command):
    command = [c.replace("{tmp}", str(tmp_path)) for c in command]
    at = command.index("--") if "--" in command else len(command)
    args = command[:at] + ["--windows", "100000"] + command[at:]
    p = subprocess.run([sys.executable, "-m", "traceap", *args], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and CAP in p.stderr, p.stderr
    assert not (tmp_path / "ran").exists()      # profile: refused before the command ran


# -- one "analyse this path" ---------------------------------------------------------------------
def test_one_path_analyses_a_file_or_a_folder(tmp_path):
    a, trace = analyze_path(CNN, 20, "expert")
    assert isinstance(a, Analysis) and trace.meta.path == str(CNN)
    job, none = analyze_path(DATA / "dlrm_job", 20, "expert")
    assert isinstance(job, JobAnalysis) and none is None and len(job.ranks) > 1
    # a folder's chosen traces only (`traceap profile`: the traces its run wrote)
    files = sorted((DATA / "dlrm_job").glob("*.json*"))[:2]
    two, _ = analyze_path(DATA / "dlrm_job", 20, "expert", files=files)
    assert sorted(r.trace_path for r in two.ranks) == sorted(str(f) for f in files)
    with pytest.raises(TraceapError, match="no such file or folder"):
        analyze_path(tmp_path / "missing.json.gz")


# -- the protocols declare what callers read ----------------------------------------------------
PROBED = {"det", "detector", "clf", "classifier", "inner", "holder", "llm_clf", "head"}


def test_no_caller_probes_a_detector_or_a_classifier():
    """No getattr/hasattr on a detector or classifier anywhere in traceap: what callers read is
    declared by the protocols (detectors/base.py, classify/base.py)."""
    probes = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and node.args
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in PROBED):
                probes.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert probes == []


def test_nothing_reaches_into_a_classifiers_private_members():
    # the LLM classifier's `_down` (its dead backend) travels back from a worker by the
    # protocol's take_state / give_state, not read by name from outside
    outside = [p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")
               if "_down" in p.read_text() and p.name != "llm.py"]
    assert outside == []


class _Bare:
    """Scores windows, but declares none of the rest of the protocol."""

    name = "bare"

    def fit(self, traces, labels):
        return self

    def score_windows(self, windows):
        return np.zeros(windows.n)


def test_an_object_outside_the_protocol_is_one_clear_error(readme_sample):
    with pytest.raises(TraceapError) as err:
        analyze(readme_sample, 20, detector=_Bare())
    assert "lacks threshold, pattern_head, failures, subtraces, notes" in str(err.value)
    assert "BaseDetector" in str(err.value) and "\n" not in str(err.value)


class _Half(BaseDetector):
    """Half the windows at 0.7: flagged at the default threshold, not at its own 0.8."""

    name = "half"

    def score_windows(self, windows):
        return np.where(np.arange(windows.n) < windows.n // 2, 0.7, 0.0)


class _Strict(_Half):
    threshold = 0.8


def test_the_threshold_is_the_detectors_else_the_default(readme_sample):
    assert analyze(readme_sample, 20, detector=_Half()).threshold == 0.5
    strict = analyze(readme_sample, 20, detector=_Strict())
    assert strict.threshold == 0.8 and not any(w.flagged for w in strict.windows)


# -- one registration style ---------------------------------------------------------------------
class _ToyDetector(_Half):
    name = "toy"

    @property
    def notes(self):
        return ["toy detector: the first half"]


class _ToyClassifier(BaseClassifier):
    name = "toyc"

    def classify(self, windows, window_indices, scores):
        return [PatternCall(int(w), None, 1.0, "", "", false_alarm=True, source=self.name)
                for w in window_indices]

    @property
    def notes(self):
        return ["toy classifier: nothing is an anti-pattern"]


@pytest.fixture
def toys():
    from traceap.classify import registry as classifiers
    from traceap.detectors import registry as detectors
    register_detector("toy", _ToyDetector)
    register_classifier("toyc", _ToyClassifier)
    yield
    detectors._DETECTORS.unregister("toy")
    classifiers._CLASSIFIERS.unregister("toyc")


def test_a_detector_and_a_classifier_registered_in_a_test_run_from_the_cli(toys):
    assert "toy" in detector_names() and "toyc" in classifier_names()
    r = runner.invoke(app, ["analyze", str(CNN), "--windows", "20", "--detector", "toy",
                            "--classifier", "toyc", "--json", "-"])
    assert r.exit_code == 0, r.output
    out = orjson.loads(r.stdout)
    assert out["n_windows"] == 20 and sum(w["flagged"] for w in out["windows"]) == 10
    assert "toy classifier: nothing is an anti-pattern" in out["notes"]
    assert "toy detector: the first half" in out["notes"]


def test_the_built_in_ones_register_from_their_own_modules():
    from traceap.classify import registry as classifiers
    from traceap.detectors import make_detector, registry as detectors
    for name in ("expert", "rule", "clustering"):
        det = make_detector(name)
        assert detectors._DETECTORS.entry(name).cls is type(det)
        assert type(det).__module__ == detectors.BUILTIN[name]
    assert classifiers.BUILTIN["offline"] == "traceap.classify.offline"


# -- diff reuses the analysis' own windows ---------------------------------------------------------
def test_diff_reads_the_amounts_the_analysis_measured(monkeypatch):
    from traceap import diff
    from traceap.load import load

    before = diff.side_of(SAMPLE)
    trace = load(SAMPLE)
    # the same numbers as cutting the trace again ...
    assert before.amounts == diff.pattern_amounts(trace, before.n_steps)
    # ... which no longer happens for a trace analysed here
    monkeypatch.setattr(diff, "pattern_amounts", lambda *a: pytest.fail("windows cut twice"))
    assert diff.side_of(SAMPLE).amounts == before.amounts


def test_diff_json_is_the_same_from_one_run_to_the_next(tmp_path):
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"d{seed}.json"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        p = subprocess.run([sys.executable, "-m", "traceap", "diff", str(CNN), str(SAMPLE),
                            "--json", str(out), "-q"], capture_output=True, text=True,
                           timeout=300, env=env)
        assert p.returncode == 0, p.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert list(orjson.loads(outs[0])["before"]["amounts"]) == [
        p for p in traceap.patterns.pattern_ids() if p in orjson.loads(outs[0])["before"]["amounts"]]
