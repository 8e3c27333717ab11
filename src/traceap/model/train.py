"""Weakly supervised training (paper 5.5): pairs of one good and one bad trace, trace labels only.

The manifest's `label` and `patterns` of train entries are read; their `anomalies` are read only
when the config asks for window supervision (`w_window` > 0, beyond the paper: planted and
simulated traces know where their anomalies are).
Several datasets can be mixed (e.g. the simulator's and the real-based one of `traceap
inject`): each step draws its bad traces from the datasets in proportion to `mix`, and each bad
trace's good partner from the same dataset; a planted trace whose unmodified base is in the
train split is paired with that base with probability `cfg.pair_same_base` (the same trace with
and without the anomaly: the only difference is where it is).

With validation sets (`val`), every epoch is scored on their `validation` split (window AUC
from the validation anomalies, which is what a validation split is for) and the best epoch is
the one kept.  Each trace is loaded and featurised once per window count N and cached on disk
(keyed by the trace file and the feature settings), so epochs after the first cost only the
model.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from .._auc import auc
from ..manifest import Entry, read_manifest, trace_path
from ..errors import DatasetError
from ..patterns import pattern_ids
from ..progress import track
from .checkpoint import save_model
from .config import ModelConfig, preset
from .features import FeatureWork, TraceFeatures, featurize_trace
from .losses import total_loss, trace_score
from .pretrain import pretrain
from .net import TraceAPModel, collate
from .text import TextEncoder, cache_dir

#: Bumped whenever `featurize` writes different arrays (2: raw times and window measures;
#: 3: host events; 4: idle time by mechanism per window; 5: the idle account gives NCCL time
#: with nothing queued behind it to the host causes; 6: a sync's lost lead, `sync_debt`, is
#: host_copies_syncs idle in later gaps too; 7: the newer mechanisms and the busy-time losses,
#: `features.SUMMARY_SPLIT`; 8: python_host is the user's code, ops on host tensors included,
#: the compiled graphs' wrapper Python not, and the GPU span's starved head is a starved gap;
#: 9: small collectives' idle holds the starved gaps while the host is in the c10d calls that
#: launch them, which were launch_bound; 10: compile_gaps holds the eager stretches between
#: the graphs of a compiled frame that holds resumed frames, `compile_regions.compiled_rows`).
FEATURE_VERSION = 10


@dataclass
class Example:
    """One trace: features per N, trace label, multi-hot pattern target; for validation also
    the window labels per N.  `group`: which dataset it came from; `partner`: index (in the
    same example list) of its unmodified base when that base is a good train trace."""

    id: str
    label: int
    patterns: np.ndarray
    feats: dict[int, TraceFeatures] = field(default_factory=dict)
    group: int = 0
    partner: int = -1
    source: str | None = None
    window_labels: dict[int, np.ndarray] = field(default_factory=dict)
    #: per N, [N, P]: the patterns of the anomalies each window overlaps (with window_labels)
    window_patterns: dict[int, np.ndarray] = field(default_factory=dict)
    #: whether `window_labels` are the truth: a good trace, or a bad one with its anomalies
    labels_known: bool = False


def _feature_keys(path: Path, ns: Sequence[int], cfg: ModelConfig) -> tuple[dict[int, str], str]:
    """Cache keys of a trace file's features at each N (its path, size and mtime, N and the
    featuriser's settings), and of the record of its failure (also its change time, so that a
    file made readable again by chmod is retried); the file is looked at once."""
    st = path.stat()
    head = f"v{FEATURE_VERSION}|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    tail = f"{cfg.max_events}|{cfg.event_sampling}|{cfg.max_streams}"

    def key(n: int) -> str:
        return hashlib.sha1(f"{head}|{n}|{tail}".encode()).hexdigest()
    return {n: key(n) for n in ns}, f"{key(0)}-{st.st_ctime_ns}"


def featurize_entries(dataset: Path, entries: Sequence[Entry], ns: Sequence[int],
                      cfg: ModelConfig, cache: Path | None = None, workers: int = 1,
                      ray: str | None = None, on_error: Callable[[str], None] | None = None
                      ) -> dict[str, dict[int, TraceFeatures]]:
    """Features of every entry at every N (cached on disk); entry id -> N -> features.

    Traces not yet in the cache are featurised `workers` at a time in local processes, or as
    Ray tasks (`ray`: "local", "auto" or an address; `traceap.parallel.Execution`).  A trace
    that cannot be featurised is an error, or with `on_error` reported there and left out.
    Failures are cached too (a `.failed` file with the reason, under the same key and the
    file's change time: a trace that is rewritten, touched or given other permissions is tried
    again), so a stray file in a folder of traces is read once, not on every run."""
    from ..parallel import Execution, run

    root = Path(cache or cache_dir()) / "features"
    root.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[int, Path]] = {}
    failed: dict[str, Path] = {}
    jobs = []

    def fail(key: str, why: str) -> None:
        if on_error is None:
            raise DatasetError(f"cannot featurise {why}")
        on_error(f"skipped (cannot featurise) {why}")
        del files[key]

    for e in entries:
        p = trace_path(dataset, e)
        if not p.is_file():
            raise DatasetError(f"{p}: trace file listed in the manifest is missing")
        keys, fail_key = _feature_keys(p, ns, cfg)
        files[e.id] = {n: root / f"{k}.npz" for n, k in keys.items()}
        failed[e.id] = root / f"{fail_key}.failed"
        if failed[e.id].exists():
            fail(e.id, failed[e.id].read_text())
            continue
        missing = tuple(n for n, f in files[e.id].items() if not f.exists())
        if missing:
            jobs.append((e.id, str(p), missing))
    # torch-free tasks (`traceap.model.features`): workers import no torch.
    for _, (key, res) in track(run(featurize_trace, jobs, FeatureWork(cfg),
                                   Execution(workers, ray), preload=("traceap.model.features",)),
                               "featurising traces", total=len(jobs)):
        if isinstance(res, str):
            failed[key].write_text(res)
            fail(key, res)
            continue
        for n, feats in res.items():
            feats.save(files[key][n])
    return {key: {n: TraceFeatures.load(f) for n, f in per_n.items()}
            for key, per_n in files.items()}


def event_names(feature_sets: Iterable[TraceFeatures]) -> set[str]:
    """The event names a set of features reads (each name table without its padding entry 0):
    the vocabulary the text encoder embeds before training."""
    return {str(n) for f in feature_sets for n in f.names[1:]}


def window_labels_of(entry: Entry, feats: TraceFeatures) -> np.ndarray:
    """`manifest.window_labels` from the features' window edges (validation and evaluation,
    or training with window supervision)."""
    y = np.zeros(feats.n_windows, dtype=bool)
    for _, hit in _anomaly_hits(entry, feats):
        y |= hit
    return y


def window_patterns_of(entry: Entry, feats: TraceFeatures,
                       patterns: Sequence[str] | None = None) -> np.ndarray:
    """[N, P] float32: 1 where a window overlaps an anomaly of that pattern, a column per id of
    `patterns` (the model's `head_patterns`; None: every registered pattern)."""
    patterns = tuple(pattern_ids() if patterns is None else patterns)
    y = np.zeros((feats.n_windows, len(patterns)), dtype=np.float32)
    for a, hit in _anomaly_hits(entry, feats):
        if a.pattern in patterns:
            y[hit, patterns.index(a.pattern)] = 1.0
    return y


def _anomaly_hits(entry: Entry, feats: TraceFeatures):
    """Each anomaly of the entry with the windows (bool [N]) it overlaps."""
    for a in entry.anomalies:
        yield a, (feats.start_us < a.end_us) & (feats.end_us > a.start_us)


def examples_from(entries: Sequence[Entry], feats: dict[str, dict[int, TraceFeatures]],
                  group: int = 0, with_window_labels: bool = False,
                  patterns: Sequence[str] | None = None) -> list[Example]:
    """Examples: trace label and trace-level patterns (never the anomalies, unless
    `with_window_labels` asks for them: validation and test, or training with `w_window`).  A
    planted trace is linked to its unmodified base (`partner`) when that base is a good trace
    among the entries.  Pattern targets have a column per id of `patterns`, the model's
    `head_patterns` (None: every registered pattern, the head of a config that names none)."""
    patterns = tuple(pattern_ids() if patterns is None else patterns)
    out = []
    base_of = {e.base: i for i, e in enumerate(entries)
               if e.base and e.source == "natural" and not e.is_bad}
    for e in entries:
        target = np.array([p in e.patterns for p in patterns], np.float32) if e.is_bad else \
            np.zeros(len(patterns), np.float32)
        partner = base_of.get(e.base, -1) if e.is_bad and e.source == "injected" else -1
        x = Example(e.id, int(e.is_bad), target, feats[e.id], group, partner, e.source)
        if with_window_labels:
            x.window_labels = {n: window_labels_of(e, f) for n, f in x.feats.items()}
            x.window_patterns = {n: window_patterns_of(e, f, patterns) for n, f in x.feats.items()}
            x.labels_known = not e.is_bad or bool(e.anomalies)
        out.append(x)
    return out


@dataclass
class TrainLog:
    """What happened during training."""

    epochs: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    featurize_seconds: float = 0.0
    n_good: int = 0
    n_bad: int = 0
    steps: int = 0
    best_epoch: int | None = None
    #: self-supervised pretraining (`traceap.model.pretrain`): a row per 25 steps, and its time
    pretrain: list[dict] = field(default_factory=list)
    pretrain_seconds: float = 0.0


def score_examples(model: TraceAPModel, examples: Sequence[Example], n: int,
                   text_table: dict[str, np.ndarray], batch_size: int = 8) -> list[np.ndarray]:
    """Window scores of each example at window count n (eval mode, no gradients)."""
    model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            chunk = examples[i:i + batch_size]
            batch = collate([x.feats[n] for x in chunk], model, text_table)
            out += list(model(batch)["scores"].numpy().astype(np.float64))
    return out


def validation_metrics(examples: Sequence[Example], scores: Sequence[np.ndarray],
                       threshold: float = 0.5) -> dict:
    """Window AUC (pooled) overall and on natural traces, trace AUC (max window score), and the
    share of flagged windows on good traces; `score` = the figure epochs are chosen by."""
    y = np.concatenate([x.window_labels[len(s)] for x, s in zip(examples, scores)])
    s = np.concatenate(scores)
    out = {"window_auc": auc(y, s)}
    nat = [(x, sc) for x, sc in zip(examples, scores) if x.source == "natural"]
    if nat:
        out["natural_auc"] = auc(np.concatenate([x.window_labels[len(sc)] for x, sc in nat]),
                                  np.concatenate([sc for _, sc in nat]))
    out["trace_auc"] = auc(np.array([x.label for x in examples]),
                            np.array([sc.max() for sc in scores]))
    good = [sc for x, sc in zip(examples, scores) if x.label == 0]
    out["healthy_flagged"] = float(np.mean([(sc >= threshold).mean() for sc in good])) \
        if good else None
    out["score"] = (out["window_auc"] or 0.0) - 0.5 * max(0.0, (out["healthy_flagged"] or 0.0) - 0.1)
    return out


def _cycler(n: int, rng: np.random.Generator):
    """Endless shuffled passes over range(n)."""
    while True:
        yield from rng.permutation(n)


@dataclass
class _Groups:
    """The train examples by label and by dataset group, and each group's share of the bad
    traces of a step."""

    goods: list[int]
    bads: list[int]
    groups: list[int]                  # the groups that have bad traces
    good_by: dict[int, list[int]]
    bad_by: dict[int, list[int]]
    weights: np.ndarray                # per entry of `groups`, sums to 1


def _group_examples(examples: Sequence[Example], mix: Sequence[float] | None) -> _Groups:
    """Split the examples by label and group; `mix` weighs the groups (default: by bad traces)."""
    goods = [i for i, x in enumerate(examples) if x.label == 0]
    bads = [i for i, x in enumerate(examples) if x.label == 1]
    if not goods or not bads:
        raise DatasetError("training needs both good and bad traces in the train split")
    groups = sorted({x.group for x in examples})
    good_by = {g: [i for i in goods if examples[i].group == g] for g in groups}
    bad_by = {g: [i for i in bads if examples[i].group == g] for g in groups}
    groups = [g for g in groups if bad_by[g]]
    weights = np.array([len(bad_by[g]) for g in groups], np.float64) if mix is None else \
        np.array([float(mix[g]) if g < len(mix) else 0.0 for g in groups], np.float64)
    if weights.sum() <= 0:
        raise DatasetError("the mix gives no weight to any dataset with bad traces")
    weights /= weights.sum()
    return _Groups(goods, bads, groups, good_by, bad_by, weights)


def _new_model(examples: Sequence[Example], cfg: ModelConfig, text_table: dict[str, np.ndarray],
               pretrain_feats: Sequence[dict[int, TraceFeatures]],
               log: Callable[[str], None] | None) -> tuple[TraceAPModel, list[dict], float]:
    """A fresh model over every platform seen, pretrained when `cfg.pretrain_steps` asks;
    (model, pretraining rows, when pretraining started)."""
    if cfg.pretrain_steps > 0 and not pretrain_feats:
        raise DatasetError("pretrain_steps needs unlabelled traces to pretrain on "
                           "(traceap train --pretrain-on DATASET|TRACES)")
    platforms = sorted({f.platform for x in examples for f in x.feats.values()}
                       | {f.platform for x in pretrain_feats for f in x.values()})
    model = TraceAPModel(cfg, platforms)
    t_pre = time.perf_counter()
    pre_rows = pretrain(model, list(pretrain_feats), cfg.pretrain_steps,
                        lambda fs, r: collate(fs, model, text_table, cfg.platform_dropout, r),
                        cfg.windows, cfg.batch_size, cfg.lr, cfg.weight_decay, cfg.seed,
                        cfg.pretrain_mask, log)
    return model, pre_rows, t_pre


@dataclass
class _Schedule:
    """The optimiser, its warm-up + cosine learning rate, and the step budget."""

    params: list
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    pairs: int                         # (good, bad) pairs per step
    per_epoch: int                     # steps per epoch
    epochs: int
    total: int                         # steps in all


def _schedule(model: TraceAPModel, cfg: ModelConfig, groups: _Groups, epochs: int | None,
              max_steps: int | None, steps_per_epoch: int | None) -> _Schedule:
    """AdamW over the trainable parameters; an epoch shows every bad (or good) trace once
    unless `steps_per_epoch` says otherwise; warm-up over 5% of the steps (at most 50)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    pairs = cfg.batch_size // 2
    per_epoch = steps_per_epoch or math.ceil(max(len(groups.goods), len(groups.bads)) / pairs)
    epochs = cfg.epochs if epochs is None else epochs
    total = max(1, per_epoch * epochs if max_steps is None else min(per_epoch * epochs, max_steps))
    warmup = max(1, min(50, total // 20))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    return _Schedule(params, opt, sched, pairs, per_epoch, epochs, total)


class _PairSampler:
    """A step's batch: bad traces drawn by group weight, each with a good partner (its own
    unmodified base with probability `cfg.pair_same_base`, else a good trace of its group)."""

    def __init__(self, examples: Sequence[Example], groups: _Groups, cfg: ModelConfig,
                 rng: np.random.Generator, pairs: int):
        self.examples, self.g, self.cfg, self.rng, self.pairs = examples, groups, cfg, rng, pairs
        self.bad_iter = {g: _cycler(len(groups.bad_by[g]), rng) for g in groups.groups}
        self.good_iter = {g: _cycler(len(groups.good_by[g]), rng) for g in groups.groups
                          if groups.good_by[g]}
        self.any_good = _cycler(len(groups.goods), rng)

    def partner_of(self, i: int) -> int:
        """The good trace shown beside bad trace i."""
        x = self.examples[i]
        if x.partner >= 0 and self.rng.random() < self.cfg.pair_same_base:
            return x.partner
        g = x.group
        return (self.g.good_by[g][next(self.good_iter[g])] if g in self.good_iter
                else self.g.goods[next(self.any_good)])

    def draw(self) -> tuple[int, list[Example]]:
        """(window count N, the batch: the partners, then the bad traces)."""
        n = int(self.rng.choice(self.cfg.windows))
        groups = self.g.groups
        picked = self.rng.choice(len(groups), size=self.pairs, p=self.g.weights)
        b = [self.g.bad_by[groups[j]][next(self.bad_iter[groups[j]])] for j in picked]
        return n, [self.examples[self.partner_of(i)] for i in b] + [self.examples[i] for i in b]


def _train_step(model: TraceAPModel, batch_ex: list[Example], n: int, cfg: ModelConfig,
                text_table: dict[str, np.ndarray], rng: np.random.Generator,
                gen: torch.Generator, sch: _Schedule, sums: dict[str, float]) -> int:
    """One optimiser step on a batch; adds its loss terms to `sums`, returns how many of its
    traces the trace score got right."""
    batch = collate([x.feats[n] for x in batch_ex], model, text_table, cfg.platform_dropout, rng)
    y = torch.tensor([x.label for x in batch_ex], dtype=torch.float32)
    targets = torch.from_numpy(np.stack([x.patterns for x in batch_ex]))
    out = model(batch)
    terms = total_loss(out, y, targets, model.svm.fc.weight, cfg, gen,
                       _window_targets(batch_ex, n) if cfg.window_supervised else None)
    sch.opt.zero_grad(set_to_none=True)
    terms["total"].backward()
    torch.nn.utils.clip_grad_norm_(sch.params, 1.0)
    sch.opt.step()
    sch.sched.step()
    for k, v in terms.items():
        sums[k] = sums.get(k, 0.0) + float(v.detach())
    with torch.no_grad():
        ts = trace_score(out["scores"], cfg.trace_pool, cfg.topk_fraction)
        return int(((ts > 0.5).float() == y).sum())


def _validate(model: TraceAPModel, val: Sequence[Sequence[Example]], val_windows: int,
              text_table: dict[str, np.ndarray], row: dict) -> str:
    """Score every validation list into `row` (`validation`, `val_score`); the log's part."""
    per = [validation_metrics(v, score_examples(model, v, val_windows, text_table)) for v in val]
    row["validation"] = per
    row["val_score"] = float(np.mean([m["score"] for m in per]))
    return " | val " + "; ".join(
        f"AUC {m['window_auc'] or float('nan'):.3f} flagged {m['healthy_flagged'] or 0:.3f}"
        for m in per)


def _epoch_line(epoch: int, epochs: int, row: dict, msg: str) -> str:
    """The log line of an epoch: mean loss terms, trace accuracy, time, validation."""
    return (f"epoch {epoch + 1}/{epochs}: loss {row.get('total', float('nan')):.4f} "
            f"(trace {row.get('trace', float('nan')):.3f}, pattern "
            f"{row.get('pattern', float('nan')):.3f}"
            + "".join(f", {k.replace('_', ' ')} {row[k]:.3f}"
                      for k in ("window", "window_pattern") if k in row)
            + f") trace acc {row['trace_acc']:.3f} "
            f"[{row['seconds']:.0f} s]" + msg)


def _stamp(train_log: TrainLog, t0: float, c0: float, step: int) -> None:
    """Wall and CPU seconds since training began, and the steps taken, into the log."""
    train_log.seconds = time.perf_counter() - t0
    train_log.cpu_seconds = time.process_time() - c0
    train_log.steps = step


def fit(examples: Sequence[Example], cfg: ModelConfig, text_table: dict[str, np.ndarray],
        epochs: int | None = None, log: Callable[[str], None] | None = None,
        max_steps: int | None = None,
        on_epoch: Callable[[TraceAPModel, "TrainLog"], None] | None = None,
        mix: Sequence[float] | None = None,
        val: Sequence[Sequence[Example]] = (), val_windows: int = 100,
        val_text_table: dict[str, np.ndarray] | None = None,
        steps_per_epoch: int | None = None,
        pretrain_feats: Sequence[dict[int, TraceFeatures]] = (),
        ) -> tuple[TraceAPModel, TrainLog]:
    """Train a fresh model on examples (each with features at every N in cfg.windows).

    `mix`: sampling weight of each example group (dataset) for the bad traces of a step
    (default: in proportion to their bad traces).  `val`: validation example lists (with
    window labels), scored after every epoch at `val_windows`; the best epoch (mean
    `validation_metrics` score over the lists) is the model returned.  An epoch is
    `steps_per_epoch` steps (default: enough pairs to show every bad trace, or every good one,
    once).  `on_epoch(model, log)` runs after every epoch (e.g. to save a checkpoint).
    `pretrain_feats`: features of unlabelled traces (per trace, N -> features) for
    `cfg.pretrain_steps` self-supervised steps before training (`traceap.model.pretrain`).
    The examples' pattern targets must have a column per pattern of the config's head
    (`examples_from(..., patterns=cfg.with_head().head_patterns)`)."""
    cfg = cfg.with_head()
    width = {len(x.patterns) for x in examples}
    if width - {len(cfg.head_patterns)}:
        raise ValueError(f"pattern targets of {sorted(width)} columns for a head of "
                         f"{len(cfg.head_patterns)} patterns (examples_from(..., patterns=))")
    groups = _group_examples(examples, mix)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    model, pre_rows, t_pre = _new_model(examples, cfg, text_table, pretrain_feats, log)
    sch = _schedule(model, cfg, groups, epochs, max_steps, steps_per_epoch)
    epochs, per_epoch = sch.epochs, sch.per_epoch
    gen = torch.Generator().manual_seed(cfg.seed)
    sampler = _PairSampler(examples, groups, cfg, rng, sch.pairs)
    train_log = TrainLog(n_good=len(groups.goods), n_bad=len(groups.bads), pretrain=pre_rows,
                         pretrain_seconds=round(time.perf_counter() - t_pre, 1) if pre_rows else 0.0)
    t0, c0 = time.perf_counter(), time.process_time()
    best: tuple[float, dict] | None = None
    step = 0
    for epoch in range(epochs):
        model.train()
        sums: dict[str, float] = {}
        correct = 0
        for _ in track(range(per_epoch), f"epoch {epoch + 1}/{epochs}"):
            if step >= sch.total:
                break
            n, batch_ex = sampler.draw()
            correct += _train_step(model, batch_ex, n, cfg, text_table, rng, gen, sch, sums)
            step += 1
        done = max(1, min(per_epoch, step - epoch * per_epoch))
        row = {"epoch": epoch + 1, **{k: v / done for k, v in sums.items()},
               "trace_acc": correct / (done * cfg.batch_size),
               "seconds": time.perf_counter() - t0}
        msg = ""
        if val:
            msg = _validate(model, val, val_windows, val_text_table or text_table, row)
            if best is None or row["val_score"] > best[0]:
                best = (row["val_score"], {k: v.detach().clone()
                                           for k, v in model.state_dict().items()})
                train_log.best_epoch = epoch + 1
        train_log.epochs.append(row)
        if log:
            log(_epoch_line(epoch, epochs, row, msg))
        if on_epoch is not None:
            model.eval()
            _stamp(train_log, t0, c0, step)
            on_epoch(model, train_log)
        if step >= sch.total:
            break
    if best is not None:
        model.load_state_dict(best[1])
    _stamp(train_log, t0, c0, step)
    model.eval()
    return model, train_log


def _window_targets(batch: Sequence[Example], n: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Window labels [B, n], whether each trace's are known [B] and the windows' patterns
    [B, n, P], for the `window` and `window_pattern` losses."""
    known = [x.labels_known and n in x.window_labels for x in batch]
    labels = np.stack([x.window_labels[n] if k else np.zeros(n, bool)
                       for x, k in zip(batch, known)])
    patterns = np.stack([x.window_patterns[n] if k else np.zeros((n, len(x.patterns)), np.float32)
                         for x, k in zip(batch, known)])
    return (torch.from_numpy(labels.astype(np.float32)), torch.tensor(known),
            torch.from_numpy(patterns))


def pretrain_pool(paths: Sequence[str | os.PathLike], ns: Sequence[int], cfg: ModelConfig,
                  cache: Path | None = None, workers: int = 1, ray: str | None = None,
                  log: Callable[[str], None] | None = None,
                  splits: Sequence[str] | None = None) -> list[dict[int, TraceFeatures]]:
    """Features of unlabelled traces for `cfg.pretrain_steps`: of a traceap dataset, every
    trace not planted by `traceap inject` (any split, or those of `splits`: no label is read);
    or trace files and folders of them (searched recursively: a user's own traces).  Traces with no GPU event in
    any window are left out (nothing to learn from), and so are files that are not readable
    traces (each said through `log`); none left is an error."""
    from ..load import find_traces

    out: list[dict[int, TraceFeatures]] = []
    for item in paths:
        p = Path(item)
        if (p / "manifest.jsonl").is_file():
            root, entries = p, [e for e in read_manifest(p) if e.source != "injected"
                                 and (splits is None or e.split in splits)]
        else:
            root = Path.cwd()
            entries = [Entry(id=f"pretrain:{f.resolve()}", path=str(f.resolve()), split="pretrain",
                             task="other", model=f.name, platform="", world_size=1, rank=0,
                             label="good") for f in find_traces([p])]
        feats = featurize_entries(root, entries, ns, cfg, cache, workers, ray,
                                  on_error=log or (lambda _: None))
        out += [f for f in feats.values() if any(x.mask.any() for x in f.values())]
    if not out:
        raise DatasetError("no trace with GPU events to pretrain on in "
                           + ", ".join(map(str, paths)))
    return out


def _limit(entries: list[Entry], limit: int, seed: int) -> list[Entry]:
    """At most `limit` entries, half good and half bad, drawn with a seed."""
    rng = np.random.default_rng(seed)
    goods = [e for e in entries if not e.is_bad]
    bads = [e for e in entries if e.is_bad]
    half = max(1, limit // 2)
    return [goods[i] for i in sorted(rng.permutation(len(goods))[:half])] + \
        [bads[i] for i in sorted(rng.permutation(len(bads))[:half])]


def train(dataset: str | os.PathLike | Sequence[str | os.PathLike],
          out: str | os.PathLike | None = None,
          config: str | ModelConfig = "small", windows: Sequence[int] | None = None,
          epochs: int | None = None, ablations: Sequence[str] = (), cache: str | None = None,
          workers: int = 1, limit: int | None = None, seed: int | None = None,
          log: Callable[[str], None] | None = None, mix: Sequence[float] | None = None,
          val: Sequence[str | os.PathLike] = (), val_windows: int = 100,
          steps_per_epoch: int | None = None, ray: str | None = None,
          pretrain_on: Sequence[str | os.PathLike] = (),
          ) -> tuple[TraceAPModel, TrainLog]:
    """Train on the `train` split of one or more datasets (docs/FORMATS.md), choose the epoch on
    the `validation` split of the `val` datasets (if any), and optionally save a checkpoint.
    `steps_per_epoch`: as `fit` (default: one pass over the bad traces).  Featurising (the part
    that reads traces) runs `workers` at a time or on Ray (`ray`).  `pretrain_on`: unlabelled
    traces for `cfg.pretrain_steps` self-supervised steps first (`pretrain_pool`)."""
    datasets = [Path(dataset)] if isinstance(dataset, (str, os.PathLike)) else \
        [Path(d) for d in dataset]
    cfg = preset(config) if isinstance(config, str) else config
    if ablations:
        cfg = cfg.with_ablations(ablations)
    if windows:
        cfg = replace(cfg, windows=tuple(int(n) for n in windows))
    if seed is not None:
        cfg = replace(cfg, seed=seed)
    if epochs is not None:
        cfg = replace(cfg, epochs=epochs)
    cfg = cfg.with_head()   # targets and head over the same patterns, named in the checkpoint
    if mix is not None and len(mix) != len(datasets):
        raise DatasetError(f"--mix gives {len(mix)} weights for {len(datasets)} datasets")
    if cfg.pretrain_steps > 0 and not pretrain_on:
        raise DatasetError("pretrain_steps needs --pretrain-on (pretrain_on: the unlabelled traces)")
    if pretrain_on and cfg.pretrain_steps <= 0:
        raise DatasetError("pretrain_on needs pretrain_steps > 0 in the config")
    t0 = time.perf_counter()
    examples: list[Example] = []
    n_train = []
    for g, ds in enumerate(datasets):
        entries = [e for e in read_manifest(ds) if e.split == "train"]
        if limit:
            entries = _limit(entries, limit, cfg.seed)
        if not entries:
            raise DatasetError(f"{ds}: no train entries in the manifest")
        feats = featurize_entries(ds, entries, cfg.windows, cfg, Path(cache) if cache else None,
                                  workers, ray)
        offset = len(examples)
        group = examples_from(entries, feats, group=g, with_window_labels=cfg.window_supervised,
                              patterns=cfg.head_patterns)
        for x in group:
            x.partner = x.partner + offset if x.partner >= 0 else -1
        examples += group
        n_train.append(len(entries))
    val_sets: list[list[Example]] = []
    for ds in val:
        entries = [e for e in read_manifest(ds) if e.split == "validation"]
        if not entries:
            raise DatasetError(f"{ds}: no validation entries in the manifest")
        feats = featurize_entries(Path(ds), entries, (val_windows,), cfg,
                                  Path(cache) if cache else None, workers, ray)
        val_sets.append(examples_from(entries, feats, with_window_labels=True,
                                      patterns=cfg.head_patterns))
    pool = pretrain_pool(pretrain_on, cfg.windows, cfg, Path(cache) if cache else None,
                         workers, ray, log) if pretrain_on else []
    names = sorted(event_names(f for x in examples for f in x.feats.values())
                   | event_names(f for per_n in pool for f in per_n.values()))
    encoder = TextEncoder()
    text_table = encoder.table(names)
    val_names = sorted(event_names(f for v in val_sets for x in v for f in x.feats.values())
                       - set(names))
    val_table = {**text_table, **encoder.table(val_names)} if val_names else text_table
    feat_s = time.perf_counter() - t0
    if log:
        log(f"featurised {sum(n_train)} train traces ({' + '.join(map(str, n_train))}) "
            f"at N = {', '.join(map(str, cfg.windows))} ({len(names)} unique event names)"
            + (f" and {sum(map(len, val_sets))} validation traces" if val_sets else "")
            + (f", {len(pool)} unlabelled traces to pretrain on" if pool else "")
            + f" in {feat_s:.0f} s")

    def save(model: TraceAPModel, train_log: TrainLog) -> None:
        # Written after every epoch, so an interrupted run still leaves its latest model.
        save_model(model, out, text_table, meta={
            "dataset": ", ".join(map(str, datasets)), "n_train": sum(n_train),
            "mix": list(mix) if mix is not None else None,
            "validation": [str(v) for v in val], "best_epoch": train_log.best_epoch,
            "n_good": train_log.n_good, "n_bad": train_log.n_bad,
            "epochs": len(train_log.epochs), "steps": train_log.steps,
            "train_seconds": round(train_log.seconds, 1),
            "train_cpu_seconds": round(train_log.cpu_seconds, 1),
            "featurize_seconds": round(feat_s, 1), "history": train_log.epochs,
            **({"pretrain": {"on": [str(p) for p in pretrain_on], "traces": len(pool),
                             "steps": cfg.pretrain_steps,
                             "seconds": train_log.pretrain_seconds, "log": train_log.pretrain}}
               if pool else {}),
        }, encoder_id=encoder.encoder_id)

    model, train_log = fit(examples, cfg, text_table, log=log,
                           on_epoch=save if out is not None and not val_sets else None,
                           mix=mix, val=val_sets, val_windows=val_windows,
                           val_text_table=val_table, steps_per_epoch=steps_per_epoch,
                           pretrain_feats=pool)
    train_log.featurize_seconds = feat_s
    if out is not None and val_sets:
        save(model, train_log)   # the best epoch on validation
    return model, train_log


__all__ = ["Example", "TrainLog", "event_names", "examples_from", "featurize_entries", "fit",
           "pretrain_pool", "score_examples", "train", "validation_metrics", "window_labels_of",
           "window_patterns_of"]
