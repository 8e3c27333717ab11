"""`traceap collect --plan PLAN.yaml`: a sweep over models x patterns x batch sizes, resumable.

A plan names a dataset folder and a list of runs; each run is a cross product:

    out: datasets/collected
    device: cuda
    steps: 3
    runs:
      - models: [resnet18, vit_b_16]
        patterns: [none, PATTERN_ID, "PATTERN_ID,PATTERN_ID"]   # examples/collect_plan.yaml
        batch_sizes: [32, 64]
        inference: [false, true]

Recordings already in the manifest are skipped, so an interrupted sweep picks up where it
stopped; patterns that cannot happen here (a GPU-only cause on a CPU, NCCL with one process)
are skipped with the reason.  One failing recording (say, out of memory) is reported and the
sweep goes on.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import product
from pathlib import Path

import torch
import yaml

from ..errors import TraceapError, raised_by_a_stop
from .causes import PatternUnavailable, parse_patterns
from .runner import CollectConfig, collect, entry_id, existing_ids, prepare_out

#: CPU training throughput and the fixed cost of one recording (model build, DataLoader
#: workers, profiler export, gzip), measured with `traceap collect --device cpu` on the 2
#: shared cores of the development VM: resnet18 224 px batch 8 ran 17 GFLOP/s, vit_s_16
#: batch 4 14 GFLOP/s; a 64 px resnet18 recording took 10-15 s in all.  Rough by nature: the
#: estimate is rescaled by the recordings already made as the sweep goes.
CPU_GFLOPS = 15.0
RECORDING_OVERHEAD_S = 10.0
#: Backward costs about twice the forward pass.
TRAIN_FLOP_FACTOR = 3.0

_RUN_KEYS = {"models", "patterns", "batch_sizes", "inference", "image_size", "task", "split",
             "steps", "workers", "compile_backend"}
_TOP_KEYS = {"out", "device", "steps", "workers", "compile_backend", "split", "runs", "seed"}


@dataclass
class Plan:
    """A parsed plan: where to write, and the recordings it asks for."""

    out: Path | None
    device: str
    configs: list[CollectConfig] = field(default_factory=list)


@dataclass
class PlanResult:
    """What a sweep did."""

    recorded: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    unavailable: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


def _as_list(value, key: str, where: str) -> list:
    if value is None:
        raise TraceapError(f"{where}: '{key}' is missing")
    items = value if isinstance(value, list) else [value]
    if not items:
        raise TraceapError(f"{where}: '{key}' is empty")
    return items


def load_plan(path: str | Path, out: Path | None = None, device: str | None = None) -> Plan:
    """Read and validate PLAN.yaml; `out` and `device` override the plan's own."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise TraceapError(f"{path}: no such plan file") from None
    except yaml.YAMLError as exc:
        raise TraceapError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise TraceapError(f"{path}: a plan is a mapping with a 'runs' list")
    _check_keys(doc, _TOP_KEYS, str(path))
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise TraceapError(f"{path}: 'runs' must be a non-empty list")
    if out is None and doc.get("out"):
        out = Path(doc["out"])  # relative to the plan file, so a plan works from anywhere
        out = out if out.is_absolute() else path.parent / out
    plan = Plan(out=out, device=device or doc.get("device", "cuda"))
    base = {k: doc[k] for k in ("steps", "workers", "compile_backend", "split", "seed") if k in doc}
    for n, run in enumerate(runs, 1):
        where = f"{path}: run {n}"
        if not isinstance(run, dict):
            raise TraceapError(f"{where}: each run is a mapping (models, patterns, batch_sizes)")
        _check_keys(run, _RUN_KEYS, where)
        opts = {**base, **{k: run[k] for k in ("steps", "workers", "compile_backend", "split",
                                               "image_size", "task") if k in run}}
        models = _as_list(run.get("models"), "models", where)
        patterns = [parse_patterns(str(p)) for p in _as_list(run.get("patterns", ["none"]),
                                                              "patterns", where)]
        sizes = _as_list(run.get("batch_sizes", [None]), "batch_sizes", where)
        modes = _as_list(run.get("inference", [False]), "inference", where)
        for model, pats, bs, inf in product(models, patterns, sizes, modes):
            if bs is not None and (not isinstance(bs, int) or bs < 1):
                raise TraceapError(f"{where}: batch size {bs!r} is not a positive integer")
            if not isinstance(inf, bool):
                raise TraceapError(f"{where}: inference must be true or false, not {inf!r}")
            cfg = CollectConfig(model=str(model), patterns=pats, device=plan.device,
                                batch_size=bs, inference=inf, **opts)
            if out is not None:
                cfg.out = Path(out)
            plan.configs.append(cfg)
    return plan


def _check_keys(mapping: dict, known: set[str], where: str) -> None:
    """A typo in a plan is an error, not a silently ignored setting."""
    unknown = set(mapping) - known
    if unknown:
        raise TraceapError(f"{where}: unknown key {sorted(unknown)[0]!r}; known: "
                           + ", ".join(sorted(known)))


@lru_cache(maxsize=None)
def forward_gflop(model: str, image_size: int | None) -> float | None:
    """GFLOP of one image's forward pass, counted on the meta device (no memory, no compute);
    None when the model cannot be traced that way."""
    from torch.utils.flop_counter import FlopCounterMode

    from .networks import build_model
    try:
        with torch.device("meta"):
            net, _, size = build_model(model, image_size)
            x = torch.empty(2, 3, size, size)  # 2: batch norm needs more than one value
        with FlopCounterMode(display=False) as counter:
            net(x)
    except Exception:  # noqa: BLE001 - an estimate must never stop a sweep
        return None
    return counter.get_total_flops() / 2 / 1e9


def estimate_seconds(cfg: CollectConfig) -> float | None:
    """Rough wall time of one recording on the CPU (None on a GPU: no reference measured)."""
    if cfg.device != "cpu":
        return None
    gflop = forward_gflop(cfg.model, cfg.image_size)
    if gflop is None:
        return None
    steps = cfg.wait + cfg.warmup + cfg.steps
    work = gflop * cfg.resolved_batch_size * steps * (1.0 if cfg.inference else TRAIN_FLOP_FACTOR)
    return RECORDING_OVERHEAD_S + work / CPU_GFLOPS


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def run_plan(plan: Plan, echo: Callable[[str], None] = print,
             recorder: Callable[[CollectConfig], object] = collect) -> PlanResult:
    """Record every configuration the manifest does not hold yet; return what happened.

    Before the first recording it says how many there are to make and, on the CPU, about how
    long they take; after each one, the time left at the pace measured so far."""
    if plan.out is None:
        raise TraceapError("the plan names no 'out' dataset folder (give --out DIR)")
    result = PlanResult()
    # a folder the sweep may not write into is one line before the first recording
    for note in prepare_out(plan.out):
        echo(note)
    done = existing_ids(plan.out)
    todo: dict[int, float | None] = {}
    impossible = there = 0
    for i, cfg in enumerate(plan.configs):
        cfg.out = plan.out
        try:
            cfg.check_possible()
        except PatternUnavailable:
            impossible += 1
            continue
        if entry_id(cfg) in done:
            there += 1
        else:
            todo[i] = None
    for i in todo:
        todo[i] = estimate_seconds(plan.configs[i])
    known = all(v is not None for v in todo.values())
    total = sum(v for v in todo.values() if v is not None)
    echo(f"plan: {len(plan.configs)} recording(s): {len(todo)} to make on {plan.device}"
         + (f" (about {_duration(total)}, a rough estimate)" if todo and known else "")
         + f", {there} already there, {impossible} not possible here -> {plan.out}")
    spent = estimated = 0.0
    for i, cfg in enumerate(plan.configs, 1):
        eid = entry_id(cfg)
        prefix = f"[{i}/{len(plan.configs)}] {eid}"
        if eid in done:
            result.existing.append(eid)
            echo(f"{prefix}: already recorded, skipped")
            continue
        try:
            cfg.check_possible()
        except PatternUnavailable as exc:
            result.unavailable.append((eid, str(exc)))
            echo(f"{prefix}: skipped: {exc}")
            continue
        t0 = time.perf_counter()
        try:
            rec = recorder(cfg)
        except (TraceapError, RuntimeError) as exc:
            if raised_by_a_stop(exc):  # the stop itself, not a failed recording: end the sweep
                raise KeyboardInterrupt from exc
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            result.failed.append((eid, msg))
            todo.pop(i - 1, None)
            echo(f"{prefix}: failed: {msg}")
        else:
            result.recorded.append(eid)
            done.add(eid)
            secs = getattr(rec, "seconds", None)
            n = len(getattr(getattr(rec, "entry", None), "anomalies", []) or [])
            left = ""
            est = todo.pop(i - 1, None)
            if est and known and todo:
                spent += time.perf_counter() - t0
                estimated += est
                rest = sum(todo.values()) * spent / estimated
                left = f"; about {_duration(rest)} left for {len(todo)}"
            echo(f"{prefix}: recorded" + (f" in {secs:.1f} s, {n} anomaly intervals"
                                          if secs is not None else "") + left)
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return result


__all__ = ["Plan", "PlanResult", "load_plan", "run_plan"]
