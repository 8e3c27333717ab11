"""What `traceap.trace_handler` holds the training loop per profiled cycle, against
`torch.profiler.tensorboard_trace_handler` measured in the same run.

A small CPU training loop (an MLP, `--steps` steps) is profiled with schedule(wait=1, warmup=1,
active=2) three times: with TensorBoard's handler (the baseline: it only exports the trace),
with traceap's handler (export, then the analysis in a background child process) and with
traceap's handler analysing in the loop (`background=False`).  Reported per cycle: the seconds
`on_trace_ready` held the loop (median), their ratio to the baseline, and the loop's wall time;
for the background handler also the time `close()` waited at the end for the last analyses.

    nice .venv/bin/python benchmarks/bench_handler.py [--steps 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import torch  # noqa: E402

import traceap  # noqa: E402


class Timed:
    """Wraps an `on_trace_ready` handler and records how long each call held the loop."""

    def __init__(self, handler):
        self.handler, self.seconds = handler, []

    def __call__(self, prof) -> None:
        t = time.perf_counter()
        self.handler(prof)
        self.seconds.append(time.perf_counter() - t)


def train(steps: int, on_trace_ready) -> float:
    """Wall seconds of the profiled loop."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2)
    t = time.perf_counter()
    with torch.profiler.profile(schedule=schedule, on_trace_ready=on_trace_ready) as prof:
        for _ in range(steps):
            loss = model(torch.randn(64, 256)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="training steps (a cycle is 4)")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Timed(torch.profiler.tensorboard_trace_handler(f"{tmp}/tb"))
        rows.append(("tensorboard_trace_handler", base, train(args.steps, base), 0.0))
        for name, background in (("traceap.trace_handler", True),
                                 ("traceap.trace_handler(background=False)", False)):
            handler = traceap.trace_handler(f"{tmp}/{name}", background=background)
            timed = Timed(handler)
            wall = train(args.steps, timed)
            t = time.perf_counter()
            handler.close()
            rows.append((name, timed, wall, time.perf_counter() - t))
            assert len(list(Path(tmp, name).glob("*.traceap.html"))) == len(timed.seconds)
    ref = statistics.median(base.seconds)
    print(f"{'handler':42s} {'cycles':>6s} {'held/cycle':>11s} {'x tensorboard':>13s} "
          f"{'loop wall':>10s} {'close()':>8s}")
    for name, timed, wall, closing in rows:
        held = statistics.median(timed.seconds)
        print(f"{name:42s} {len(timed.seconds):6d} {held * 1e3:9.1f}ms {held / ref:13.2f} "
              f"{wall:9.2f}s {closing:7.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
