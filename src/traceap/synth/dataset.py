"""The TorchTraceAP-like dataset: a plan of jobs, simulated in parallel, written per docs/FORMATS.md.

Default as in the paper: 610 traces; 460 on the seen tasks (classification, detection,
segmentation) split 400 train / 60 validation (docs/FORMATS.md: validation is for every tunable
choice), and 150 test with window-level labels, split into test_seen (the same three tasks) and
test_unseen (generation, depth, pose, action recognition); a pattern mix like Table 2; single-
and multi-GPU jobs (one manifest line per rank, sharing "job").  The plan is drawn from the seed in
the parent process and each job from its own seed, so the output does not depend on --jobs.

The workload mix is what people profile, not only large-batch training: a third of the
single-GPU jobs are inference, 40% of the jobs run small batches (1-8: latency checks,
debugging runs), 40% use torch.compile.  With it (and the host/launch calibration of the
simulator), benchmarks/realism.py's classifier tells generated healthy windows from the real
NVIDIA traces with AUC 0.67 +- 0.02 over 5 samples (workloads held out), against 0.87 +- 0.02
for the earlier simulator whose healthy runs were mostly large-batch training.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from ..manifest import MANIFEST, Anomaly, Entry, SEEN_TASKS, listed_files, write_manifest
from ..outputs import Claim, Owner, claim
from ..progress import track
from . import ops
from . import switches
from .workloads import MODELS, ModelSpec
from .platforms import PLATFORM_LABELS, PLATFORMS
from .simulator import RunConfig, simulate
from .writer import trace_document, write_trace

UNSEEN_TASKS = ("image_generation", "depth_estimation", "pose_estimation", "action_recognition")
DEFAULT_TRACES = 610
#: The record of what `generate` wrote into a folder (docs/FORMATS.md, "synth.json"): its
#: configuration and every file it writes, so a rerun knows what it may replace or remove.
STAMP = "synth.json"
STAMP_SCHEMA = "traceap.synth/v1"
#: Share of each split in the paper's 610 traces (its 460 training traces: 400 train + 60 validation).
SPLIT_SHARE = {"train": 400 / 610, "validation": 60 / 610, "test_seen": 75 / 610,
               "test_unseen": 75 / 610}
SPLIT_ORDER = ("train", "validation", "test_seen", "test_unseen")


@dataclass(frozen=True)
class SynthConfig:
    """How to build a dataset (defaults: the paper's)."""

    traces: int = DEFAULT_TRACES
    seed: int = 0
    jobs: int = 1
    bad_fraction: float = 0.6
    #: probability of a 2-pattern trace among bad ones
    two_patterns: float = 0.25
    world_sizes: tuple[int, ...] = (1, 2, 4, 8)
    world_size_p: tuple[float, ...] = (0.68, 0.2, 0.09, 0.03)
    #: single-GPU jobs that profile inference (realism.py: the real traces are mostly inference)
    infer_fraction: float = 0.35
    #: jobs at batch 1-8 (latency checks, debugging runs)
    small_batch_fraction: float = 0.4
    #: torch.compile is common in PyTorch 2.x training scripts; graph-break runs add to this
    compiled_fraction: float = 0.4

    def __post_init__(self):
        if self.traces < 3:
            raise ValueError("need at least 3 traces (one per split)")
        if self.jobs < 1:
            raise ValueError("--jobs must be at least 1")


@dataclass
class JobPlan:
    """One job to simulate: settings shared by its ranks."""

    index: int
    split: str
    task: str
    model_builder: tuple[str, int]     # (task, index into MODELS[task])
    platform: str
    world_size: int
    patterns: tuple[str, ...]
    seed: int
    settings: dict = field(default_factory=dict)

    @property
    def job_id(self) -> str:
        return f"{self.split}-{self.index:04d}"

    def trace_id(self, rank: int) -> str:
        """The manifest id of one rank's trace."""
        return f"{self.job_id}-r{rank}" if self.world_size > 1 else self.job_id


def trace_rel(trace_id: str) -> str:
    """A trace's path relative to the dataset folder (the manifest's "path")."""
    return f"traces/{trace_id}.pt.trace.json.gz"


def split_counts(n: int) -> dict[str, int]:
    """Traces per split for a dataset of n traces (400/60/75/75 for the paper's 610).

    Validation takes its share once there are 6 traces or more; every other split has one
    trace at least.
    """
    seen = max(1, round(n * SPLIT_SHARE["test_seen"]))
    unseen = max(1, round(n * SPLIT_SHARE["test_unseen"]))
    val = round(n * SPLIT_SHARE["validation"]) if n >= 6 else 0
    train = n - seen - unseen - val
    return {"train": train, "validation": val, "test_seen": seen, "test_unseen": unseen}


_SHARE = {p: w / sum(switches.TABLE2_WEIGHTS.values()) for p, w in switches.TABLE2_WEIGHTS.items()}


def _pick_patterns(rng: np.random.Generator, world_size: int, mode: str, k: int,
                   counts: dict[str, int]) -> tuple[str, ...]:
    """Patterns for a bad job: the ones furthest below their Table-2 share so far.

    Quota sampling rather than independent draws: the 610-trace dataset follows Table 2
    closely (a small one may still lack an NCCL pattern: `cover_every_pattern` adds it).  NCCL patterns need several ranks.
    """
    allowed = [p for p in switches.TABLE2_WEIGHTS
               if (world_size > 1 and mode == "train") or p not in switches.MULTI_GPU]
    total = sum(counts.values()) + 1
    chosen: list[str] = []
    for _ in range(min(k, len(allowed))):
        deficit = {p: _SHARE[p] * total - counts[p] + 0.3 * float(rng.random())
                   for p in allowed if p not in chosen}
        best = max(deficit, key=deficit.get)
        chosen.append(best)
        counts[best] += world_size
        total += world_size
    return tuple(sorted(chosen))


def plan(cfg: SynthConfig) -> list[JobPlan]:
    """The jobs of a dataset, drawn from the seed."""
    rng = np.random.default_rng(cfg.seed)
    jobs: list[JobPlan] = []
    for split, count in split_counts(cfg.traces).items():
        if count == 0:
            continue
        counts = {p: 0 for p in switches.TABLE2_WEIGHTS}      # traces per pattern in this split
        tasks = SEEN_TASKS if split != "test_unseen" else UNSEEN_TASKS
        left = count
        while left > 0:
            task = tasks[int(rng.integers(len(tasks)))]
            mi = int(rng.integers(len(MODELS[task])))
            ws = int(rng.choice(cfg.world_sizes, p=cfg.world_size_p))
            while ws > left:
                ws //= 2
            mode = "infer" if rng.random() < cfg.infer_fraction and ws == 1 else "train"
            bad = rng.random() < cfg.bad_fraction
            k = 2 if rng.random() < cfg.two_patterns else 1
            pats = _pick_patterns(rng, ws, mode, k, counts) if bad else ()
            plat = str(rng.choice(list(PLATFORMS)))
            small = rng.random() < cfg.small_batch_fraction
            settings = {"mode": mode, "steps": int(rng.choice([2, 3, 3])),
                        "amp": bool(rng.random() < 0.55), "channels_last": bool(rng.random() < 0.3),
                        "compiled": bool(rng.random() < cfg.compiled_fraction),
                        "efficiency": float(rng.uniform(0.45, 0.85)),
                        "batch_i": int(rng.integers(0, 8)), "res_i": int(rng.integers(0, 8)),
                        # latency-oriented inference and debugging runs use batches of 1-8
                        "small_batch": int(rng.choice([1, 2, 4, 8])) if small else 0,
                        # NCCL versions in use: 2.21 (PyTorch 2.5+), 2.19/2.18 (2.2-2.4),
                        # 2.14 (1.13-2.0), 2.10 (1.10-1.12): three kernel-name dialects
                        "nccl_version": str(rng.choice(ops.NCCL_VERSIONS, p=[0.35, 0.15, 0.2, 0.2, 0.1])),
                        # the tuner's LL / LL128 limits move with topology and version
                        "nccl_ll_max": float(np.exp(rng.uniform(np.log(16e3), np.log(2e6)))),
                        "nccl_ll128_max": float(np.exp(rng.uniform(np.log(4e6), np.log(64e6)))),
                        "tf32_matmul": bool(rng.random() < 0.35),
                        "algo_salt": int(rng.integers(0, 1 << 16)),
                        # hosts differ a lot: workstation CPUs, shared cloud vCPUs, profiler
                        # options (record_shapes, with_stack) that inflate every op
                        "host_factor": float(np.clip(rng.lognormal(np.log(1.35), 0.45), 0.8, 5.0)),
                        "fused_adam": bool(rng.random() < 0.3),
                        "zero_grad_fill": bool(rng.random() < 0.25)}
            jobs.append(JobPlan(len(jobs), split, task, (task, mi), plat, ws, pats,
                                int(rng.integers(0, 2**31 - 1)), settings))
            left -= ws
    two_gpu = dict(zip(cfg.world_sizes, cfg.world_size_p)).get(2, 0.0) > 0
    return cover_every_pattern(jobs, merge=two_gpu)


#: The fewest traces for which `plan` puts every one of the eight patterns into the dataset
#: (`cover_every_pattern`; checked for every size from 15 to 60 with 1,000 seeds each, and
#: 96 / 150 / 300 / 610 with 50): from 15 on the train split holds 10 traces, room for a
#: multi-GPU training job that the NCCL patterns need.  Below it a pattern may be missing
#: (1-20% of seeds at 7-14 traces, every seed at 6 or fewer); `generate` says which.
MIN_TRACES_ALL_PATTERNS = 15


def _can_carry(job: JobPlan, pattern: str) -> bool:
    """Whether a planned job can take one more pattern (two at most, as `_pick_patterns`)."""
    if pattern in job.patterns or len(job.patterns) >= 2:
        return False
    return pattern not in switches.MULTI_GPU or (job.world_size > 1
                                                 and job.settings["mode"] == "train")


def _add_multi_gpu_train_job(jobs: list[JobPlan]) -> list[JobPlan]:
    """The plan with one more 2-GPU training job in the train split: two single-GPU train jobs
    (the healthiest, latest first) become one, so the number of traces stays."""
    single = [j for j in jobs if j.split == "train" and j.world_size == 1]
    if len(single) < 2:
        return jobs
    keep, drop = sorted(sorted(single, key=lambda j: -j.index),
                        key=lambda j: len(j.patterns))[:2]
    keep.world_size = 2
    keep.settings = {**keep.settings, "mode": "train"}
    out = [j for j in jobs if j is not drop]  # its patterns, if any, are placed again
    for i, j in enumerate(out):  # ids follow the plan's order
        j.index = i
    return out


def cover_every_pattern(jobs: list[JobPlan], merge: bool = True) -> list[JobPlan]:
    """The plan with every pattern in at least one job: each missing pattern goes to a job
    that can carry it (`_can_carry`), train split first, a healthy job before a one-pattern one;
    an NCCL pattern no job can carry gets a 2-GPU training job made of two single-GPU ones
    (when `merge`: the configuration draws 2-GPU jobs at all).

    Quota sampling per split (`_pick_patterns`) follows Table 2 but leaves the rare NCCL
    patterns out of small datasets (`--traces 48 --seed 11` had neither collectives on the
    compute stream nor exposed collectives: they need a multi-GPU training job).  A plan that already
    holds every pattern is returned unchanged, so such datasets keep their bytes."""
    order = {sp: i for i, sp in enumerate(SPLIT_ORDER)}
    for _ in range(len(switches.TABLE2_WEIGHTS)):  # a merge may free patterns to place again
        todo = missing_patterns(jobs)
        if not todo:
            break
        for p in todo:
            fits = [j for j in jobs if _can_carry(j, p)]
            if not fits and p in switches.MULTI_GPU and merge:
                jobs = _add_multi_gpu_train_job(jobs)
                fits = [j for j in jobs if _can_carry(j, p)]
            if fits:
                j = min(fits, key=lambda j: (order[j.split], len(j.patterns), j.index))
                j.patterns = tuple(sorted(j.patterns + (p,)))
                continue
            # every job that could carry it is full: free a place, by dropping a pattern other
            # jobs also carry or by moving one to a job with room for it
            held = {q: sum(q in j.patterns for j in jobs) for q in switches.TABLE2_WEIGHTS}
            trade = [(j, q) for j in jobs for q in j.patterns if _can_carry(_without(j, q), p)
                     and (held[q] >= 2 or any(k is not j and _can_carry(k, q) for k in jobs))]
            if trade:
                j, q = min(trade, key=lambda jq: (order[jq[0].split], -held[jq[1]], jq[0].index))
                j.patterns = tuple(sorted(set(j.patterns) - {q} | {p}))
                if held[q] < 2:
                    k = min((k for k in jobs if _can_carry(k, q)),
                            key=lambda k: (order[k.split], len(k.patterns), k.index))
                    k.patterns = tuple(sorted(k.patterns + (q,)))
    return jobs


def _without(job: JobPlan, pattern: str) -> JobPlan:
    """A copy of a planned job without one of its patterns (to ask what it could carry)."""
    return replace(job, patterns=tuple(q for q in job.patterns if q != pattern))


def missing_patterns(jobs: list[JobPlan]) -> list[str]:
    """Patterns no planned job carries (none from `MIN_TRACES_ALL_PATTERNS` traces on)."""
    have = {p for j in jobs for p in j.patterns}
    return [p for p in switches.TABLE2_WEIGHTS if p not in have]


def _model(builder: tuple[str, int]) -> ModelSpec:
    task, i = builder
    return MODELS[task][i]()


def run_config(job: JobPlan, rank: int, strength: float = 1.0) -> RunConfig:
    """The RunConfig of one rank of a planned job."""
    rng = np.random.default_rng([job.seed, rank, int(strength * 10)])
    jrng = np.random.default_rng(job.seed)        # shared by the ranks of the job
    m = _model(job.model_builder)
    s = job.settings
    p = PLATFORMS[job.platform]
    dt = ("bf16" if p.cc[0] >= 8 and jrng.random() < 0.6 else "fp16") if s["amp"] else "fp32"
    batch = s["small_batch"] or m.batch_choices[s["batch_i"] % len(m.batch_choices)]
    cfg = RunConfig(model=m, platform=p, batch=batch,
                    res=m.res_choices[s["res_i"] % len(m.res_choices)], dt=dt,
                    channels_last=s["channels_last"], compiled=s["compiled"], mode=s["mode"],
                    world_size=job.world_size, rank=rank, steps=s["steps"],
                    first_step=int(jrng.integers(1, 20)), seed=int(rng.integers(0, 2**31 - 1)),
                    t0_us=float(jrng.uniform(1e12, 6e12)) + float(rng.uniform(0, 300)),
                    efficiency=s["efficiency"] * float(rng.uniform(0.97, 1.03)),
                    optimizer=m.optimizer, nccl_version=s["nccl_version"],
                    nccl_ll_max=s["nccl_ll_max"], nccl_ll128_max=s["nccl_ll128_max"],
                    tf32_matmul=s["tf32_matmul"], algo_salt=s["algo_salt"],
                    host_factor=s["host_factor"],
                    extra={"fused_adam": s["fused_adam"], "zero_grad_fill": s["zero_grad_fill"]})
    switches.healthy(cfg, np.random.default_rng([job.seed, 7]))
    prng = np.random.default_rng([job.seed, 11])
    for p_id in job.patterns:
        switches.apply(p_id, cfg, prng, strength)
    return cfg


def simulate_job(args: tuple[JobPlan, str]) -> list[tuple[Entry, int]]:
    """Simulate and write every rank of a job; returns (manifest entry, bytes written) per rank."""
    job, out = args
    out_dir = Path(out)
    results = []
    for rank in range(job.world_size):
        strength = 1.0
        for _ in range(3):
            cfg = run_config(job, rank, strength)
            res = simulate(cfg)
            found = {a[2] for a in res.anomalies}
            if set(job.patterns) <= found:
                break
            strength *= 1.8      # the mechanism was hidden behind GPU work: make it stronger
        tid = job.trace_id(rank)
        rel = trace_rel(tid)
        base_ns = int(1.7e18) + job.seed * 1000
        nbytes = write_trace(out_dir / rel, trace_document(res, base_ns))
        anomalies = [Anomaly(round(a, 3), round(b, 3), p) for a, b, p in sorted(res.anomalies)]
        present = sorted({a.pattern for a in anomalies})
        # workload only: the knobs that cause patterns stay out of the manifest
        notes = (f"{cfg.mode} {cfg.dt} batch={cfg.batch} res={cfg.res} steps={cfg.steps} "
                 f"compiled={cfg.compiled} channels_last={cfg.channels_last}")
        entry = Entry(id=tid, path=rel, split=job.split, task=job.task, model=cfg.model.name,
                      platform=PLATFORM_LABELS[job.platform], world_size=job.world_size,
                      rank=rank, label="bad" if present else "good", patterns=present,
                      anomalies=anomalies, source="synthetic", notes=notes,
                      job=job.job_id if job.world_size > 1 else None)
        results.append((entry, nbytes))
    return results


@dataclass
class SynthReport:
    """What a synth run produced."""

    out: str
    n_traces: int
    n_bad: int
    bytes: int
    seconds: float
    pattern_counts: dict[str, int]
    split_counts: dict[str, int]
    #: split -> {"traces", "good", "bad"}, in split order
    per_split: dict[str, dict[str, int]] = field(default_factory=dict)
    #: what happened to files already in the folder (one line each, for the user)
    notes: list[str] = field(default_factory=list)


def _stamp_config(cfg: SynthConfig) -> dict:
    """The settings that decide the output (not --jobs: the bytes do not depend on it)."""
    d = asdict(cfg)
    d.pop("jobs")
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def planned_files(jobs: list[JobPlan]) -> list[str]:
    """Relative paths of the trace files a plan writes (as in its manifest lines)."""
    return sorted(trace_rel(j.trace_id(r)) for j in jobs for r in range(j.world_size))


def _legacy_synth_files(out: Path) -> set[str] | None:
    """Files of a synth output written before synth.json existed: a manifest of synthetic
    traces only and nothing else in the folder.  None when the folder is anything else."""
    listed = listed_files(out, "synthetic")
    if listed is None:
        return None
    present = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    return listed if present <= listed else None


#: What owns a synth output folder (traceap.outputs): a rerun of the same configuration
#: regenerates it in place (same seed, same bytes); another one needs --overwrite.
OWNER = Owner("synth", STAMP, STAMP_SCHEMA, rerun="same_config", aside=(MANIFEST,))


def _describe(old: dict) -> str:
    return f"traces={old.get('traces')}, seed={old.get('seed')}"


def prepare_out(out: Path, cfg: SynthConfig, jobs: list[JobPlan], overwrite: bool = False
                ) -> Claim:
    """Check that `out` may receive this dataset (traceap.outputs.claim): new, empty, or a
    previous synth output of the same configuration; anything else raises OutputError
    (nothing written) unless `overwrite`.  Files traceap synth did not write are never
    replaced or deleted: even with `overwrite`, a trace file in the way stops the run, and a
    foreign manifest.jsonl is kept under another name."""
    return claim(out, OWNER, _stamp_config(cfg), planned_files(jobs) + [MANIFEST], overwrite,
                 legacy=_legacy_synth_files, describe=_describe)


def generate(out: str | os.PathLike, cfg: SynthConfig = SynthConfig(),
             overwrite: bool = False) -> SynthReport:
    """Generate a whole dataset into `out` (manifest.jsonl + traces/ + synth.json).

    `out` must be new, empty, or a previous synth output of the same configuration (rerun in
    place: same seed, same bytes); anything else raises OutputError before a byte is written,
    unless `overwrite` (see `prepare_out`).  Only trace files an earlier synth run wrote there
    and the new manifest no longer lists are deleted."""
    t0 = time.time()
    out = Path(out)
    jobs = plan(cfg)
    owned = prepare_out(out, cfg, jobs, overwrite)
    lacking = missing_patterns(jobs)
    if lacking:
        owned.notes.append(f"{cfg.traces} traces hold no {', '.join(lacking)}: every pattern is "
                           f"guaranteed from --traces {MIN_TRACES_ALL_PATTERNS} on")
    files = planned_files(jobs)
    # Stamped first, so an interrupted run is still recognised as ours; the stamp lists the
    # previous run's files too until the new manifest is in place.
    owned.begin(files + [MANIFEST])
    (out / "traces").mkdir(parents=True, exist_ok=True)
    work = [(j, str(out)) for j in jobs]
    # big jobs first so the pool does not end on a straggler
    work.sort(key=lambda w: -w[0].world_size)
    entries: list[Entry] = []
    total = 0
    if cfg.jobs > 1:
        # workers start from a forkserver, never as a fork of this process: its threads (Ray,
        # torch, BLAS pools of the caller) may hold locks that a forked child would wait on
        ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods()
                             else None)
        with ctx.Pool(cfg.jobs) as pool:
            for res in track(pool.imap_unordered(simulate_job, work), "synth", total=len(work)):
                for e, n in res:
                    entries.append(e)
                    total += n
    else:
        for w in track(work, "synth"):
            for e, n in simulate_job(w):
                entries.append(e)
                total += n
    order = {sp: i for i, sp in enumerate(SPLIT_ORDER)}
    entries.sort(key=lambda e: (order[e.split], e.id))
    write_manifest(out, entries)
    # Regenerating in place: each trace was replaced atomically while readers may still be at
    # work; only now go the files of the previous run that the new manifest no longer lists.
    notes = owned.finish(files + [MANIFEST])
    counts: dict[str, int] = {p: 0 for p in switches.TABLE2_WEIGHTS}
    for e in entries:
        for a in e.anomalies:
            counts[a.pattern] += 1
    splits: dict[str, int] = {}
    per_split: dict[str, dict[str, int]] = {}
    for e in entries:
        splits[e.split] = splits.get(e.split, 0) + 1
        row = per_split.setdefault(e.split, {"traces": 0, "good": 0, "bad": 0})
        row["traces"] += 1
        row[e.label] += 1
    return SynthReport(str(out), len(entries), sum(e.label == "bad" for e in entries), total,
                       time.time() - t0, counts, splits, per_split, notes)
