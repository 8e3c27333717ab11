"""Run a command unchanged with torch.profiler switched on from outside, collect its traces.

The command's environment gets `bootstrap/` first on PYTHONPATH and the recording settings in
`TRACEAP_PROFILE`; every Python process it starts then runs `bootstrap/sitecustomize.py`, which
installs the recorder (`bootstrap/_traceap_profile_child.py`) once torch is imported.  The
command's stdin, stdout and stderr are its own (less libkineto's USDT lines, dropped by the
recorder around each profiler call); its exit code is returned as it is (a signal N
becomes 128 + N, as a shell reports it).  Each process leaves a JSON record in a private state
folder: which step source it used, how many steps it recorded, which trace it wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OutputError, TraceapError
from ..outputs import Claim, Owner, claim

BOOTSTRAP = Path(__file__).resolve().parent / "bootstrap"
ENV = "TRACEAP_PROFILE"
TOP_ENV = "TRACEAP_PROFILE_TOP"
TRACE_GLOB = "*.pt.trace.json*"
#: The stamp of a profile output folder (docs/FORMATS.md, "Output stamps").
STAMP = ".traceap-profile.json"
STAMP_SCHEMA = "traceap.profile/v1"
ACTIVITIES = ("cpu", "cuda", "xpu")
#: Why the defaults: the paper's traces hold 2-3 profiler steps (traceap collect records 3);
#: five steps skipped cover cuDNN autotuning, DataLoader worker start-up and first-call
#: allocations in the CV training loops we record, and one of them is the profiler's warm-up.
DEFAULT_STEPS = 3
DEFAULT_SKIP = 5
#: Length of a time-based step when the command never steps (no optimizer, no DataLoader).
DEFAULT_PERIOD_S = 1.0


@dataclass(frozen=True)
class ProfileConfig:
    """What to record: skip S steps, record K, where, which activities, whether to stop."""

    out: Path
    steps: int = DEFAULT_STEPS
    skip: int = DEFAULT_SKIP
    activities: tuple[str, ...] | None = None   # None: cpu+cuda when CUDA is available
    with_stack: bool = False
    exit_after: bool = False
    period_s: float = DEFAULT_PERIOD_S
    overwrite: bool = False

    def validate(self) -> None:
        """Raise TraceapError (one line) for settings a recording cannot start with."""
        if self.steps < 1:
            raise TraceapError("--steps must be at least 1")
        if self.skip < 1:
            raise TraceapError("--skip must be at least 1 (the first step's start is not "
                               "visible from outside the script)")
        if self.period_s <= 0:
            raise TraceapError("--period must be above 0 seconds")
        if self.activities is not None:
            bad = [a for a in self.activities if a not in ACTIVITIES]
            if bad or not self.activities:
                raise TraceapError(f"--activities: {', '.join(bad) or 'nothing given'} not "
                                   f"known; use {', '.join(ACTIVITIES)} separated by commas")

    def child_settings(self, state: Path) -> dict:
        """The TRACEAP_PROFILE object the recorder reads."""
        return {"out": str(Path(self.out).resolve()), "state": str(state),
                "steps": self.steps, "skip": self.skip,
                "activities": list(self.activities) if self.activities else "auto",
                "with_stack": self.with_stack, "exit_after": self.exit_after,
                "period_s": self.period_s}


@dataclass
class ProfileRun:
    """What one profiled run left: its exit code, the traces, and each process's record."""

    command: list[str]
    exit_code: int
    out: Path
    traces: list[Path]
    records: list[dict]
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: the output folder's stamp: `owned.add([...])` records files written after the run
    owned: Claim | None = None
    #: the signal (SIGINT, SIGTERM) that asked traceap to stop while the command ran, or None
    stopped_by: int | None = None

    @property
    def sources(self) -> set[str]:
        """Step sources the recorded traces used: optimizer, dataloader, time."""
        return {r["source"] for r in self.records if r.get("trace") and r.get("source")}

    @property
    def cpu_only(self) -> bool:
        """True when no trace recorded GPU activity (cuda/xpu)."""
        acts = [set(r.get("activities") or ()) for r in self.records if r.get("trace")]
        return bool(acts) and not any(a - {"cpu"} for a in acts)

    @property
    def stopped_by_traceap(self) -> bool:
        """True when --exit-after stopped a process of the command after its trace."""
        return any(r.get("stopped_by_traceap") for r in self.records)


def steps_text(first: int, n: int) -> str:
    """'steps 2-4', or 'step 2' for one step (never 'steps 2-2')."""
    return f"steps {first}-{first + n - 1}" if n > 1 else f"step {first}"


def default_out(command: list[str]) -> Path:
    """traceap-profile/<script>-<date-time>: a fresh folder per run, so runs never mix."""
    script = next((Path(a).stem for a in command[1:] if a.endswith(".py")),
                  Path(command[0]).name if command else "run")
    return Path("traceap-profile") / f"{script}-{time.strftime('%Y%m%d-%H%M%S')}"


#: What owns a profile output folder (traceap.outputs): a folder is one run, so an earlier
#: run's folder needs --overwrite, which replaces only the files that run wrote.
OWNER = Owner("profile", STAMP, STAMP_SCHEMA, rerun="overwrite", foreign_ok=True)


def prepare_out(cfg: ProfileConfig, reports: tuple[str, ...] = ()) -> Claim:
    """Check the output folder before the command starts (traceap.outputs.claim).

    A folder an earlier profile run wrote is refused unless --overwrite, which replaces that
    run's traces and report only.  Traces profile did not write are never deleted: without
    --overwrite they stop the run (the folder would mix two runs for `traceap analyze DIR`),
    with it the new traces go beside them.  `reports` are the files written after the run
    (report.html): one profile did not write stops the run."""
    out = Path(cfg.out)
    owned = claim(out, OWNER, {"steps": cfg.steps, "skip": cfg.skip}, planned=reports,
                  overwrite=cfg.overwrite)
    theirs = [p.name for p in sorted(out.glob(TRACE_GLOB)) if p.name not in owned.previous]
    if theirs and not cfg.overwrite:
        raise OutputError(f"--out {out}: holds {len(theirs)} trace(s) traceap profile did not "
                          f"write (a folder is one run): pick another --out, or --overwrite to "
                          f"record beside them (nothing there is deleted)")
    if theirs:
        owned.notes.append(f"kept {len(theirs)} trace(s) traceap profile did not write in {out} "
                           f"(traceap analyze {out} reads them too)")
    return owned


def child_env(cfg: ProfileConfig, state: Path, base: dict | None = None) -> dict:
    """The command's environment: the bootstrap first on PYTHONPATH, the settings in
    TRACEAP_PROFILE, and no stale marker of an outer profiled run."""
    env = dict(os.environ if base is None else base)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(BOOTSTRAP) + (os.pathsep + path if path else "")
    env[ENV] = json.dumps(cfg.child_settings(state))
    env.pop(TOP_ENV, None)
    return env


def run(command: list[str], cfg: ProfileConfig, on_start=None,
        reports: tuple[str, ...] = ()) -> ProfileRun:
    """Run `command` with the recorder switched on; wait for it; gather its traces.

    `on_start()` is called once the inputs are checked, just before the command starts;
    `reports` are files the caller writes into the folder afterwards (`ProfileRun.owned.add`)."""
    if not command:
        raise TraceapError("give the command to profile after --, e.g. "
                           "traceap profile -- python train.py")
    cfg.validate()
    exe = shutil.which(command[0])
    if exe is None:
        raise TraceapError(f"{command[0]}: command not found")
    owned = prepare_out(cfg, reports)
    if on_start is not None:
        on_start()
    out = Path(cfg.out)
    owned.begin()
    before = {p.name for p in out.glob(TRACE_GLOB)}
    state = Path(tempfile.mkdtemp(prefix="traceap-profile-"))
    try:
        t0 = time.perf_counter()
        code, stop = _wait(command, child_env(cfg, state))
        seconds = time.perf_counter() - t0
        records = _read_records(state)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    traces = [out / r["trace"] for r in records if r.get("trace") and (out / r["trace"]).exists()]
    known = {p.name for p in traces}
    # A process killed before its record was written still leaves its trace: keep it.
    stray = [p for p in sorted(out.glob(TRACE_GLOB)) if p.name not in known | before]
    # ... unless it was killed while writing it: a truncated file is not left as a trace.
    cut = [p for p in stray if not p.name.endswith(".gz") or not complete_gzip(p)]
    for p in cut:
        p.unlink(missing_ok=True)
    stray = [p for p in stray if p not in cut]
    traces += stray
    # Only now go the traces of an earlier run (--overwrite): this run's are in place.
    notes = owned.finish(p.name for p in traces)
    if stray:
        notes.append(f"{len(stray)} trace(s) without a process record (the process was killed "
                     f"before it could report): {', '.join(p.name for p in stray)}")
    if cut:
        notes.append(f"removed {len(cut)} trace(s) a process was killed while writing "
                     f"(incomplete): {', '.join(p.name for p in cut)}")
    return ProfileRun(list(command), code, out, traces, records, seconds, notes, owned, stop)


def _wait(command: list[str], env: dict) -> tuple[int, int | None]:
    """Run the command in the foreground; return (its exit code, the stop signal traceap got).

    Ctrl-C reaches the command itself (same process group); traceap only notes it.  SIGTERM
    (`timeout`, a batch system, `kill`) is passed on to the command.  Either way traceap waits
    for the command to end, so that what it wrote can be gathered and checked."""
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise TraceapError(f"{command[0]}: cannot run: {exc.strerror or exc}") from None
    got: list[int] = []

    def on_int(signum, frame) -> None:
        got.append(signum)

    def on_term(signum, frame) -> None:
        got.append(signum)
        proc.send_signal(signum)

    old_int = signal.signal(signal.SIGINT, on_int)
    old_term = signal.signal(signal.SIGTERM, on_term)
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
    return (128 - code if code < 0 else code), (got[0] if got else None)


def complete_gzip(path: Path) -> bool:
    """True when `path` is a whole gzip stream (a process killed while writing its trace
    leaves a truncated one)."""
    import zlib

    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                d.decompress(chunk, 0)
                if d.eof:
                    break
    except (OSError, zlib.error):
        return False
    return d.eof


def _read_records(state: Path) -> list[dict]:
    records = []
    for f in sorted(state.glob("*.json")):
        try:
            records.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    records.sort(key=lambda r: (r.get("rank") is None, r.get("rank") or 0, r.get("pid", 0)))
    return records


def describe(run_: ProfileRun, cfg: ProfileConfig) -> list[str]:
    """What happened, in sentences: step source per process, partial or missing recordings."""
    lines: list[str] = []
    first, last = cfg.skip + 1, cfg.skip + cfg.steps
    for r in run_.records:
        who = (f"rank {r['rank']}" if r.get("rank") is not None else
               f"process {r['pid']}")
        if r.get("error"):
            lines.append(f"{who}: profiling stopped: {r['error']}")
        src = r.get("source")
        if r.get("trace"):
            n = r.get("steps_recorded", 0)
            what = {"optimizer": "optimizer steps", "dataloader": "DataLoader batches",
                    "time": f"time-based steps of {r.get('period_s', cfg.period_s):g} s"}.get(
                        src, src)
            steps = steps_text(first, n) if n else f"part of step {first}"
            lines.append(f"{who}: recorded {steps} ({n} of {cfg.steps}, marked by {what}) -> "
                         f"{r['trace']}")
            if src == "time":
                lines.append(f"{who}: no optimizer step and no DataLoader batch happened, so "
                             f"traceap used a time-based schedule: each 'step' is "
                             f"{r.get('period_s', cfg.period_s):g} s of the run, not a training "
                             f"iteration (--period sets it)")
            if n < cfg.steps:
                lines.append(f"{who}: the process ended before step {last} finished; the "
                             f"trace holds {n} complete step(s)")
        elif r.get("role") in ("main", "rank"):
            seen = (f"{r.get('optimizer_steps', 0)} optimizer step(s), "
                    f"{r.get('batches', 0)} DataLoader batch(es)")
            lines.append(f"{who}: nothing recorded: {seen}, fewer than the {cfg.skip} skipped "
                         f"+ 1; and it ended before a time-based recording could finish "
                         f"(try a smaller --skip or --period)")
        lines.extend(f"{who}: {n}" for n in r.get("notes") or ())
    if not run_.records:
        lines.append("no Python process of the command imported torch with the recorder on "
                     "(is the command a Python program using torch? `python -S`/`-I`/`-E` and "
                     "interpreters that ignore PYTHONPATH cannot be profiled from outside)")
    return lines + run_.notes


__all__ = ["BOOTSTRAP", "DEFAULT_PERIOD_S", "DEFAULT_SKIP", "DEFAULT_STEPS", "ProfileConfig",
           "ProfileRun", "child_env", "default_out", "describe", "prepare_out", "run"]
