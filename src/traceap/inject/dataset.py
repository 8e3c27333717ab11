"""Writing an injected dataset (traceap dataset v1): every base, every pattern, every copy.

DATASET/traces/<id>.pt.trace.json.gz and DATASET/manifest.jsonl, plus a marker file that
says the folder is an inject output (so a later run may replace it; nothing else is ever
deleted).  Each base is parsed once; outputs are seeded by (seed, base name, pattern, copy),
so the same seed gives the same bytes whatever the order or the number of jobs.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..manifest import MANIFEST, SPLITS, TASKS, Anomaly, Entry, encode_entry, read_manifest
from ..patterns._registry import is_pattern, pattern_ids
from ..errors import DatasetError, TraceapError, TraceFormatError
from ..load import find_traces, load_bytes, read_bytes
from ..outputs import Claim, Owner, claim
from .core import WARMUP_SHARE, Invalid, inject_one, warmup_share_in
from .edit import Doc, gz_bytes, write_file
from .mechanisms import Base, Unusable
from .natural import natural_anomalies

#: The stamp of an inject output (docs/FORMATS.md, "Output stamps"): its configuration and
#: every file it wrote, so that a rerun knows what it may replace; nothing else is deleted.
MARKER = ".traceap-inject.json"
SCHEMA = "traceap.inject/v2"


@dataclass(frozen=True)
class InjectConfig:
    """What to write."""

    patterns: tuple = field(default_factory=pattern_ids)
    copies: int = 1
    seed: int = 0
    jobs: int = 1
    split: str = "test_unseen"
    task: str = "other"
    overwrite: bool = False

    def __post_init__(self):
        bad = [p for p in self.patterns if not is_pattern(p)]
        if bad:
            raise DatasetError(f"unknown pattern {bad[0]!r}; choose from {', '.join(pattern_ids())}")
        if self.copies < 1:
            raise DatasetError("--copies must be at least 1")
        if self.jobs < 1:
            raise DatasetError("--jobs must be at least 1")
        if self.split not in SPLITS:
            raise DatasetError(f"unknown split {self.split!r}; choose from {', '.join(SPLITS)}")
        if self.task not in TASKS:
            raise DatasetError(f"unknown task {self.task!r}; choose from {', '.join(TASKS)}")


@dataclass(frozen=True)
class SplitPlan:
    """Which split each base goes to, by where it came from (a benchmark split by source).

    `splits` maps a split name to glob patterns matched against a base's path relative to the
    input folder it was found in (e.g. ``"facebookresearch__param/*"``: a project folder), or
    against its file name; `copies` optionally gives a split its own number of copies.  A base
    matched by no split is skipped with one line; one matched by two is an error.
    """

    splits: dict
    copies: dict = field(default_factory=dict)

    @classmethod
    def read(cls, path: str | os.PathLike) -> "SplitPlan":
        """Read a YAML plan: ``{splits: {split: [globs]}, copies: {split: k}}``."""
        import yaml

        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise DatasetError(f"{path}: cannot read the split plan ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("splits"), dict):
            raise DatasetError(f"{path}: a split plan needs a 'splits' mapping (split: [globs])")
        unknown = set(data) - {"splits", "copies"}
        if unknown:
            raise DatasetError(f"{path}: unknown key {sorted(unknown)[0]!r} in the split plan")
        splits = {str(k): [str(g) for g in (v or [])] for k, v in data["splits"].items()}
        copies = {str(k): int(v) for k, v in (data.get("copies") or {}).items()}
        for name in list(splits) + list(copies):
            if name not in SPLITS:
                raise DatasetError(f"{path}: unknown split {name!r}; choose from {', '.join(SPLITS)}")
        if any(k < 1 for k in copies.values()):
            raise DatasetError(f"{path}: copies must be at least 1")
        return cls(splits, copies)

    def split_of(self, rel: str) -> str | None:
        """The split of a base (relative path with '/' separators), None when unplanned."""
        name = rel.rsplit("/", 1)[-1]
        hits = [s for s, globs in self.splits.items()
                if any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(name, g) for g in globs)]
        if len(hits) > 1:
            raise DatasetError(f"{rel}: in two splits of the plan ({hits[0]}, {hits[1]}): a "
                               f"base, family or project must sit in one split only")
        return hits[0] if hits else None


@dataclass
class InjectReport:
    """What a run wrote and what it skipped (one line each)."""

    out: Path
    entries: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    seconds: float = 0.0
    #: what happened to files already in the folder (one line each)
    notes: list = field(default_factory=list)

    def counts(self) -> dict:
        """Written traces per pattern (injected), plus natural / good copies of the bases."""
        out: dict = {}
        for e in self.entries:
            key = e.patterns[0] if e.source == "injected" else ("natural" if e.is_bad else "good")
            out[key] = out.get(key, 0) + 1
        return out


def relative_names(inputs: list, files: list[Path]) -> list[str]:
    """Each file's path relative to the input folder it was found in ('/'-separated); a file
    named directly is its own name."""
    roots = [Path(i) for i in inputs if Path(i).is_dir()]
    out = []
    for f in files:
        rel = f.name
        for r in roots:
            try:
                rel = f.relative_to(r).as_posix()
                break
            except ValueError:
                continue
        out.append(rel)
    return out


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


#: What owns an inject output folder (traceap.outputs): a rerun with the same bases and
#: settings rewrites it in place; another one needs --overwrite and replaces only inject's files.
OWNER = Owner("inject", MARKER, SCHEMA, rerun="same_config", aside=(MANIFEST,))


def _stamp_config(files: list[Path], config: InjectConfig, plan: SplitPlan | None) -> dict:
    """The settings that decide the output (not --jobs, not --overwrite)."""
    return {"bases": [str(f.resolve()) for f in files], "patterns": list(config.patterns),
            "copies": config.copies, "seed": config.seed, "split": config.split,
            "task": config.task,
            "plan": None if plan is None else {"splits": plan.splits, "copies": plan.copies}}


def _describe(old: dict) -> str:
    bases = old.get("bases") or []
    return (f"{len(bases)} base(s), patterns {','.join(old.get('patterns') or [])}, "
            f"{old.get('copies')} cop{'y' if old.get('copies') == 1 else 'ies'}, "
            f"seed {old.get('seed')}")


def _legacy_inject_files(out: Path) -> set[str] | None:
    """Files of an inject output written before its marker listed them (marker schema
    traceap.inject/v1): the manifest's traces, the manifest and the marker."""
    try:
        old = json.loads((out / MARKER).read_text())
        entries = read_manifest(out)
    except (OSError, ValueError, DatasetError):
        return None
    if not isinstance(old, dict) or old.get("schema") != "traceap.inject/v1":
        return None
    return {e.path for e in entries} | {MANIFEST, MARKER}


def planned_files(ids: list[str], configs: list[InjectConfig]) -> list[str]:
    """Every file a run may write (a base or a plant may still be skipped)."""
    files = [MANIFEST]
    for bid, cfg in zip(ids, configs):
        files.append(f"traces/{bid}.pt.trace.json.gz")
        files += [f"traces/{bid}__{p}__c{k}.pt.trace.json.gz"
                  for p in cfg.patterns for k in range(cfg.copies)]
    return files


def prepare_out(out: Path, files: list[Path], ids: list[str], configs: list[InjectConfig],
                config: InjectConfig, plan: SplitPlan | None = None) -> Claim:
    """Check the output folder before anything is written (traceap.outputs.claim): new,
    empty, or an earlier inject output of the same configuration; anything else needs
    --overwrite, which replaces only files an earlier inject run wrote there."""
    return claim(out, OWNER, _stamp_config(files, config, plan), planned_files(ids, configs),
                 config.overwrite, legacy=_legacy_inject_files, describe=_describe)


def build(inputs: list, out: str | os.PathLike, config: InjectConfig = InjectConfig(),
          log=None, plan: SplitPlan | None = None) -> InjectReport:
    """Inject every pattern into every base trace of `inputs` and write the dataset at `out`.

    With a `plan`, each base goes to the split its source is planned in (with that split's
    copies); otherwise every base goes to `config.split`."""
    t_start = time.perf_counter()
    out = Path(out)
    files = find_traces(inputs)
    report = InjectReport(out)
    configs = [config] * len(files)
    if plan is not None:
        rels = relative_names(inputs, files)
        where = [plan.split_of(r) for r in rels]
        for r, w in zip(rels, where):
            if w is None:
                report.skipped.append(f"skip {r}: in no split of the plan")
                if log:
                    log(report.skipped[-1])
        keep = [i for i, w in enumerate(where) if w is not None]
        files = [files[i] for i in keep]
        configs = [replace(config, split=where[i], copies=plan.copies.get(where[i], config.copies))
                   for i in keep]
        if not files:
            raise DatasetError("the split plan matches none of the given traces")
    ids = base_ids(files)
    owned = prepare_out(out, files, ids, configs, config, plan)
    owned.begin(planned_files(ids, configs))
    (out / "traces").mkdir(parents=True, exist_ok=True)
    explicit = {str(Path(i)) for i in inputs if not Path(i).is_dir()}
    jobs = [(str(f), bid, cfg, str(out), str(f) in explicit)
            for f, bid, cfg in zip(files, ids, configs)]
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
    # Only now, with the new manifest in place, go the files of an earlier run it no longer lists.
    report.notes = owned.finish([e.path for e in report.entries] + [MANIFEST])
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
    at = doc.absolute_us  # the Doc's clock -> the file's (ns-resolution traces count from an origin)
    natural = [(at(a), at(b), p) for a, b, p in natural_anomalies(tr)]
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
    nat_patterns = sorted({p for _, _, p in natural}, key=pattern_ids().index)
    entries.append(entry(bid, world_size=ws, rank=rank,
                         label="bad" if natural else "good", patterns=nat_patterns,
                         anomalies=[Anomaly(a, b, p) for a, b, p in natural],
                         source="natural"))
    crc = zlib.crc32(bid.encode())
    for pattern in config.patterns:
        k = pattern_ids().index(pattern)
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
            # the edited trace as `traceap analyze` reads it: a plant that reads as start-up
            # is not the pattern, and is not written
            warm = warmup_share_in(load_bytes(o.data, eid), o.anomalies)
            if warm > WARMUP_SHARE:
                lines.append(f"skip {eid}: {100 * warm:.0f}% of the GPU idle it would be "
                             f"labelled with is warm-up in the edited trace (start-up, not a "
                             f"steady-state {pattern})")
                continue
            write_file(out / "traces" / f"{eid}.pt.trace.json.gz", o.gz)
            entries.append(entry(eid, world_size=o.world_size or ws, rank=rank, label="bad",
                                 patterns=pats, anomalies=anomalies, source="injected",
                                 notes=f"{pattern} planted {o.n_instances}x into {path.name} "
                                       f"(seed {config.seed}, copy {copy})"))
    return entries, lines


__all__ = ["InjectConfig", "InjectReport", "MARKER", "SplitPlan", "base_ids", "build",
           "inject_base", "prepare_out", "relative_names"]
