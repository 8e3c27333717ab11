"""One recording: a real training (or inference) loop under torch.profiler, labelled by markers.

The loop is what a user writes: a DataLoader over the data set, the batch moved to the device,
forward, loss, backward, optimizer step.  The profiler waits `wait` steps (compilation, worker
start-up), warms up `warmup` steps and records `steps` active ones.  The patterns' causes are
switched on in the loop (`causes.py`), each inside its marker (`markers.py`); the saved trace
has the markers turned into anomaly intervals and removed.

Under `torchrun` every rank records its own trace and manifest line, sharing a `job` id.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import re
import shutil
import sys
import time
import warnings
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.utils.data import DataLoader

from ..manifest import (MANIFEST, SEEN_TASKS, SPLITS, TASKS, Entry, encode_entry, listed_files,
                        read_manifest)
from ..errors import DatasetError, TraceapError
from ..outputs import Owner, claim
from ..progress import track
from . import markers
from .data import SyntheticImages, target_to
from .networks import build_model, model_spec
from .causes import (PatternUnavailable, Recipe, allreduce_after_backward, break_graph,
                     check_available, compile_fixed_shapes, heavy_preprocess, host_noise,
                     host_syncs, multi_scale, parse_patterns, wrap_distributed)


@dataclass
class CollectConfig:
    """Everything one recording needs; defaults follow the paper (2-3 profiled steps)."""

    model: str
    patterns: tuple[str, ...] = ()
    out: Path = Path("dataset")
    device: str = "cuda"
    steps: int = 3
    batch_size: int | None = None
    inference: bool = False
    task: str | None = None
    split: str | None = None
    image_size: int | None = None
    workers: int = 2
    wait: int = 1
    warmup: int = 1
    compile_backend: str = "inductor"
    seed: int = 0
    overwrite: bool = False
    world_size: int = field(default_factory=lambda: int(os.environ.get("WORLD_SIZE", "1")))
    rank: int = field(default_factory=lambda: int(os.environ.get("RANK", "0")))

    def validate(self) -> None:
        """Raise TraceapError with one line for anything a recording cannot start with."""
        model_spec(self.model)  # raises for an unknown model
        if self.device not in ("cuda", "cpu"):
            raise TraceapError(f"--device must be cuda or cpu, not {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise TraceapError("--device cuda: no CUDA GPU is visible here (use --device cpu)")
        if self.steps < 1 or self.wait < 0 or self.warmup < 0:
            raise TraceapError("--steps must be at least 1 (wait and warmup at least 0)")
        if self.batch_size is not None and self.batch_size < 1:
            raise TraceapError("--batch-size must be at least 1")
        if self.workers < 1:
            raise TraceapError("--workers (the clean loader's worker processes) must be >= 1")
        if self.task is not None and self.task not in TASKS:
            raise TraceapError(f"unknown task {self.task!r}; one of: {', '.join(TASKS)}")
        if self.split is not None and self.split not in SPLITS:
            raise TraceapError(f"unknown split {self.split!r}; one of: {', '.join(SPLITS)}")
        if self.image_size is not None and self.image_size < 16:
            raise TraceapError("--image-size must be at least 16")
        self.check_possible()

    def check_possible(self) -> None:
        """Raise PatternUnavailable (one line) when a pattern's cause cannot happen in this
        recording: with this model, on this device, in this world size or mode.  A plan skips
        such recordings with the reason."""
        spec = model_spec(self.model)
        if "recompilation" in self.patterns and (spec.task != "image_classification"
                                                 or not spec.convolutional):
            raise PatternUnavailable(f"pattern recompilation feeds a new input size each step; "
                                     f"{self.model} needs a convolutional classifier (resnet*)")
        if "no_channels_last" in self.patterns and not spec.convolutional:
            raise PatternUnavailable(f"pattern no_channels_last is about convolutions; "
                                     f"{self.model} has none past its patch embedding")
        check_available(self.patterns, self.device, self.world_size, self.inference)

    @property
    def recipe(self) -> Recipe:
        """The knobs of this recording."""
        return Recipe.make(self.patterns, self.device, self.workers, self.compile_backend,
                           model_spec(self.model).convolutional)

    @property
    def resolved_task(self) -> str:
        """The task written to the manifest: --task, else the model's own."""
        return self.task or model_spec(self.model).task

    @property
    def resolved_batch_size(self) -> int:
        """--batch-size, else 32 on a GPU and 8 on the CPU."""
        if self.batch_size:
            return self.batch_size
        return 8 if self.device == "cpu" else 32


def platform_name(device: str) -> str:
    """The GPU's name as the driver reports it, or "cpu"."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return "cpu"


def job_id(cfg: CollectConfig) -> str:
    """Deterministic id of a recording (shared by the ranks of one job): resumes key on it."""
    plat = re.sub(r"[^a-z0-9]+", "-", platform_name(cfg.device).lower()).strip("-")
    what = "+".join(cfg.patterns) if cfg.patterns else "clean"
    mode = "infer" if cfg.inference else "train"
    size = f"-{cfg.image_size}px" if cfg.image_size else ""
    ws = f"-ws{cfg.world_size}" if cfg.world_size > 1 else ""
    return f"{cfg.model}-{mode}-{what}-bs{cfg.resolved_batch_size}{size}-{plat}{ws}"


def entry_id(cfg: CollectConfig) -> str:
    """Id of this rank's manifest line."""
    base = job_id(cfg)
    return f"{base}-r{cfg.rank}" if cfg.world_size > 1 else base


@dataclass
class Recorded:
    """What one recording produced."""

    entry: Entry
    trace: Path
    seconds: float
    #: what happened to files already in the folder (one line each)
    notes: list[str] = field(default_factory=list)


def collect(cfg: CollectConfig) -> Recorded:
    """Record one trace with the configured patterns and append its manifest line."""
    cfg.validate()
    out = Path(cfg.out)
    eid = entry_id(cfg)
    again = eid in existing_ids(out)
    if again and not cfg.overwrite:
        raise DatasetError(f"{out}: {eid} is already recorded (use --overwrite to replace it)")
    notes = prepare_out(out, cfg.overwrite, [f"traces/{eid}.pt.trace.json.gz"])
    if again:
        notes.append(f"replaced the earlier recording of {eid} (its trace and manifest line)")
    t0 = time.perf_counter()
    with _distributed(cfg) as device:
        tmp = out / ".collect-tmp" / eid
        trace_rel = f"traces/{eid}.pt.trace.json.gz"
        listed = False
        try:
            # Staged beside the raw file and checked there: a recording refused (its cause left
            # no mark) never replaces the trace an earlier one of this id left.
            staged = tmp / "staged.json.gz"
            anomalies = markers.finalize(_record(cfg, eid, device, tmp), staged,
                                         name=out / trace_rel)
            _check_took_effect(cfg, staged)
            task = cfg.resolved_task
            entry = Entry(
                id=eid, path=trace_rel,
                split=cfg.split or ("test_seen" if task in SEEN_TASKS else "test_unseen"),
                task=task, model=cfg.model, platform=platform_name(cfg.device),
                world_size=cfg.world_size, rank=cfg.rank,
                label="bad" if cfg.patterns else "good", patterns=list(cfg.patterns),
                anomalies=anomalies, source="collected",
                notes=_notes(cfg), job=job_id(cfg) if cfg.world_size > 1 else None)
            (out / trace_rel).parent.mkdir(parents=True, exist_ok=True)
            staged.replace(out / trace_rel)
            append_entry(out, entry, replace=cfg.overwrite)
            listed = True
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            with suppress(OSError):
                tmp.parent.rmdir()  # only when no other recording is using it
            # A stop (Ctrl-C, SIGTERM) between the trace and its manifest line: the trace goes
            # too, so the manifest and the traces agree and a rerun records it again.
            if not listed and eid not in existing_ids(out):
                (out / trace_rel).unlink(missing_ok=True)
    return Recorded(entry, out / trace_rel, time.perf_counter() - t0, notes)


def _check_took_effect(cfg: CollectConfig, path: Path) -> None:
    """Raise TraceapError when the trace shows that a cause did not take effect, so that no
    label claims what the run did not do: a forced graph break leaves at least two compiled
    frames (`Torch-Compiled Region: N/M`) in the profiled steps (one means the break never
    ran), and multi-scale input under fixed shapes leaves compile work after the first
    profiled step (none means no shape change made Dynamo compile again)."""
    if not {"graph_break", "recompilation"} & set(cfg.patterns):
        return
    from ..load import load
    from ..measures.compile_regions import frame_ids, recompile_rows

    trace = load(path)
    frames = frame_ids(trace)
    if "graph_break" in cfg.patterns and len(frames) < 2:
        raise TraceapError(
            f"graph_break did not take effect on {cfg.model}: the profiled steps ran "
            f"{len(frames)} compiled frame(s), not a graph split in two; nothing recorded")
    if "recompilation" in cfg.patterns and not len(recompile_rows(trace)):
        raise TraceapError(
            f"recompilation did not take effect on {cfg.model}: no compile work after the "
            f"first profiled step; nothing recorded")


def _notes(cfg: CollectConfig) -> str:
    spec = model_spec(cfg.model)
    mode = "inference" if cfg.inference else "training"
    recipe = cfg.recipe
    precision = ("bf16 autocast" if recipe.amp
                 else "fp32, tf32 off" if recipe.no_tf32 else "fp32")
    return (f"traceap collect: {mode}, batch {cfg.resolved_batch_size}, "
            f"{cfg.image_size or spec.image_size}px, {cfg.steps} active steps, "
            f"num_workers={recipe.num_workers}, pin_memory={recipe.pin_memory}, {precision}, "
            f"{'channels_last' if recipe.channels_last else 'NCHW'}, "
            f"foreach={recipe.foreach}, "
            + ("multi-scale input under torch.compile(dynamic=False), " if
               recipe.on("recompilation") else "")
            + f"torch {torch.__version__}")


# --------------------------------------------------------------------------------------------
# the output folder and the manifest

#: A collect dataset grows one recording at a time, in any configuration, and needs no stamp:
#: its manifest lines say which traces collect wrote (source "collected").
OWNER = Owner("collect", None, None, rerun="any", aside=(MANIFEST,))


def _collected(out: Path) -> set[str]:
    """The trace files the manifest lists as recorded by collect."""
    try:
        return {e.path for e in read_manifest(out) if e.source == "collected"}
    except DatasetError:
        return set()


def _collect_files(out: Path) -> set[str] | None:
    """The files of a collect dataset (a manifest of collected traces only), else None.  A
    folder holding nothing but a killed recording's `.collect-tmp/` is one too."""
    if not (out / MANIFEST).exists():
        files = [p.relative_to(out).parts[0] for p in out.rglob("*") if p.is_file()]
        return set() if files and set(files) == {".collect-tmp"} else None
    return listed_files(out, "collected")


def prepare_out(out: Path, overwrite: bool = False, traces: list[str] = ()) -> list[str]:
    """Check that `out` may receive recordings, before any is made; returns notes.  A folder that is not a collect dataset is refused unless `overwrite` (then the
    recordings go beside its files; a manifest found there is kept under another name); a
    trace file collect did not write, in the way of one of `traces`, stops the run."""
    out = Path(out)
    planned = [MANIFEST] + [t for t in traces if t not in _collected(out)]
    return claim(out, OWNER, None, planned, overwrite, legacy=_collect_files).notes


def existing_ids(out: Path) -> set[str]:
    """Ids already in DATASET/manifest.jsonl (empty when there is none yet)."""
    if not (Path(out) / MANIFEST).exists():
        return set()
    return {e.id for e in read_manifest(out)}


def append_entry(out: Path, entry: Entry, replace: bool = False) -> None:
    """Append one manifest line under a lock (ranks of a job append concurrently).

    The lock is taken on the manifest itself, so no lock file is left behind in the dataset."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / MANIFEST, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if replace:
            f.seek(0)
            kept = [line for line in f.read().splitlines()
                    if line.strip() and _decode_id(line) != entry.id]
            f.seek(0)
            f.truncate()
            f.write(b"".join(line + b"\n" for line in kept))
        f.write(encode_entry(entry) + b"\n")
        f.flush()
        os.fsync(f.fileno())


def _decode_id(line: bytes) -> str | None:
    try:
        return orjson.loads(line).get("id")
    except orjson.JSONDecodeError:
        return None


# --------------------------------------------------------------------------------------------
# the loop


@contextmanager
def _distributed(cfg: CollectConfig):
    """The device of this process; joins the torchrun process group when there is one."""
    if cfg.world_size < 2:
        yield torch.device("cuda" if cfg.device == "cuda" else "cpu")
        return
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", cfg.rank))
    device = torch.device("cuda", local) if cfg.device == "cuda" else torch.device("cpu")
    if cfg.device == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # Once per process: a plan records many traces, and re-joining a torchrun group
        # after destroying it is not supported.
        dist.init_process_group("nccl" if cfg.device == "cuda" else "gloo",
                                device_id=device if cfg.device == "cuda" else None)
        atexit.register(dist.destroy_process_group)
    yield device
    dist.barrier()  # every rank's manifest line is written before anyone moves on


#: Kineto prints USDT/STAGE lines on stderr at its default log level; 6 is above all of its
#: levels (ERROR 4, USDT 5; the default already hides errors), so nothing is lost.
KINETO_QUIET_LEVEL = "6"
_said: set[str] = set()


def note_once(message: str) -> None:
    """One line on stderr, once per process (a sweep records many traces)."""
    if message not in _said:
        _said.add(message)
        print(f"traceap: note: {message}", file=sys.stderr, flush=True)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _record(cfg: CollectConfig, eid: str, device: torch.device, tmp: Path) -> Path:
    """Run the loop under the profiler; return the raw trace file it wrote."""
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)
    torch.manual_seed(cfg.seed + cfg.rank)
    model, spec, size = build_model(cfg.model, cfg.image_size)
    recipe = cfg.recipe
    model = model.to(device, memory_format=recipe.memory_format)
    raw_model = model
    bs, total = cfg.resolved_batch_size, cfg.wait + cfg.warmup + cfg.steps
    data = SyntheticImages(spec, size, bs * total, seed=cfg.seed * 100 + cfg.rank)
    if recipe.num_workers > _cpus():
        # torch warns at every DataLoader (its warning filters are reset between recordings)
        note_once(f"{recipe.num_workers} DataLoader workers on {_cpus()} CPU(s): recordings "
                  f"may run slowly (--workers sets the number)")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create",
                                category=UserWarning)
        loader = DataLoader(data, batch_size=bs, shuffle=False, drop_last=True,
                            num_workers=recipe.num_workers, pin_memory=recipe.pin_memory,
                            prefetch_factor=2 if recipe.num_workers else None)
    if cfg.world_size > 1 and not cfg.inference:
        model = wrap_distributed(model, recipe, device)
    if recipe.compile_backend:
        # Each recording compiles from scratch: Dynamo's cache of an earlier recording in this
        # process (a plan's) would serve its graphs again, with or without the cause's break.
        torch._dynamo.reset()
        model = (break_graph(model, recipe.compile_backend) if recipe.on("graph_break")
                 else compile_fixed_shapes(model, recipe.compile_backend))
        with recipe.precision():
            _settle_compilation(cfg, recipe, model, raw_model, spec, data, device)
    if cfg.inference:
        raw_model.eval()
        optimizer = None
    else:
        raw_model.train()
        optimizer = torch.optim.SGD(raw_model.parameters(), lr=1e-3, momentum=0.9,
                                    foreach=recipe.foreach)

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    non_blocking = device.type == "cuda"
    with warnings.catch_warnings():  # said once above
        warnings.filterwarnings("ignore", message="This DataLoader will create",
                                category=UserWarning)
        it = iter(loader)  # worker processes start here, outside the profiled steps
    with recipe.precision(), profile(activities=activities,
                 schedule=schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.steps, repeat=1),
                 record_shapes=True,
                 on_trace_ready=tensorboard_trace_handler(str(tmp), worker_name=eid,
                                                          use_gzip=True)) as prof:
        for step in track(range(total), f"recording {eid}"):
            with recipe.mark("single_process_dataloading"):
                images, target = next(it)
            if recipe.on("cpu_bound"):
                with recipe.mark("cpu_bound"):
                    images = heavy_preprocess(images, seed=cfg.seed * 7919 + step)
                    if recipe.pin_memory:
                        images = images.pin_memory()
            with recipe.mark("no_pin_memory"):
                images = images.to(device, non_blocking=non_blocking,
                                   memory_format=recipe.memory_format)
                target = target_to(target, device, non_blocking)
            if recipe.on("cpu_tensor_init"):
                with recipe.mark("cpu_tensor_init"):
                    images = host_noise(images)
            profiled = step - cfg.wait - cfg.warmup
            rescaled = recipe.on("recompilation") and profiled >= 0
            if rescaled:  # a new size in every profiled step: Dynamo compiles again
                images = multi_scale(images, profiled)
            loss = _step(cfg, recipe, model, raw_model, spec, optimizer, images, target,
                         churned=step > 0, rescaled=rescaled)
            prof.step()
    del it, loader
    files = sorted(tmp.glob("*.pt.trace.json*"))
    if not files:
        raise TraceapError(f"the profiler wrote no trace into {tmp} (steps: {total})")
    del loss
    return files[-1]


def _settle_compilation(cfg, recipe, model, raw_model, spec, data, device,
                        max_calls: int = 6) -> None:
    """Call the compiled model until Dynamo stops compiling, before the profiler starts.

    A graph break compiles lazily, frame by frame and call by call (and recompiles a frame
    that later sees other shapes), so the profiler's single wait step may not cover it.
    """
    from torch._dynamo.utils import counters
    from torch.utils.data import default_collate

    images, target = default_collate([data[i] for i in range(cfg.resolved_batch_size)])
    images = images.to(device, memory_format=recipe.memory_format)
    target = target_to(target, device, False)
    seen = -1
    for _ in range(max_calls):
        graphs = counters["stats"]["unique_graphs"]
        if graphs == seen:
            break
        seen = graphs
        if cfg.inference:
            with torch.inference_mode(), recipe.autocast(device):
                model(images)
        else:
            with recipe.autocast(device):
                loss = spec.loss(raw_model, model(images), target)
            loss.backward()
            raw_model.zero_grad(set_to_none=True)


#: Patterns whose cause is the whole forward, loss and backward (precision, layout) or sits in
#: them (allocator_churn: the driver allocations after an `empty_cache()`).
_COMPUTE_MARKS = ("no_mixed_precision", "no_channels_last")


def _step(cfg, recipe: Recipe, model, raw_model, spec, optimizer, images, target,
          churned: bool = False, rescaled: bool = False):
    """Forward, loss, backward, gradient reduction, optimizer step (or just forward).

    `churned`: an earlier step emptied the allocator's cache (allocator_churn), so this step's
    compute allocates from the driver and is marked.  `rescaled`: this step's input has a size
    the compiled model has not seen (recompilation): its compute compiles again and is
    marked."""
    compute = (_COMPUTE_MARKS + (("allocator_churn",) if churned else ())
               + (("recompilation",) if rescaled else ()))
    device = images.device
    if cfg.inference:
        with (torch.inference_mode(), recipe.mark("graph_break"), recipe.marks(*compute),
              recipe.autocast(device)):
            outputs = model(images)
        if recipe.on("excessive_memcpy"):
            with recipe.mark("excessive_memcpy"):
                host_syncs(outputs, None, raw_model)
        _churn(recipe)
        return None
    with recipe.marks(*compute):
        with recipe.autocast(device):
            with recipe.mark("graph_break"):
                outputs = model(images)
            loss = spec.loss(raw_model, outputs, target)
        with recipe.mark("graph_break"):
            loss.backward()
    if recipe.comm == "nccl_compute_no_overlap":
        with recipe.mark("nccl_compute_no_overlap"):
            allreduce_after_backward(raw_model)
    if recipe.on("excessive_memcpy"):
        with recipe.mark("excessive_memcpy"):
            host_syncs(outputs, loss, raw_model)
    with recipe.mark("unfused_optimizer"):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _churn(recipe)
    return loss


def _churn(recipe: Recipe) -> None:
    """`torch.cuda.empty_cache()` after the step, the allocator_churn cause."""
    if recipe.on("allocator_churn"):
        with recipe.mark("allocator_churn"):
            torch.cuda.empty_cache()


__all__ = ["CollectConfig", "OWNER", "Recorded", "append_entry", "collect", "entry_id", "existing_ids",
           "job_id", "parse_patterns", "platform_name", "prepare_out"]
