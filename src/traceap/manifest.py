"""Datasets in the traceap dataset v1 format (docs/FORMATS.md): DATASET/manifest.jsonl + traces.

Training is weakly supervised: training code may read `label` and `patterns`, never
`anomalies` of train entries (`Entry.anomalies_for_eval` guards the distinction).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from .errors import DatasetError
from .patterns._registry import is_pattern
from .windows import Windows

SPLITS = ("train", "validation", "test_seen", "test_unseen")
TASKS = ("image_classification", "object_detection", "image_segmentation", "image_generation",
         "depth_estimation", "pose_estimation", "action_recognition", "other")
SEEN_TASKS = ("image_classification", "object_detection", "image_segmentation")
MANIFEST = "manifest.jsonl"


class Anomaly(msgspec.Struct):
    """One ground-truth occurrence of an anti-pattern, in the trace's own clock (us)."""

    start_us: float
    end_us: float
    pattern: str


class Entry(msgspec.Struct, omit_defaults=True):
    """One manifest line (one trace; a rank of a job shares `job` with its siblings)."""

    id: str
    path: str
    split: str
    task: str
    model: str
    platform: str
    world_size: int
    rank: int
    label: str
    patterns: list[str] = []
    anomalies: list[Anomaly] = []
    source: str | None = None
    notes: str | None = None
    job: str | None = None
    #: For injected traces: the file name of the real trace they were made from.
    base: str | None = None

    @property
    def is_bad(self) -> bool:
        """Trace-level label as an int-like bool (bad = has anti-patterns, low utilisation)."""
        return self.label == "bad"


_DECODER = msgspec.json.Decoder(Entry)
_ENCODER = msgspec.json.Encoder()


def read_manifest(dataset: str | os.PathLike) -> list[Entry]:
    """All entries of DATASET/manifest.jsonl, validated."""
    root = Path(dataset)
    path = root / MANIFEST if root.is_dir() else root
    if not path.exists():
        raise DatasetError(f"{dataset}: no {MANIFEST} (not a traceap dataset)")
    entries = []
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            e = _DECODER.decode(line)
        except msgspec.DecodeError as exc:
            raise DatasetError(f"{path}:{n}: bad manifest line ({exc})") from None
        if e.split not in SPLITS:
            raise DatasetError(f"{path}:{n}: unknown split {e.split!r}")
        if e.label not in ("good", "bad"):
            raise DatasetError(f"{path}:{n}: label must be 'good' or 'bad', not {e.label!r}")
        bad = [p for p in list(e.patterns) + [a.pattern for a in e.anomalies] if not is_pattern(p)]
        if bad:
            raise DatasetError(f"{path}:{n}: unknown pattern id {bad[0]!r}")
        entries.append(e)
    return entries


def listed_files(dataset: str | os.PathLike, source: str) -> set[str] | None:
    """The manifest and every trace it lists (relative paths), when each entry is of `source`
    ("collected", "synthetic"): what an earlier run of the command that writes such a dataset
    left there.  None when there is no readable manifest, an empty one, or other sources."""
    try:
        entries = read_manifest(dataset)
    except DatasetError:
        return None
    if not entries or any(e.source != source for e in entries):
        return None
    return {e.path for e in entries} | {MANIFEST}


def trace_path(dataset: str | os.PathLike, entry: Entry) -> Path:
    """Absolute path of an entry's trace file."""
    root = Path(dataset)
    root = root if root.is_dir() else root.parent
    return root / entry.path


def encode_entry(entry: Entry) -> bytes:
    """One manifest line (no trailing newline).

    `patterns` and `anomalies` are always written (docs/FORMATS.md lists them as keys of every
    line, even when empty); unset optional fields (source, notes, job) are left out.
    """
    obj = msgspec.to_builtins(entry)
    obj.setdefault("patterns", [])
    obj.setdefault("anomalies", [])
    return _ENCODER.encode(obj)


def write_manifest(dataset: str | os.PathLike, entries: list[Entry]) -> Path:
    """Write DATASET/manifest.jsonl."""
    path = Path(dataset) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(encode_entry(e) + b"\n" for e in entries))
    return path


def _window_covers(entry: Entry, windows: Windows):
    """(window, covered us, pattern) for every window an anomaly interval overlaps."""
    for a in entry.anomalies:
        for w in windows.overlapping(a.start_us, a.end_us):
            yield w, min(a.end_us, windows.end_us[w]) - max(a.start_us, windows.start_us[w]), \
                a.pattern


def window_labels(entry: Entry, windows: Windows) -> np.ndarray:
    """Per window: True when it overlaps any anomaly interval (docs/FORMATS.md).  Test-time only."""
    y = np.zeros(windows.n, dtype=bool)
    for a in entry.anomalies:
        y[windows.overlapping(a.start_us, a.end_us)] = True
    return y


def window_patterns(entry: Entry, windows: Windows) -> list[str | None]:
    """Per window: the pattern of the anomaly covering most of it, or None (exactly the windows
    `window_labels` leaves clean: an instant anomaly inside a window covers none of it and still
    names it)."""
    best: list[tuple[float, str | None]] = [(-1.0, None)] * windows.n
    for w, cover, pattern in _window_covers(entry, windows):
        if cover > best[w][0]:
            best[w] = (cover, pattern)
    return [p for _, p in best]


def window_pattern_sets(entry: Entry, windows: Windows) -> list[frozenset[str]]:
    """Per window: every pattern whose anomaly overlaps it (empty for a clean window).

    A window can hold two causes (a pattern planted into a base with a natural one); naming
    either is right for it, while `window_patterns` keeps the one covering most of the window.
    """
    sets: list[set[str]] = [set() for _ in range(windows.n)]
    for w, _, pattern in _window_covers(entry, windows):
        sets[w].add(pattern)
    return [frozenset(s) for s in sets]


def planted_pattern(entry: Entry) -> str | None:
    """The pattern `traceap inject` planted into an injected entry (`patterns` lists it first,
    docs/FORMATS.md), else None (a natural, generated or collected trace)."""
    return entry.patterns[0] if entry.source == "injected" and entry.patterns else None


def window_planted(entry: Entry, windows: Windows) -> list[str | None]:
    """Per window: the planted pattern where one of its intervals overlaps the window, else
    None (every window of a trace nothing was planted into).  A base's natural anomaly of the
    same pattern is not told apart from the plant: naming that pattern is right for both."""
    planted = planted_pattern(entry)
    out: list[str | None] = [None] * windows.n
    if planted is None:
        return out
    for a in entry.anomalies:
        if a.pattern == planted:
            for w in windows.overlapping(a.start_us, a.end_us):
                out[w] = planted
    return out


@dataclass
class Split:
    """Entries of one split, grouped for convenience."""

    name: str
    entries: list[Entry] = field(default_factory=list)

    def by_task(self) -> dict[str, list[Entry]]:
        """Entries per task, in the order tasks first appear."""
        out: dict[str, list[Entry]] = {}
        for e in self.entries:
            out.setdefault(e.task, []).append(e)
        return out


def splits(entries: list[Entry]) -> dict[str, Split]:
    """Entries per split name."""
    out = {s: Split(s) for s in SPLITS}
    for e in entries:
        out[e.split].entries.append(e)
    return out


__all__ = ["Anomaly", "Entry", "SEEN_TASKS", "SPLITS", "Split", "TASKS",
           "encode_entry", "listed_files", "planted_pattern", "read_manifest", "splits",
           "trace_path", "window_labels", "window_pattern_sets", "window_patterns",
           "window_planted", "write_manifest"]
