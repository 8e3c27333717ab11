"""`traceap profile -- CMD`: real training scripts run unchanged under the recorder (CPU)."""

from __future__ import annotations

import gzip
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

import traceap
from traceap.profile import BOOTSTRAP, ProfileConfig, describe, run

from .conftest import REPO

TRAIN = REPO / "examples" / "train_small.py"
#: A few tiny steps of the example: 8 steps of batch 4 at 32 px, 8 channels.
TINY = ["--steps", "8", "--batch-size", "4", "--image-size", "32", "--width", "8"]
#: The name tensorboard_trace_handler gives a trace: <worker>.<time_ns>.pt.trace.json.gz.
HANDLER_NAME = re.compile(r"(rank\d+_)?[^.]+_\d+\.\d+\.pt\.trace\.json\.gz")


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    # Two intra-op threads per process on a shared 2-core machine make each step 10x slower.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _script(tmp_path: Path, text: str, name: str = "script.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


#: The exit code `traceap profile` passes through when the profiled Python dies of SIGSEGV.
SEGFAULT = 128 + 11


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`traceap profile ARGS`; run once more, from scratch, when the profiled interpreter died
    of a segfault: a child (torch with its profiler) crashed once in about 40 runs on 2 loaded
    cores (no record written, exit 139; not reproduced in 31 runs since, cause unknown), never
    twice in a row, while a deterministic crash would repeat.  The output folder is emptied
    between the two runs."""
    cmd = [sys.executable, "-m", "traceap", "profile", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if p.returncode == SEGFAULT:
        if "--out" in args:
            shutil.rmtree(args[args.index("--out") + 1], ignore_errors=True)
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    return p


def _flat(text: str) -> str:
    """Text with its line breaks undone: traceap profile wraps its messages to the console."""
    return " ".join(text.split())


def test_records_exactly_k_optimizer_steps_of_a_real_training_script(tmp_path, capfd):
    cfg = ProfileConfig(out=tmp_path / "prof", steps=3, skip=2)
    r = run([sys.executable, str(TRAIN), *TINY], cfg)
    out = capfd.readouterr().out
    assert r.exit_code == 0 and "done: 8 steps" in out   # the script ran to its end
    (rec,) = r.records
    assert rec["source"] == "optimizer" and rec["steps_recorded"] == 3
    assert rec["activities"] == ["cpu"] and r.cpu_only
    (path,) = r.traces
    assert HANDLER_NAME.fullmatch(path.name) and path.parent == cfg.out
    t = traceap.load(path)
    # Steps 1-2 skipped (2 is the profiler's warm-up), 3-5 recorded, numbered as the run's.
    assert [s.number for s in t.steps] == [3, 4, 5]
    events = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    convs = [e for e in events if e.get("name") == "aten::conv2d"]
    assert convs and all("Input Dims" in e["args"] for e in convs)   # record_shapes
    assert not any("Python id" in e.get("args", {}) for e in events)  # no with_stack asked


def test_command_output_arguments_and_exit_code_pass_through(tmp_path):
    script = _script(tmp_path, """
        import sys, torch
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            loss = model(torch.randn(4, 8)).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()
        print("args:", sys.argv[1:])
        print("to stderr", file=sys.stderr)
        sys.exit(3)
    """)
    out = tmp_path / "prof"
    p = _cli("--skip", "1", "--steps", "2", "--out", str(out), "--html", "--",
             sys.executable, str(script), "--lr", "0.1", "two words")
    assert p.returncode == 3
    assert p.stdout == "args: ['--lr', '0.1', 'two words']\n"   # traceap writes to stderr only
    assert "to stderr" in p.stderr
    assert "exited with code 3" in p.stderr and "recorded steps 2-3" in p.stderr
    # ... and the recording was analysed: the header, the host numbers, the CPU-only caveat.
    assert "steps 2" in p.stderr and "median step" in p.stderr and "no DataLoader" in p.stderr
    assert "eight GPU" in p.stderr and (out / "report.html").stat().st_size > 10_000


def test_output_has_no_kineto_usdt_line_and_fits_100_columns(tmp_path, monkeypatch):
    """libkineto printed "USDT:... profiler_start" / "profiler_stop" on every run, and traceap's
    own summary lines ran to 237 characters."""
    # Run from tmp_path (short relative paths in the output) with the traceap under test.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(Path(traceap.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("COLUMNS", "100")
    script = _script(tmp_path, """
        import sys, torch
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(6):
            loss = model(torch.randn(4, 8)).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()
            print(f"script line {i}", file=sys.stderr)
    """)
    p = _cli("--skip", "1", "--steps", "2", "--out", "prof", "--html", "--",
             sys.executable, str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    assert not [x for x in lines if "USDT" in x]
    # the script's own stderr, steps 2-3 recorded in between, all there and in order
    assert [x for x in lines if x.startswith("script line")] == [f"script line {i}"
                                                                 for i in range(6)]
    assert "CPU-only recording" in p.stderr and "compare with another run" in p.stderr
    assert max(len(x) for x in lines) <= 100, max(lines, key=len)


def _bootstrap_module():
    spec = importlib.util.spec_from_file_location("_traceap_profile_child",
                                                  BOOTSTRAP / "_traceap_profile_child.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_usdt_filter_drops_only_kinetos_usdt_lines(capfd):
    """What libkineto writes to fd 2 during a profiler call: its USDT lines go, the rest
    (an error, the script's output) reaches the user unchanged."""
    child = _bootstrap_module()
    with child._without_usdt_lines():
        os.write(2, b"USDT:2026-12-02 17:56:35 13008:13008 "
                    b"SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"ERROR:2026-12-02 17:56:35 13008:13008 CuptiActivityApi.cpp:1] failed\n")
        os.write(2, b"USDT: a line of the script's own\n")
    assert capfd.readouterr().err == ("ERROR:2026-12-02 17:56:35 13008:13008 "
                                      "CuptiActivityApi.cpp:1] failed\n"
                                      "USDT: a line of the script's own\n")


def test_failing_script_reaches_the_user_with_its_exit_code_and_a_partial_trace(tmp_path):
    out = tmp_path / "prof"
    p = _cli("--skip", "2", "--steps", "3", "--out", str(out), "--no-analysis", "--",
             sys.executable, str(TRAIN), *TINY, "--fail-at", "5")
    assert p.returncode == 1
    assert "RuntimeError: failing at step 5 as asked (--fail-at)" in p.stderr
    assert "Traceback" in p.stderr                       # the script's own traceback, as is
    assert "the trace holds 2 complete step(s)" in _flat(p.stderr)
    (trace,) = out.glob("*.pt.trace.json.gz")
    assert [s.number for s in traceap.load(trace).steps][:2] == [3, 4]


def test_script_that_never_steps_gets_the_time_based_schedule_and_a_note(tmp_path):
    out = tmp_path / "prof"
    # No optimizer, no DataLoader: matrix products until the recorder has written its trace
    # (bounded, so a broken recorder fails the test instead of hanging it).
    script = _script(tmp_path, f"""
        import glob, time, torch
        x = torch.randn(64, 64)
        t0 = time.time()
        while not glob.glob({str(out)!r} + "/*.pt.trace.json.gz") and time.time() - t0 < 120:
            for _ in range(20):
                x = torch.tanh(x @ x)
        print("stopped after", round(time.time() - t0, 1), "s")
    """)
    cfg = ProfileConfig(out=out, steps=2, skip=1, period_s=0.3)
    r = run([sys.executable, str(script)], cfg)
    assert r.exit_code == 0
    (rec,) = r.records
    assert rec["source"] == "time" and rec["optimizer_steps"] == rec["batches"] == 0
    (path,) = r.traces
    t = traceap.load(path)
    assert [s.number for s in t.steps] == [2, 3]
    assert all(s.end_us - s.start_us >= 0.25e6 for s in t.steps)   # about --period each
    note = " ".join(describe(r, cfg))
    assert "time-based schedule" in note and "not a training iteration" in note


def test_dataloader_batches_mark_the_steps_of_an_inference_loop(tmp_path):
    script = _script(tmp_path, """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval()
        data = DataLoader(TensorDataset(torch.randn(48, 16)), batch_size=4)
        with torch.no_grad():
            for (x,) in data:
                model(x)
        print("inference done")
    """)
    r = run([sys.executable, str(script)], ProfileConfig(out=tmp_path / "prof", steps=3,
                                                         skip=2))
    (rec,) = r.records
    assert r.exit_code == 0 and rec["source"] == "dataloader"
    (path,) = r.traces
    t = traceap.load(path)
    assert [s.number for s in t.steps] == [3, 4, 5]
    # A batch starts a step: each step holds exactly one DataLoader.__next__.
    from traceap.info import step_numbers
    assert step_numbers(t)["loader_calls"] == 3


def test_exit_after_stops_the_run_once_the_trace_is_written(tmp_path, capfd):
    r = run([sys.executable, str(TRAIN), *TINY[2:], "--steps", "200"],
            ProfileConfig(out=tmp_path / "prof", steps=2, skip=2, exit_after=True))
    cap = capfd.readouterr()
    assert r.exit_code == 0 and r.stopped_by_traceap
    assert "done:" not in cap.out                  # the 200-step run did not go on
    assert "stopping the run (--exit-after)" in cap.err
    (path,) = r.traces
    assert [s.number for s in traceap.load(path).steps] == [3, 4]


@pytest.mark.slow
def test_torchrun_with_two_cpu_processes_gives_one_trace_per_rank(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    script = _script(tmp_path, """
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                        torch.nn.Linear(32, 2)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
        print(f"rank {dist.get_rank()} done", flush=True)
        dist.destroy_process_group()
    """)
    out = tmp_path / "prof"
    for attempt in (1, 2, 3):
        r = run([str(torchrun), "--standalone", "--nproc-per-node=2", str(script)],
                ProfileConfig(out=out, steps=2, skip=2))
        # Gloo's worker threads can abort a rank in interpreter teardown after its work is done
        # ("terminate called without an active exception", SIGABRT; pytorch/pytorch#179291),
        # seen once in a few runs on 2 loaded cores, twice in a row once: the run is torch's
        # to fail, so try it again, from scratch, and judge the third.
        if r.exit_code == 0 or attempt == 3:
            break
        shutil.rmtree(out, ignore_errors=True)
    assert r.exit_code == 0
    assert sorted(rec["rank"] for rec in r.records if rec["trace"]) == [0, 1]
    job = traceap.load_job(out)
    assert [t.meta.rank for t in job.traces] == [0, 1] and job.world_size == 2
    assert all([s.number for s in t.steps] == [3, 4] for t in job.traces)
    assert all(HANDLER_NAME.fullmatch(p.name) for p in r.traces)


def test_bootstrap_is_inert_without_settings_and_runs_the_sitecustomize_it_shadows(tmp_path):
    # No torch here: this checks the start-up path every Python process of the command takes.
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    script = _script(tmp_path, """
        import os, sys
        print(os.environ.get("THEIRS_RAN"), type(sys.modules.get("sitecustomize")).__name__,
              [type(f).__name__ for f in sys.meta_path].count("_TorchWatcher"))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BOOTSTRAP), str(theirs)]))
    env.pop("TRACEAP_PROFILE", None)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert p.stdout.split() == ["yes", "module", "0"] and p.stderr == ""
    env["TRACEAP_PROFILE"] = orjson.dumps(ProfileConfig(out=tmp_path / "o").child_settings(
        tmp_path)).decode()
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert p.stdout.split() == ["yes", "module", "1"] and p.stderr == ""


@pytest.mark.parametrize("args, message", [
    ([], "give the command to profile after --"),
    (["--", "no-such-command-xyz"], "no-such-command-xyz: command not found"),
    (["--steps", "0", "--", "true"], "--steps must be at least 1"),
    (["--activities", "gpu", "--", "true"], "--activities: gpu not known"),
])
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    p = _cli("--out", str(tmp_path / "o"), *args)
    assert p.returncode == 2
    assert p.stderr.startswith("traceap: error: ") and message in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_overwrite_replaces_only_what_an_earlier_profile_run_wrote(tmp_path):
    """Issue #32 item 2: --overwrite used to delete every trace in --out, the user's too."""
    out = tmp_path / "o"
    out.mkdir()
    user = out / "old.pt.trace.json.gz"
    shutil.copy(REPO / "tests" / "data" / "kineto2021_v100.json.gz", user)
    p = _cli("--out", str(out), "--", "true")
    assert p.returncode == 2 and "1 trace(s) traceap profile did not write" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = _cli("--out", str(out), "--overwrite", "--", "true")
    assert p.returncode == 0 and user.is_file()           # the user's trace stays
    assert "kept 1 trace(s) traceap profile did not write" in _flat(p.stderr)
    # a real earlier run: its trace is replaced on --overwrite, and only it
    run = out / "run"
    args = ("--skip", "1", "--steps", "1", "--no-analysis", "--", sys.executable, str(TRAIN),
            *TINY)
    assert _cli("--out", str(run), *args).returncode == 0
    first = [q.name for q in run.glob("*.pt.trace.json.gz")]
    assert len(first) == 1
    shutil.copy(user, run / "theirs.pt.trace.json.gz")
    p = _cli("--out", str(run), *args)
    assert p.returncode == 2 and "holds 1 trace of an earlier traceap profile run" in p.stderr
    p = _cli("--out", str(run), "--overwrite", *args)
    assert p.returncode == 0, p.stderr
    assert "replaced 1 trace of an earlier profile run" in _flat(p.stderr)
    now = {q.name for q in run.glob("*.pt.trace.json.gz")}
    assert "theirs.pt.trace.json.gz" in now and first[0] not in now and len(now) == 2


def test_a_stop_ends_the_run_without_analysis_and_keeps_only_complete_traces(tmp_path):
    """Issue #32 item 12: SIGTERM to the whole group (`timeout`) while the command runs: the
    command is stopped, its complete trace kept, no analysis after the deadline, one line,
    exit 143."""
    import os
    import signal
    import time
    out = tmp_path / "o"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "traceap", "profile", "--skip", "1",
                             "--steps", "1", "--out", str(out), "--", sys.executable,
                             str(TRAIN), *TINY[2:], "--steps", "100000"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("*.pt.trace.json.gz")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == (f"traceap: interrupted (SIGTERM); 1 complete "
                                            f"trace(s) kept in {out}, not analysed (traceap "
                                            f"analyze {out})"), err
    assert "no anti-pattern" not in err and "Traceback" not in err


def test_a_trace_cut_short_by_a_killed_process_is_not_kept(tmp_path):
    """A process killed while writing its trace leaves a truncated file and no record: it is
    removed, with a line, rather than passed to the analysis as a trace."""
    import gzip
    out = tmp_path / "o"
    script = _script(tmp_path, """
        import gzip, json, os
        out = json.loads(os.environ["TRACEAP_PROFILE"])["out"]
        data = gzip.compress(b'{"traceEvents": []}' * 1000)
        open(os.path.join(out, "host_1.1.pt.trace.json.gz"), "wb").write(data[: len(data) // 2])
        open(os.path.join(out, "host_2.2.pt.trace.json.gz"), "wb").write(data)
    """)
    p = _cli("--out", str(out), "--no-analysis", "--", sys.executable, str(script))
    assert p.returncode == 0, p.stderr
    assert "removed 1 trace(s) a process was killed while writing (incomplete): " \
           "host_1.1.pt.trace.json.gz" in _flat(p.stderr)
    assert sorted(q.name for q in out.glob("*.pt.trace.json.gz")) == ["host_2.2.pt.trace.json.gz"]
    assert gzip.decompress((out / "host_2.2.pt.trace.json.gz").read_bytes())



def test_an_out_folder_that_cannot_be_written_is_one_line_before_the_command_runs(tmp_path):
    """Issue #32 item 11 for profile: checked before the command starts (it never runs)."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    marker = tmp_path / "ran"
    for out in ("/proc/x", str(a_file / "o")):
        p = _cli("--out", out, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")
        assert p.returncode == 2 and f"--out {out}: cannot be written" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    assert not marker.exists()


def test_one_recorded_step_is_step_n_not_steps_n_to_n(tmp_path):
    p = _cli("--out", str(tmp_path / "o"), "--steps", "1", "--skip", "1", "--", "true")
    assert p.returncode == 0, p.stderr
    assert "recording step 2 of" in _flat(p.stderr) and "steps 2-2" not in _flat(p.stderr)
    from traceap.profile.runner import steps_text
    assert (steps_text(2, 1), steps_text(2, 3)) == ("step 2", "steps 2-4")
