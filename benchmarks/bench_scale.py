"""Scale: a job of many ranks analysed in 1 process, in N local worker processes and on Ray.

Builds large jobs from real ranks (default: the 8 DLRM ranks of facebookresearch/param in the
shared set, else the 2 bundled in tests/data/dlrm_job).  Rank ``r`` of an n-rank job is a copy
of source rank ``r mod 8`` rewritten so that it is a rank of its own and not a copy: its
``distributedInfo`` says rank r of n, the CPU process and thread ids are renumbered, its clock
is shifted by ``r x 7 us``, and correlation / flow / External ids are offset per rank (the
replay of ``make_large_trace.py``).  ``--copies K`` replays each rank's profiled steps K times
back to back (longer profiles: bigger ranks).  Ranks are plain JSON.

Each case is a fresh process that calls ``analyze_job`` (the work of ``traceap analyze DIR``):

* ``serial``: ``workers=1``, this process reads and analyses rank after rank;
* ``local``: ``workers=N`` processes (forkserver; started by the call, timed);
* ``ray``: Ray tasks on an instance started before the timer (a running cluster), N CPUs;
  starting a local instance (``--ray`` on the command line) is timed separately.

Reported per case: wall seconds of the call, CPU seconds per rank (in the workers), the peak
RSS of the parent process and the largest peak RSS of a worker, and whether the job JSON is
byte-identical to the serial one.  Ratios are to the serial case of the same size, measured
in the same run (interleaved rounds, medians).  Then the rates per MB of trace from a small-
and a big-rank job, and the extrapolation to 1,000 ranks x 500 MB.

    nice .venv/bin/python benchmarks/bench_scale.py                       # 8, 64, 512 ranks
    nice .venv/bin/python benchmarks/bench_scale.py --ranks 8 --repeat 5 --copies-big 16
    nice .venv/bin/python benchmarks/bench_scale.py --ranks 8 --modes serial,local   # no Ray

Output: a Markdown report on stdout and in benchmarks/out/scale/bench_scale.md, the numbers in
benchmarks/out/scale/bench_scale.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from make_large_trace import Replicator, read_trace  # noqa: E402

SHARED_DLRM = Path(os.environ.get("TRACEAP_SHARED", ROOT.parent / "shared")) / "traces" / \
    "facebookresearch__param"
BUNDLED_DLRM = ROOT / "tests" / "data" / "dlrm_job"
OUT = ROOT / "benchmarks" / "out" / "scale"
#: Clock offset between consecutive ranks (a few us, as NTP-synchronised hosts differ).
RANK_SKEW_US = 7
#: Offset added to CPU process / thread ids per rank (above any Linux pid, 2**22).
PID_STEP = 10_000_000
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}


# -- building a job ---------------------------------------------------------------------------------
def sources() -> list[Path]:
    """The real ranks jobs are built from."""
    files = sorted(SHARED_DLRM.glob("dlrm_kineto*worker*.json.gz"))
    return files if len(files) == 8 else sorted(BUNDLED_DLRM.glob("*.json.gz"))


class RankMaker:
    """Rank ``r`` of an n-rank job from one real rank, with ``copies`` replays of its steps."""

    def __init__(self, path: Path, copies: int):
        self.doc = read_trace(path)
        self.rep = Replicator(self.doc)
        self.copies = copies
        gpu = {e.get("pid") for e in self.rep.events if e.get("cat") in GPU_CATS}
        self.cpu_pids = {e.get("pid") for e in self.doc["traceEvents"]
                         if isinstance(e.get("pid"), int)} - gpu

    def write(self, out: Path, rank: int, world: int) -> int:
        """Write the rank as plain JSON; returns its size in bytes."""
        head = {k: v for k, v in self.doc.items() if k != "traceEvents"}
        head["distributedInfo"] = {**(head.get("distributedInfo") or {}), "rank": rank,
                                   "world_size": world}
        # Copy c of the replay for rank r is replay number r * copies + c: every id block is
        # its own (ids never collide across ranks), then the time shift of the earlier ranks'
        # blocks is taken back out, so ranks overlap in time, RANK_SKEW_US apart.
        base = rank * self.copies
        back = base * self.rep.period - rank * RANK_SKEW_US
        events = [self._renumber(dict(e), rank) for e in self.rep.meta_events]
        for c in range(self.copies):
            for e in self.rep.copy(base + c):
                e = self._renumber(dict(e), rank)
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] = round(e["ts"] - back, 3)
                events.append(e)
        data = orjson.dumps({**head, "traceEvents": events})
        out.write_bytes(data)
        return len(data)

    def _renumber(self, e: dict, rank: int) -> dict:
        if e.get("pid") in self.cpu_pids:
            off = (rank + 1) * PID_STEP
            e["pid"] = e["pid"] + off
            if isinstance(e.get("tid"), int):
                e["tid"] = e["tid"] + off
        return e


def build_job(n_ranks: int, copies: int, out_root: Path = OUT) -> tuple[Path, dict]:
    """The n-rank job folder (built once, then reused) and what it holds."""
    folder = out_root / f"job_{n_ranks}x{copies}"
    meta_path = out_root / f"job_{n_ranks}x{copies}.meta.json"   # beside: not a rank file
    if meta_path.is_file():
        return folder, json.loads(meta_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    srcs = sources()
    makers = [RankMaker(p, copies) for p in srcs]
    t0 = time.perf_counter()
    sizes = [makers[r % len(makers)].write(folder / f"rank{r:04d}.pt.trace.json", r, n_ranks)
             for r in range(n_ranks)]
    meta = {"ranks": n_ranks, "copies": copies, "sources": [str(p) for p in srcs],
            "bytes": sum(sizes), "mb_per_rank": round(statistics.mean(sizes) / 1e6, 3),
            "events_per_rank": round(statistics.mean(
                len(m.rep.events) * copies + len(m.rep.meta_events) for m in makers)),
            "build_s": round(time.perf_counter() - t0, 1)}
    meta_path.write_text(json.dumps(meta, indent=2))
    return folder, meta


# -- one case, in a fresh process ---------------------------------------------------------------------
def case(folder: str, mode: str, workers: int, windows: int) -> dict:
    """Run one analysis (in this process; called through `--case`) and describe it."""
    import resource

    t_start = time.perf_counter()
    from traceap.job import analyze_job
    from traceap.parallel import peak_rss_bytes

    ray_start_s = None
    kwargs = {}
    if mode == "local":
        kwargs["workers"] = workers
    elif mode == "ray":
        import logging

        import ray
        t = time.perf_counter()
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR)
        ray_start_s = time.perf_counter() - t
        kwargs["ray"] = "local"          # joins the instance started above
    imported = time.perf_counter()
    job = analyze_job(folder, n_windows=windows, **kwargs)
    wall = time.perf_counter() - imported
    parent_peak = peak_rss_bytes()   # the analysis' own, before the report is serialised
    data = orjson.dumps(job.to_json(), option=orjson.OPT_SERIALIZE_NUMPY)
    import pickle
    result_bytes = statistics.mean(len(pickle.dumps(a)) for a in job.ranks)
    out = {"mode": mode, "workers": workers if mode != "serial" else 1, "wall_s": wall,
           "process_s": time.perf_counter() - t_start, "ranks": len(job.ranks),
           "cpu_s_per_rank": statistics.median(job.run["rank_cpu_seconds"]),
           "wall_s_per_rank": statistics.median(job.run["rank_seconds"]),
           "parent_peak_rss": parent_peak, "unreadable": len(job.unreadable),
           "worker_peak_rss": job.run["worker_peak_rss_bytes"],
           "children_peak_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
           "result_bytes_per_rank": result_bytes,
           "json_sha": hashlib.sha1(data).hexdigest(), "findings": len(job.findings),
           "ray_start_s": ray_start_s}
    if mode == "ray":
        import ray
        t = time.perf_counter()
        ray.shutdown()
        out["ray_stop_s"] = time.perf_counter() - t
    return out


def run_case(folder: Path, mode: str, workers: int, windows: int) -> dict:
    """`case` in a fresh interpreter (imports, forkserver and Ray start as a user meets them)."""
    env = dict(os.environ, TRACEAP_PROGRESS="0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src")] +
                                        [p for p in [env.get("PYTHONPATH")] if p])
    p = subprocess.run([sys.executable, __file__, "--case", str(folder), mode, str(workers),
                        str(windows)], capture_output=True, text=True, env=env)
    if p.returncode:
        raise SystemExit(f"case {mode} on {folder} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# -- the command, as a user runs it -------------------------------------------------------------------
def idle_share(seconds: float = 1.0) -> float:
    """Fraction of the machine's CPU time left idle over the next `seconds` (/proc/stat)."""
    def read():
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        return v[3] + v[4], sum(v)
    i0, t0 = read()
    time.sleep(seconds)
    i1, t1 = read()
    return (i1 - i0) / max(t1 - t0, 1)


def command_check(folder: Path, workers: int, rounds: int, quiet_share: float,
                  wait_max_s: float) -> dict:
    """`traceap analyze DIR -q --json OUT` against the same with --workers N: whole commands,
    interleaved; before each pair, wait (up to `wait_max_s`) until at least `quiet_share` of
    the CPUs sat idle for a second, so the pair meets a quiet-ish machine."""
    env = dict(os.environ, TRACEAP_PROGRESS="0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src")] +
                                        [p for p in [env.get("PYTHONPATH")] if p])
    out = {"serial": [], "workers": [], "load_avg": [], "idle_before": []}
    for _ in range(rounds):
        deadline = time.time() + wait_max_s
        idle = idle_share()
        while idle < quiet_share and time.time() < deadline:
            time.sleep(5)
            idle = idle_share()
        out["idle_before"].append(round(idle, 2))
        out["load_avg"].append(os.getloadavg()[0])
        for key, extra in (("serial", []), ("workers", ["--workers", str(workers)])):
            t = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "traceap", "analyze", str(folder), "-q",
                                "--json", os.devnull, *extra], env=env, capture_output=True,
                               text=True)
            if p.returncode:
                raise SystemExit(f"traceap analyze failed:\n{p.stderr[-2000:]}")
            out[key].append(time.perf_counter() - t)
    s, w = statistics.median(out["serial"]), statistics.median(out["workers"])
    out |= {"serial_median_s": s, "workers_median_s": w, "ratio": w / s,
            "pair_ratios": [b / a for a, b in zip(out["serial"], out["workers"])]}
    return out


# -- the report -------------------------------------------------------------------------------------
def _mb(b: float) -> str:
    return f"{b / 1e6:.0f} MB"


def summarise(rows: list[dict]) -> dict:
    """Medians over the rounds of one (size, mode)."""
    keys = ("wall_s", "process_s", "cpu_s_per_rank", "wall_s_per_rank", "parent_peak_rss",
            "worker_peak_rss", "result_bytes_per_rank")
    out = {k: statistics.median(r[k] for r in rows) for k in keys}
    out["rounds"] = len(rows)
    out["json_shas"] = sorted({r["json_sha"] for r in rows})
    starts = [r["ray_start_s"] for r in rows if r.get("ray_start_s") is not None]
    out["ray_start_s"] = statistics.median(starts) if starts else None
    return out


def fit_line(x1: float, y1: float, x2: float, y2: float) -> tuple[float, float]:
    """(intercept, slope) through two points."""
    slope = (y2 - y1) / (x2 - x1) if x2 != x1 else 0.0
    return y1 - slope * x1, slope


def extrapolate(small: dict, big: dict, node_cpus: int, node_mem_gb: float,
                target_min: float) -> tuple[dict, list[str]]:
    """1,000 ranks x 500 MB from the per-rank CPU time and worker memory at two rank sizes."""
    a, b = fit_line(small["mb"], small["cpu_s_per_rank"], big["mb"], big["cpu_s_per_rank"])
    m0, c = fit_line(small["mb"], small["worker_peak_rss"] / 1e6, big["mb"],
                     big["worker_peak_rss"] / 1e6)
    mb, ranks = 500.0, 1000
    t_rank = a + b * mb                              # CPU s of one core for one rank
    mem_worker = m0 + c * mb                         # MB of one worker while it has a rank
    per_node = max(1, min(node_cpus, int(0.8 * node_mem_gb * 1e3 // mem_worker)))
    core_hours = ranks * t_rank / 3600
    one_node_h = math.ceil(ranks / per_node) * t_rank / 3600
    nodes = max(1, math.ceil(ranks * t_rank / (per_node * target_min * 60)))
    wall_min = math.ceil(ranks / (nodes * per_node)) * t_rank / 60
    driver_mb = ranks * big["result_bytes_per_rank"] / 1e6
    numbers = {"cpu_s_per_rank_intercept": a, "cpu_s_per_mb": b, "worker_mb_base": m0,
               "worker_mb_per_trace_mb": c, "t_rank_500mb_s": t_rank,
               "worker_mem_500mb_gb": mem_worker / 1e3, "workers_per_node": per_node,
               "core_hours": core_hours, "one_node_hours": one_node_h, "nodes": nodes,
               "wall_min_on_nodes": wall_min, "driver_results_mb": driver_mb}
    lines = [
        f"Rates (fitted through the {small['mb']:.1f} MB and {big['mb']:.1f} MB ranks, CPU "
        f"seconds in the workers, peak RSS of one worker):",
        f"- time per rank = {a:.2f} s + {b:.3f} s/MB x size; worker memory = {m0:.0f} MB + "
        f"{c:.2f} x size.",
        f"- One 500 MB rank: {t_rank:.0f} CPU s ({t_rank / 60:.1f} min) and "
        f"{mem_worker / 1e3:.1f} GB in its worker.",
        f"- 1,000 ranks x 500 MB: {core_hours:.0f} core-hours of analysis.  A node with "
        f"{node_cpus} cores and {node_mem_gb:.0f} GB runs {per_node} workers at once "
        f"(cores, and 80% of memory / {mem_worker / 1e3:.1f} GB): {one_node_h:.1f} h on one "
        f"node; {nodes} such nodes finish in about {wall_min:.0f} min "
        f"(target {target_min:.0f} min; `traceap analyze DIR --ray-address auto`).",
        f"- Memory per node: {per_node} x {mem_worker / 1e3:.1f} GB = "
        f"{per_node * mem_worker / 1e3:.0f} GB; the driver keeps only the per-rank results, "
        f"about {big['result_bytes_per_rank'] / 1e3:.0f} KB each, {driver_mb:.0f} MB for "
        f"1,000 ranks (+ its own ~{big['parent_peak_rss'] / 1e6:.0f} MB).",
        "- On paper only: linear in size (as `traceap.load` is: 1.4-1.65x the file in memory, "
        "benchmarks/README.md); reading 500 GB from shared storage adds its own time "
        "(at 1 GB/s per node, 500 GB / nodes).",
    ]
    return numbers, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", nargs=4, metavar=("DIR", "MODE", "WORKERS", "WINDOWS"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--ranks", default="8,64,512", help="job sizes (ranks), comma-separated")
    ap.add_argument("--copies", type=int, default=1, help="replays per rank for the job sizes")
    ap.add_argument("--copies-big", type=int, default=64,
                    help="replays per rank for the big-rank job (8 ranks) that gives the per-MB "
                         "rates; 0 = skip")
    ap.add_argument("--modes", default="serial,local,ray")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--windows", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3,
                    help="interleaved rounds for jobs of up to --repeat-below ranks")
    ap.add_argument("--repeat-below", type=int, default=16)
    ap.add_argument("--node-cpus", type=int, default=32)
    ap.add_argument("--node-mem-gb", type=float, default=256)
    ap.add_argument("--target-min", type=float, default=30,
                    help="wall time the extrapolation sizes the cluster for")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--command-rounds", type=int, default=0,
                    help="also time the whole `traceap analyze DIR` command, serial against "
                         "--workers N, this many interleaved rounds on each 8-rank job")
    ap.add_argument("--quiet-share", type=float, default=0.5,
                    help="before each command pair, wait for this idle share of the CPUs")
    ap.add_argument("--wait-max-s", type=float, default=120)
    args = ap.parse_args(argv)
    if args.case:
        folder, mode, workers, windows = args.case
        print(json.dumps(case(folder, mode, int(workers), int(windows))))
        return 0

    modes = [m for m in args.modes.split(",") if m]
    if "ray" in modes:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("bench_scale: Ray is not installed (pip install traceap[ray]); no Ray cases",
                  file=sys.stderr)
            modes.remove("ray")
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(int(n), args.copies) for n in args.ranks.split(",") if n]
    if args.copies_big:
        jobs.append((8, args.copies_big))
    load_start = os.getloadavg()
    results: dict = {"machine": {"cpus": os.cpu_count(), "load_avg_start": load_start,
                                 "python": sys.version.split()[0]},
                     "settings": vars(args) | {"out": str(args.out), "modes": modes}, "jobs": []}
    lines = ["# bench_scale", ""]
    for n, copies in jobs:
        folder, meta = build_job(n, copies, args.out)
        rounds = args.repeat if n <= args.repeat_below else 1
        raw: dict[str, list] = {m: [] for m in modes}
        for _ in range(rounds):
            for m in modes:
                raw[m].append(run_case(folder, m, args.workers, args.windows))
                print(f"  {n} ranks x{copies} {m}: {raw[m][-1]['wall_s']:.1f} s", file=sys.stderr)
        summ = {m: summarise(rows) for m, rows in raw.items()}
        results["jobs"].append({"meta": meta, "cases": summ, "raw": raw})
        base = summ["serial"]
        lines += [f"## {n} ranks, {meta['mb_per_rank']:.2f} MB each "
                  f"({meta['events_per_rank']} events; {copies} replay(s) of a real DLRM rank), "
                  f"medians of {rounds} interleaved round(s)", "",
                  "| mode | wall s | x serial | CPU s/rank | parent peak RSS | worker peak RSS "
                  "| same JSON |", "|---|---|---|---|---|---|---|"]
        for m, s in summ.items():
            same = s["json_shas"] == base["json_shas"] and len(s["json_shas"]) == 1
            label = {"serial": "1 process", "local": f"{args.workers} local workers",
                     "ray": f"Ray, {args.workers} CPUs (running)"}[m]
            lines.append(f"| {label} | {s['wall_s']:.2f} | {s['wall_s'] / base['wall_s']:.2f} "
                         f"| {s['cpu_s_per_rank']:.3f} | {_mb(s['parent_peak_rss'])} | "
                         f"{_mb(s['worker_peak_rss'])} | {'yes' if same else 'NO'} |")
        if args.command_rounds and n == 8:
            chk = command_check(folder, args.workers, args.command_rounds, args.quiet_share,
                                args.wait_max_s)
            results["jobs"][-1]["command"] = chk
            lines.append(
                f"\nWhole command `traceap analyze DIR -q --json OUT`, {args.command_rounds} "
                f"interleaved pairs: serial {chk['serial_median_s']:.2f} s, --workers "
                f"{args.workers} {chk['workers_median_s']:.2f} s (median), ratio "
                f"**{chk['ratio']:.2f}x** (pairs: "
                f"{', '.join(f'{r:.2f}' for r in chk['pair_ratios'])}; idle CPU share before "
                f"each pair {chk['idle_before']}, load average {chk['load_avg']}).")
        if "ray" in summ and summ["ray"]["ray_start_s"] is not None:
            lines.append(f"\nStarting the local Ray instance (not in the times above; "
                         f"`--ray` pays it once per command): {summ['ray']['ray_start_s']:.1f} s.")
        lines.append("")
    if args.copies_big and "local" in modes:
        small = next(j for j in results["jobs"] if j["meta"]["ranks"] == 8
                     and j["meta"]["copies"] == args.copies)
        big = results["jobs"][-1]
        pts = []
        for j in (small, big):
            c = j["cases"]["local"]
            pts.append({"mb": j["meta"]["mb_per_rank"], "cpu_s_per_rank": c["cpu_s_per_rank"],
                        "worker_peak_rss": c["worker_peak_rss"],
                        "result_bytes_per_rank": c["result_bytes_per_rank"],
                        "parent_peak_rss": c["parent_peak_rss"]})
        numbers, text = extrapolate(pts[0], pts[1], args.node_cpus, args.node_mem_gb,
                                    args.target_min)
        results["extrapolation"] = numbers
        lines += ["## 1,000 ranks x 500 MB, on paper", ""] + text + [""]
    results["machine"]["load_avg_end"] = os.getloadavg()
    lines.append(f"Machine: {os.cpu_count()} CPUs shared with other users, load average "
                 f"{load_start[0]:.1f} at the start, {results['machine']['load_avg_end'][0]:.1f} "
                 f"at the end; Python {results['machine']['python']}.")
    report = "\n".join(lines)
    print(report)
    (args.out / "bench_scale.md").write_text(report + "\n")
    (args.out / "bench_scale.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
