"""Load time and peak memory of `traceap.load`, side by side with the baselines, in one run.

For each trace size (made by `make_large_trace.py` from the bundled real DDP trace) every
loader runs in a fresh subprocess, repeats interleaved, medians reported:

- `orjson`       bare `orjson.loads(bytes)`, the garbage collector on (what a user gets);
- `orjson_nogc`  the same with `gc.disable()` (the fastest a generic JSON parse gets here);
- `json`         stdlib `json.loads(bytes)`;
- `traceap`      `traceap.load(path)`, end to end: reading the file, decoding, columns, links;
- `hta`          HolisticTraceAnalysis `TraceAnalysis(trace_dir=...)`, run by the Python of its
                 own virtual environment (never a traceap dependency).

Time is wall-clock (and CPU seconds, less sensitive to other work on a shared machine).
Peak memory is the RSS high-water mark of the loader's process tree (kernel `ru_maxrss` of the
process and its children, and a 20 ms sampler of the summed tree RSS for HTA's worker
processes), less the RSS before loading (interpreter and imports), divided by the
uncompressed file size.

    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install HolisticTraceAnalysis
    nice .venv/bin/python benchmarks/bench_load.py --sizes 54MB,200MB,1GB

Only the standard library is imported at the top: the same file is the worker in both venvs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOADERS = ("orjson", "orjson_nogc", "json", "traceap", "hta")
_MARK = "BENCH_RESULT "


# -- worker side (runs in a fresh interpreter per measurement) --------------------------------

def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _worker(loader: str, path: str) -> None:
    parse = load = None
    if loader in ("orjson", "orjson_nogc"):
        import orjson
        parse = orjson.loads
    elif loader == "json":
        parse = json.loads
    elif loader == "traceap":
        sys.path.insert(0, str(ROOT / "src"))
        import traceap
        load = traceap.load
    elif loader == "hta":
        from hta.trace_analysis import TraceAnalysis

        def load(p):
            return TraceAnalysis(trace_dir=str(Path(p).parent))
    else:
        raise SystemExit(f"unknown loader {loader}")
    if loader == "orjson_nogc":
        gc.disable()
    base = _rss_mb()
    if parse is not None:
        # The parse of bytes already in memory: "orjson.loads of the same bytes".
        data = Path(path).read_bytes()
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = parse(data)
    else:
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = load(path)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime + rc.ru_utime + rc.ru_stime)
    peak = max(r1.ru_maxrss, rc.ru_maxrss) / 1024
    del out
    print(_MARK + json.dumps({"wall_s": wall, "cpu_s": cpu, "base_mb": base, "peak_mb": peak}),
          flush=True)


# -- harness side -----------------------------------------------------------------------------

def _tree_rss_mb(pid: int) -> float:
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) / 1024
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def measure(python: str, loader: str, path: Path, timeout: float) -> dict:
    """One measurement in a fresh process: wall_s, cpu_s, base_mb, peak_mb (or an error)."""
    cmd = [python, str(Path(__file__).resolve()), "--worker", loader, str(path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(ROOT))
    sampled = [0.0]
    done = threading.Event()

    def sample():
        while not done.wait(0.02):
            sampled[0] = max(sampled[0], _tree_rss_mb(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"timeout after {timeout:.0f} s"}
    finally:
        done.set()
        sampler.join()
    lines = [ln for ln in out.splitlines() if ln.startswith(_MARK)]
    if proc.returncode != 0 or not lines:
        tail = (err.strip().splitlines() or ["?"])[-1][:200]
        return {"error": f"exit {proc.returncode}: {tail}"}
    res = json.loads(lines[-1][len(_MARK):])
    res["peak_mb"] = max(res["peak_mb"], sampled[0])
    return res


def _parse_size(text: str) -> int:
    sys.path.insert(0, str(HERE))
    from make_large_trace import parse_size
    return parse_size(text)


def ensure_trace(label: str, out_dir: Path) -> tuple[Path, dict]:
    """benchmarks/out/replay_<label>/rank0.json (a folder, as HTA wants), generated once."""
    path = out_dir / f"replay_{label}" / "rank0.json"
    meta = out_dir / f"replay_{label}.meta.json"  # outside the folder: HTA reads every file
    if not path.exists() or not meta.exists():
        sys.path.insert(0, str(HERE))
        from make_large_trace import DEFAULT_SOURCE, write_large
        print(f"generating {path} ...", file=sys.stderr, flush=True)
        write_large(DEFAULT_SOURCE, path, _parse_size(label), meta_path=meta)
    return path, json.loads(meta.read_text())


def _median(runs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in runs if key in r]
    return statistics.median(vals) if vals else None


def _machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                                capture_output=True).stdout.strip()
    except OSError:
        commit = "?"
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "commit": commit, "load_avg_start": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", nargs=2, metavar=("LOADER", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="54MB,200MB,1GB", help="trace sizes (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per loader and size")
    ap.add_argument("--loaders", default=",".join(LOADERS), help="default %(default)s")
    ap.add_argument("--hta-python", default="/tmp/hta-venv/bin/python",
                    help="Python of the venv with HolisticTraceAnalysis (default %(default)s)")
    ap.add_argument("--skip-above", action="append", default=["hta=300MB", "json=300MB"],
                    metavar="LOADER=SIZE",
                    help="skip a loader on traces larger than SIZE (default: hta and stdlib "
                         "json above 300MB: minutes and many GB each)")
    ap.add_argument("--big-repeats", type=int, default=1,
                    help="runs per loader on traces above 300MB (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--out", type=Path, default=HERE / "out", help="where traces and results go")
    args = ap.parse_args(argv)
    if args.worker:
        _worker(*args.worker)
        return 0

    loaders = [x for x in args.loaders.split(",") if x]
    if "hta" in loaders and not Path(args.hta_python).exists():
        print(f"no {args.hta_python}: HTA skipped (see the docstring to install it)",
              file=sys.stderr)
        loaders.remove("hta")
    skip = {k: _parse_size(v) for k, v in (s.split("=", 1) for s in args.skip_above)}
    machine = _machine()
    results = {"machine": machine, "sizes": []}
    for label in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        path, meta = ensure_trace(label, args.out)
        size = path.stat().st_size
        todo = [ld for ld in loaders if size <= skip.get(ld, float("inf"))]
        repeats = args.repeats if size <= 300e6 else args.big_repeats
        runs: dict[str, list] = {ld: [] for ld in todo}
        for rep in range(repeats):
            for ld in todo:  # interleaved, so drifting load on a shared machine hits all alike
                py = args.hta_python if ld == "hta" else sys.executable
                r = measure(py, ld, path, args.timeout)
                runs[ld].append(r)
                shown = (f"{r['wall_s']:.2f} s, peak {r['peak_mb'] - r['base_mb']:.0f} MB"
                         if "error" not in r else r["error"])
                print(f"  {label} run {rep + 1}/{repeats} {ld:12s} {shown}", file=sys.stderr,
                      flush=True)
        row = {"label": label, "bytes": size, "json_events": meta["n_events_json"],
               "skipped": [ld for ld in loaders if ld not in todo], "loaders": {}}
        for ld, rs in runs.items():
            ok = [r for r in rs if "error" not in r]
            row["loaders"][ld] = {
                "runs": rs, "wall_s": _median(ok, "wall_s"), "cpu_s": _median(ok, "cpu_s"),
                "mem_over_size": (statistics.median((r["peak_mb"] - r["base_mb"]) * 2**20 / size
                                                    for r in ok) if ok else None),
                "peak_mb": _median(ok, "peak_mb"),
                "errors": [r["error"] for r in rs if "error" in r]}
        results["sizes"].append(row)
        print(_table_row_block(row), flush=True)
    machine["load_avg_end"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_load.json").write_text(json.dumps(results, indent=1))
    print(_markdown(results))
    return 0


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _table_row_block(row: dict) -> str:
    lines = [f"{row['label']}: {row['bytes'] / 1e6:.0f} MB, {row['json_events']} events"]
    for ld, r in row["loaders"].items():
        if r["wall_s"] is None:
            lines.append(f"  {ld:12s} failed: {'; '.join(r['errors'])}")
            continue
        lines.append(f"  {ld:12s} wall {r['wall_s']:7.2f} s  cpu {r['cpu_s']:7.2f} s  "
                     f"peak-base {r['mem_over_size']:.2f}x file")
    return "\n".join(lines)


def _markdown(results: dict) -> str:
    m = results["machine"]
    out = [f"Commit {m['commit']}, {m['cores']} cores ({m['cpu']}), Python {m['python']}, "
           f"load average {m['load_avg_start'][0]:.1f} at start, "
           f"{m['load_avg_end'][0]:.1f} at end.", "",
           "| trace | events | loader | wall s | CPU s | traceap wall / this | "
           "traceap CPU / this | peak RSS - base, x file |",
           "|---|---|---|---|---|---|---|---|"]
    for row in results["sizes"]:
        t = row["loaders"].get("traceap", {})
        for ld, r in row["loaders"].items():
            if r["wall_s"] is None:
                out.append(f"| {row['bytes'] / 1e6:.0f} MB | {row['json_events']} | {ld} | "
                           f"failed: {'; '.join(r['errors'])} | | | | |")
                continue
            out.append(f"| {row['bytes'] / 1e6:.0f} MB | {row['json_events']} | {ld} | "
                       f"{r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                       f"{_ratio(t.get('wall_s'), r['wall_s'])} | "
                       f"{_ratio(t.get('cpu_s'), r['cpu_s'])} | {r['mem_over_size']:.2f} |")
        if row["skipped"]:
            out.append(f"| {row['bytes'] / 1e6:.0f} MB | | skipped: {', '.join(row['skipped'])}"
                       f" | | | | | |")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
