"""Run detectors and classifiers over a dataset's test traces and collect the paper's numbers.

Each test trace is loaded once; for every window count N it is cut into `Windows`, labelled
from the manifest's anomaly intervals (a window is positive when it overlaps one), scored by
every detector and, on its truly anomalous windows, classified by every classifier.  The raw
per-trace results (`TraceRecord`) are kept, so that the tables (`EvalResult.summary`) and the
plots are computed from the same data.

Detectors that need training are fitted on the dataset's train split with trace-level labels
only (`label`: good/bad); the train traces' anomaly intervals are never read.
"""

from __future__ import annotations

import os
import time
import warnings as _warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from ..manifest import SEEN_TASKS, TASKS, Entry, read_manifest, trace_path, \
    window_labels, window_pattern_sets, window_patterns, window_planted
from ..detectors.base import Detector
from ..errors import DatasetError, TraceFormatError
from ..load import load
from ..patterns import pattern_ids
from ..progress import track
from ..trace import Trace
from ..windows import Windows, check_windows
from . import metrics

SCHEMA = "traceap.eval/v1"
#: Column order of the tables: the paper's Table 3, then the other tasks of docs/FORMATS.md.
_PAPER_ORDER = SEEN_TASKS + ("pose_estimation", "depth_estimation", "image_generation")
TASK_ORDER = _PAPER_ORDER + tuple(t for t in TASKS if t not in _PAPER_ORDER)
#: Split name -> the group it is reported under (the paper's "Seen" and "Unseen").
GROUPS = {"test_seen": "seen", "test_unseen": "unseen", "train": "train", "validation": "validation"}
#: The detector whose flags the classification's `flagged` accuracy counts when it was scored:
#: the one `traceap analyze` flags with by default (`traceap.stages.resolve_detector`), so the
#: number is the accuracy a user sees; else the run's first detector (`EvalResult.flagging`).
FLAGGING_DETECTOR = "hybrid"


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate.  Defaults are the paper's (N = 50, 100, 200; seen and unseen tests)."""

    windows: tuple[int, ...] = (50, 100, 200)
    splits: tuple[str, ...] = ("test_seen", "test_unseen")
    #: Score at or above which a window is flagged (when the detector has no `threshold`).
    threshold: float = 0.5
    #: At most this many test traces per split, spread over (task, label); None = all.
    limit: int | None = None
    #: At most this many train traces to fit detectors on, spread over labels; None = all.
    fit_limit: int | None = None

    def __post_init__(self):
        if not self.windows:
            raise ValueError("window counts must be positive integers")
        for n in self.windows:   # the one window-count check (`traceap.windows`)
            check_windows(n)
        bad = [s for s in self.splits if s not in GROUPS]
        if bad or not self.splits:
            raise ValueError(f"unknown split {bad[0] if bad else ''!r}; "
                             f"choose from {', '.join(GROUPS)}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError("threshold must lie in [0, 1]")
        for name in ("limit", "fit_limit"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be at least 1")


@dataclass
class TraceRecord:
    """One test trace at one window count: labels, scores per detector, calls per classifier."""

    id: str
    split: str
    task: str
    bad: bool
    n: int
    span_us: tuple[float, float]
    labels: np.ndarray                      # bool per window (overlaps an anomaly)
    patterns: list[str | None]              # true pattern per window (None = clean)
    #: Every pattern whose anomaly overlaps each window (`manifest.window_pattern_sets`): a
    #: plant beside a natural anomaly gives a window two right answers.
    pattern_sets: list[frozenset[str]] = field(default_factory=list)
    #: The planted pattern on each window its plant overlaps, else None
    #: (`manifest.window_planted`; all None for a trace nothing was planted into).
    planted: list[str | None] = field(default_factory=list)
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    flagged: dict[str, np.ndarray] = field(default_factory=dict)
    #: classifier -> predicted pattern for each truly anomalous window, in window order.
    calls: dict[str, list[str | None]] = field(default_factory=dict)
    #: classifier -> how many of its calls came from each source ("llm", "offline-fallback", ...).
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    #: The manifest's `source` ("injected", "natural", or None for generated datasets).
    source: str | None = None

    @property
    def group(self) -> str:
        """"seen", "unseen" or "train"."""
        return GROUPS[self.split]

    @property
    def true_calls(self) -> list[str]:
        """The true pattern of each truly anomalous window, in window order."""
        return [p for p in self.patterns if p is not None]

    def flagged_windows(self, detector: str, classifier: str
                        ) -> list[tuple[str, str | None, frozenset[str]]]:
        """(true pattern, classifier's call, every pattern overlapping the window) of each
        truly anomalous window that `detector` flagged, in window order: what a user of that
        detector and classifier is told."""
        calls = self.calls.get(classifier)
        if not calls:
            return []
        # calls[k] is the call on the k-th truly anomalous window (`score_entry`)
        anomalous = np.flatnonzero(self.labels)
        flagged = self.flagged[detector][anomalous]
        sets = self._sets()
        return [(self.patterns[w], c, sets[w]) for w, c, f in zip(anomalous, calls, flagged)
                if f and self.patterns[w] is not None]

    def flagged_planted(self, detector: str, classifier: str
                        ) -> list[tuple[str, str | None, frozenset[str]]]:
        """(planted pattern, classifier's call, every pattern overlapping the window) of each
        window `detector` flagged that the trace's plant overlaps (issue #35's "flagged
        planted windows"), in window order."""
        calls = self.calls.get(classifier)
        if not calls or not self.planted:
            return []
        anomalous = np.flatnonzero(self.labels)   # a plant's windows are anomalous windows
        flagged = self.flagged[detector][anomalous]
        sets = self._sets()
        return [(self.planted[w], c, sets[w] | {self.planted[w]})
                for w, c, f in zip(anomalous, calls, flagged) if f and self.planted[w] is not None]

    def _sets(self) -> list[frozenset[str]]:
        """Every pattern overlapping each window (the window's own pattern where the record
        has no `pattern_sets`)."""
        return self.pattern_sets or [frozenset([p]) if p else frozenset() for p in self.patterns]


def _share(hits: list[bool]) -> float | None:
    """The share of True in `hits`, None when there are none."""
    return float(np.mean(hits)) if hits else None


def _named(rows: list[tuple[str, str | None, frozenset[str]]]) -> dict:
    """(right answer, call, every pattern the window holds) rows -> the share that names the
    right answer (`accuracy`), any pattern the window holds (`accuracy_any`), how many, and
    what the wrong calls named (`wrong`: call -> windows, most first; "none" for no pattern)."""
    wrong = Counter("none" if c is None else c for t, c, _ in rows if c != t)
    return {"accuracy": _share([c == t for t, c, _ in rows]),
            "accuracy_any": _share([c in s for _, c, s in rows]), "n_windows": len(rows),
            "wrong": dict(wrong.most_common())}


def select(entries: Sequence[Entry], limit: int | None, key: Callable[[Entry], tuple]) -> list[Entry]:
    """At most `limit` entries, taken round-robin over the groups of `key` (stable order)."""
    if limit is None or len(entries) <= limit:
        return list(entries)
    groups: dict[tuple, list[Entry]] = {}
    for e in entries:
        groups.setdefault(key(e), []).append(e)
    queues = [list(g) for g in groups.values()]
    out: list[Entry] = []
    while len(out) < limit:
        for q in queues:
            if q and len(out) < limit:
                out.append(q.pop(0))
    keep = {id(e) for e in out}
    return [e for e in entries if id(e) in keep]


def chosen_entries(entries: Sequence[Entry], config: EvalConfig) -> list[Entry]:
    """The entries evaluated: the chosen splits, each cut to `config.limit` traces."""
    out: list[Entry] = []
    for split in config.splits:
        chosen = [e for e in entries if e.split == split]
        out += select(chosen, config.limit, key=lambda e: (e.task, e.label))
    return out


class _Loader:
    """Loads traces of a dataset, reporting missing or unreadable ones instead of failing."""

    def __init__(self, dataset: Path, warn: Callable[[str], None]):
        self.dataset = dataset
        self.warn = warn

    def __call__(self, entry: Entry) -> Trace | None:
        path = trace_path(self.dataset, entry)
        if not path.is_file():
            self.warn(f"{entry.id}: trace file {path} is missing; skipped")
            return None
        try:
            return load(path)
        except (TraceFormatError, OSError, ValueError) as exc:
            self.warn(f"{entry.id}: cannot read {path} ({exc}); skipped")
            return None


#: A detector, or a factory that builds one for a window count N (for detectors whose
#: features depend on the window width, such as clustering, fitted once per N).
DetectorSpec = Detector | Callable[[int], Detector]


def instances(specs: Mapping[str, DetectorSpec], windows: Sequence[int]) -> dict[int, dict[str, Detector]]:
    """N -> name -> detector: one shared object for a plain detector, one per N for a factory."""
    out: dict[int, dict[str, Detector]] = {n: {} for n in windows}
    for name, spec in specs.items():
        for n in windows:
            out[n][name] = spec if isinstance(spec, Detector) else spec(n)
    return out


def fit_detectors(detectors: Iterable[Detector], train: Sequence[Entry],
                  load_trace: Callable[[Entry], Trace | None]) -> int:
    """Fit detectors on train traces with trace-level labels; returns the traces used."""
    detectors = list({id(d): d for d in detectors}.values())
    if not detectors or not train:
        return 0
    traces, labels = [], []
    for e in track(train, "loading train traces"):
        t = load_trace(e)
        if t is not None:
            traces.append(t)
            labels.append(1 if e.is_bad else 0)   # the label only: never e.anomalies
    if not traces:
        return 0
    for d in track(detectors, "fitting detectors"):
        d.fit(traces, labels)
    return len(traces)


@dataclass
class EntryWork:
    """What scoring one test trace needs (sent to each worker once)."""

    dataset: Path
    windows: tuple[int, ...]
    threshold: float
    per_n: dict[int, dict[str, Detector]]
    classifiers: dict[str, object]


def score_entry(work: EntryWork, entry: Entry) -> tuple[list[TraceRecord], list[str]]:
    """The task of one test trace: its records at every N, and warnings (an unreadable trace
    gives no record and one warning)."""
    warned: list[str] = []
    trace = _Loader(work.dataset, warned.append)(entry)
    if trace is None:
        return [], warned
    records = []
    for n in work.windows:
        w = Windows(trace, n)
        y = window_labels(entry, w)
        rec = TraceRecord(entry.id, entry.split, entry.task, entry.is_bad, n,
                          (float(w.edges[0]), float(w.edges[-1])), y, window_patterns(entry, w),
                          window_pattern_sets(entry, w), window_planted(entry, w),
                          source=entry.source)
        for name, det in work.per_n[n].items():
            t1 = time.perf_counter()
            s = np.asarray(det.score_windows(w), dtype=np.float64)
            rec.seconds[name] = time.perf_counter() - t1
            if s.shape != (n,):
                raise ValueError(f"detector {name!r} returned {s.shape} scores for {n} windows")
            rec.scores[name] = np.clip(np.nan_to_num(s), 0.0, 1.0)
            rec.flagged[name] = rec.scores[name] >= _threshold(det, work.threshold)
        if y.any():
            idx = np.flatnonzero(y)
            for name, clf in work.classifiers.items():
                t1 = time.perf_counter()
                calls = clf.classify(w, idx, y.astype(np.float64))
                rec.seconds[name] = time.perf_counter() - t1
                if len(calls) != len(idx):
                    raise ValueError(f"classifier {name!r} returned {len(calls)} calls "
                                     f"for {len(idx)} windows")
                rec.calls[name] = [c.pattern for c in calls]
                for c in calls:
                    src = str(getattr(c, "source", name))
                    rec.sources.setdefault(name, {})[src] = rec.sources.get(name, {}).get(src, 0) + 1
        records.append(rec)
    return records, warned


@dataclass
class EvalResult:
    """Everything one evaluation produced: raw records, summaries, warnings."""

    dataset: str
    config: EvalConfig
    detectors: list[str]
    classifiers: list[str]
    records: list[TraceRecord]
    ablation: list[str] = field(default_factory=list)
    n_fit_traces: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: detector -> {"failed", "subtraces", "note"} for detectors that count the parts they
    #: could not score (the pure-LLM baseline scores those 0; readers must know how many)
    failures: dict[str, dict] = field(default_factory=dict)

    def of(self, n: int, split: str | None = None, task: str | None = None) -> list[TraceRecord]:
        """Records at window count n, optionally of one split and task."""
        return [r for r in self.records if r.n == n and (split is None or r.split == split)
                and (task is None or r.task == task)]

    @cached_property
    def tasks(self) -> dict[str, list[str]]:
        """Group -> tasks present in it, in the paper's order (then first appearance)."""
        order = {t: i for i, t in enumerate(TASK_ORDER)}
        out: dict[str, list[str]] = {}
        for split in self.config.splits:
            present = {r.task for r in self.records if r.split == split}
            out[GROUPS[split]] = sorted(present, key=lambda t: (order.get(t, 99), t))
        return out

    def _split_of(self, group: str) -> str:
        return next(s for s, g in GROUPS.items() if g == group)

    def _detection(self, n: int, name: str) -> dict:
        out: dict = {}
        for group, tasks in self.tasks.items():
            split = self._split_of(group)
            per_task = {}
            for task in tasks:
                recs = self.of(n, split, task)
                y = np.concatenate([r.labels for r in recs])
                s = np.concatenate([r.scores[name] for r in recs])
                per_task[task] = metrics.auc(y, s)
            recs = self.of(n, split)
            y = np.concatenate([r.labels for r in recs]) if recs else np.zeros(0, bool)
            s = np.concatenate([r.scores[name] for r in recs]) if recs else np.zeros(0)
            out[group] = {"tasks": per_task, "avg": metrics.mean_defined(list(per_task.values())),
                          "pooled": metrics.auc(y, s),
                          "n_windows": int(y.size), "n_positive": int(y.sum())}
        return out

    def _classification(self, n: int, name: str) -> dict:
        out: dict = {"tasks": {}}
        every_true: list[str] = []
        every_pred: list[str | None] = []
        sources: dict[str, int] = {}
        for r in self.of(n):
            for src, k in r.sources.get(name, {}).items():
                sources[src] = sources.get(src, 0) + k
        out["sources"] = dict(sorted(sources.items()))
        listed = [t for ts in self.tasks.values() for t in ts]
        for group, tasks in self.tasks.items():
            split = self._split_of(group)
            for task in tasks:
                truth: list[str] = []
                pred: list[str | None] = []
                for r in self.of(n, split, task):
                    truth += r.true_calls
                    pred += r.calls.get(name, [])
                key = task if listed.count(task) == 1 else f"{task} ({group})"
                out["tasks"][key] = {"accuracy": metrics.accuracy(truth, pred), "n_windows": len(truth),
                                     "group": group}
                every_true += truth
                every_pred += pred
        out["avg"] = metrics.mean_defined([v["accuracy"] for v in out["tasks"].values()])
        out["overall"] = metrics.accuracy(every_true, every_pred)
        out["by_pattern"] = {}
        for p in pattern_ids():   # the share of P's windows named P (the confusion's row)
            pred = [q for t, q in zip(every_true, every_pred) if t == p]
            if pred:
                out["by_pattern"][p] = {"accuracy": metrics.accuracy([p] * len(pred), pred),
                                        "n_windows": len(pred)}
        ids = pattern_ids()
        out["confusion"] = {"labels": list(ids) + [metrics.NO_PATTERN],
                            "matrix": metrics.confusion(every_true, every_pred, ids).tolist()}
        out["flagged"] = self._flagged_accuracy(n, name, list(out["by_pattern"]))
        return out

    @property
    def flagging(self) -> str | None:
        """The detector whose flags the `flagged` accuracy counts: FLAGGING_DETECTOR when it
        was scored, else the first scored detector; None when no detector was scored."""
        if FLAGGING_DETECTOR in self.detectors:
            return FLAGGING_DETECTOR
        return self.detectors[0] if self.detectors else None

    def _flagged_accuracy(self, n: int, name: str, patterns: list[str]) -> dict | None:
        """Classifier `name`'s accuracy on the truly anomalous windows the flagging detector
        flagged (what a user of it is told): every pattern with anomalous windows gets a row,
        with 0 windows when none of its was flagged.
        `accuracy` counts a call right when it names the window's pattern (the anomaly covering
        most of it); `accuracy_any` when it names any anomaly overlapping the window (a pattern
        planted into a base with a natural one: either is a right answer there).  `planted`:
        issue #35's "pattern accuracy on flagged planted windows" (`_planted_accuracy`)."""
        det = self.flagging
        if det is None:
            return None
        rows = [x for r in self.of(n) for x in r.flagged_windows(det, name)]
        total = _named(rows)
        return {"detector": det, "overall": total["accuracy"], "overall_any": total["accuracy_any"],
                "n_windows": len(rows),
                "by_pattern": {p: _named([x for x in rows if x[0] == p]) for p in patterns},
                "planted": self._planted_accuracy(n, det, name, patterns)}

    def _planted_accuracy(self, n: int, det: str, name: str, patterns: list[str]) -> dict | None:
        """Classifier `name` on the windows `det` flagged that a plant overlaps: the share named
        the planted pattern (`accuracy`), or any pattern the window holds (`accuracy_any`: a
        natural anomaly beside the plant), overall and per planted pattern (every pattern
        planted into a scored trace gets a row, with 0 windows when none of its windows was
        flagged); None when no scored trace was planted into."""
        recs = self.of(n)
        kinds = list(dict.fromkeys(p for r in recs for p in r.planted if p is not None))
        if not kinds:
            return None
        got = [x for r in recs for x in r.flagged_planted(det, name)]
        order = [p for p in patterns if p in kinds] + [p for p in kinds if p not in patterns]
        total = _named(got)
        return {"overall": total["accuracy"], "overall_any": total["accuracy_any"],
                "n_windows": len(got),
                "by_pattern": {p: _named([x for x in got if x[0] == p]) for p in order}}

    def _by_pattern(self, n: int, name: str) -> dict:
        """Per pattern P present: window AUC of P's windows (true pattern P) against every clean
        window (no anomaly) of the same traces; windows of other patterns are left out, so
        each pattern is ranked against the same healthy background."""
        recs = self.of(n)
        if not recs:
            return {}
        truth = np.array([p for r in recs for p in r.patterns], dtype=object)
        scores = np.concatenate([r.scores[name] for r in recs])
        clean = np.concatenate([~r.labels for r in recs])
        return {p: {"auc": a, "n_windows": n}
                for p, (a, n) in metrics.pattern_aucs(truth, scores, clean, pattern_ids()).items()}

    def _trace_level(self, n: int, name: str) -> dict:
        recs = self.of(n)
        out: dict = {}
        for group in list(self.tasks) + ["all"]:
            rs = recs if group == "all" else [r for r in recs if r.group == group]
            y = [r.bad for r in rs]
            out[group] = {
                "auc_mean": metrics.auc(y, [float(r.scores[name].mean()) for r in rs]),
                "auc_max": metrics.auc(y, [float(r.scores[name].max()) for r in rs]),
                "n_good": int(sum(not b for b in y)), "n_bad": int(sum(y)),
            }
        good = [r for r in recs if not r.bad]
        bad = [r for r in recs if r.bad]
        out["false_findings_per_healthy_trace"] = (
            float(np.mean([metrics.runs(r.flagged[name]) for r in good])) if good else None)
        out["flagged_windows_per_healthy_trace"] = (
            float(np.mean([r.flagged[name].sum() for r in good])) if good else None)
        out["flagged_share_healthy"] = (
            float(np.mean([r.flagged[name].mean() for r in good])) if good else None)
        lab = np.concatenate([r.labels for r in bad]) if bad else np.zeros(0, bool)
        flg = np.concatenate([r.flagged[name] for r in bad]) if bad else np.zeros(0, bool)
        out["window_recall_bad"] = float(flg[lab].mean()) if lab.any() else None
        out["window_precision_bad"] = float(lab[flg].mean()) if flg.any() else None
        return out

    def _by_source(self, n: int, name: str) -> dict:
        """Per split group, for datasets with a `source` (the real-based benchmark): window AUC
        on planted traces, on natural traces (unmodified, with or without natural anomalies)
        and on all; trace AUC (good vs bad, max window score); and, on healthy traces
        (natural and good), findings (runs of flagged windows) and the flagged share."""
        out: dict = {}
        for group in self.tasks:
            recs = self.of(n, self._split_of(group))
            row: dict = {}
            for src, keep in (("injected", lambda r: r.source == "injected"),
                              ("natural", lambda r: r.source == "natural"),
                              ("all", lambda r: True)):
                rs = [r for r in recs if keep(r)]
                y = np.concatenate([r.labels for r in rs]) if rs else np.zeros(0, bool)
                s = np.concatenate([r.scores[name] for r in rs]) if rs else np.zeros(0)
                row[src] = {"auc": metrics.auc(y, s), "n_traces": len(rs),
                            "n_windows": int(y.size), "n_positive": int(y.sum())}
            row["trace_auc_max"] = metrics.auc([r.bad for r in recs],
                                               [float(r.scores[name].max()) for r in recs])
            row["trace_auc_mean"] = metrics.auc([r.bad for r in recs],
                                                [float(r.scores[name].mean()) for r in recs])
            healthy = [r for r in recs if r.source == "natural" and not r.bad]
            row["healthy"] = {
                "n_traces": len(healthy),
                "findings_per_trace": float(np.mean([metrics.runs(r.flagged[name])
                                                     for r in healthy])) if healthy else None,
                "flagged_share": float(np.mean([r.flagged[name].mean() for r in healthy]))
                if healthy else None}
            out[group] = row
        return out

    @cached_property
    def summary(self) -> dict:
        """The tables as plain JSON-able data (schema traceap.eval/v1)."""
        ns = list(self.config.windows)
        scored = list(self.detectors)
        out = {
            "schema": SCHEMA,
            "dataset": self.dataset,
            "windows": ns,
            "splits": list(self.config.splits),
            "detectors": scored,
            "classifiers": self.classifiers,
            "ablation": self.ablation,
            "threshold": self.config.threshold,
            "limit": self.config.limit,
            "tasks": self.tasks,
            "n_traces": {GROUPS[s]: {"good": sum(1 for r in self.of(ns[0], s) if not r.bad),
                                     "bad": sum(1 for r in self.of(ns[0], s) if r.bad)}
                         for s in self.config.splits},
            "n_fit_traces": self.n_fit_traces,
            "detection": {str(n): {d: self._detection(n, d) for d in scored + self.ablation}
                          for n in ns},
            "classification": {c: {str(n): self._classification(n, c) for n in ns}
                               for c in self.classifiers},
            "trace_level": {str(n): {d: self._trace_level(n, d) for d in scored} for n in ns},
            "by_pattern": {str(n): {d: self._by_pattern(n, d) for d in scored + self.ablation}
                           for n in ns},
            "by_source": ({str(n): {d: self._by_source(n, d) for d in scored + self.ablation}
                           for n in ns}
                          if any(r.source for r in self.records) else {}),
            "seconds_per_trace": {str(n): {k: _mean([r.seconds[k] for r in self.of(n) if k in r.seconds])
                                           for k in scored + self.ablation + self.classifiers}
                                  for n in ns},
            "seconds": self.seconds,
            "detector_failures": self.failures,
            "warnings": self.warnings,
        }
        return out


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _threshold(detector: Detector, default: float) -> float:
    """The detector's own threshold, else the evaluation's."""
    return float(default if detector.threshold is None else detector.threshold)


def evaluate(dataset: str | os.PathLike, detectors: Mapping[str, DetectorSpec],
             classifiers: Mapping[str, object] | None = None,
             config: EvalConfig = EvalConfig(), fit: Iterable[str] = (),
             ablation: Mapping[str, DetectorSpec] | None = None,
             on_warning: Callable[[str], None] | None = None, *, workers: int = 1,
             ray: str | None = None) -> EvalResult:
    """Evaluate `detectors` (and `classifiers`) on the test splits of a dataset.

    A detector may be given as a factory `N -> Detector` to get one instance per window
    count.  `fit` names the detectors to fit on the train split (trace-level labels only)
    before testing.  `ablation` are extra detectors (model variants) reported in the ablation
    table.  Classifiers are told which windows are anomalous, as in the paper's Table 4: they
    get the truly anomalous windows, with scores 1 there and 0 elsewhere.

    Test traces are scored `workers` at a time in local processes, or as Ray tasks (`ray`:
    "local", "auto" or an address; `traceap.parallel.Execution`); the records are the same.
    """
    classifiers = dict(classifiers or {})
    ablation = dict(ablation or {})
    dataset = Path(dataset)
    entries = read_manifest(dataset)
    chosen = chosen_entries(entries, config)
    if not chosen:
        raise DatasetError(f"{dataset}: no traces in split(s) {', '.join(config.splits)}")
    if not detectors and not ablation and not classifiers:
        raise ValueError("nothing to evaluate: give at least one detector or classifier")
    warned: list[str] = []

    def warn(msg: str) -> None:
        warned.append(msg)
        if on_warning is not None:
            on_warning(msg)
        else:
            _warnings.warn(msg, stacklevel=2)

    load_trace = _Loader(dataset, warn)
    t0 = time.perf_counter()
    per_n = instances({**detectors, **ablation}, config.windows)
    train = select([e for e in entries if e.split == "train"], config.fit_limit,
                   key=lambda e: (e.label,))
    fit_names = [n for n in fit if n in detectors]
    n_fit = fit_detectors([per_n[n][name] for n in config.windows for name in fit_names],
                          train, load_trace)
    if fit_names and n_fit == 0:
        warn(f"{dataset}: no train traces; {', '.join(fit_names)} evaluated unfitted")

    # Test traces are the unit of work: each is read by the process that scores it (this one,
    # local workers or Ray tasks: `traceap.parallel`), and only its records come back.
    from ..parallel import Execution, run

    work = EntryWork(dataset, tuple(config.windows), config.threshold, per_n, classifiers)
    records: list[TraceRecord] = []
    done = sorted(track(run(score_entry, chosen, work, Execution(workers, ray),
                                preload=("traceap.eval.runner",)),
                        "evaluating traces", total=len(chosen)), key=lambda ir: ir[0])
    for _, (recs, entry_warnings) in done:
        for msg in entry_warnings:
            warn(msg)
        records += recs
    if not records:
        raise DatasetError(f"{dataset}: none of the {len(chosen)} test traces could be read")
    failures = detector_failures(per_n)
    for name, f in failures.items():
        warn(f"{name}: {f['note']}")
    return EvalResult(str(dataset), config, list(detectors), list(classifiers), records,
                      list(ablation), {n: n_fit for n in fit_names}, warned,
                      time.perf_counter() - t0, failures)


def detector_failures(per_n: Mapping[int, Mapping[str, Detector]]) -> dict[str, dict]:
    """Per detector name: the sub-traces it failed to score, summed over its instances (a
    detector shared by every N is counted once)."""
    out: dict[str, dict] = {}
    seen: set[int] = set()
    for dets in per_n.values():
        for name, det in dets.items():
            if id(det) in seen or not det.failures:
                continue
            seen.add(id(det))
            f = out.setdefault(name, {"failed": 0, "subtraces": 0, "reasons": []})
            f["failed"] += len(det.failures)
            f["subtraces"] += int(det.subtraces)
            f["reasons"] += [x for x in det.failures if x not in f["reasons"]][:3]
    for name in [n for n, f in out.items() if not f["failed"]]:
        del out[name]
    for f in out.values():
        why = f["reasons"][0].split(": ", 1)[-1] if f["reasons"] else ""
        f["note"] = (f"{f['failed']} of {f['subtraces']} sub-trace(s) got no valid answer and "
                     f"scored 0" + (f" (first: {why})" if why else ""))
    return out


__all__ = ["DetectorSpec", "EntryWork", "EvalConfig", "EvalResult", "FLAGGING_DETECTOR",
           "GROUPS", "SCHEMA", "TraceRecord", "chosen_entries", "evaluate", "fit_detectors",
           "instances", "score_entry", "select"]
