"""Leave-one-source-out folds of a dataset built by `traceap inject` (issue #35's protocol).

A fold plan (docs/FORMATS.md, "Fold plans"; the real-based benchmark's:
`benchmarks/real_folds.yaml`) puts every base trace of a dataset in exactly one fold by where
it came from, and names in each fold a slice of its bases, its `inner_validation`.  For each
held-out fold K, the *fold view* is a dataset (a manifest and a link to the dataset's traces,
no copies) in which

- `train` is the other folds' traces outside their inner-validation slices,
- `validation` is the other folds' inner-validation slices (every tunable choice of fold K's
  model and stack is made there),
- `test_unseen` is fold K's traces: scored only.

So a fold's model, threshold and stack are fitted on the view's train and validation splits
with the usual commands (`traceap train`, `traceap ship model|stack`), and `traceap eval
--folds` scores each view's test split with its own fold's model.
"""

from __future__ import annotations

import fnmatch
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import msgspec

from ..errors import DatasetError
from ..manifest import Entry, read_manifest, write_manifest

#: The split a fold view gives the held-out fold's traces (scored, never fitted on).
HELD_OUT = "test_unseen"
#: The schema of `traceap eval --folds`'s eval.json.
FOLDS_SCHEMA = "traceap.eval-folds/v1"


@dataclass(frozen=True)
class Fold:
    """One fold: the sources (globs) whose bases it holds, and its inner-validation slice."""

    name: str
    sources: tuple[str, ...]
    inner_validation: tuple[str, ...] = ()

    def holds(self, rel: str) -> bool:
        """Whether a base ('project/file' or a file name) is one of this fold's sources."""
        return _matches(rel, self.sources)

    def inner(self, rel: str) -> bool:
        """Whether a base of this fold is in its inner-validation slice."""
        return _matches(rel, self.inner_validation)


def _matches(rel: str, globs: tuple[str, ...]) -> bool:
    # as a split plan (`traceap.inject.dataset.SplitPlan.split_of`): the path or the file name
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(name, g) for g in globs)


def _globs(value, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, list) \
            or not all(isinstance(g, str) and g for g in value):
        raise DatasetError(f"{where}: expected a list of glob strings")
    return tuple(value)


@dataclass(frozen=True)
class FoldPlan:
    """Folds of whole source families, in the plan file's order."""

    folds: tuple[Fold, ...]
    path: str = ""

    @classmethod
    def read(cls, path: str | os.PathLike) -> "FoldPlan":
        """Read a YAML plan ``{folds: {name: {sources: [globs], inner_validation: [globs]}}}``;
        raises DatasetError (one line) for anything else."""
        import yaml

        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            why = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
            raise DatasetError(f"{path}: cannot read the fold plan ({why})") from None
        if not isinstance(data, dict) or not isinstance(data.get("folds"), dict):
            raise DatasetError(f"{path}: a fold plan needs a 'folds' mapping "
                               f"(name: {{sources: [globs], inner_validation: [globs]}})")
        unknown = set(data) - {"folds"}
        if unknown:
            raise DatasetError(f"{path}: unknown key {sorted(unknown)[0]!r} in the fold plan")
        folds = []
        for name, spec in data["folds"].items():
            where = f"{path}: fold {name!r}"
            if not isinstance(spec, dict):
                raise DatasetError(f"{where}: expected {{sources: [globs], "
                                   f"inner_validation: [globs]}}")
            extra = set(spec) - {"sources", "inner_validation"}
            if extra:
                raise DatasetError(f"{where}: unknown key {sorted(extra)[0]!r}")
            sources = _globs(spec.get("sources"), f"{where} sources")
            if not sources:
                raise DatasetError(f"{where}: give its sources (a list of globs)")
            if not str(name) or "/" in str(name) or str(name).startswith("."):
                raise DatasetError(f"{where}: a fold name is a plain folder name")
            folds.append(Fold(str(name), sources,
                              _globs(spec.get("inner_validation"), f"{where} inner_validation")))
        if len(folds) < 2:
            raise DatasetError(f"{path}: a fold plan needs at least two folds")
        return cls(tuple(folds), str(path))

    @property
    def names(self) -> list[str]:
        """The fold names, in the plan's order."""
        return [f.name for f in self.folds]

    def fold_of(self, rel: str) -> Fold:
        """The one fold holding a base; DatasetError when none or two do."""
        hits = [f for f in self.folds if f.holds(rel)]
        if len(hits) != 1:
            where = "no fold" if not hits else f"two folds ({hits[0].name}, {hits[1].name})"
            raise DatasetError(f"{self.path or 'fold plan'}: base {rel} is in {where}: every "
                               f"base, family and project must sit in exactly one fold")
        return hits[0]


def base_origins(dataset: str | os.PathLike) -> dict[str, str]:
    """Base id (an inject output's manifest `model`) -> 'project/file' (the base's folder and
    name), from the inject stamp of the dataset (or of the dataset a fold view links to);
    empty when there is none or it does not list the bases."""
    from ..inject.dataset import MARKER, base_ids

    root = Path(dataset)
    for stamp in (root / MARKER, (root / "traces").resolve().parent / MARKER):
        try:
            files = [Path(b) for b in json.loads(stamp.read_text())["config"]["bases"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        # the ids inject gave the bases (a file name shared by two folders gets its folder)
        return {bid: f"{f.parent.name}/{f.name}" for bid, f in zip(base_ids(files), files)}
    return {}


@dataclass(frozen=True)
class Assignment:
    """Where each entry of a dataset goes: its fold and whether it is inner validation."""

    plan: FoldPlan
    fold: dict[str, str]          # entry id -> fold name
    inner: dict[str, bool]        # entry id -> in its fold's inner-validation slice
    bases: dict[str, set[str]]    # fold name -> its bases ('project/file')

    def view(self, entries: list[Entry], held_out: str | None) -> list[Entry]:
        """The entries of the fold view that holds `held_out` out (module docstring); with
        None, every source's view (what the shipped model trains on: no test split)."""
        out = []
        for e in entries:
            split = HELD_OUT if self.fold[e.id] == held_out else \
                "validation" if self.inner[e.id] else "train"
            out.append(msgspec.structs.replace(e, split=split))
        return out

    def single_view(self, entries: list[Entry], fold: str) -> list[Entry]:
        """The view of a model trained on `fold` alone, whose scores weigh the model in a
        stack fitted without any fold it saw (out-of-source stacking, benchmarks/fold_models.py
        `--single-source`): `fold`'s traces outside its slice are `train`, its slice
        `validation`, the other folds' inner-validation slices `test_unseen` (scored only);
        the other folds' other traces are left out."""
        out = []
        for e in entries:
            mine = self.fold[e.id] == fold
            if mine or self.inner[e.id]:
                split = ("validation" if self.inner[e.id] else "train") if mine else HELD_OUT
                out.append(msgspec.structs.replace(e, split=split))
        return out

    def slice_view(self, entries: list[Entry], fold: str) -> list[Entry]:
        """`fold`'s inner-validation slice alone, as `test_unseen`: what the fold's own model
        (fitted without it) scores for the shipped stack's out-of-source fit."""
        return [msgspec.structs.replace(e, split=HELD_OUT) for e in entries
                if self.fold[e.id] == fold and self.inner[e.id]]


def assign(entries: list[Entry], plan: FoldPlan, origins: dict[str, str]) -> Assignment:
    """Every entry's fold by its base; DatasetError (one line) when a base is in no fold or
    two, when a job's ranks are split between folds, or when a fold holds no trace."""
    fold: dict[str, str] = {}
    inner: dict[str, bool] = {}
    bases: dict[str, set[str]] = {f.name: set() for f in plan.folds}
    job_fold: dict[str, str] = {}
    for e in entries:
        rel = origins.get(e.model) or e.base or Path(e.path).name
        f = plan.fold_of(rel)
        fold[e.id], inner[e.id] = f.name, f.inner(rel)
        bases[f.name].add(rel)
        if e.job is not None and job_fold.setdefault(e.job, f.name) != f.name:
            raise DatasetError(f"{plan.path}: the ranks of job {e.job!r} are in two folds "
                               f"({job_fold[e.job]}, {f.name}): a job is one base family")
    empty = [n for n, b in bases.items() if not b]
    if empty:
        raise DatasetError(f"{plan.path}: fold {empty[0]!r} holds no trace of the dataset "
                           f"(check its globs)")
    return Assignment(plan, fold, inner, bases)


def dataset_assignment(dataset: str | os.PathLike, plan: FoldPlan) -> tuple[list[Entry], Assignment]:
    """The dataset's entries and their folds."""
    entries = read_manifest(dataset)
    origins = base_origins(dataset)
    try:
        return entries, assign(entries, plan, origins)
    except DatasetError as exc:
        if origins or "no fold" not in str(exc):
            raise
        # globs on 'project/file' need the bases' folders, which only the stamp records
        raise DatasetError(f"{exc}; {dataset} has no inject stamp listing where its bases came "
                           f"from (rebuild it with `traceap inject --split-plan`)") from None


def write_view(path: Path, entries: list[Entry], traces: Path) -> Path:
    """A dataset folder: its manifest and a link to the traces (no copies; feature caches are
    keyed by the resolved path, so the views share them)."""
    link, manifest = path / "traces", path / "manifest.jsonl"
    # Only a view of this dataset is rewritten: a folder holding anything else named so (a
    # dataset's own manifest, a link to other traces) is the user's, never replaced.
    if link.is_symlink():
        if link.resolve() != traces.resolve():
            raise DatasetError(f"{link}: a link to {link.resolve()}, not to {traces}: "
                               f"give another folder")
    elif link.exists():
        raise DatasetError(f"{link}: exists and is not a link to {traces}")
    elif manifest.exists():
        raise DatasetError(f"{manifest}: exists and is not a fold view's: give another folder")
    write_manifest(path, entries)
    if not link.is_symlink():
        os.symlink(traces.resolve(), link)
    return path


def write_views(dataset: str | os.PathLike, plan: FoldPlan, out: str | os.PathLike,
                assigned: tuple[list[Entry], Assignment] | None = None) -> dict[str, Path]:
    """OUT/<fold>/ for every fold: the fold view (module docstring); returns fold -> folder.
    `assigned`: the dataset's `dataset_assignment`, when the caller has it already.

    A held-out fold whose other folds have no inner-validation slice gets an empty validation
    split (nothing to choose on): an error, since every choice must be made without it."""
    dataset, out = Path(dataset), Path(out)
    entries, a = assigned or dataset_assignment(dataset, plan)
    views = {}
    for name in plan.names:
        view = a.view(entries, name)
        if not any(e.split == "validation" for e in view):
            raise DatasetError(f"{plan.path}: held out fold {name!r} leaves no inner "
                               f"validation (give the other folds an inner_validation slice)")
        views[name] = write_view(out / name, view, dataset / "traces")
    return views


def describe(entries: list[Entry], a: Assignment) -> list[str]:
    """One line per fold: its bases and traces, and its inner-validation share."""
    lines = []
    for f in a.plan.folds:
        ids = [e.id for e in entries if a.fold[e.id] == f.name]
        n_inner = sum(a.inner[i] for i in ids)
        lines.append(f"{f.name}: {len(a.bases[f.name])} bases, {len(ids)} traces "
                     f"({n_inner} inner validation when another fold is held out)")
    return lines


@dataclass
class FoldsResult:
    """Each held-out fold's evaluation, and all of them pooled (every trace scored once, by
    the detectors of the fold that held it out)."""

    plan: FoldPlan
    dataset: str
    per_fold: dict          # fold name -> runner.EvalResult
    pooled: object          # runner.EvalResult over every fold's records
    bases: dict             # fold name -> sorted bases ('project/file')

    @cached_property
    def summary(self) -> dict:
        """Plain JSON-able data (schema traceap.eval-folds/v1, docs/FORMATS.md)."""
        return {"schema": FOLDS_SCHEMA, "plan": self.plan.path, "dataset": self.dataset,
                "folds": {name: {"bases": self.bases[name], "n_traces": len({
                    r.id for r in res.records}), "eval": res.summary}
                    for name, res in self.per_fold.items()},
                "pooled": self.pooled.summary}


def evaluate_folds(dataset: str | os.PathLike, plan: FoldPlan,
                   detectors_for: Callable[[str], Mapping], config,
                   classifiers_for: Callable[[str, Mapping], Mapping] | None = None,
                   only: Iterable[str] = (), fit: Iterable[str] = (),
                   on_warning: Callable[[str], None] | None = None, **run) -> FoldsResult:
    """Score every fold's traces with the detectors (and classifiers) of that fold
    (`detectors_for(fold)`, `classifiers_for(fold, detectors)`), each on its fold view; the
    detectors named in `fit` are fitted on the view's train split; `only` keeps these folds
    (pooled over them; default all).  `config`'s splits are
    replaced by the held-out one; `run` goes to `runner.evaluate` (workers, ray)."""
    from .runner import EvalResult, evaluate

    config = replace(config, splits=(HELD_OUT,))
    dataset = Path(dataset)
    entries, a = dataset_assignment(dataset, plan)
    per_fold = {}
    with tempfile.TemporaryDirectory(prefix="traceap-folds-") as tmp:
        views = write_views(dataset, plan, tmp, (entries, a))
        for name in list(only) or plan.names:
            dets = dict(detectors_for(name))
            clfs = dict(classifiers_for(name, dets)) if classifiers_for else {}
            per_fold[name] = evaluate(views[name], dets, clfs, config, fit=fit,
                                      on_warning=on_warning, **run)
            per_fold[name].dataset = str(dataset)   # not the temporary view
    first = next(iter(per_fold.values()))
    pooled = EvalResult(str(dataset), config, first.detectors, first.classifiers,
                        [r for res in per_fold.values() for r in res.records],
                        warnings=[w for res in per_fold.values() for w in res.warnings],
                        seconds=sum(res.seconds for res in per_fold.values()))
    return FoldsResult(plan, str(dataset), per_fold, pooled,
                       {n: sorted(a.bases[n]) for n in per_fold})


__all__ = ["FOLDS_SCHEMA", "Assignment", "Fold", "FoldPlan", "HELD_OUT", "assign", "base_origins",
           "FoldsResult", "dataset_assignment", "describe", "evaluate_folds", "write_view", "write_views"]
