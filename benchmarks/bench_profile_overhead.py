"""Overhead of `traceap profile` outside the recorded steps: does the run go on at full speed?

Each repetition runs `examples/train_small.py` twice at the same time, unprofiled and under
`traceap profile` (skip S, record K, no analysis), so both see the same machine load (on a shared
machine, load changes between two sequential runs exceed the 5% to be measured).  Each run
writes every step's wall time, CPU time (`time.process_time`, all threads of the training
process: hooks or a profiler left running would show there) and the clock time it ended.

A phase of the profiled run (steps 2..S-1: hooks installed, nothing recorded yet; S+1..S+K:
recorded; S+K+2..N: after the recording, the one after the trace export left out) is compared
with the unprofiled run's steps (from step S+K+2 on; from step 2 for the first phase) that
ended in the same clock interval, median against median, so both sides ran under the same load.  The unprofiled run is
given three times the steps so that it is still running when the profiled one finishes (the
last one running would otherwise have the machine to itself).  One ratio per phase and
repetition; the medians over repetitions are reported.  Target: after the recording, <= 1.05.

    nice .venv/bin/python benchmarks/bench_profile_overhead.py [--reps 5] [--steps 40]
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
CLOCKS = (("wall_s", "wall"), ("cpu_s", "CPU"))


def _both(cmd: list[str], steps: int, tmp: Path, skip: int, k: int) -> tuple[dict, dict]:
    """The unprofiled and the profiled run, started together; their step timings."""
    plain_t, prof_t = tmp / "plain.json", tmp / "profiled.json"
    plain = subprocess.Popen(cmd + ["--steps", str(3 * steps), "--timings", str(plain_t)],
                             stdout=subprocess.DEVNULL)
    try:
        r = run(cmd + ["--steps", str(steps), "--timings", str(prof_t)],
                ProfileConfig(out=tmp / "prof", steps=k, skip=skip, overwrite=True))
    finally:
        if plain.wait() != 0:
            raise SystemExit("the unprofiled run failed")
    if r.exit_code != 0 or len(r.traces) != 1:
        raise SystemExit(f"profiled run failed: exit {r.exit_code}, {len(r.traces)} traces")
    return json.loads(plain_t.read_text()), json.loads(prof_t.read_text())


def _phase_ratio(plain: dict, prof: dict, idx: range, steady_from: int, clock: str
                 ) -> tuple[float, int] | None:
    """median(profiled steps idx) / median(unprofiled steady steps ending meanwhile)."""
    idx = [i for i in idx if i < len(prof[clock])]
    if not idx:
        return None
    t0 = prof["end_time"][idx[0]] - prof["wall_s"][idx[0]]
    t1 = prof["end_time"][idx[-1]]
    same = [plain[clock][j] for j in range(steady_from, len(plain[clock]))
            if t0 <= plain["end_time"][j] <= t1]
    if len(same) < 3:
        return None
    return statistics.median(prof[clock][i] for i in idx) / statistics.median(same), len(same)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=40, help="steps of the profiled run")
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--record", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("extra", nargs="*", help="more train_small.py arguments (after --)")
    a = p.parse_args()
    cmd = [sys.executable, str(TRAIN), "--device", a.device, "--batch-size", "8",
           "--image-size", "48", "--width", "16", *a.extra]
    s, k = a.skip, a.record
    # 0-based step indices of the profiled run's phases.
    phases = {"after": range(s + k + 1, a.steps), "hooks": range(1, s - 1),
              "recorded": range(s, s + k)}
    # The unprofiled steps each phase is held against: steady ones, or early ones for the
    # early phase (both runs start together).
    steady_from = {"after": s + k + 1, "hooks": 1, "recorded": s}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            t0 = time.perf_counter()
            plain, prof = _both(cmd, a.steps, Path(tmp), s, k)
            row = {c: {ph: _phase_ratio(plain, prof, idx, steady_from[ph], c)
                       for ph, idx in phases.items()} for c, _ in CLOCKS}
            rows.append(row)
            print(f"rep {rep + 1}: " + "; ".join(
                f"{name}: after the recording {_x(row[c]['after'])}, before it "
                f"{_x(row[c]['hooks'])}, recorded {_x(row[c]['recorded'])}"
                for c, name in CLOCKS) +
                f" (unprofiled step {1000 * statistics.median(plain['wall_s'][s + k + 1:]):.1f}"
                f" ms; {time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"\nmedians over {a.reps} repetitions, profiled / unprofiled step time, same clock "
          f"interval [{a.device}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}]:")
    for c, name in CLOCKS:
        med = {ph: _median([r[c][ph] for r in rows]) for ph in phases}
        print(f"  {name:4s}: after the recording {_x(med['after'])} (target <= 1.05), before it "
              f"(hooks only) {_x(med['hooks'])}, recorded steps {_x(med['recorded'])}")


def _median(vals: list) -> tuple[float, int] | None:
    got = [v[0] for v in vals if v is not None]
    return (statistics.median(got), len(got)) if got else None


def _x(v: tuple[float, int] | None) -> str:
    return "-" if v is None else f"{v[0]:.3f}x"


if __name__ == "__main__":
    main()
