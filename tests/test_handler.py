"""`traceap.trace_handler`, the drop-in for `torch.profiler.tensorboard_trace_handler`: each
profiled cycle leaves its trace (TensorBoard's file name), the analysis JSON and the HTML report
beside it and one printed line; nothing it meets raises into the training loop; each rank of a
torchrun job names its own files (issue #36, item 1)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from traceap.handler import TraceHandler, analyze_cycle, outputs_of
from traceap.load.job import trace_files

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "dlrm_a100_rank3.json.gz"

#: The issue's "done when": a small CPU training loop profiled with the handler.
LOOP = textwrap.dedent("""
    import sys
    import torch
    import traceap

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # positional, as tensorboard_trace_handler(dir_name, worker_name, use_gzip)
    handler = traceap.trace_handler(sys.argv[1], None, "--gzip" in sys.argv)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2)
    if "--distributed" in sys.argv:
        torch.distributed.init_process_group("gloo")
    with torch.profiler.profile(schedule=schedule, on_trace_ready=handler) as prof:
        for step in range(8):                      # two cycles of wait 1, warm-up 1, active 2
            loss = model(torch.randn(16, 32)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    print("training done")
    # no handler.close(): the analyses still running are waited for at exit
""")


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "PYTHONPATH": str(ROOT / "src"), **extra}


def _run_loop(tmp_path: Path, out: Path, *args: str, **env) -> subprocess.CompletedProcess:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    return subprocess.run([sys.executable, str(script), str(out), *args], capture_output=True,
                          text=True, env=_env(**env), cwd=tmp_path, timeout=300)


def _cycles(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if ".pt.trace.json" in p.name)


def test_a_profiled_cpu_loop_leaves_trace_analysis_and_report_for_each_cycle(tmp_path):
    out = tmp_path / "traces"
    r = _run_loop(tmp_path, out)
    assert r.returncode == 0, r.stderr
    traces = _cycles(out)
    assert len(traces) == 2
    worker = f"{socket.gethostname()}_"
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("traceap: ")]
    for trace in traces:
        # TensorBoard's name: {hostname}_{pid}.{time_ns}.pt.trace.json
        assert re.fullmatch(re.escape(worker) + r"\d+\.\d+\.pt\.trace\.json", trace.name), trace
        analysis, html = outputs_of(trace)
        data = json.loads(analysis.read_text())
        assert data["schema"] == "traceap.analysis/v1" and data["trace"] == str(trace)
        assert "traceap report" in html.read_text()
        # one line per cycle; a CPU-only trace says so rather than reporting GPU idle time
        (line,) = [ln for ln in lines if trace.name in ln]
        assert re.search(r", step [\d.]+ (us|ms); CPU-only trace", line), line
    assert r.stdout.index("training done") < r.stdout.index("traceap: " + traces[-1].name)
    assert trace_files(out) == traces  # `traceap analyze DIR` reads the traces, not the analyses


def test_gzip_and_rank_from_torchrun_environment_name_the_files(tmp_path):
    out = tmp_path / "traces"
    r = _run_loop(tmp_path, out, "--gzip", RANK="3")
    assert r.returncode == 0, r.stderr
    traces = _cycles(out)
    assert len(traces) == 2
    for trace in traces:
        assert re.fullmatch(r"rank3_" + re.escape(socket.gethostname()) +
                            r"_\d+\.\d+\.pt\.trace\.json\.gz", trace.name), trace
        data = json.loads(outputs_of(trace)[0].read_text())
        assert data["rank"] == 3   # the loader reads the rank back from the name


@pytest.mark.slow
def test_each_torchrun_rank_writes_and_analyses_its_own_files(tmp_path):
    pytest.importorskip("torch.distributed.run")
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    out = tmp_path / "traces"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        "--master_port=29531", str(script), str(out), "--distributed"],
                       capture_output=True, text=True, env=_env(OMP_NUM_THREADS="1"),
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    traces = _cycles(out)
    assert sorted({t.name.split("_")[0] for t in traces}) == ["rank0", "rank1"]
    assert len(traces) == 4 and all(p.is_file() for t in traces for p in outputs_of(t))


class _Profiler:
    """Stands in for torch's profiler where the test needs an export that torch never makes."""

    def __init__(self, text: str | None = None, source: Path | None = None):
        self.text, self.source = text, source

    def export_chrome_trace(self, path: str) -> None:
        if self.source is not None:
            shutil.copyfile(self.source, path)
        else:
            Path(path).write_text(self.text or "")


def test_a_trace_that_fails_analysis_is_one_warning_line_and_is_kept(tmp_path, capfd):
    for background in (False, True):
        out = tmp_path / f"bg{background}"
        with TraceHandler(out, "worker", background=background) as handler:
            handler(_Profiler('{"traceEvents": [ {"ph": '))   # cut short
        assert len(handler.traces) == 1 and handler.traces[0].is_file()
        assert not outputs_of(handler.traces[0])[0].exists()
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(
            f"traceap: warning: {handler.traces[0].name}: the analysis failed ("), err
        assert err[0].endswith("; the trace is kept")


def test_a_folder_that_cannot_be_written_is_one_warning_line(tmp_path, capfd):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    handler = TraceHandler(blocker / "traces", "worker")
    handler(_Profiler("{}"))          # returns: the training loop goes on
    assert handler.traces == []
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("traceap: warning: the profiler's trace could not "
                                               f"be written to {blocker / 'traces'} (")


def test_a_gpu_cycle_line_gives_step_time_gpu_idle_and_the_top_finding(tmp_path, capsys):
    trace = tmp_path / "rank3_host_1.1.pt.trace.json.gz"
    shutil.copyfile(SAMPLE, trace)
    assert analyze_cycle(trace, html=False)
    analysis, html = outputs_of(trace)
    data = json.loads(analysis.read_text())
    assert not html.exists()
    top = data["findings"][0]
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"traceap: {trace.name}, step ")
    idle = data["gpu_idle"]
    span = idle["gpu_span_us"][1] - idle["gpu_span_us"][0]
    assert f", GPU idle {round(100 * idle['total_us'] / span)}%, " in line   # 39%
    assert f"top finding: {top['title']} (fixing it gains about " in line
    assert f"per step, {top['gain_pct']:.1f}%)" in line
    # the README shows this line (under another file name)
    said = line.split(", ", 1)[1]
    assert f".pt.trace.json, {said}\n" in (ROOT / "README.md").read_text()


def test_a_handler_crosses_to_another_process_and_works_there(tmp_path, capfd):
    """Lightning's ddp_spawn pickles the callbacks (and so their handler) to its workers."""
    import pickle

    handler = TraceHandler(tmp_path / "traces", use_gzip=True)
    handler(_Profiler(source=SAMPLE))          # its thread, queue and default name exist now
    copy = pickle.loads(pickle.dumps(handler))
    code = ("import pickle, sys; copy = pickle.loads(sys.stdin.buffer.read()); "
            "from test_handler import _Profiler, SAMPLE; copy(_Profiler(source=SAMPLE)); "
            "copy.close(); print(copy.traces[-1])")
    r = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(handler),
                       capture_output=True, env=_env(PYTHONPATH=os.pathsep.join(
                           [str(ROOT / "src"), str(ROOT / "tests")])), timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    theirs = Path(r.stdout.decode().strip().splitlines()[-1])
    handler.close()
    mine = handler.traces[0]
    # the other process names its files by its own pid, not by the one it was copied from
    assert mine.name.split(".")[0] == f"{socket.gethostname()}_{os.getpid()}"
    assert theirs.name.split(".")[0] != mine.name.split(".")[0]
    assert all(p.is_file() for t in (mine, theirs) for p in outputs_of(t))
    assert copy.traces == [mine]
