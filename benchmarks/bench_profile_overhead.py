"""Overhead of `traceap profile` outside the recorded steps: does the run go on at full speed?

Runs `examples/train_small.py` twice per repetition, unprofiled and under `traceap profile`
(skip S, record K, no analysis), both at the same time so that both see the same machine load
(on a shared machine, load changes between two sequential runs exceed the 5% to be measured),
each writing the duration of every step.  The ratio compared is

    median step time of steps S+K+2..N (profiled run) / the same steps of the unprofiled run

(step S+K ends with the trace export and S+K+1 is the first one after it, so both are left
out), plus the same ratio for steps 2..S-1, where only the step hooks are installed, in wall
time and in CPU time of the training process (`time.process_time`, every thread of it: hooks
or a profiler left running would show there, and it moves far less with the machine's load
than wall time does).  Each repetition gives one ratio measured within it; the median over
repetitions is reported.  The target is a ratio within 1.05.

    nice .venv/bin/python benchmarks/bench_profile_overhead.py [--reps 5] [--steps 50]
         [--device cpu|cuda] [-- extra train_small.py arguments]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from traceap.profile import ProfileConfig, run  # noqa: E402

TRAIN = REPO / "examples" / "train_small.py"


def _steps(path: Path) -> dict[str, list[float]]:
    return json.loads(path.read_text())


def _both(cmd: list[str], tmp: Path, skip: int, k: int) -> tuple[dict, dict]:
    """The unprofiled and the profiled run, started together; their step durations."""
    plain_t, prof_t = tmp / "plain.json", tmp / "profiled.json"
    plain = subprocess.Popen(cmd + ["--timings", str(plain_t)], stdout=subprocess.DEVNULL)
    r = run(cmd + ["--timings", str(prof_t)],
            ProfileConfig(out=tmp / "prof", steps=k, skip=skip, overwrite=True))
    if plain.wait() != 0:
        raise SystemExit("the unprofiled run failed")
    if r.exit_code != 0 or len(r.traces) != 1:
        raise SystemExit(f"profiled run failed: exit {r.exit_code}, {len(r.traces)} traces")
    return _steps(plain_t), _steps(prof_t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=50, help="training steps per run")
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--record", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("extra", nargs="*", help="more train_small.py arguments (after --)")
    a = p.parse_args()
    cmd = [sys.executable, str(TRAIN), "--steps", str(a.steps), "--device", a.device,
           "--batch-size", "8", "--image-size", "48", "--width", "16", *a.extra]
    s, k = a.skip, a.record
    after = slice(s + k + 1, None)        # 0-based: steps S+K+2..N
    before = slice(1, s - 1)              # steps 2..S-1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for rep in range(a.reps):
            t0 = time.perf_counter()
            pl, pr = _both(cmd, tmp, s, k)
            row = {"seconds": time.perf_counter() - t0,
                   "step_ms": 1000 * statistics.median(pl["wall_s"][after])}
            for clock in ("wall_s", "cpu_s"):
                x, y = pl[clock], pr[clock]
                row[clock] = {"after": _ratio(y[after], x[after]),
                              "hooks": _ratio(y[before], x[before]) if s > 2 else None,
                              "recorded": _ratio(y[s:s + k], x[s:s + k])}
            rows.append(row)
            print(f"rep {rep + 1}: " + "; ".join(
                f"{'wall' if c == 'wall_s' else 'CPU'} time: after the recording "
                f"{row[c]['after']:.3f}x, before it {_x(row[c]['hooks'])}, recorded steps "
                f"{row[c]['recorded']:.2f}x" for c in ("wall_s", "cpu_s")) +
                f" (unprofiled step {row['step_ms']:.1f} ms; {row['seconds']:.0f} s)", flush=True)
    print(f"\nmedians over {a.reps} repetitions, profiled / unprofiled step time "
          f"[{a.device}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}]:")
    for clock, name in (("wall_s", "wall"), ("cpu_s", "CPU")):
        med = {part: statistics.median(r[clock][part] for r in rows
                                       if r[clock][part] is not None)
               for part in ("after", "hooks", "recorded") if any(r[clock][part] for r in rows)}
        print(f"  {name:4s}: steps after the recording {med['after']:.3f}x (target <= 1.05), "
              f"before it {_x(med.get('hooks'))}, recorded steps {med['recorded']:.2f}x")


def _ratio(profiled: list[float], plain: list[float]) -> float:
    return statistics.median(profiled) / statistics.median(plain)


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


if __name__ == "__main__":
    main()
