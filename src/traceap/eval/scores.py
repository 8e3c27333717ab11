"""The per-window scores of `traceap eval --out DIR` (`DIR/scores.jsonl`), written and read back.

One line per trace and window count N: the trace's id, split, label, window labels and every
detector's window scores (docs/FORMATS.md, "Eval scores").  Fitting what traceap ships on a
validation split (the model's flag threshold, `traceap.model.ship`; the hybrid stack,
`traceap.detectors.stack`) reads these records instead of scoring the split again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable
from pathlib import Path

import orjson

from ..errors import DatasetError


def write_scores(records: Iterable, path: Path) -> None:
    """Per trace and N: window labels and every detector's scores (`runner.TraceRecord`s)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for r in records:
            f.write(orjson.dumps({
                "id": r.id, "split": r.split, "task": r.task, "label": "bad" if r.bad else "good",
                "n_windows": r.n, "span_us": list(r.span_us),
                "labels": r.labels.astype(int).tolist(),
                "patterns": r.patterns, "scores": {k: [round(float(x), 5) for x in v]
                                                   for k, v in r.scores.items()},
                "calls": r.calls}) + b"\n")


def merge_scores(paths: Iterable[str | os.PathLike], splits: Collection[str] = (),
                 ids: Collection[str] | None = None) -> dict[tuple[str, int], dict]:
    """(trace id, N) -> record of the scores.jsonl files' lines in the `splits` (or of the
    trace ids `ids`, whatever split their scoring run called them), the detectors' scores of
    several files (e.g. one run per detector) merged into one record.  Raises DatasetError
    (one line) for a file that cannot be read or is not a scores.jsonl."""
    def wanted(r: dict) -> bool:
        return r["split"] in splits if ids is None else r["id"] in ids
    merged: dict[tuple[str, int], dict] = {}
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise DatasetError(f"{path}: cannot read the scores ({exc.strerror or exc})") from None
        for k, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                if not wanted(r):
                    continue
                key = (r["id"], r["n_windows"])
            except (ValueError, KeyError, TypeError):
                raise DatasetError(f"{path}:{k}: not a line of traceap eval's scores.jsonl "
                                   f"(id, split, n_windows, labels, scores)") from None
            if key in merged:
                merged[key]["scores"].update(r["scores"])
            else:
                merged[key] = r
    return merged


def read_scores(paths: Iterable[str | os.PathLike], dataset: str | os.PathLike, split: str,
                oof: tuple[str, ...] = (), detectors: Collection[str] = ("model", "expert")
                ) -> list[dict]:
    """Records of scores.jsonl files for the traces of `split` of the dataset and of the `oof`
    splits (which traces: the dataset's manifest; `source` and `split` from it too), that hold
    scores of every one of `detectors`; the scores of several files (e.g. one run per
    detector, or one run per fold of out-of-fold models) merged per trace and N."""
    from ..manifest import read_manifest

    entries = {e.id: e for e in read_manifest(dataset) if e.split in (split, *oof)}
    rows = [r for r in merge_scores(paths, ids=entries).values()
            if set(detectors) <= set(r["scores"])]
    for r in rows:
        r["source"] = entries[r["id"]].source
        r["split"] = entries[r["id"]].split
    return rows


__all__ = ["merge_scores", "read_scores", "write_scores"]
