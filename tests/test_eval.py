"""`traceap eval` on a tiny dataset built from real traces, where the right numbers are known.

The dataset copies the bundled real traces into tmp/traces and writes a manifest whose anomaly
intervals we choose, at fractions of each trace's span that fall strictly inside windows for
N = 50, 100 and 200, so the number of labelled windows is known by arithmetic alone.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

import traceap
from traceap.manifest import Anomaly, Entry, read_manifest, trace_path, write_manifest
from traceap.patterns import pattern_ids
from traceap.detectors import BaseDetector
from traceap.errors import DatasetError
from traceap.eval import EvalConfig, evaluate, metrics, plots, tables
from traceap.eval.runner import select

from .conftest import DATA, CNN

PATTERNS = pattern_ids()  # the built-in pattern ids, in report order

# (id, source file, split, task, label, [(start fraction, end fraction, pattern)])
LAYOUT = [
    ("ic_bad", DATA / "particle_transformer_bs8.json.gz", "test_seen", "image_classification", "bad",
     [(0.1025, 0.2975, "no_pin_memory"), (0.6025, 0.6975, "cpu_bound")]),
    ("ic_good", DATA / "kineto2021_v100.json.gz", "test_seen", "image_classification", "good", []),
    ("od_bad", DATA / "amd_mi250_train.json.gz", "test_seen", "object_detection", "bad",
     [(0.2025, 0.4975, "excessive_memcpy")]),
    ("od_good", DATA / "amd_mi300_gemm.json.gz", "test_seen", "object_detection", "good", []),
    ("pe_bad", DATA / "dlrm_job" / "worker0.pt.trace.json.gz", "test_unseen", "pose_estimation",
     "bad", [(0.4025, 0.5975, "small_nccl_kernels")]),
    ("pe_good", DATA / "dlrm_job" / "worker1.pt.trace.json.gz", "test_unseen", "pose_estimation",
     "good", []),
    ("ig_bad", CNN, "test_unseen", "image_generation", "bad",
     [(0.0025, 0.0975, "graph_break"), (0.8025, 0.9975, "nccl_compute_no_overlap")]),
    ("ig_good", DATA / "cpu_only_zoology.json.gz", "test_unseen", "image_generation", "good", []),
    ("train_bad", DATA / "amd_mi250_train.json.gz", "train", "image_classification", "bad",
     [(0.0025, 0.9975, "cpu_bound")]),
    ("train_good", DATA / "kineto2021_v100.json.gz", "train", "image_classification", "good", []),
]
WINDOWS = (50, 100, 200)


def n_labelled(a: float, b: float, n: int) -> int:
    """Windows of N equal windows that overlap [a, b) (fractions strictly inside windows)."""
    return math.floor(b * n) - math.floor(a * n) + 1


def build(root: Path, layout=LAYOUT, missing: bool = False) -> Path:
    """A dataset in FORMATS.md form from the bundled real traces."""
    (root / "traces").mkdir(parents=True)
    entries = []
    for tid, src, split, task, label, anomalies in layout:
        rel = f"traces/{tid}.pt.trace.json.gz"
        shutil.copyfile(src, root / rel)
        lo, hi = traceap.load(src).span
        entries.append(Entry(
            id=tid, path=rel, split=split, task=task, model="m", platform="p", world_size=1,
            rank=0, label=label, patterns=sorted({p for *_, p in anomalies}),
            anomalies=[Anomaly(lo + a * (hi - lo), lo + b * (hi - lo), p) for a, b, p in anomalies]))
    if missing:
        entries.append(Entry(id="gone", path="traces/gone.pt.trace.json.gz", split="test_seen",
                             task="image_classification", model="m", platform="p", world_size=1,
                             rank=0, label="good"))
    write_manifest(root, entries)
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("tiny"), missing=True)


class Oracle(BaseDetector):
    """Reads the manifest: a window's score is 1 exactly when it overlaps an anomaly."""

    name = "perfect"

    def __init__(self, root: Path, invert: bool = False):
        self.by_file = {trace_path(root, e).name: e for e in read_manifest(root)}
        self.invert = invert

    def entry(self, windows) -> Entry:
        return self.by_file[Path(windows.trace.meta.path).name]

    def fit(self, traces, labels):
        return self

    def score_windows(self, windows) -> np.ndarray:
        e = self.entry(windows)
        lo, hi = windows.start_us, windows.end_us
        y = np.zeros(windows.n)
        for a in e.anomalies:
            y[(lo < a.end_us) & (hi > a.start_us)] = 1.0
        return 1.0 - y if self.invert else y


class Coin(BaseDetector):
    """Uniform random scores: AUC about 0.5."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def fit(self, traces, labels):
        return self

    def score_windows(self, windows) -> np.ndarray:
        return self.rng.random(windows.n)


class Constant(BaseDetector):
    """The same score everywhere (flags every window when >= the threshold)."""

    name = "constant"

    def __init__(self, value: float):
        self.value = value
        self.fitted_on: list[tuple[int, list[int]]] = []

    def fit(self, traces, labels):
        assert all(isinstance(t, traceap.Trace) for t in traces)
        self.fitted_on.append((len(traces), list(labels)))
        return self

    def score_windows(self, windows) -> np.ndarray:
        return np.full(windows.n, self.value)


@dataclass
class Call:
    pattern: str | None


class KnownClassifier:
    """Right on image classification; always says cpu_bound on object detection; silent on
    pose estimation; right on image generation."""

    def __init__(self, root: Path):
        self.oracle = Oracle(root)

    def classify(self, windows, window_indices, scores):
        e = self.oracle.entry(windows)
        out = []
        for w in window_indices:
            lo, hi = windows.start_us[w], windows.end_us[w]
            cover = [(min(a.end_us, hi) - max(a.start_us, lo), a.pattern) for a in e.anomalies]
            truth = max(cover)[1]
            out.append(Call({"object_detection": "cpu_bound", "pose_estimation": None}.get(
                e.task, truth)))
        return out


@pytest.fixture(scope="module")
def result(dataset):
    return evaluate(dataset, {"perfect": Oracle(dataset), "random": Coin(0),
                              "inverted": Oracle(dataset, invert=True), "constant": Constant(0.7)},
                    classifiers={"known": KnownClassifier(dataset)},
                    config=EvalConfig(windows=WINDOWS), fit=["constant"],
                    on_warning=lambda m: None)


def test_perfect_detector_has_auc_one_and_random_about_half(result):
    s = result.summary
    for n in WINDOWS:
        det = s["detection"][str(n)]
        for group, tasks in (("seen", ["image_classification", "object_detection"]),
                             ("unseen", ["pose_estimation", "image_generation"])):
            assert s["tasks"][group] == tasks
            assert det["perfect"][group]["tasks"] == {t: 1.0 for t in tasks}
            assert det["perfect"][group]["avg"] == 1.0
            assert det["inverted"][group]["avg"] == 0.0
            assert det["random"][group]["pooled"] == pytest.approx(0.5, abs=0.1)
            assert det["constant"][group]["avg"] == 0.5     # all ties
    # Table 3 average is the mean of the per-task AUCs.
    r = s["detection"]["200"]["random"]["seen"]
    assert r["avg"] == pytest.approx(np.mean(list(r["tasks"].values())))


def test_window_labels_count_exactly(result):
    s = result.summary
    for n in WINDOWS:
        seen = sum(n_labelled(a, b, n) for _, _, split, _, _, an in LAYOUT if split == "test_seen"
                   for a, b, _ in an)
        det = s["detection"][str(n)]["perfect"]["seen"]
        assert det["n_positive"] == seen
        assert det["n_windows"] == 4 * n      # the missing trace is skipped, not counted


def test_missing_trace_is_reported_and_skipped(result):
    assert [w for w in result.warnings if "gone" in w and "missing" in w]
    assert "gone" not in {r.id for r in result.records}
    assert s_counts(result) == {"seen": {"good": 2, "bad": 2}, "unseen": {"good": 2, "bad": 2}}


def s_counts(result):
    return result.summary["n_traces"]


def test_classification_accuracy_and_confusion(result):
    s = result.summary
    for n in WINDOWS:
        c = s["classification"]["known"][str(n)]
        acc = {t: v["accuracy"] for t, v in c["tasks"].items()}
        assert acc == {"image_classification": 1.0, "object_detection": 0.0,
                       "pose_estimation": 0.0, "image_generation": 1.0}
        assert c["avg"] == 0.5
        m = np.array(c["confusion"]["matrix"])
        labels = c["confusion"]["labels"]
        assert labels == list(PATTERNS) + ["none"]
        ix = {p: i for i, p in enumerate(labels)}
        expect = np.zeros_like(m)
        for tid, _, split, task, _, an in LAYOUT:
            if split == "train":
                continue
            for a, b, p in an:
                pred = {"object_detection": "cpu_bound", "pose_estimation": "none"}.get(task, p)
                expect[ix[p], ix[pred]] += n_labelled(a, b, n)
        assert (m == expect).all()
        total = m.sum()
        assert c["overall"] == pytest.approx(np.trace(m) / total)


class FirstAnomaly(Oracle):
    """Flags only the windows of each trace's first anomaly: the later ones go unflagged."""

    name = "first"

    def score_windows(self, windows) -> np.ndarray:
        e = self.entry(windows)
        y = np.zeros(windows.n)
        for a in e.anomalies[:1]:
            y[(windows.start_us < a.end_us) & (windows.end_us > a.start_us)] = 1.0
        return y


def test_flagged_accuracy_counts_only_the_windows_the_default_detector_flags(dataset):
    """Issue #35's accuracy: of the anomalous windows `hybrid` flags, the share named right.

    `hybrid` (the default detector) flags the first anomaly of each bad trace only, so
    ic_bad's cpu_bound and ig_bad's nccl_compute_no_overlap (both named right by the known
    classifier) drop out; the object-detection (wrong) and pose-estimation (no answer)
    windows stay in: the flagged accuracy is below the all-windows one."""
    r = evaluate(dataset, {"perfect": Oracle(dataset), "hybrid": FirstAnomaly(dataset)},
                 classifiers={"known": KnownClassifier(dataset)},
                 config=EvalConfig(windows=WINDOWS), on_warning=lambda m: None)
    s = r.summary
    for n in WINDOWS:
        c = s["classification"]["known"][str(n)]
        f = c["flagged"]
        assert f["detector"] == "hybrid"          # the default detector, though not first
        first = {tid: an[0] for tid, _, split, _, _, an in LAYOUT if an and split != "train"}
        count = {tid: n_labelled(a, b, n) for tid, (a, b, _) in first.items()}
        right = count["ic_bad"] + count["ig_bad"]  # od: cpu_bound (wrong); pe: None (wrong)
        assert f["n_windows"] == sum(count.values())
        assert f["overall"] == pytest.approx(right / sum(count.values()))
        # one anomaly per window here: naming any overlapping one is naming the one
        assert f["overall_any"] == f["overall"]
        assert f["by_pattern"]["no_pin_memory"] == {"accuracy": 1.0, "accuracy_any": 1.0,
                                                    "n_windows": count["ic_bad"], "wrong": {}}
        # every wrong call counted under what it named
        assert f["by_pattern"]["excessive_memcpy"] == {"accuracy": 0.0, "accuracy_any": 0.0,
                                                       "n_windows": count["od_bad"],
                                                       "wrong": {"cpu_bound": count["od_bad"]}}
        # a pattern whose windows are all unflagged keeps its row, with no windows
        assert f["by_pattern"]["cpu_bound"] == {"accuracy": None, "accuracy_any": None,
                                                "n_windows": 0, "wrong": {}}
        assert set(f["by_pattern"]) == set(c["by_pattern"])
        # the same number by hand from the records: flagged & anomalous windows, their calls
        truth, pred = [], []
        for rec in r.of(n):
            anomalous = list(np.flatnonzero(rec.labels))
            for w in np.flatnonzero(rec.labels & rec.flagged["hybrid"]):
                truth.append(rec.patterns[w])
                pred.append(rec.calls["known"][anomalous.index(w)])
        assert f["n_windows"] == len(truth)
        assert f["overall"] == pytest.approx(np.mean([t == p for t, p in zip(truth, pred)]))
        # not the all-windows accuracy (every anomalous window), which stays as it was
        later = n_labelled(0.6025, 0.6975, n) + n_labelled(0.8025, 0.9975, n)  # unflagged, right
        assert c["overall"] == pytest.approx((right + later) / (sum(count.values()) + later))
        assert f["overall"] < c["overall"]
    md = tables.markdown(s)
    assert "## Pattern accuracy (%) of the `known` classifier on windows `hybrid` flags" in md
    bold = [f"**{tables.pct(s['classification']['known'][str(n)]['flagged']['overall'], 1)} / "
            f"{tables.pct(s['classification']['known'][str(n)]['flagged']['overall_any'], 1)} "
            f"({s['classification']['known'][str(n)]['flagged']['n_windows']})**"
            for n in WINDOWS]
    assert "| **flagged windows** | " + " | ".join(bold) + " |" in md
    assert "| `cpu_bound` | – / – (0) | – / – (0) | – / – (0) |" in md
    # without `hybrid`, the run's first detector flags; without a detector, no number
    r = evaluate(dataset, {"first": FirstAnomaly(dataset), "perfect": Oracle(dataset)},
                 classifiers={"known": KnownClassifier(dataset)},
                 config=EvalConfig(windows=(50,)), on_warning=lambda m: None)
    assert r.summary["classification"]["known"]["50"]["flagged"]["detector"] == "first"
    r = evaluate(dataset, {}, classifiers={"known": KnownClassifier(dataset)},
                 config=EvalConfig(windows=(50,)), on_warning=lambda m: None)
    assert r.summary["classification"]["known"]["50"]["flagged"] is None
    assert "on windows" not in tables.markdown(r.summary)


def test_flagged_accuracy_any_takes_either_cause_of_a_window_holding_two():
    """A pattern planted into a base with a natural one: the window they share has two right
    answers.  Strict accuracy wants the one covering most of the window; `accuracy_any` takes
    either (and still counts a call naming neither, or none, wrong)."""
    from traceap.eval.runner import EvalResult, TraceRecord

    labels = np.array([True, True, True, False])
    rec = TraceRecord("t", "test_unseen", "other", True, 4, (0.0, 4.0), labels,
                      ["no_channels_last", "no_channels_last", "no_channels_last", None],
                      [frozenset({"no_channels_last", "no_pin_memory"}),
                       frozenset({"no_channels_last"}),
                       frozenset({"no_channels_last", "no_pin_memory"}), frozenset()])
    rec.flagged["hybrid"] = np.array([True, True, True, True])
    rec.calls["c"] = ["no_pin_memory", "no_pin_memory", "no_channels_last"]
    res = EvalResult("d", EvalConfig(windows=(4,), splits=("test_unseen",)), ["hybrid"], ["c"],
                     [rec])
    f = res._flagged_accuracy(4, "c", ["no_channels_last"])
    # window 0: the planted pattern named (right for any); 1: it is not there (wrong); 2: right
    assert f["overall"] == pytest.approx(1 / 3) and f["overall_any"] == pytest.approx(2 / 3)
    assert f["by_pattern"]["no_channels_last"] == {"accuracy": pytest.approx(1 / 3),
                                                   "accuracy_any": pytest.approx(2 / 3),
                                                   "n_windows": 3,
                                                   "wrong": {"no_pin_memory": 2}}


class Says:
    """Names one pattern on every window it is asked about."""

    def __init__(self, pattern: str):
        self.pattern = pattern

    def classify(self, windows, window_indices, scores):
        return [Call(self.pattern) for _ in window_indices]


def test_planted_accuracy_counts_the_plants_windows_and_names_the_plant(tmp_path):
    """Issue #35's "pattern accuracy on flagged planted windows": of the flagged windows a
    plant overlaps, the share named the planted pattern (`patterns[0]` of an injected entry).
    A plant inside a natural anomaly covering more of its windows is wrong for the strict
    measure and right here; a natural trace's windows and the natural anomaly's own windows
    are not planted windows."""
    from traceap.manifest import window_planted
    from traceap.windows import Windows
    root = tmp_path / "ds"
    (root / "traces").mkdir(parents=True)
    rows = [  # id, source, patterns, [(a, b, pattern)] (the natural one first: it covers more)
        ("inj", "injected", ["no_pin_memory", "no_channels_last"],
         [(0.0025, 0.9975, "no_channels_last"), (0.2025, 0.2975, "no_pin_memory")]),
        ("nat", "natural", ["no_pin_memory"], [(0.4025, 0.4975, "no_pin_memory")]),
    ]
    entries = []
    for tid, source, pats, anomalies in rows:
        rel = f"traces/{tid}.pt.trace.json.gz"
        shutil.copyfile(CNN, root / rel)
        lo, hi = traceap.load(CNN).span
        entries.append(Entry(
            id=tid, path=rel, split="test_unseen", task="other", model="m", platform="p",
            world_size=1, rank=0, label="bad", patterns=pats, source=source,
            anomalies=[Anomaly(lo + a * (hi - lo), lo + b * (hi - lo), p) for a, b, p in anomalies]))
    write_manifest(root, entries)
    n = 100
    by_id = {e.id: e for e in read_manifest(root)}
    w = Windows(traceap.load(CNN), n)
    plant = window_planted(by_id["inj"], w)
    assert [i for i, p in enumerate(plant) if p] == list(range(20, 30))
    assert set(plant) == {None, "no_pin_memory"}
    assert window_planted(by_id["nat"], w) == [None] * n
    r = evaluate(root, {"hybrid": Oracle(root)}, classifiers={"says": Says("no_pin_memory")},
                 config=EvalConfig(windows=(n,), splits=("test_unseen",)),
                 on_warning=lambda m: None)
    f = r.summary["classification"]["says"][str(n)]["flagged"]
    planted = n_labelled(0.2025, 0.2975, n)
    natural = n_labelled(0.4025, 0.4975, n)
    # every window of the injected trace is flagged (its natural anomaly spans it), named the
    # plant: strict right only on the natural trace's windows, either-cause on the plant's too
    assert f["n_windows"] == 100 + natural
    assert f["overall"] == pytest.approx(natural / (100 + natural))
    assert f["overall_any"] == pytest.approx((planted + natural) / (100 + natural))
    assert f["planted"] == {"overall": 1.0, "overall_any": 1.0, "n_windows": planted,
                            "by_pattern": {"no_pin_memory": {"accuracy": 1.0, "accuracy_any": 1.0,
                                                             "n_windows": planted, "wrong": {}}}}
    md = tables.markdown(r.summary)
    assert "on planted windows `hybrid` flags" in md
    assert f"| **planted windows** | **100.0 / 100.0 ({planted})** |" in md
    # named the natural cause instead: wrong on every planted window, right for the strict
    r = evaluate(root, {"hybrid": Oracle(root)}, classifiers={"says": Says("no_channels_last")},
                 config=EvalConfig(windows=(n,), splits=("test_unseen",)),
                 on_warning=lambda m: None)
    f = r.summary["classification"]["says"][str(n)]["flagged"]
    assert f["planted"]["overall"] == 0.0 and f["overall"] == pytest.approx(100 / (100 + natural))
    assert f["planted"]["overall_any"] == 1.0   # the natural cause the plant's windows hold
    # a cause the window does not hold is wrong for both
    r = evaluate(root, {"hybrid": Oracle(root)}, classifiers={"says": Says("cpu_bound")},
                 config=EvalConfig(windows=(n,), splits=("test_unseen",)),
                 on_warning=lambda m: None)
    p = r.summary["classification"]["says"][str(n)]["flagged"]["planted"]
    assert p["overall"] == 0.0 and p["overall_any"] == 0.0 and p["n_windows"] == planted
    assert p["by_pattern"]["no_pin_memory"]["wrong"] == {"cpu_bound": planted}
    # nothing planted: no planted accuracy, and no table for it
    write_manifest(root, [by_id["nat"]])
    r = evaluate(root, {"hybrid": Oracle(root)}, classifiers={"says": Says("no_pin_memory")},
                 config=EvalConfig(windows=(n,), splits=("test_unseen",)),
                 on_warning=lambda m: None)
    assert r.summary["classification"]["says"][str(n)]["flagged"]["planted"] is None
    assert "planted windows" not in tables.markdown(r.summary)


def test_trace_level_auc_and_false_findings(result):
    s = result.summary
    for n in WINDOWS:
        t = s["trace_level"][str(n)]
        assert t["perfect"]["all"]["auc_mean"] == 1.0
        assert t["perfect"]["all"]["auc_max"] == 1.0
        assert t["perfect"]["false_findings_per_healthy_trace"] == 0.0
        assert t["perfect"]["window_recall_bad"] == 1.0
        assert t["perfect"]["window_precision_bad"] == 1.0
        # The inverted oracle flags every window of a healthy trace: one finding of N windows.
        assert t["inverted"]["false_findings_per_healthy_trace"] == 1.0
        assert t["inverted"]["flagged_windows_per_healthy_trace"] == n
        assert t["constant"]["flagged_share_healthy"] == 1.0


def test_fitting_uses_train_split_labels_only(result, dataset):
    const = Constant(0.7)
    evaluate(dataset, {"constant": const, "random": Coin()}, config=EvalConfig(windows=(10,)),
             fit=["constant"], on_warning=lambda m: None)
    assert const.fitted_on == [(2, [1, 0])]
    assert result.n_fit_traces == {"constant": 2}


def test_factory_builds_and_fits_one_detector_per_window_count(dataset):
    built: dict[int, Constant] = {}

    def factory(n: int) -> Constant:
        built[n] = Constant(n / 1000)
        return built[n]

    r = evaluate(dataset, {"per_n": factory}, config=EvalConfig(windows=(20, 40)),
                 fit=["per_n"], on_warning=lambda m: None)
    assert sorted(built) == [20, 40]
    assert all(c.fitted_on == [(2, [1, 0])] for c in built.values())
    assert {float(r.scores["per_n"][0]) for r in r.records if r.n == 40} == {0.04}


def test_dataset_without_train_split_evaluates_unfitted(tmp_path):
    root = build(tmp_path / "d", [x for x in LAYOUT if x[2] != "train"][:4])
    const = Constant(0.2)
    seen: list[str] = []
    r = evaluate(root, {"constant": const, "perfect": Oracle(root)},
                 config=EvalConfig(windows=(20,), splits=("test_seen",)), fit=["constant"],
                 on_warning=seen.append)
    assert const.fitted_on == []
    assert any("no train traces" in w for w in seen)
    assert r.summary["detection"]["20"]["perfect"]["seen"]["avg"] == 1.0
    assert list(r.summary["tasks"]) == ["seen"]


def test_limit_keeps_tasks_and_labels(dataset):
    entries = [e for e in read_manifest(dataset) if e.split == "test_unseen"]
    picked = select(entries, 2, key=lambda e: (e.task, e.label))
    assert len(picked) == 2 and len({(e.task, e.label) for e in picked}) == 2
    r = evaluate(dataset, {"perfect": Oracle(dataset)},
                 config=EvalConfig(windows=(20,), limit=2), on_warning=lambda m: None)
    assert len(r.records) <= 4


def test_metrics_are_sklearn_and_handle_one_class():
    assert metrics.auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    assert metrics.auc([1, 1], [0.1, 0.2]) is None
    assert metrics.accuracy(["a", "b"], ["a", None]) == 0.5
    assert metrics.accuracy([], []) is None
    assert metrics.runs(np.array([1, 1, 0, 1, 0, 0, 1], bool)) == 3
    assert metrics.runs(np.zeros(5, bool)) == 0
    assert metrics.mean_defined([None, 0.5, 1.0]) == 0.75


def test_markdown_json_and_plots(result, tmp_path):
    md_path, js_path = tables.write(result.summary, tmp_path)
    md = md_path.read_text()
    assert "| 100 | perfect | 100.00 | 100.00 | **100.00** | 100.00 | 100.00 | **100.00** |" in md
    assert "Image Classification" in md and "Pose Estimation" in md
    assert "| **Avg** (over tasks) | **50.00** | **50.00** | **50.00** |" in md
    back = orjson.loads(js_path.read_bytes())
    assert back["schema"] == "traceap.eval/v1"
    assert back["detection"]["50"]["perfect"]["unseen"]["avg"] == 1.0
    roc = plots.roc_curves(result, tmp_path, 100)
    tl = plots.timelines(result, tmp_path, 100)
    for p in (roc, tl):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    # One bad trace per task, the seen tasks first.
    assert [r.id for r in plots.pick_traces(result, 100)] == ["ic_bad", "od_bad", "pe_bad", "ig_bad"]
    assert plots.spans(np.array([0, 1, 1, 0, 1], bool)) == [(1, 3), (4, 5)]


def test_bad_inputs(tmp_path):
    with pytest.raises(DatasetError, match="no manifest"):
        evaluate(tmp_path, {"random": Coin()})
    root = build(tmp_path / "d", LAYOUT[-2:])
    with pytest.raises(DatasetError, match="no traces in split"):
        evaluate(root, {"random": Coin()})
    with pytest.raises(ValueError, match="unknown split"):
        EvalConfig(splits=("test",))


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def traceap_cli(monkeypatch, capsys):
    """Run `traceap eval ARGS` in this process, as the installed command would."""
    from traceap.cli import main

    def run(*args: str) -> Run:
        monkeypatch.setattr("sys.argv", ["traceap", "eval", *args])
        with pytest.raises(SystemExit) as exit_:
            main()
        out = capsys.readouterr()
        return Run(exit_.value.code or 0, out.out, out.err)
    return run


@pytest.mark.parametrize("args, message", [
    (["--dataset", "{tmp}/nothing"], "no manifest.jsonl"),
    (["--dataset", "{data}", "--detectors", "rule,psychic"], "unknown detector 'psychic'"),
    (["--dataset", "{data}", "--windows", "50,many"], "--windows"),
    (["--dataset", "{data}", "--split", "holdout"], "unknown split 'holdout'"),
    (["--dataset", "{data}", "--detectors", "rule", "--classifier", "tarot"],
     "unknown classifier 'tarot'"),
    (["--dataset", "{data}", "--detectors", "rule", "--ablation", "--ablation-dir", "{tmp}/none"],
     "--ablation"),
])
def test_cli_bad_input_is_one_line_and_exit_2(traceap_cli, dataset, tmp_path, args, message):
    p = traceap_cli(*(a.format(tmp=tmp_path, data=dataset) for a in args))
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and message in p.stderr and "Traceback" not in p.stderr


def test_cli_writes_tables_scores_and_plots(traceap_cli, dataset, tmp_path):
    out = tmp_path / "out"
    p = traceap_cli("--dataset", str(dataset), "--detectors", "rule,expert", "--windows", "20,40",
                    "--classifier", "offline", "--out", str(out), "--plot-traces", "od_bad,ig_bad")
    assert p.returncode == 0, p.stderr
    assert "gone" in p.stderr and "missing" in p.stderr       # reported, not fatal
    assert "(paper Table 3)" in p.stdout and "(paper Table 4)" in p.stdout
    s = orjson.loads((out / "eval.json").read_bytes())
    assert s["detectors"] == ["rule", "expert"] and s["windows"] == [20, 40]
    assert s["n_fit_traces"] == {"rule": 2}
    for d in ("rule", "expert"):
        auc = s["detection"]["40"][d]["seen"]["avg"]
        assert auc is not None and 0.0 <= auc <= 1.0
    assert s["classification"]["offline"]["40"]["confusion"]["labels"][-1] == "none"
    lines = (out / "scores.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 8
    first = orjson.loads(lines[0])
    assert len(first["scores"]["rule"]) == first["n_windows"] == len(first["labels"])
    for f in ("eval.md", "roc_N20.png", "roc_N40.png", "timelines_N40.png"):
        assert (out / f).stat().st_size > 0


def test_cli_out_never_replaces_a_file_eval_did_not_write(traceap_cli, dataset, tmp_path):
    """Issue #32 item 1 for eval --out: a file of the user's with an eval output's name stops
    the run before the evaluation; a rerun replaces eval's own files, and drops the plot of a
    window count it no longer makes; other files in the folder are kept."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "eval.md").write_text("my notes")
    (out / "other.txt").write_text("mine")
    args = ("--dataset", str(dataset), "--detectors", "expert", "--classifier", "",
            "--out", str(out))
    p = traceap_cli(*args, "--windows", "20,40")
    assert p.returncode == 2 and "eval.md exists and was not written by traceap eval" in p.stderr
    assert (out / "eval.md").read_text() == "my notes" and not (out / "eval.json").exists()
    (out / "eval.md").unlink()
    assert traceap_cli(*args, "--windows", "20,40").returncode == 0
    p = traceap_cli(*args, "--windows", "40")
    assert p.returncode == 0, p.stderr
    assert "replaced 6 files of an earlier eval run" in p.stderr and "1 removed" in p.stderr
    assert not (out / "roc_N20.png").exists() and (out / "roc_N40.png").is_file()
    assert (out / "other.txt").read_text() == "mine"
    # an --out that cannot be written: one line, before the evaluation
    p = traceap_cli(*args[:-1], str(out / "other.txt" / "sub"))
    assert p.returncode == 2 and "cannot be written" in p.stderr and p.stderr.count("\n") == 1


def test_ablation_table_from_variant_detectors(dataset):
    from types import SimpleNamespace

    from traceap.cli.eval import _variant_label

    cfg = SimpleNamespace(no_event_adapter=False, no_transformer=False, no_relation=True,
                          names_masked=False)
    assert _variant_label(cfg, Path("x.pt")) == "no_relation"
    cfg.no_relation = False
    assert _variant_label(cfg, Path("x.pt")) == "full"
    assert _variant_label(None, Path("mine.pt")) == "mine"

    r = evaluate(dataset, {}, ablation={"model[full]": Oracle(dataset),
                                        "model[no_transformer+no_relation]": Coin(1)},
                 config=EvalConfig(windows=(100,)), on_warning=lambda m: None)
    s = r.summary
    assert s["ablation"] == ["model[full]", "model[no_transformer+no_relation]"]
    md = tables.markdown(s)
    assert "(paper Table 5)" in md
    assert "| `model[full]` | ✓ | ✓ | ✓ | ✓ | 100.00 | 100.00 |" in md
    assert "| `model[no_transformer+no_relation]` | ✓ | – | – | ✓ |" in md


def test_cli_many_missing_traces_are_counted_not_flooded(traceap_cli, tmp_path):
    root = build(tmp_path / "d", LAYOUT[:2])
    entries = read_manifest(root)
    ghosts = [Entry(id=f"ghost{i}", path=f"traces/ghost{i}.json.gz", split="test_seen",
                    task="image_classification", model="m", platform="p", world_size=1, rank=0,
                    label="good") for i in range(12)]
    write_manifest(root, entries + ghosts)
    p = traceap_cli("--dataset", str(root), "--detectors", "expert", "--windows", "10",
                    "--classifier", "", "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    assert sum("ghost" in ln for ln in lines) == 10
    assert any("and 2 more" in ln for ln in lines)
    saved = orjson.loads((tmp_path / "o" / "eval.json").read_bytes())["warnings"]
    assert sum("ghost" in w for w in saved) == 12


# -- a newcomer's first hour ------------------------------------------------------------------
def test_model_option_is_the_checkpoint_of_hybrid_too(tmp_path):
    """`eval --model X` must not be ignored for `hybrid` (it once scored the bundled model)."""
    import torch

    from traceap.cli.eval import build_detectors
    from traceap.model.checkpoint import load_model, save_model
    from traceap.windows import Windows

    ck = load_model()
    with torch.no_grad():
        for p in ck.model.relation.parameters():
            p.mul_(0.5)                   # another opinion: surely other scores
    other = save_model(ck.model, tmp_path / "other.pt", ck.text_table, ck.meta, ck.encoder_id)
    dets = build_detectors(["hybrid", "model"], True, other, warn=lambda m: None)
    assert dets["hybrid"].learned.predictor.checkpoint.path == str(other)
    assert dets["model"].predictor.checkpoint.path == str(other)
    w = Windows(traceap.load(CNN), 20)
    bundled = build_detectors(["hybrid"], True, None, warn=lambda m: None)["hybrid"]
    assert not np.allclose(dets["hybrid"].score_windows(w), bundled.score_windows(w))


def test_eval_help_lists_every_detector():
    from traceap.cli import app
    from traceap.detectors import detector_names
    r = CliRunner().invoke(app, ["eval", "--help"], terminal_width=200)
    flat = " ".join(r.output.split())
    assert all(name in flat for name in detector_names()), flat
    assert "docs/FORMATS.md" in flat


class _Failing(BaseDetector):
    """A pure-LLM-like detector that fails on some sub-traces (scores 0 there) and counts them."""

    name = "llm"

    def __init__(self):
        self.failures: list[str] = []
        self.subtraces = 0

    def fit(self, traces, labels):
        return self

    def score_windows(self, windows):
        self.subtraces += 5
        self.failures += [f"windows 0-{windows.n // 5 - 1}: no valid answer"] * 2
        return np.r_[np.zeros(2 * windows.n // 5), np.full(windows.n - 2 * windows.n // 5, 0.9)]

    @property
    def notes(self):
        return [f"{len(self.failures)} failed"] if self.failures else []


def test_pure_llm_failures_are_counted_in_the_tables(dataset):
    warned: list[str] = []
    r = evaluate(dataset, {"llm": _Failing()}, config=EvalConfig(windows=(20,)),
                 on_warning=warned.append)
    f = r.summary["detector_failures"]["llm"]
    n = len({rec.id for rec in r.records})
    assert f["failed"] == 2 * n and f["subtraces"] == 5 * n
    assert f["note"].startswith(f"{2 * n} of {5 * n} sub-trace(s) got no valid answer and scored 0")
    assert any(w.startswith("llm: ") and "scored 0" in w for w in warned)
    md = tables.markdown(r.summary)
    assert f"**Pure LLM: {2 * n} of {5 * n} sub-trace(s)" in md
    # a detector that never fails adds nothing
    r = evaluate(dataset, {"random": Coin()}, config=EvalConfig(windows=(20,)),
                 on_warning=lambda m: None)
    assert r.summary["detector_failures"] == {}


def test_by_source_groups_planted_natural_and_healthy_traces(tmp_path):
    """With `source` in the manifest (the real-based benchmark), window AUC is reported on the
    planted and on the natural traces apart, and false alarms on the healthy ones."""
    layout = [row for row in LAYOUT if row[2] != "train"]
    root = build(tmp_path / "real", layout)
    entries = read_manifest(root)
    for e in entries:        # one planted trace per task; the other bad one is natural
        e.source = "injected" if e.id in ("ic_bad", "pe_bad") else "natural"
    write_manifest(root, entries)
    r = evaluate(root, {"perfect": Oracle(root), "inverted": Oracle(root, invert=True),
                        "constant": Constant(0.7)},
                 config=EvalConfig(windows=(50,)), on_warning=lambda m: None)
    by = r.summary["by_source"]["50"]
    perfect, inverted = by["perfect"]["seen"], by["inverted"]["unseen"]
    assert perfect["injected"]["auc"] == perfect["natural"]["auc"] == perfect["all"]["auc"] == 1.0
    assert perfect["injected"]["n_traces"] == 1 and perfect["natural"]["n_traces"] == 3
    assert inverted["injected"]["auc"] == inverted["all"]["auc"] == 0.0
    assert perfect["trace_auc_max"] == 1.0 and inverted["trace_auc_max"] == 0.5   # ties
    assert perfect["healthy"] == {"n_traces": 2, "findings_per_trace": 0.0, "flagged_share": 0.0}
    assert by["constant"]["seen"]["healthy"]["flagged_share"] == 1.0
    assert by["constant"]["seen"]["healthy"]["findings_per_trace"] == 1.0
    md = tables.markdown(r.summary)
    assert "By source (real-based benchmark)" in md
    assert "| 50 | perfect | Seen | 100.00 | 100.00 | 100.00 | 100.00 |" in md


def test_no_source_no_by_source_table(result):
    """A generated dataset (no `source`) keeps the tables it had."""
    assert result.summary["by_source"] == {}
    assert "By source" not in tables.markdown(result.summary)


def test_window_pattern_sets_keep_every_overlapping_cause():
    """A plant beside a natural anomaly: the window they share has both patterns; the single
    label keeps the one covering more of it, and clean windows have none."""
    from traceap.load import load
    from traceap.manifest import window_labels, window_pattern_sets, window_patterns
    from traceap.windows import Windows

    w = Windows(load(CNN), 10)
    e0, width = float(w.edges[0]), float(w.edges[1] - w.edges[0])
    at = lambda k: e0 + k * width  # noqa: E731  (window k starts here)
    entry = Entry("x", "x", "test_unseen", "other", "m", "p", 1, 0, "bad",
                  patterns=["excessive_memcpy", "nccl_compute_no_overlap"],
                  anomalies=[Anomaly(at(2.1), at(4.7), "excessive_memcpy"),
                             Anomaly(at(4.8), at(5.5), "nccl_compute_no_overlap")])
    sets, single = window_pattern_sets(entry, w), window_patterns(entry, w)
    assert sets[4] == {"excessive_memcpy", "nccl_compute_no_overlap"}
    assert single[4] == "excessive_memcpy"          # 0.7 of the window against 0.2
    assert sets[5] == {"nccl_compute_no_overlap"} and single[5] == "nccl_compute_no_overlap"
    assert [bool(s) for s in sets] == window_labels(entry, w).tolist()
    assert all(p is None or p in s for p, s in zip(single, sets))


def test_an_instant_anomaly_names_the_window_it_labels():
    """A zero-length anomaly interval inside a window labels it anomalous (`window_labels`), so
    it must name its pattern too: a labelled window with no true pattern put every later
    classifier call of the trace against the wrong window (`TraceRecord.true_calls`)."""
    from traceap.load import load
    from traceap.manifest import window_labels, window_patterns
    from traceap.windows import Windows

    w = Windows(load(CNN), 10)
    e0, width = float(w.edges[0]), float(w.edges[1] - w.edges[0])
    entry = Entry("x", "x", "test_unseen", "other", "m", "p", 1, 0, "bad",
                  patterns=["graph_break"],
                  anomalies=[Anomaly(e0 + 3.5 * width, e0 + 3.5 * width, "graph_break")])
    labels, single = window_labels(entry, w), window_patterns(entry, w)
    assert labels.tolist() == [k == 3 for k in range(10)]
    assert single == [("graph_break" if k == 3 else None) for k in range(10)]
