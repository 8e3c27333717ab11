"""Train model variants on cached features and score them on the validation splits: the
ablations behind "why the model did not transfer to real traces" and the choice of the
shipped configuration (docs/RESULTS.md; history: benchmarks/README.md).

    python benchmarks/transfer_experiments.py --real /work/datasets/real \
        --synth /work/datasets/synth_oldv --out benchmarks/out/transfer.jsonl \
        --run synth_only --run synth_only+names_masked ... [--windows 100] [--epochs 4]

A run is named by `+`-joined recipe parts (see RECIPES): the data (`synth_only`, `real_only`,
`mix`) then config changes.  Every run trains with `traceap.model.train.fit` (trace labels
and patterns only) and is scored, after each epoch, on the `validation` split of the real
dataset and of the synthetic one (window AUC, healthy windows flagged, trace AUC); the best
epoch's numbers are appended as one JSON line.  Features come from the cache
(`--cache`); nothing is read from the test splits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from traceap.manifest import read_manifest
from traceap.model.config import preset
from traceap.model.text import TextEncoder
from traceap.model.train import event_names, examples_from, featurize_entries, fit, pretrain_pool

#: Config changes by name; a run applies them left to right.
RECIPES = {
    "names_masked": {"names_masked": True},
    "no_name_dropout": {"name_dropout": 0.0},
    "name_dropout3": {"name_dropout": 0.3},
    "time_rel": {"time_relative": True},
    "time_rel_only": {"time_relative": True, "time_absolute": False},
    "sum_rel_only": {"summary_absolute": False, "summary_relative": True},
    "sum_extra": {"summary_extra": True},
    "no_platform": {"platform_embedding": False},
    "mean_pool": {"trace_pool": "mean"},
    "topk05": {"topk_fraction": 0.05},
    "topk10": {"topk_fraction": 0.1},
    "topk30": {"topk_fraction": 0.3},
    "pair": {"pair_same_base": 0.5},
    "pair_all": {"pair_same_base": 1.0},
    "relative": {"time_relative": True, "time_absolute": False, "summary_absolute": False,
                 "summary_relative": True, "summary_extra": True, "platform_embedding": False},
    "lr3e-3": {"lr": 3e-3},
    "idle": {"summary_idle": True},
    "host8": {"host_events": 8},
    "host16": {"host_events": 16},
    "n_all": {"windows": (50, 100, 200)},
    "n_100": {"windows": (100,)},
    "win03": {"w_window": 0.3},
    "win1": {"w_window": 1.0},
    "winpat": {"w_window": 1.0, "w_window_pattern": 0.5},
    "ssl150": {"pretrain_steps": 150},
    "ssl300": {"pretrain_steps": 300},
    "ssl600": {"pretrain_steps": 600},
    "seed1": {"seed": 1},
    "seed2": {"seed": 2},
    "seed3": {"seed": 3},
}
DATA = ("synth_only", "real_only", "mix", "mix_real2", "mix_real3")


def load_split(dataset: Path, split: str, ns, cfg, cache: Path, group: int = 0,
               with_labels: bool = False):
    entries = [e for e in read_manifest(dataset) if e.split == split]
    feats = featurize_entries(dataset, entries, ns, cfg, cache)
    return examples_from(entries, feats, group=group, with_window_labels=with_labels)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", type=Path, required=True)
    ap.add_argument("--synth", type=Path, required=True)
    ap.add_argument("--run", action="append", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--windows", default="100")
    ap.add_argument("--cache", type=Path, default=Path("benchmarks/out/cache"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", type=Path, help="folder for each run's checkpoint")
    ap.add_argument("--steps-per-epoch", type=int, help="default: one pass over the bad traces")
    ap.add_argument("--extra-train", type=Path, action="append", default=[],
                    help="another dataset whose train split joins the real group (e.g. the DDP "
                         "stand-in built with `ddp_standin.py --split train`)")
    ap.add_argument("--pretrain-on", type=Path, action="append", default=[],
                    metavar="DATASET[:SPLIT,SPLIT]",
                    help="unlabelled traces for the `ssl*` runs' self-supervised steps: the "
                         "unmodified traces (no planted ones) of a dataset's splits (default: "
                         "all splits); no label is read")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ns = tuple(int(x) for x in args.windows.split(","))
    base = replace(preset("small"), windows=ns, epochs=args.epochs)
    all_ns = tuple(sorted(set(ns) | {100} | {n for r in args.run for p in r.split("+")
                                             for n in RECIPES.get(p, {}).get("windows", ())}))
    t0 = time.perf_counter()
    # window labels of train traces are read only by runs with window supervision (`w_window`)
    synth = load_split(args.synth, "train", all_ns, base, args.cache, group=0, with_labels=True)
    real = load_split(args.real, "train", all_ns, base, args.cache, group=1, with_labels=True)
    for extra in args.extra_train:
        more = load_split(extra, "train", all_ns, base, args.cache, group=1, with_labels=True)
        real += [replace(x, partner=x.partner + len(real) if x.partner >= 0 else -1)
                 for x in more]
    val_real = load_split(args.real, "validation", (100,), base, args.cache, with_labels=True)
    val_synth = load_split(args.synth, "validation", (100,), base, args.cache, with_labels=True)
    pool = []
    for spec in args.pretrain_on:
        path, _, splits = str(spec).partition(":")
        pool += pretrain_pool([path], all_ns, base, args.cache,
                              splits=splits.split(",") if splits else None)
    if pool:
        print(f"{len(pool)} unlabelled traces for pretraining", flush=True)
    enc = TextEncoder()
    names = sorted(event_names(f for xs in (synth, real, val_real, val_synth) for x in xs
                               for f in x.feats.values())
                   | event_names(f for per_n in pool for f in per_n.values()))
    table = enc.table(names)
    print(f"loaded {len(synth)} synth + {len(real)} real train, {len(val_real)} + "
          f"{len(val_synth)} validation traces, {len(names)} names in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    for run in args.run:
        parts = run.split("+")
        data, changes = parts[0], parts[1:]
        if data not in DATA or any(c not in RECIPES for c in changes):
            raise SystemExit(f"unknown run {run!r}")
        cfg = base
        for c in changes:
            cfg = replace(cfg, **RECIPES[c])
        offset = len(synth)
        real_ex = [replace(x, partner=x.partner + offset if x.partner >= 0 else -1) for x in real]
        examples = {"synth_only": synth, "real_only": real_ex, "mix": synth + real_ex,
                    "mix_real2": synth + real_ex, "mix_real3": synth + real_ex}[data]
        if data == "real_only":
            examples = [replace(x, partner=x.partner - offset if x.partner >= 0 else -1)
                        for x in real_ex]
        mix = {"mix": (0.5, 0.5), "mix_real2": (1 / 3, 2 / 3), "mix_real3": (0.25, 0.75)}.get(data)
        t1, c1 = time.perf_counter(), time.process_time()
        model, log = fit(examples, cfg, table, mix=mix, val=[val_real, val_synth],
                         val_windows=100, log=lambda m: print("  " + m, flush=True),
                         steps_per_epoch=args.steps_per_epoch,
                         pretrain_feats=pool if cfg.pretrain_steps else ())
        best = log.epochs[(log.best_epoch or len(log.epochs)) - 1]
        row = {"run": run, "best_epoch": log.best_epoch, "steps": log.steps,
               "pretrain": log.pretrain, "pretrain_seconds": log.pretrain_seconds,
               "seconds": round(time.perf_counter() - t1, 1),
               "cpu_seconds": round(time.process_time() - c1, 1),
               "real_val": best["validation"][0], "synth_val": best["validation"][1],
               "history": [{"epoch": e["epoch"], "real": e["validation"][0],
                            "synth": e["validation"][1]} for e in log.epochs]}
        r, s = row["real_val"], row["synth_val"]
        print(f"{run}: real AUC {r['window_auc']:.3f} flagged {r['healthy_flagged']:.3f} trace "
              f"{r['trace_auc'] or float('nan'):.3f} | synth AUC {s['window_auc']:.3f} flagged "
              f"{s['healthy_flagged']:.3f} | best epoch {log.best_epoch} [{row['seconds']:.0f} s]",
              flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if args.save:
            from traceap.model.checkpoint import save_model
            args.save.mkdir(parents=True, exist_ok=True)
            save_model(model, args.save / f"{run}.pt", {n: table[n] for n in names}, meta={
                "run": run, "command": "python benchmarks/transfer_experiments.py "
                + " ".join(argv or sys.argv[1:]),
                "dataset": ", ".join(map(str, [args.synth, args.real, *args.extra_train])),
                "n_train": len(examples),
                "mix": list(mix) if mix is not None else None,
                "validation": [str(args.real), str(args.synth)], "best_epoch": log.best_epoch,
                "n_good": log.n_good, "n_bad": log.n_bad, "epochs": len(log.epochs),
                "steps": log.steps, "train_seconds": row["seconds"],
                "train_cpu_seconds": row["cpu_seconds"], "history": log.epochs},
                encoder_id=enc.encoder_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
