"""Weakly supervised training (paper 5.5): pairs of one good and one bad trace, trace labels only.

The manifest's `label` and `patterns` of train entries are read; their `anomalies` never are.
Each trace is loaded and featurised once per window count N and cached on disk (keyed by the
trace file and the feature settings), so epochs after the first cost only the model.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from ..dataset import PATTERNS, Entry, read_manifest, trace_path
from ..errors import DatasetError
from ..progress import track
from .checkpoint import save_model
from .config import ModelConfig, preset
from .features import FeatureWork, TraceFeatures, featurize_trace
from .losses import total_loss, trace_score
from .net import TraceAPModel, collate
from .text import TextEncoder, cache_dir

FEATURE_VERSION = 1


@dataclass
class Example:
    """One training trace: features per N, trace label, multi-hot pattern target."""

    id: str
    label: int
    patterns: np.ndarray
    feats: dict[int, TraceFeatures] = field(default_factory=dict)


def _feature_key(path: Path, n: int, cfg: ModelConfig) -> str:
    st = path.stat()
    raw = (f"v{FEATURE_VERSION}|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{n}|"
           f"{cfg.max_events}|{cfg.event_sampling}|{cfg.time_vocab}|{cfg.t_min_us}|{cfg.t_max_us}|{cfg.max_streams}")
    return hashlib.sha1(raw.encode()).hexdigest()


def featurize_entries(dataset: Path, entries: Sequence[Entry], ns: Sequence[int],
                      cfg: ModelConfig, cache: Path | None = None, workers: int = 1,
                      ray: str | None = None) -> dict[str, dict[int, TraceFeatures]]:
    """Features of every entry at every N (cached on disk); entry id -> N -> features.

    Traces not yet in the cache are featurised `workers` at a time in local processes, or as
    Ray tasks (`ray`: "local", "auto" or an address; `traceap.parallel.Execution`)."""
    from ..parallel import Execution, run

    root = Path(cache or cache_dir()) / "features"
    root.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[int, Path]] = {}
    jobs = []
    for e in entries:
        p = trace_path(dataset, e)
        if not p.is_file():
            raise DatasetError(f"{p}: trace file listed in the manifest is missing")
        files[e.id] = {n: root / f"{_feature_key(p, n, cfg)}.npz" for n in ns}
        missing = tuple(n for n, f in files[e.id].items() if not f.exists())
        if missing:
            jobs.append((e.id, str(p), missing))
    # torch-free tasks (`traceap.model.features`): workers import no torch.
    for _, (key, res) in track(run(featurize_trace, jobs, FeatureWork(cfg),
                                   Execution(workers, ray), preload=("traceap.model.features",)),
                               "featurising traces", total=len(jobs)):
        if isinstance(res, str):
            raise DatasetError(f"cannot featurise {res}")
        for n, feats in res.items():
            feats.save(files[key][n])
    return {key: {n: TraceFeatures.load(f) for n, f in per_n.items()}
            for key, per_n in files.items()}


def examples_from(entries: Sequence[Entry], feats: dict[str, dict[int, TraceFeatures]]
                  ) -> list[Example]:
    """Training examples: trace label and trace-level patterns (never the anomalies)."""
    out = []
    for e in entries:
        target = np.array([p in e.patterns for p in PATTERNS], np.float32) if e.is_bad else \
            np.zeros(len(PATTERNS), np.float32)
        out.append(Example(e.id, int(e.is_bad), target, feats[e.id]))
    return out


@dataclass
class TrainLog:
    """What happened during training."""

    epochs: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    featurize_seconds: float = 0.0
    n_good: int = 0
    n_bad: int = 0
    steps: int = 0


def fit(examples: Sequence[Example], cfg: ModelConfig, text_table: dict[str, np.ndarray],
        epochs: int | None = None, log: Callable[[str], None] | None = None,
        max_steps: int | None = None,
        on_epoch: Callable[[TraceAPModel, "TrainLog"], None] | None = None
        ) -> tuple[TraceAPModel, TrainLog]:
    """Train a fresh model on examples (each with features at every N in cfg.windows).

    `on_epoch(model, log)` runs after every epoch (e.g. to save a checkpoint)."""
    goods = [x for x in examples if x.label == 0]
    bads = [x for x in examples if x.label == 1]
    if not goods or not bads:
        raise DatasetError("training needs both good and bad traces in the train split")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    platforms = sorted({f.platform for x in examples for f in x.feats.values()})
    model = TraceAPModel(cfg, platforms)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    pairs = cfg.batch_size // 2
    per_epoch = math.ceil(max(len(goods), len(bads)) / pairs)
    epochs = cfg.epochs if epochs is None else epochs
    total = max(1, per_epoch * epochs if max_steps is None else min(per_epoch * epochs, max_steps))
    warmup = max(1, min(50, total // 20))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    gen = torch.Generator().manual_seed(cfg.seed)
    train_log = TrainLog(n_good=len(goods), n_bad=len(bads))
    t0 = time.perf_counter()
    step = 0
    for epoch in range(epochs):
        model.train()
        g = [goods[i] for i in rng.permutation(np.resize(np.arange(len(goods)), per_epoch * pairs))]
        b = [bads[i] for i in rng.permutation(np.resize(np.arange(len(bads)), per_epoch * pairs))]
        sums: dict[str, float] = {}
        correct = 0
        for s in track(range(per_epoch), f"epoch {epoch + 1}/{epochs}"):
            if step >= total:
                break
            n = int(rng.choice(cfg.windows))
            batch_ex = g[s * pairs:(s + 1) * pairs] + b[s * pairs:(s + 1) * pairs]
            batch = collate([x.feats[n] for x in batch_ex], model, text_table,
                            cfg.platform_dropout, rng)
            y = torch.tensor([x.label for x in batch_ex], dtype=torch.float32)
            targets = torch.from_numpy(np.stack([x.patterns for x in batch_ex]))
            out = model(batch)
            terms = total_loss(out, y, targets, model.svm.fc.weight, cfg, gen)
            opt.zero_grad(set_to_none=True)
            terms["total"].backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            step += 1
            for k, v in terms.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach())
            with torch.no_grad():
                ts = trace_score(out["scores"], cfg.trace_pool, cfg.topk_fraction)
                correct += int(((ts > 0.5).float() == y).sum())
        done = max(1, min(per_epoch, step - epoch * per_epoch))
        row = {"epoch": epoch + 1, **{k: v / done for k, v in sums.items()},
               "trace_acc": correct / (done * cfg.batch_size),
               "seconds": time.perf_counter() - t0}
        train_log.epochs.append(row)
        if log:
            log(f"epoch {epoch + 1}/{epochs}: loss {row.get('total', float('nan')):.4f} "
                f"(trace {row.get('trace', float('nan')):.3f}, pattern "
                f"{row.get('pattern', float('nan')):.3f}) trace acc {row['trace_acc']:.3f} "
                f"[{row['seconds']:.0f} s]")
        if on_epoch is not None:
            model.eval()
            train_log.seconds = time.perf_counter() - t0
            train_log.steps = step
            on_epoch(model, train_log)
        if step >= total:
            break
    train_log.seconds = time.perf_counter() - t0
    train_log.steps = step
    model.eval()
    return model, train_log


def train(dataset: str | os.PathLike, out: str | os.PathLike | None = None,
          config: str | ModelConfig = "small", windows: Sequence[int] | None = None,
          epochs: int | None = None, ablations: Sequence[str] = (), cache: str | None = None,
          workers: int = 1, limit: int | None = None, seed: int | None = None,
          log: Callable[[str], None] | None = None, ray: str | None = None
          ) -> tuple[TraceAPModel, TrainLog]:
    """Train on the `train` split of a dataset (docs/FORMATS.md) and optionally save a checkpoint.

    Featurising (the part that reads traces) runs `workers` at a time or on Ray (`ray`)."""
    dataset = Path(dataset)
    cfg = preset(config) if isinstance(config, str) else config
    if ablations:
        cfg = cfg.with_ablations(ablations)
    if windows:
        cfg = replace(cfg, windows=tuple(int(n) for n in windows))
    if seed is not None:
        cfg = replace(cfg, seed=seed)
    if epochs is not None:
        cfg = replace(cfg, epochs=epochs)
    entries = [e for e in read_manifest(dataset) if e.split == "train"]
    if limit:
        rng = np.random.default_rng(cfg.seed)
        goods = [e for e in entries if not e.is_bad]
        bads = [e for e in entries if e.is_bad]
        half = max(1, limit // 2)
        entries = [goods[i] for i in sorted(rng.permutation(len(goods))[:half])] + \
                  [bads[i] for i in sorted(rng.permutation(len(bads))[:half])]
    if not entries:
        raise DatasetError(f"{dataset}: no train entries in the manifest")
    t0 = time.perf_counter()
    feats = featurize_entries(dataset, entries, cfg.windows, cfg, Path(cache) if cache else None,
                              workers, ray)
    names = sorted({str(n) for per_n in feats.values() for f in per_n.values() for n in f.names[1:]})
    encoder = TextEncoder()
    text_table = encoder.table(names)
    feat_s = time.perf_counter() - t0
    if log:
        log(f"featurised {len(entries)} traces at N = {', '.join(map(str, cfg.windows))} "
            f"({len(names)} unique event names) in {feat_s:.0f} s")

    def save(model: TraceAPModel, train_log: TrainLog) -> None:
        # Written after every epoch, so an interrupted run still leaves its latest model.
        save_model(model, out, text_table, meta={
            "dataset": str(dataset), "n_train": len(entries), "n_good": train_log.n_good,
            "n_bad": train_log.n_bad, "epochs": len(train_log.epochs), "steps": train_log.steps,
            "train_seconds": round(train_log.seconds, 1), "featurize_seconds": round(feat_s, 1),
            "history": train_log.epochs,
        }, encoder_id=encoder.encoder_id)

    model, train_log = fit(examples_from(entries, feats), cfg, text_table, log=log,
                           on_epoch=save if out is not None else None)
    train_log.featurize_seconds = feat_s
    return model, train_log


__all__ = ["Example", "TrainLog", "examples_from", "featurize_entries", "fit", "train"]
