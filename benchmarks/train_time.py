"""Training and inference cost of the learned detector on CPU (run by hand, not by CI).

    .venv/bin/python benchmarks/train_time.py [--dataset datasets/torchtraceap] [--steps 20]

Measures, in one run: seconds per training step for each config preset (batch 8, N = 100),
the projected time of a full default training (epochs x steps per epoch on the train split),
and inference per trace at N = 100 next to the time to load the same trace (the baseline).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch

from traceap.manifest import read_manifest, trace_path
from traceap.load import load
from traceap.model import Predictor, preset
from traceap.model.net import TraceAPModel, collate
from traceap.model.losses import total_loss
from traceap.model.features import featurize
from traceap.model.text import TextEncoder
from traceap.windows import Windows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="datasets/torchtraceap")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--traces", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    entries = read_manifest(args.dataset)
    train = [e for e in entries if e.split == "train"]
    test = [e for e in entries if e.split != "train"][:args.traces]
    goods = [e for e in train if not e.is_bad]
    bads = [e for e in train if e.is_bad]
    sample = goods[:4] + bads[:4]
    traces = [load(trace_path(args.dataset, e)) for e in sample]
    encoder = TextEncoder()

    print(f"dataset {args.dataset}: {len(goods)} good + {len(bads)} bad train traces; "
          f"{args.threads} thread(s)")
    for name in ("small", "paper"):
        cfg = preset(name)
        feats = [featurize(Windows(t, 100), cfg) for t in traces]
        table = encoder.table(str(n) for f in feats for n in f.names[1:])
        model = TraceAPModel(cfg, sorted({f.platform for f in feats}))
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        y = torch.tensor([0.0] * 4 + [1.0] * 4)
        targets = torch.zeros(8, 8)
        times = []
        for _ in range(args.steps + 1):
            t0 = time.perf_counter()
            out = model(collate(feats, model, table))
            total_loss(out, y, targets, model.svm.fc.weight, cfg)["total"].backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
        step = float(np.median(times[1:]))
        per_epoch = math.ceil(max(len(goods), len(bads)) / (cfg.batch_size // 2))
        mean_n = float(np.mean(cfg.windows)) / 100.0
        proj = step * mean_n * per_epoch * cfg.epochs
        print(f"{name:>6}: {step:.2f} s/step at N=100 -> {cfg.epochs} epochs x {per_epoch} steps "
              f"(mean N {mean_n * 100:.0f}) ~ {proj / 60:.1f} min")

    predictor = Predictor()
    load_s, infer_s = [], []
    for e in test:
        t0 = time.perf_counter()
        t = load(trace_path(args.dataset, e))
        load_s.append(time.perf_counter() - t0)
        w = Windows(t, 100)
        predictor.predict(w)   # warm the name cache for this trace's names
        w = Windows(t, 100)
        t0 = time.perf_counter()
        predictor.predict(w)
        infer_s.append(time.perf_counter() - t0)
    print(f"inference at N=100 (bundled model): median {np.median(infer_s) * 1e3:.0f} ms, max "
          f"{max(infer_s) * 1e3:.0f} ms per trace; load {np.median(load_s) * 1e3:.0f} ms "
          f"(ratio inference/load {np.median(infer_s) / np.median(load_s):.2f})")


if __name__ == "__main__":
    main()
