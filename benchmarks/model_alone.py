"""Where the shipped model puts its window scores: per test trace, the trained model alone and
the default `hybrid` (model + expert rules), on a generated dataset.

    .venv/bin/traceap synth --out /tmp/ds --traces 40 --seed 0
    .venv/bin/python benchmarks/model_alone.py /tmp/ds [--windows 100]

One line per test trace and detector: min / median / max window score, windows flagged
(score >= 0.5), windows labelled (overlapping an anomaly), and the mean score on labelled and
on the other windows.  A detector that localises scores the labelled windows high and the rest
low; one that judges whole traces scores every window of a bad trace alike.
"""

from __future__ import annotations

import argparse

import numpy as np

import traceap
from traceap.manifest import read_manifest, trace_path, window_labels
from traceap.detectors.registry import make_detector
from traceap.windows import Windows


def main() -> None:
    """Print the table for the test splits of a dataset."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("--windows", type=int, default=100)
    args = ap.parse_args()
    detectors = {"model": make_detector("model"), "hybrid": make_detector("hybrid")}
    print(f"{'trace':22s} {'label':5s} {'detector':8s} {'min':>5s} {'median':>6s} {'max':>5s} "
          f"{'flagged':>7s} {'labelled':>8s} {'@labelled':>9s} {'@rest':>6s}")
    for e in read_manifest(args.dataset):
        if not e.split.startswith("test"):
            continue
        w = Windows(traceap.load(trace_path(args.dataset, e)), args.windows)
        y = window_labels(e, w)
        for name, det in detectors.items():
            s = det.score_windows(w)
            pos = f"{s[y].mean():.2f}" if y.any() else "-"
            print(f"{e.id:22s} {e.label:5s} {name:8s} {s.min():5.2f} {np.median(s):6.2f} "
                  f"{s.max():5.2f} {int((s >= 0.5).sum()):7d} {int(y.sum()):8d} {pos:>9s} "
                  f"{s[~y].mean():6.2f}")


if __name__ == "__main__":
    main()
