"""Making a trained checkpoint the one traceap ships (`traceap ship model`, `ship ensemble`).

    join_ensemble("ens.pt", "seed1.pt", ["seed2.pt"])         # one recipe, several seeds
    cal = calibrate_threshold(validation_records)            # the model's scores.jsonl lines
    ship("ens.pt", "out/model.pt", trace_files, calibration=cal)

`ship` copies the checkpoint (weights, config, training record as they are) and adds to its
name table the embeddings of every event name the model reads in `trace_files` (the traces
that come with traceap: `checkout_traces()`) at N = 50 / 100 / 200, so that `traceap analyze`
on them never runs the text encoder (a cold start stays fast).  With a calibration it also
sets the model's flagging threshold (`meta["flag_threshold"]`, read by
`LearnedDetector.threshold`): the score that best separates anomalous from normal windows on a
validation split (Youden's J over the pooled windows of every N) among those that flag at most
`max_healthy_flagged` of the windows of healthy traces.  Scores, and so every AUC, are
unchanged.  The shipped file is `traceap/data/model.pt`; `traceap ship model --into-package`
writes there, anywhere else by default.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..errors import ModelError, TraceapError
from .checkpoint import add_members, load_model

#: Window counts whose event names the shipped name table covers (those `analyze` offers).
NAME_WINDOWS = (50, 100, 200)

#: Windows of healthy traces the calibrated threshold may flag at most (share, averaged over
#: the healthy traces of the split): issue 35's bound for the model alone.
MAX_HEALTHY_FLAGGED = 0.02

#: The folders of a source checkout whose traces the shipped name table covers.
CHECKOUT_TRACE_FOLDERS = ("examples", "tests/data")


def checkout_root() -> Path | None:
    """The source checkout traceap runs from (the folder holding `src/traceap`), or None for
    an installed package."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "src" / "traceap").is_dir() and (root / "pyproject.toml").is_file() \
        else None


def checkout_traces(root: str | os.PathLike | None = None) -> list[Path]:
    """The trace files that come with traceap: `examples/` and `tests/data/` of the checkout
    (`root`, default `checkout_root()`), in name order; [] outside a checkout."""
    root = Path(root) if root is not None else checkout_root()
    if root is None:
        return []
    return [f for d in CHECKOUT_TRACE_FOLDERS for f in sorted((root / d).glob("*.json*"))]


def trace_names(files: Iterable[str | os.PathLike], cfg,
                windows: Sequence[int] = NAME_WINDOWS) -> set[str]:
    """Event names the model (config `cfg`) reads in the traces at each window count.  Files
    that are not readable traces are skipped: fixtures of broken traces are there on purpose."""
    from ..load import load
    from ..windows import Windows
    from .features import featurize

    names: set[str] = set()
    for f in files:
        try:
            trace = load(f)
        except TraceapError:
            continue
        for n in windows:
            names |= {str(s) for s in featurize(Windows(trace, n), cfg).names[1:]}
    return names


def calibrate_threshold(records: Sequence[dict],
                        max_healthy_flagged: float = MAX_HEALTHY_FLAGGED) -> dict:
    """The flagging threshold chosen on a validation split's model scores (see the module
    docstring): {flag_threshold, youden_j, healthy_flagged, windows, healthy_traces}.
    `records` are scores.jsonl lines (`traceap.eval.scores`) with `scores["model"]`, `labels`
    and `label`.  Raises ModelError when there are none or no threshold keeps the limit."""
    if not records:
        raise ModelError("no validation-split model scores: calibrate on validation")
    scores = [np.asarray(r["scores"]["model"], float) for r in records]
    y = np.concatenate([np.asarray(r["labels"], bool) for r in records])
    s = np.concatenate(scores)
    # healthy: the good traces (in the real-based benchmark, the unmodified healthy ones)
    healthy = [sc for r, sc in zip(records, scores) if r["label"] == "good"]
    best = None
    for t in np.unique(np.round(np.quantile(s, np.linspace(0.5, 0.999, 400)), 4)):
        flagged = float(np.mean([(h >= t).mean() for h in healthy])) if healthy else 0.0
        if flagged > max_healthy_flagged:
            continue
        j = float((s[y] >= t).mean() - (s[~y] >= t).mean())
        if best is None or j > best["youden_j"]:
            best = {"flag_threshold": float(t), "youden_j": j, "healthy_flagged": flagged,
                    "windows": int(y.size), "healthy_traces": len(healthy)}
    if best is None:
        raise ModelError(f"no threshold keeps the healthy windows flagged under "
                         f"{max_healthy_flagged:.0%}")
    return best


def join_ensemble(out: str | os.PathLike, first: str | os.PathLike,
                  others: Sequence[str | os.PathLike]) -> Path:
    """Join checkpoints of one recipe (seeds) into an ensemble at `out`: `first` (its config,
    platforms and meta, plus `ensemble_of`) with the weights of every one of `others` as
    `members` (docs/FORMATS.md, "Model checkpoint"); their vocabularies are merged.  Raises
    ModelError when a member does not fit."""
    for p in (first, *others):
        load_model(p)              # a readable traceap checkpoint, or one ModelError line
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    return add_members(first, list(others), out=out,
                       meta={"ensemble_of": [str(p) for p in [first, *others]]})


def ship(checkpoint: str | os.PathLike, out: str | os.PathLike,
         trace_files: Iterable[str | os.PathLike] = (), calibration: dict | None = None,
         names_masked_out: str | os.PathLike | None = None, encoder=None) -> dict:
    """Write `checkpoint` to `out` as a checkpoint to ship: the names of `trace_files` added
    to its name table, `calibration` (`calibrate_threshold`'s result plus where it came from)
    setting `meta["flag_threshold"]`; with `names_masked_out`, also the names-masked probe
    there (`names_masked`).  `encoder`: the text encoder (default `TextEncoder()`).
    Returns the written checkpoint object's `meta` and `names`.  The caller checks first
    that `out` may be written."""
    import torch

    from .text import TextEncoder

    cfg = load_model(checkpoint).config
    obj = torch.load(checkpoint, weights_only=False)
    extra = sorted(trace_names(trace_files, cfg) - set(obj["names"]))
    if extra:
        emb = (encoder or TextEncoder()).embed(extra, persist=False)
        names = list(obj["names"]) + extra
        table = np.concatenate([obj["name_embeddings"].numpy(), emb.astype(np.float16)])
        order = np.argsort(names)
        obj["names"] = [names[i] for i in order]
        obj["name_embeddings"] = torch.from_numpy(np.ascontiguousarray(table[order]))
    obj["meta"] = {**obj.get("meta", {}), "shipped_from": str(checkpoint),
                   "bundled_trace_names": len(extra)}
    if calibration:
        obj["meta"].update(flag_threshold=calibration["flag_threshold"], calibration=calibration)
    _save(obj, Path(out))
    if names_masked_out:
        _save(names_masked(obj), Path(names_masked_out))
    return {"meta": obj["meta"], "names": obj["names"], "added": extra}


def names_masked(obj: dict) -> dict:
    """The names-masked probe of a checkpoint object: the same weights with config
    `names_masked` on, so every event is scored nameless (`traceap eval --ablation` reports
    it as `model[names_masked]`: how much the model leans on event names)."""
    return {**obj, "config": {**obj["config"], "names_masked": True},
            "meta": {**obj.get("meta", {}), "probe": "names_masked at scoring time"}}


def write_names_masked(checkpoint: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the names-masked probe of the checkpoint file at `checkpoint` to `out`."""
    import torch

    _save(names_masked(torch.load(checkpoint, weights_only=False)), Path(out))
    return Path(out)


def _save(obj: dict, path: Path) -> None:
    """torch.save, atomically: an interrupted ship never leaves half a checkpoint.  The
    temporary file has the final name, in a folder of its own, because torch names the
    archive inside after the file (`model/data.pkl`): the same bytes as a direct save."""
    import torch

    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp" / path.name
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        tmp.parent.rmdir()


__all__ = ["CHECKOUT_TRACE_FOLDERS", "MAX_HEALTHY_FLAGGED", "NAME_WINDOWS",
           "calibrate_threshold", "checkout_root", "checkout_traces", "join_ensemble",
           "names_masked", "ship", "trace_names", "write_names_masked"]
