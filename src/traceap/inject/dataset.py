"""Writing an injected dataset (traceap dataset v1): every base, every pattern, every copy.

DATASET/traces/<id>.pt.trace.json.gz and DATASET/manifest.jsonl, plus a marker file that
says the folder is an inject output (so a later run may replace it; nothing else is ever
deleted).  Each base is parsed once; outputs are seeded by (seed, base name, pattern, copy),
so the same seed gives the same bytes whatever the order or the number of jobs.
"""

from __future__ import annotations

import json
import os
import re
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..dataset import MANIFEST, PATTERNS, SPLITS, TASKS, Anomaly, Entry, encode_entry, read_manifest
from ..errors import DatasetError, TraceapError, TraceFormatError
from ..load import read_bytes
from .core import Invalid, inject_one
from .edit import Doc, gz_bytes, write_file
from .mechanisms import Base, Unusable
from .natural import natural_anomalies

#: The marker file of an inject output (its presence allows replacing the folder's traces).
MARKER = ".traceap-inject.json"
SCHEMA = "traceap.inject/v1"
_TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass(frozen=True)
class InjectConfig:
    """What to write."""

    patterns: tuple = PATTERNS
    copies: int = 1
    seed: int = 0
    jobs: int = 1
    split: str = "test_unseen"
    task: str = "other"
    overwrite: bool = False

    def __post_init__(self):
        bad = [p for p in self.patterns if p not in PATTERNS]
        if bad:
            raise DatasetError(f"unknown pattern {bad[0]!r}; choose from {', '.join(PATTERNS)}")
        if self.copies < 1:
            raise DatasetError("--copies must be at least 1")
        if self.jobs < 1:
            raise DatasetError("--jobs must be at least 1")
        if self.split not in SPLITS:
            raise DatasetError(f"unknown split {self.split!r}; choose from {', '.join(SPLITS)}")
        if self.task not in TASKS:
            raise DatasetError(f"unknown task {self.task!r}; choose from {', '.join(TASKS)}")


@dataclass
class InjectReport:
    """What a run wrote and what it skipped (one line each)."""

    out: Path
    entries: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    seconds: float = 0.0

    def counts(self) -> dict:
        """Written traces per pattern (injected), plus natural / good copies of the bases."""
        out: dict = {}
        for e in self.entries:
            key = e.patterns[0] if e.source == "injected" else ("natural" if e.is_bad else "good")
            out[key] = out.get(key, 0) + 1
        return out


def find_traces(inputs: list) -> list[Path]:
    """Trace files named or found (recursively) in folders; a missing path is an error."""
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if not p.exists():
            raise TraceFormatError(f"{p}: no such file or folder")
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and q.name.endswith(_TRACE_SUFFIXES)
                           and MARKER not in q.parts and q.name != "catalog.json")
            files += found
        else:
            files.append(p)
    if not files:
        raise TraceFormatError("no trace files (*.json, *.json.gz) in the given paths")
    return files


def base_ids(files: list[Path]) -> list[str]:
    """A unique, file-system-safe id per base (its stem; the folder is added on a clash)."""
    def stem(p: Path) -> str:
        name = p.name
        for suf in (".json.gz", ".json"):
            if name.endswith(suf):
                name = name[: -len(suf)]
        name = name.removesuffix(".pt.trace")
        return re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    stems = [stem(p) for p in files]
    out = []
    for p, s in zip(files, stems):
        if stems.count(s) > 1:
            s = re.sub(r"[^A-Za-z0-9._-]+", "_", p.parent.name) + "__" + s
        out.append(s)
    seen: dict = {}
    for i, s in enumerate(out):  # still clashing (same folder names): number them
        if s in seen:
            seen[s] += 1
            out[i] = f"{s}__{seen[s]}"
        else:
            seen[s] = 0
    return out


def prepare_out(out: Path, overwrite: bool) -> set[str]:
    """Check the output folder; returns the trace files a previous inject run wrote there."""
    if out.exists() and not out.is_dir():
        raise DatasetError(f"{out}: exists and is not a folder")
    if not out.exists() or not any(out.iterdir()):
        return set()
    ours = (out / MARKER).is_file() and (out / MANIFEST).is_file()
    if not ours and not overwrite:
        raise DatasetError(f"{out}: not empty and not a previous `traceap inject` output "
                           f"(use --overwrite to write into it anyway; nothing there is deleted)")
    if not ours:
        return set()
    try:
        return {Path(e.path).name for e in read_manifest(out)}
    except DatasetError:
        return set()


def build(inputs: list, out: str | os.PathLike, config: InjectConfig = InjectConfig(),
          log=None) -> InjectReport:
    """Inject every pattern into every base trace of `inputs` and write the dataset at `out`."""
    t_start = time.perf_counter()
    out = Path(out)
    files = find_traces(inputs)
    previous = prepare_out(out, config.overwrite)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    ids = base_ids(files)
    explicit = {str(Path(i)) for i in inputs if not Path(i).is_dir()}
    jobs = [(str(f), bid, config, str(out), str(f) in explicit) for f, bid in zip(files, ids)]
    report = InjectReport(out)
    if config.jobs > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=config.jobs) as pool:
            results = list(pool.map(_one_base_safe, jobs))
    else:
        results = [_one_base_safe(j) for j in jobs]
    for entries, lines, fatal in results:
        if fatal:
            raise TraceFormatError(fatal)
        report.entries += entries
        report.skipped += lines
        if log:
            for line in lines:
                log(line)
    manifest = out / MANIFEST
    tmp = manifest.with_name(MANIFEST + ".tmp")
    tmp.write_bytes(b"".join(encode_entry(e) + b"\n" for e in report.entries))
    os.replace(tmp, manifest)
    (out / MARKER).write_text(json.dumps({
        "schema": SCHEMA, "seed": config.seed, "copies": config.copies,
        "patterns": list(config.patterns), "split": config.split,
        "bases": [f.name for f in files]}, indent=1) + "\n")
    keep = {Path(e.path).name for e in report.entries}
    for name in previous - keep:  # written by an earlier inject run, no longer listed
        p = out / "traces" / name
        if p.is_file():
            p.unlink()
    report.seconds = time.perf_counter() - t_start
    return report


def _one_base_safe(job) -> tuple[list, list, str | None]:
    path, bid, config, out, explicit = job
    try:
        entries, lines = inject_base(Path(path), bid, config, Path(out))
        return entries, lines, None
    except TraceapError as exc:
        if explicit:
            return [], [], str(exc)
        return [], [f"skip {Path(path).name}: {exc}"], None


def inject_base(path: Path, bid: str, config: InjectConfig, out: Path) -> tuple[list, list]:
    """All outputs of one base: its unmodified copy and every (pattern, copy)."""
    raw = read_bytes(path)
    doc = Doc(path, raw)
    base = Base.of(doc, path.name)
    why = base.unusable()
    if why:
        return [], [f"skip {path.name}: {why}"]
    tr = doc.trace
    natural = natural_anomalies(tr)
    platform = tr.gpu_name or "unknown"
    ws = tr.meta.world_size or 1
    rank = tr.meta.rank or 0
    entries, lines = [], []

    def entry(eid: str, **kw) -> Entry:
        return Entry(id=eid, path=f"traces/{eid}.pt.trace.json.gz", split=config.split,
                     task=config.task, model=bid, platform=platform, base=path.name, **kw)

    # the unmodified base, gzipped as it came (its own bytes when already gzip)
    data = path.read_bytes()
    (out / "traces" / f"{bid}.pt.trace.json.gz").write_bytes(
        data if data[:2] == b"\x1f\x8b" else gz_bytes(raw))
    nat_patterns = sorted({p for _, _, p in natural}, key=PATTERNS.index)
    entries.append(entry(bid, world_size=ws, rank=rank,
                         label="bad" if natural else "good", patterns=nat_patterns,
                         anomalies=[Anomaly(a, b, p) for a, b, p in natural],
                         source="natural"))
    crc = zlib.crc32(bid.encode())
    for pattern in config.patterns:
        k = PATTERNS.index(pattern)
        for copy in range(config.copies):
            rng = np.random.default_rng([config.seed, crc, k, copy])
            eid = f"{bid}__{pattern}__c{copy}"
            try:
                o = inject_one(base, pattern, rng)
            except Unusable as exc:
                lines.append(f"skip {path.name} {pattern}: {exc}")
                break  # the other copies would not find a point either
            except Invalid as exc:
                lines.append(f"not written {eid}: the edited trace fails validation ({exc})")
                continue
            moved = [(o.shift_start(a), o.shift_end(b), p) for a, b, p in natural]
            anomalies = [Anomaly(a, b, pattern) for a, b in o.anomalies]
            anomalies += [Anomaly(a, b, p) for a, b, p in moved if b > a]
            anomalies.sort(key=lambda x: (x.start_us, x.end_us))
            pats = [pattern] + [p for p in nat_patterns if p != pattern]
            write_file(out / "traces" / f"{eid}.pt.trace.json.gz", o.gz)
            entries.append(entry(eid, world_size=o.world_size or ws, rank=rank, label="bad",
                                 patterns=pats, anomalies=anomalies, source="injected",
                                 notes=f"{pattern} planted {o.n_instances}x into {path.name} "
                                       f"(seed {config.seed}, copy {copy})"))
    return entries, lines


__all__ = ["InjectConfig", "InjectReport", "MARKER", "base_ids", "build", "find_traces",
           "inject_base", "prepare_out"]
