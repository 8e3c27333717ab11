"""Overhead of `traceap profile` outside the recorded steps: does the run go on at full speed?

Runs `examples/train_small.py` twice per repetition, unprofiled and under `traceap profile`
(skip S, record K, no analysis), alternating which goes first, each writing the duration of
every step.  The ratio compared is

    median step time of steps S+K+2..N (profiled run) / the same steps of the unprofiled run

(step S+K ends with the trace export and S+K+1 is the first one after it, so both are left
out), plus the same ratio for steps 2..S-1, where only the step hooks are installed.  Each
repetition gives one ratio measured within it; the median over repetitions is reported.
The target is a ratio within 1.05.

    nice .venv/bin/python benchmarks/bench_profile_overhead.py [--reps 5] [--steps 60]
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


def _steps(path: Path) -> list[float]:
    return json.loads(path.read_text())


def _plain(cmd: list[str], timings: Path) -> list[float]:
    subprocess.run(cmd + ["--timings", str(timings)], check=True, stdout=subprocess.DEVNULL)
    return _steps(timings)


def _profiled(cmd: list[str], timings: Path, out: Path, skip: int, k: int) -> list[float]:
    r = run(cmd + ["--timings", str(timings)],
            ProfileConfig(out=out, steps=k, skip=skip, overwrite=True))
    if r.exit_code != 0 or len(r.traces) != 1:
        raise SystemExit(f"profiled run failed: exit {r.exit_code}, {len(r.traces)} traces")
    return _steps(timings)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=60, help="training steps per run")
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--record", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("extra", nargs="*", help="more train_small.py arguments (after --)")
    a = p.parse_args()
    cmd = [sys.executable, str(TRAIN), "--steps", str(a.steps), "--device", a.device,
           "--batch-size", "16", "--image-size", "64", "--width", "16", *a.extra]
    s, k = a.skip, a.record
    after = slice(s + k + 1, None)        # 0-based: steps S+K+2..N
    before = slice(1, s - 1)              # steps 2..S-1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for rep in range(a.reps):
            t0 = time.perf_counter()
            order = ("plain", "profiled") if rep % 2 == 0 else ("profiled", "plain")
            got = {}
            for which in order:
                timings = tmp / f"{which}.json"
                got[which] = (_plain(cmd, timings) if which == "plain" else
                              _profiled(cmd, timings, tmp / "prof", s, k))
            pl, pr = got["plain"], got["profiled"]
            row = {
                "after_ratio": statistics.median(pr[after]) / statistics.median(pl[after]),
                "hooks_ratio": (statistics.median(pr[before]) / statistics.median(pl[before])
                                if s > 2 else None),
                "recorded_ratio": (statistics.median(pr[s:s + k]) /
                                   statistics.median(pl[s:s + k])),
                "plain_step_ms": 1000 * statistics.median(pl[after]),
                "seconds": time.perf_counter() - t0,
            }
            rows.append(row)
            hooks = "-" if row["hooks_ratio"] is None else f"{row['hooks_ratio']:.3f}x"
            print(f"rep {rep + 1}: steps after the recording {row['after_ratio']:.3f}x, "
                  f"before it (hooks only) {hooks}, "
                  f"recorded steps {row['recorded_ratio']:.2f}x "
                  f"(plain step {row['plain_step_ms']:.1f} ms, {row['seconds']:.0f} s)",
                  flush=True)
    med = statistics.median(r["after_ratio"] for r in rows)
    hooks = [r["hooks_ratio"] for r in rows if r["hooks_ratio"] is not None]
    print(f"\nmedian over {a.reps} repetitions: steps after the recording {med:.3f}x the "
          f"unprofiled run" + (f", steps before it {statistics.median(hooks):.3f}x" if hooks
                               else "") +
          f"; recorded steps {statistics.median(r['recorded_ratio'] for r in rows):.2f}x "
          f"(target: within 1.05 outside the recorded steps) "
          f"[{a.device}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}]")


if __name__ == "__main__":
    main()
