"""`traceap collect`: real CPU recordings of a tiny ResNet with the causes switched on."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

import traceap
from traceap.collect import MARKER_PREFIX, CollectConfig, collect, load_plan, run_plan
from traceap.collect.markers import extract
from traceap.manifest import read_manifest
from traceap.errors import DatasetError, OutputError, TraceapError

from .conftest import CNN

pytestmark = pytest.mark.filterwarnings("ignore")
SP_NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
MP_NEXT = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def _events(path: Path) -> list[dict]:
    return orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def _intervals(events: list[dict], name: str) -> list[tuple[float, float]]:
    return [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events
            if e.get("name") == name and e.get("ph") == "X"]


def _inside(span, anomalies) -> bool:
    return any(a.start_us <= span[0] and span[1] <= a.end_us for a in anomalies)


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """One training recording with three CPU-possible causes switched on together."""
    out = tmp_path_factory.mktemp("collected")
    cfg = CollectConfig(model="resnet_tiny", device="cpu", out=out, batch_size=4, steps=2,
                        patterns=("single_process_dataloading", "excessive_memcpy", "cpu_bound"))
    return collect(cfg)


def test_trace_loads_and_manifest_line_is_complete(bad):
    t = traceap.load(bad.trace)
    assert len(t) > 1000 and len(t.steps) == 2
    (e,) = read_manifest(bad.trace.parents[1])
    assert e.id == bad.entry.id and e.path == f"traces/{e.id}.pt.trace.json.gz"
    assert (e.label, e.source, e.platform, e.world_size, e.rank) == ("bad", "collected", "cpu", 1, 0)
    assert e.task == "image_classification" and e.split == "test_seen"
    assert e.patterns == ["single_process_dataloading", "excessive_memcpy", "cpu_bound"]
    assert {a.pattern for a in e.anomalies} == set(e.patterns)
    lo, hi = t.span
    assert all(lo <= a.start_us < a.end_us <= hi for a in e.anomalies)


def test_markers_are_gone(bad):
    events = _events(bad.trace)
    assert not [e for e in events if MARKER_PREFIX in str(e.get("name", ""))]
    assert not (bad.trace.parents[1] / ".collect-tmp").exists()


def test_dataloading_intervals_cover_the_single_process_next_calls(bad):
    events = _events(bad.trace)
    nexts = _intervals(events, SP_NEXT)
    spans = [a for a in bad.entry.anomalies if a.pattern == "single_process_dataloading"]
    assert len(nexts) == 2 and len(spans) == 2
    assert all(_inside(n, spans) for n in nexts)
    assert not _intervals(events, MP_NEXT)  # num_workers=0 really was the cause


def test_sync_intervals_contain_the_item_calls(bad):
    events = _events(bad.trace)
    syncs = [a for a in bad.entry.anomalies if a.pattern == "excessive_memcpy"]
    items = _intervals(events, "aten::_local_scalar_dense")
    inside = [s for s in items if _inside(s, syncs)]
    n_params = 2 * sum(1 for _ in traceap.collect.build_model("resnet_tiny")[0].parameters())
    assert len(syncs) == 2 and len(inside) >= n_params  # one grad-norm .item() per tensor and step
    # every other .item() belongs to another marked cause (the dataset in the main process,
    # the random crop parameters), none happens in unmarked code
    assert all(_inside(s, bad.entry.anomalies) for s in items)


def test_cpu_bound_intervals_contain_the_augmentation(bad):
    events = _events(bad.trace)
    spans = [a for a in bad.entry.anomalies if a.pattern == "cpu_bound"]
    ops = _intervals(events, "aten::grid_sampler_2d")
    assert len(ops) == 2 * 4  # one rotation per image per step
    assert all(_inside(s, spans) for s in ops)
    step = np.median([e["dur"] for e in events if str(e.get("name")).startswith("ProfilerStep#")])
    assert sum(a.end_us - a.start_us for a in spans) / 2 > 0.05 * step  # a visible share


def test_same_id_twice_needs_overwrite(bad):
    cfg = CollectConfig(model="resnet_tiny", device="cpu", out=bad.trace.parents[1],
                        batch_size=4, steps=2, patterns=tuple(bad.entry.patterns))
    with pytest.raises(DatasetError, match="already recorded"):
        collect(cfg)


def test_overwrite_re_records_one_id_and_says_so(tmp_path):
    cfg = CollectConfig(model="resnet_tiny", device="cpu", out=tmp_path / "ds", batch_size=2,
                        steps=1, workers=1)
    first = collect(cfg)
    (tmp_path / "ds" / "mine.txt").write_text("mine")
    cfg.overwrite = True
    again = collect(cfg)
    assert again.notes == [f"replaced the earlier recording of {first.entry.id} (its trace and "
                           f"manifest line)"]
    assert [e.id for e in read_manifest(tmp_path / "ds")] == [first.entry.id]
    assert (tmp_path / "ds" / "mine.txt").read_text() == "mine"


def test_a_folder_collect_did_not_write_is_refused_and_never_overwritten(tmp_path):
    """Issue #32 item 1 for collect: a folder that is not a collect dataset (an inject output
    here) is one line before anything is recorded; with --overwrite the recording goes beside
    its files (its manifest kept under another name), and a trace of theirs in the way of the
    recording stops it."""
    out = tmp_path / "ds"
    (out / "traces").mkdir(parents=True)
    eid = "resnet_tiny-train-clean-bs2-cpu"
    line = ('{"id": "x", "path": "traces/%s.pt.trace.json.gz", "split": "test_unseen", '
            '"task": "other", "model": "m", "platform": "p", "world_size": 1, "rank": 0, '
            '"label": "good", "source": "injected"}\n' % eid)
    (out / "manifest.jsonl").write_text(line)
    theirs = out / "traces" / f"{eid}.pt.trace.json.gz"
    theirs.write_bytes(b"user bytes")
    cmd = [sys.executable, "-m", "traceap", "collect", "--model", "resnet_tiny", "--out",
           str(out), "--device", "cpu", "--batch-size", "2", "--steps", "1"]
    for extra, message in (([], "not written by traceap collect"),
                           (["--overwrite"], f"traces/{eid}.pt.trace.json.gz exists and was "
                                             f"not written by traceap collect")):
        r = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and message in r.stderr.splitlines()[-1], r.stderr
        assert all(ln.startswith("traceap: ") for ln in r.stderr.splitlines()), r.stderr
    assert theirs.read_bytes() == b"user bytes"
    kept = [p.read_text() for p in out.glob("manifest*.jsonl")]
    assert kept == [line]                  # theirs, in place or kept under another name


def test_what_a_killed_recording_leaves_does_not_make_the_folder_foreign(tmp_path):
    """SIGKILL leaves an empty traces/ and a .collect-tmp/ with the profiler's raw file: the
    rerun records there (only a file collect did not write makes a folder foreign)."""
    from traceap.collect.runner import prepare_out
    out = tmp_path / "ds"
    (out / "traces").mkdir(parents=True)
    (out / ".collect-tmp" / "x").mkdir(parents=True)
    (out / ".collect-tmp" / "x" / "raw.pt.trace.json.gz").write_bytes(b"half")
    assert prepare_out(out) == []
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not written by traceap collect"):
        prepare_out(out)


def test_plan_records_clean_and_graph_break_then_resumes(tmp_path):
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(
        "out: ds\ndevice: cpu\nsteps: 2\ncompile_backend: aot_eager\nworkers: 1\n"
        "runs:\n  - models: [resnet_tiny]\n"
        "    patterns: [none, graph_break, no_pin_memory]\n    batch_sizes: [2]\n")
    plan = load_plan(plan_file)
    assert plan.out == tmp_path / "ds" and len(plan.configs) == 3
    lines: list[str] = []
    first = run_plan(plan, echo=lines.append)
    assert len(first.recorded) == 2 and not first.failed
    # before starting: how many recordings, and about how long on this CPU
    assert lines[0].startswith("plan: 3 recording(s): 2 to make on cpu (about ")
    assert "a rough estimate), 0 already there, 1 not possible here" in lines[0]
    assert "left for 1" in next(ln for ln in lines if "recorded in" in ln)
    # nothing but the dataset is left behind (no lock or temporary files)
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["manifest.jsonl", "traces"]
    assert [i for i, _ in first.unavailable] == ["resnet_tiny-train-no_pin_memory-bs2-cpu"]
    assert any("skipped" in ln and "cannot be recorded on cpu" in ln for ln in lines)

    entries = {e.id: e for e in read_manifest(tmp_path / "ds")}
    clean = entries["resnet_tiny-train-clean-bs2-cpu"]
    assert clean.label == "good" and clean.patterns == [] and clean.anomalies == []
    clean_events = _events(tmp_path / "ds" / clean.path)
    assert len(_intervals(clean_events, MP_NEXT)) == 2 and not _intervals(clean_events, SP_NEXT)

    broken = entries["resnet_tiny-train-graph_break-bs2-cpu"]
    events = _events(tmp_path / "ds" / broken.path)
    regions = [e for e in events if str(e.get("name")).startswith("Torch-Compiled Region")]
    assert len({e["name"] for e in regions}) >= 2  # the forced break split the graph
    assert all(_inside((e["ts"], e["ts"] + e["dur"]), broken.anomalies) for e in regions)

    calls = []
    lines = []
    again = run_plan(load_plan(plan_file), echo=lines.append, recorder=calls.append)
    assert lines[0].startswith("plan: 3 recording(s): 0 to make on cpu, 2 already there")
    assert calls == [] and sorted(again.existing) == sorted(first.recorded)
    assert len(read_manifest(tmp_path / "ds")) == 2


def test_the_forced_graph_break_splits_a_vit_too():
    """The break's hook goes on a layer the forward calls: a ViT's middle linear layer is a
    MultiheadAttention `out_proj`, whose weights are read without calling it (the H200 ViT-B
    recording compiled one graph per step with the hook there)."""
    import torch
    from torch._dynamo.utils import counters

    from traceap.collect.causes import break_graph
    from traceap.collect.networks import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(32, 8, 2, 2, 32, 64, num_classes=10)
    torch._dynamo.reset()
    counters.clear()
    compiled = break_graph(vit, "aot_eager")
    compiled(torch.randn(2, 3, 32, 32))
    assert counters["stats"]["unique_graphs"] >= 2
    assert sum(counters["graph_break"].values()) >= 1
    torch._dynamo.reset()


def test_a_graph_break_that_did_not_take_effect_records_nothing(tmp_path, monkeypatch):
    """A cause that left no mark in the trace is refused in one line, and no trace or manifest
    line claims it."""
    import torch

    from traceap.collect import runner

    # the hook never placed (as on a MultiheadAttention out_proj): one graph per step
    monkeypatch.setattr(runner, "break_graph",
                        lambda model, backend: torch.compile(model, backend=backend))
    cfg = CollectConfig(model="resnet_tiny", patterns=("graph_break",), out=tmp_path / "ds",
                        device="cpu", steps=2, compile_backend="aot_eager", workers=1)
    with pytest.raises(TraceapError, match="graph_break did not take effect"):
        collect(cfg)
    assert not list((tmp_path / "ds" / "traces").glob("*"))
    assert not (tmp_path / "ds" / "manifest.jsonl").exists()
    # an earlier recording of that id is left as it was by a refused --overwrite
    monkeypatch.undo()
    first = collect(cfg)
    trace, line = first.trace.read_bytes(), (tmp_path / "ds" / "manifest.jsonl").read_bytes()
    monkeypatch.setattr(runner, "break_graph",
                        lambda model, backend: torch.compile(model, backend=backend))
    cfg.overwrite = True
    with pytest.raises(TraceapError, match="graph_break did not take effect"):
        collect(cfg)
    assert first.trace.read_bytes() == trace
    assert (tmp_path / "ds" / "manifest.jsonl").read_bytes() == line
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["manifest.jsonl", "traces"]


def test_gpu_only_pattern_on_cpu_is_one_clear_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "traceap", "collect", "--model", "resnet_tiny",
                        "--pattern", "no_pin_memory", "--out", str(tmp_path / "ds"),
                        "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no_pin_memory" in lines[0] and "cannot be recorded on cpu" in lines[0]
    assert not (tmp_path / "ds").exists()


def test_marker_interval_extends_to_the_gpu_work_it_launched():
    """On a real A100 trace: a marker around a kernel launch ends where the kernel ends."""
    trace = orjson.loads(gzip.decompress(CNN.read_bytes()))
    events = trace["traceEvents"]
    kernels = {e["args"]["correlation"]: e for e in events
               if e.get("cat") == "kernel" and "correlation" in e.get("args", {})}
    launch = next(e for e in events if e.get("cat") == "cuda_runtime"
                  and e.get("args", {}).get("correlation") in kernels
                  and kernels[e["args"]["correlation"]]["ts"] > e["ts"] + e["dur"])
    kernel = kernels[launch["args"]["correlation"]]
    events.append({"ph": "X", "cat": "user_annotation", "name": MARKER_PREFIX + "no_pin_memory",
                   "pid": launch["pid"], "tid": launch["tid"], "ts": launch["ts"] - 1,
                   "dur": launch["dur"] + 2})
    n = len(events)
    (a,) = extract(trace)
    assert len(trace["traceEvents"]) == n - 1
    assert a.pattern == "no_pin_memory" and a.start_us == launch["ts"] - 1
    assert a.end_us == pytest.approx(kernel["ts"] + kernel["dur"])


@pytest.mark.parametrize("text, message", [
    ("runs: []\n", "non-empty list"),
    ("runs:\n  - models: [resnet_tiny]\n    batch_size: [2]\n", "unknown key 'batch_size'"),
    ("runs:\n  - models: [resnet_tiny]\n    patterns: [no_such_thing]\n", "unknown pattern"),
    ("runs:\n  - models: [resnet_tiny]\n    batch_sizes: [0]\n", "not a positive integer"),
    ("runs: [\n", "not valid YAML"),
])
def test_bad_plans_are_one_clear_error(tmp_path, text, message):
    plan = tmp_path / "plan.yaml"
    plan.write_text(text)
    with pytest.raises(traceap.errors.TraceapError, match=message):
        load_plan(plan, out=tmp_path)


def test_example_plan_expands_to_the_advertised_sweep():
    plan = load_plan(CNN.parent / "collect_plan.yaml", device="cpu")
    ids = plan.configs
    assert len(ids) == 3 * 7 * 2 * 2 + 2 * 6 * 2 + 2 * 6 + 2 * 5 + 1 + 2 * 4
    assert {c.model for c in ids} >= {"resnet18", "vit_b_16", "retinanet_resnet18_fpn", "unet"}


def test_estimate_grows_with_the_work():
    from traceap.collect.plan import estimate_seconds, forward_gflop
    assert 3.0 < forward_gflop("resnet18", None) < 4.5  # torchvision: 1.8 G multiply-adds
    small = CollectConfig(model="resnet18", device="cpu", image_size=64, batch_size=2, steps=1)
    big = CollectConfig(model="resnet18", device="cpu", batch_size=8, steps=3)
    assert estimate_seconds(small) < estimate_seconds(big)
    assert estimate_seconds(CollectConfig(model="resnet18", device="cuda")) is None


def test_collect_without_device_says_cpu_and_keeps_stderr_clean(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRACEAP_PROGRESS": "0"}
    r = subprocess.run([sys.executable, "-m", "traceap", "collect", "--model", "resnet_tiny",
                        "--pattern", "none", "--out", str(tmp_path / "ds"), "--batch-size", "2",
                        "--steps", "1", "--workers", "3"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    err = r.stderr.splitlines()
    assert err[0] == "traceap: no --device given and no CUDA GPU visible: recording on the CPU"
    assert "no GPU events" in err[1] and "bash scripts/gpu_collect.sh" in err[1]
    # no profiler USDT/STAGE lines, no torch worker warnings (at most our own note, once)
    assert not any(ln.startswith(("USDT:", "STAGE:")) for ln in err), err
    assert not any("UserWarning" in ln for ln in err), err
    assert len(err) <= 3 and all(ln.startswith("traceap: ") for ln in err), err
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["manifest.jsonl", "traces"]


def test_a_stopped_recording_leaves_nothing_behind(tmp_path):
    """SIGTERM (timeout, a batch system) mid-recording: one line, exit 143, no temporary files."""
    import signal
    import time
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRACEAP_PROGRESS": "0"}
    out = tmp_path / "ds"
    proc = subprocess.Popen([sys.executable, "-m", "traceap", "collect", "--model", "resnet_tiny",
                             "--out", str(out), "--device", "cpu", "--steps", "400",
                             "--batch-size", "2", "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not (out / ".collect-tmp").is_dir() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == ("traceap: interrupted (SIGTERM); nothing of this "
                                            "recording was kept"), err
    assert not (out / ".collect-tmp").exists()
    assert not list(out.rglob("*.lock"))


_STOP_IN_A_PROFILER_STEP = """
import os, signal, sys
import torch.autograd.profiler as ap
enter = ap.record_function.__enter__
def stopped_inside(self):
    if self.name == "ProfilerStep#3":  # SIGTERM lands before the step's record is set
        os.kill(os.getpid(), signal.SIGTERM)
    return enter(self)
ap.record_function.__enter__ = stopped_inside
from traceap.cli import main
sys.argv = ["traceap", "collect", "--model", "resnet_tiny", "--out", sys.argv[1],
            "--device", "cpu", "--steps", "6", "--batch-size", "2", "--workers", "1"]
main()
"""


def test_a_stop_inside_the_profilers_bookkeeping_is_still_a_stop(tmp_path):
    """CI, stop 49: a SIGTERM that lands inside `record_function.__enter__` (the profiler opens
    one per step) leaves the step's record unset; the profiler's exit then raises
    "AssertionError: Expected record to be set" over the KeyboardInterrupt.  That was read as
    an internal error (exit 1) and the interpreter's teardown crashed (SIGSEGV).  The signal
    is real and sent at that exact point; only its timing is forced."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRACEAP_PROGRESS": "0"}
    out = tmp_path / "ds"
    proc = subprocess.run([sys.executable, "-c", _STOP_IN_A_PROFILER_STEP, str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("traceap: interrupted (SIGTERM); nothing "
                                                    "of this recording was kept"), proc.stderr
    assert "internal error" not in proc.stderr
    assert not out.exists() or not list(out.rglob("*.json.gz"))
    assert not (out / ".collect-tmp").exists()


def test_a_sweep_ends_when_a_recording_fails_only_because_it_was_stopped(tmp_path):
    """A recorder whose clean-up raises a RuntimeError over the stop's KeyboardInterrupt: the
    sweep ends there (KeyboardInterrupt), not logged as one failed recording and carried on."""
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text("out: ds\ndevice: cpu\nsteps: 2\nworkers: 1\nruns:\n"
                         "  - models: [resnet_tiny]\n    patterns: [none, no_pin_memory]\n"
                         "    batch_sizes: [2]\n")
    calls = []

    def recorder(cfg):
        calls.append(cfg)
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("clean-up after the stop failed") from None

    with pytest.raises(KeyboardInterrupt):
        run_plan(load_plan(plan_file), echo=lambda line: None, recorder=recorder)
    assert len(calls) == 1


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_stop_sent_to_the_whole_sweep_stops_it(tmp_path, signum):
    """Issue #32 item 12: `timeout` (or Ctrl-C) signals the whole process group, DataLoader
    workers included.  Their deaths used to surface as "DataLoader worker ... killed by
    signal: Terminated": the recording was logged failed and the sweep went on with the
    next one.  Now the sweep stops at once: one line, 128 + the signal, the manifest and
    the traces in agreement, nothing half written left."""
    import signal
    import time
    plan = tmp_path / "plan.yaml"
    plan.write_text("out: ds\ndevice: cpu\nsteps: 200\nworkers: 2\nruns:\n"
                    "  - models: [resnet_tiny]\n    patterns: [none, cpu_bound]\n"
                    "    batch_sizes: [8]\n    image_size: 96\n")
    out = tmp_path / "ds"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRACEAP_PROGRESS": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "traceap", "collect", "--plan", str(plan)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out / ".collect-tmp").is_dir() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)                        # inside the first recording's loop, workers busy
    os.killpg(proc.pid, getattr(signal, signum))
    try:
        stdout, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, err = proc.communicate()
        pytest.fail(f"the sweep went on after {signum}: {stdout}")
    assert proc.returncode == 128 + getattr(signal, signum), err
    assert err.strip().splitlines()[-1] == (f"traceap: interrupted ({signum}); rerun the same "
                                            f"command to record the rest"), err
    assert "failed" not in stdout and "[2/2]" not in stdout and "Traceback" not in err
    assert not (out / ".collect-tmp").exists() and not list(out.rglob("*.part"))
    listed = {e.path for e in read_manifest(out)} if (out / "manifest.jsonl").exists() else set()
    assert {p.relative_to(out).as_posix() for p in out.rglob("*.pt.trace.json.gz")} == listed


def test_a_forked_child_ends_silently_on_the_stop_signal(capfd):
    """The SIGTERM handler raises KeyboardInterrupt in `traceap collect` itself; a forked child
    (a DataLoader worker still starting up when the stopping parent terminates it) inherits
    the handler and must end as SIGTERM's default does, without a traceback on stderr."""
    import multiprocessing
    import signal
    import time

    from traceap.cli.collect import interrupt_here

    old = signal.signal(signal.SIGTERM, interrupt_here())
    try:
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
        child.start()
        time.sleep(0.5)
        child.terminate()
        child.join(10)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert child.exitcode == -signal.SIGTERM
    assert capfd.readouterr().err == ""


def test_a_cut_tensor_hand_over_prints_nothing(capfd):
    """A stop that cuts a DataLoader worker's file-descriptor hand-over resets the connection
    of multiprocessing's resource sharer, which prints the error with sys.excepthook; the hook
    `traceap collect` installs drops exactly that, and passes every other exception on."""
    import socket
    import sys
    import time
    from multiprocessing import resource_sharer

    from traceap.cli.collect import quiet_fd_sharing

    old = sys.excepthook
    seen = []
    sys.excepthook = lambda *exc: seen.append(exc[0])
    try:
        quiet_fd_sharing()
        r, w = os.pipe()
        resource_sharer.DupFd(r)          # starts the sharer's listener thread
        address = resource_sharer._resource_sharer._address
        for _ in range(2):                # a client that hangs up during the handshake
            s = socket.socket(socket.AF_UNIX)
            s.connect(address)
            s.close()
        time.sleep(0.5)
        sys.excepthook(ValueError, ValueError("other"), None)
    finally:
        sys.excepthook = old
        os.close(r)
        os.close(w)
    assert seen == [ValueError]
    assert capfd.readouterr().err == ""


# --------------------------------------------------------------------------------------------
# the GPU recipe (checked here on its knobs; benchmarks/h200 holds what it recorded on an H200)


def test_a_clean_gpu_run_trains_the_way_the_tuning_guide_says():
    from traceap.collect.causes import Recipe
    clean = Recipe.make((), "cuda", 4, "inductor", convolutional=True)
    assert (clean.amp, clean.channels_last, clean.no_tf32, clean.foreach, clean.pin_memory,
            clean.num_workers) == (True, True, False, None, True, 4)
    vit = Recipe.make((), "cuda", 4, "inductor", convolutional=False)
    assert vit.amp and not vit.channels_last
    cpu = Recipe.make((), "cpu", 4, "inductor")
    assert not (cpu.amp or cpu.channels_last or cpu.pin_memory)


@pytest.mark.parametrize("pattern,knobs", [
    ("no_mixed_precision", dict(amp=False, no_tf32=True, channels_last=True)),
    ("no_channels_last", dict(amp=True, no_tf32=False, channels_last=False)),
    ("unfused_optimizer", dict(amp=True, foreach=False)),
    ("cpu_tensor_init", dict(amp=True, channels_last=True, foreach=None)),
])
def test_each_new_cause_turns_one_knob(pattern, knobs):
    from traceap.collect.causes import Recipe
    r = Recipe.make((pattern,), "cuda", 4, "inductor", convolutional=True)
    assert {k: getattr(r, k) for k in knobs} == knobs


def test_fp32_cause_switches_tf32_off_only_while_recording():
    import torch
    from traceap.collect.causes import Recipe
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    r = Recipe.make(("no_mixed_precision",), "cuda", 4, "inductor")
    with r.precision():
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


@pytest.mark.parametrize("argv,words", [
    (["--model", "resnet_tiny", "--pattern", "unfused_optimizer"], "cannot be recorded on cpu"),
    (["--model", "resnet_tiny", "--pattern", "allocator_churn"], "cannot be recorded on cpu"),
    (["--model", "vit_s_16", "--pattern", "no_channels_last"], "none past its patch embedding"),
    (["--model", "vit_s_16", "--pattern", "recompilation"], "needs a convolutional classifier"),
    (["--model", "resnet_tiny", "--pattern", "recompilation,graph_break"], "one at a time"),
])
def test_new_causes_that_cannot_happen_are_one_clear_line(tmp_path, argv, words):
    r = subprocess.run([sys.executable, "-m", "traceap", "collect", *argv, "--device", "cpu",
                        "--out", str(tmp_path / "ds")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert not (tmp_path / "ds").exists()


def test_recompilation_cause_compiles_again_inside_its_marks(tmp_path):
    """Multi-scale input under torch.compile(dynamic=False): Dynamo compiles the model again in
    each profiled step (real compile work, aot_eager on the CPU), inside the marked intervals."""
    from traceap.measures.compile_regions import recompile_rows, recompiled_frames
    r = collect(CollectConfig(model="resnet_tiny", patterns=("recompilation",), out=tmp_path,
                              device="cpu", steps=2, batch_size=2, image_size=64, workers=1,
                              compile_backend="aot_eager"))
    assert [a.pattern for a in r.entry.anomalies] == ["recompilation", "recompilation"]
    assert "torch.compile(dynamic=False)" in r.entry.notes
    t = traceap.load(r.trace)
    rows = recompile_rows(t)
    assert len(rows) >= 3 and recompiled_frames(t)
    assert all(_inside((t.ts[x], t.ts[x]), r.entry.anomalies) for x in rows)


def test_a_recompilation_that_did_not_happen_records_nothing(tmp_path, monkeypatch):
    """Steps that keep their input size (the multi-scale resize undone): nothing compiles
    again, and the recording is refused rather than labelled recompilation."""
    from traceap.collect import runner

    monkeypatch.setattr(runner, "multi_scale", lambda images, step: images)
    with pytest.raises(TraceapError, match="recompilation did not take effect"):
        collect(CollectConfig(model="resnet_tiny", patterns=("recompilation",),
                              out=tmp_path / "ds", device="cpu", steps=2, batch_size=2,
                              image_size=64, workers=1, compile_backend="aot_eager"))
    assert not list((tmp_path / "ds" / "traces").glob("*"))
    assert not (tmp_path / "ds" / "manifest.jsonl").exists()


def test_a_plan_skips_a_cause_the_model_cannot_have_with_the_reason(tmp_path):
    """A cause that needs another kind of model (recompilation: a convolutional classifier) is
    'not possible here' in a plan, like a GPU-only cause on a CPU: skipped with its reason,
    never recorded and never counted as a failure."""
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(
        "out: ds\ndevice: cpu\nsteps: 1\ncompile_backend: aot_eager\nworkers: 1\n"
        "runs:\n  - models: [vit_s_16, resnet_tiny]\n"
        "    patterns: [recompilation]\n    batch_sizes: [2]\n")
    calls, lines = [], []
    result = run_plan(load_plan(plan_file), echo=lines.append, recorder=calls.append)
    assert "1 to make on cpu" in lines[0] and "1 not possible here" in lines[0]
    assert [c.model for c in calls] == ["resnet_tiny"] and not result.failed
    assert [i for i, _ in result.unavailable] == ["vit_s_16-train-recompilation-bs2-cpu"]
    assert "needs a convolutional classifier" in result.unavailable[0][1]
