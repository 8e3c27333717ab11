"""A multi-rank job: a folder of per-rank traces, loaded as one."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import TraceFormatError
from ..progress import track
from ..trace import Trace
from .kineto import load

TRACE_SUFFIXES = (".json", ".json.gz")
#: traceap's own analysis files, which `traceap.trace_handler` writes beside the traces it
#: exports: JSON, but not traces.
NOT_TRACES = (".traceap.json",)


@dataclass
class Job:
    """The traces of one distributed job, ordered by rank."""

    path: str
    traces: list[Trace]

    @property
    def world_size(self) -> int:
        """Ranks in the job (from distributedInfo where present, else the number of files)."""
        sizes = [t.meta.world_size for t in self.traces if t.meta.world_size]
        return max(sizes) if sizes else len(self.traces)

    def __iter__(self):
        return iter(self.traces)

    def __len__(self) -> int:
        return len(self.traces)


def trace_files(folder: str | os.PathLike) -> list[Path]:
    """Trace files directly inside a folder (`*.json`, `*.json.gz`), sorted by name.  Hidden
    files are not traces (the stamp `traceap profile` leaves, `.traceap-profile.json`), nor are
    the analyses `traceap.trace_handler` writes beside its traces (`*.traceap.json`)."""
    p = Path(folder)
    return sorted(f for f in p.iterdir()
                  if f.is_file() and f.name.endswith(TRACE_SUFFIXES) and not f.name.startswith(".")
                  and not f.name.endswith(NOT_TRACES))


def find_traces(inputs: list) -> list[Path]:
    """Trace files named, or found recursively in the named folders, in that order (each
    folder's sorted); a missing path is an error.  Hidden files and folders (the stamps of
    traceap's outputs) and a source's `catalog.json` are not traces."""
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if not p.exists():
            raise TraceFormatError(f"{p}: no such file or folder")
        if p.is_dir():
            files += sorted(q for q in p.rglob("*")
                            if q.is_file() and q.name.endswith(TRACE_SUFFIXES)
                            and q.name != "catalog.json"
                            and not any(x.startswith(".") for x in q.relative_to(p).parts))
        else:
            files.append(p)
    if not files:
        raise TraceFormatError("no trace files (*.json, *.json.gz) in the given paths")
    return files


def load_job(folder: str | os.PathLike, files: list[Path] | None = None) -> Job:
    """Load every trace in a folder (or just `files`), ordered by rank (from distributedInfo or
    the file name; the file's position when neither says).

    Whether they are one job's ranks, and the renumbering of ranks that repeat in one job, is
    decided with the traces' summaries (`traceap.job.analyze_job`): copies of one trace are one
    trace, and traces that disagree (world size, clocks, ...) keep their own ranks."""
    files = trace_files(folder) if files is None else [Path(f) for f in files]
    if not files:
        raise TraceFormatError(f"{folder}: no .json or .json.gz traces in this folder")
    traces = [load(f) for f in track(files, "loading ranks")]
    for i, t in enumerate(traces):
        if t.meta.rank is None:
            t.meta.rank, t.meta.rank_assigned = i, True
    traces.sort(key=lambda t: t.meta.rank)
    return Job(str(folder), traces)
