"""Pattern accuracy of the LLM classifier against the offline classifier (paper Table 4).

On the test splits of a dataset (docs/FORMATS.md), take windows that truly hold an anti-pattern
(`window_patterns`), a seeded sample per task, and ask both classifiers to name the pattern,
as the paper does: the window is known to be anomalous, only the name is asked.  Prints per
task: windows, offline accuracy, LLM accuracy (strict: a fallback counts as wrong), the
system's accuracy (LLM with its offline fallback), fallbacks, seconds per window.

    python benchmarks/llm_accuracy.py --model qwen1.5b --per-task 8          # starts llama.cpp
    python benchmarks/llm_accuracy.py --url http://127.0.0.1:8000/v1 --per-task 20
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from traceap.classify.llm import LLMClassifier  # noqa: E402
from traceap.llm.backend import OpenAIBackend  # noqa: E402
from traceap.classify.offline import OfflineClassifier  # noqa: E402
from traceap.manifest import read_manifest, trace_path, window_patterns  # noqa: E402
from traceap.load import load  # noqa: E402
from traceap.windows import Windows  # noqa: E402


def sample_windows(dataset: Path, n_windows: int, per_task: int, seed: int,
                   max_per_trace: int) -> dict[str, list[tuple]]:
    """Per task: [(entry, windows, window index, true pattern)], a seeded sample of anomalous
    windows, stratified by pattern (round-robin over the patterns present in the task), since
    one pattern dominates the anomalies of a generated test split."""
    rng = random.Random(seed)
    entries = [e for e in read_manifest(dataset) if e.split != "train" and e.anomalies]
    by_task: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for e in entries:
        w = Windows(load(trace_path(dataset, e)), n_windows)
        cands = [(i, p) for i, p in enumerate(window_patterns(e, w)) if p]
        rng.shuffle(cands)
        per_pattern: dict[str, int] = defaultdict(int)
        for i, p in cands:
            if per_pattern[p] < max_per_trace:
                per_pattern[p] += 1
                by_task[e.task][p].append((e, w, i, p))
    out: dict[str, list[tuple]] = {}
    for task, pools in sorted(by_task.items()):
        for pool in pools.values():
            rng.shuffle(pool)
        picked: list[tuple] = []
        order = sorted(pools)
        rng.shuffle(order)
        while len(picked) < per_task and any(pools.values()):
            for p in order:
                if pools[p] and len(picked) < per_task:
                    picked.append(pools[p].pop())
        out[task] = picked
    return out


def run(args) -> dict:
    samples = sample_windows(Path(args.dataset), args.windows, args.per_task, args.seed,
                             args.max_per_trace)
    n_total = sum(len(v) for v in samples.values())
    print(f"{n_total} truly anomalous windows from {args.dataset} "
          f"({', '.join(f'{t} {len(v)}' for t, v in samples.items())}), N = {args.windows}")
    backend = OpenAIBackend(args.url, args.llm_model, timeout_s=args.timeout) if args.url else None
    llm = LLMClassifier(backend or "none", max_tokens=args.max_tokens,
                        assume_anomalous=not args.allow_none)
    offline = OfflineClassifier()
    # Round-robin over tasks, so that a time budget cut leaves every task sampled alike.
    queue = [(task, v[k]) for k in range(max((len(v) for v in samples.values()), default=0))
             for task, v in samples.items() if k < len(v)]
    per_window: list[dict] = []
    t_start = time.perf_counter()
    for task, (e, w, i, truth) in queue:
        if args.budget_s and time.perf_counter() - t_start > args.budget_s:
            print(f"time budget of {args.budget_s:.0f} s spent: stopping after "
                  f"{len(per_window)} windows")
            break
        off = offline.classify(w, [i], np.zeros(w.n))[0]
        t0 = time.perf_counter()
        c = llm.classify(w, [i], np.zeros(w.n))[0]
        sec = time.perf_counter() - t0
        rec = llm.records[-1]
        per_window.append({"task": task, "trace": e.id, "window": i, "truth": truth,
                           "offline": off.pattern,
                           "llm": (c.pattern or "none") if c.source == "llm" else None,
                           "source": c.source, "seconds": round(sec, 2), "errors": rec.errors,
                           "reply": rec.replies[-1] if rec.replies else None})
        print(f"  {task:20s} {e.id:22s} w{i:<3d} truth {truth:27s} offline "
              f"{str(off.pattern):27s} llm {per_window[-1]['llm'] or '(fallback)':27s} "
              f"{sec:.1f}s", flush=True)

    def row(rs: list[dict]) -> dict:
        n = max(len(rs), 1)
        return {"windows": len(rs),
                "offline": sum(r["offline"] == r["truth"] for r in rs) / n,
                "llm": sum(r["llm"] == r["truth"] for r in rs) / n,
                "system": sum((r["llm"] if r["source"] == "llm" else r["offline"]) == r["truth"]
                              for r in rs) / n,
                "fallbacks": sum(r["source"] != "llm" for r in rs),
                "sec_per_window": float(np.mean([r["seconds"] for r in rs] or [0]))}

    rows = {task: row([r for r in per_window if r["task"] == task]) for task in samples}
    rows["all"] = row(per_window)
    allw = per_window
    by_pattern: dict[str, list[dict]] = defaultdict(list)
    for r in allw:
        by_pattern[r["truth"]].append(r)
    print(f"\n{'true pattern':28s} {'n':>4s} {'offline':>8s} {'llm':>8s}")
    for p, rs in sorted(by_pattern.items()):
        print(f"{p:28s} {len(rs):4d} {100 * np.mean([r['offline'] == p for r in rs]):7.1f}% "
              f"{100 * np.mean([r['llm'] == p for r in rs]):7.1f}%")
    name = args.label or (backend.model if backend else "no LLM (offline only)")
    print(f"\nmodel: {name}, {'none allowed' if args.allow_none else 'window known anomalous'}"
          f"   (paper Table 4, GPT-4.1: 75.6-78.9%)")
    print(f"{'task':22s} {'n':>4s} {'offline':>8s} {'llm':>8s} {'llm+fb':>8s} {'llm/off':>8s} "
          f"{'fallbk':>7s} {'s/window':>9s}")
    for task, r in rows.items():
        ratio = r["llm"] / r["offline"] if r["offline"] else float("nan")
        print(f"{task:22s} {r['windows']:4d} {100 * r['offline']:7.1f}% {100 * r['llm']:7.1f}% "
              f"{100 * r['system']:7.1f}% {ratio:8.2f} {r['fallbacks']:7d} "
              f"{r['sec_per_window']:9.1f}")
    return {"model": name, "n_windows": args.windows, "tasks": rows,
            "per_window": per_window}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default=str(REPO / "datasets" / "torchtraceap"))
    ap.add_argument("--windows", type=int, default=100)
    ap.add_argument("--per-task", type=int, default=8)
    ap.add_argument("--max-per-trace", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--url", help="An OpenAI-compatible server (else --model is served here).")
    ap.add_argument("--llm-model", help="Model name on the server.")
    ap.add_argument("--model", default="qwen1.5b", help="A fetched model to serve with llama.cpp.")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--allow-none", action="store_true",
                    help="Let the LLM answer 'none' (as in analysis); default: the paper's "
                         "Table 4 setting, where the window is known to be anomalous.")
    ap.add_argument("--budget-s", type=float, default=0, help="Stop after this many seconds.")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--offline-only", action="store_true", help="Only the offline classifier.")
    ap.add_argument("--out", help="Write the results (with per-window answers) as JSON here.")
    args = ap.parse_args()
    if args.url or args.offline_only:
        args.url = None if args.offline_only else args.url
        result = run(args)
    else:
        from traceap.llm.setup import running_server
        args.label = args.label or args.model
        with running_server(args.model, threads=args.threads, timeout_s=300) as url:
            args.url = url
            result = run(args)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
