"""Choose the offline classifier's `head_weight` (the learned pattern head's share beside the
rules) on a VALIDATION split: pattern accuracy on the truly anomalous windows per weight.

    python benchmarks/tune_head_weight.py --dataset /work/datasets/real [--split validation] \
        [--windows 100] [--weights 0,0.1,0.25,0.5] [--model CKPT]

Every bad trace of the split is cut into N windows once; its truly anomalous windows are
classified by `OfflineClassifier(pattern_head=<the model's head>, head_weight=w)` for each w
(what `traceap analyze` does with the hybrid detector).  Prints accuracy overall and per
pattern.  Never tune on a test split: `--report` scores one weight (the shipped one) on a test
split, to report it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from traceap.classify.offline import OfflineClassifier
from traceap.manifest import read_manifest, trace_path, window_patterns
from traceap.detectors.learned import LearnedDetector
from traceap.load import load
from traceap.windows import Windows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--windows", type=int, default=100)
    ap.add_argument("--weights", default="0,0.1,0.25,0.5")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--report", action="store_true",
                    help="score one weight on any split (reporting, not choosing)")
    args = ap.parse_args(argv)
    weights = [float(w) for w in args.weights.split(",")]
    if args.split.startswith("test") and not (args.report and len(weights) == 1):
        raise SystemExit("tune on a validation split, never on a test split "
                         "(--report with one weight reports it)")
    head = LearnedDetector(args.model)
    right = {w: {} for w in weights}
    total: dict[str, int] = {}
    for e in [e for e in read_manifest(args.dataset) if e.split == args.split and e.is_bad]:
        windows = Windows(load(trace_path(args.dataset, e)), args.windows)
        truth = window_patterns(e, windows)
        idx = [i for i, p in enumerate(truth) if p is not None]
        if not idx:
            continue
        probs = head.pattern_probabilities(windows)
        for w in weights:
            calls = OfflineClassifier(pattern_head=lambda _w, p=probs: p, head_weight=w).classify(
                windows, idx, np.zeros(windows.n))
            for i, c in zip(idx, calls):
                r = right[w].setdefault(truth[i], 0)
                right[w][truth[i]] = r + int(c.pattern == truth[i])
        for i in idx:
            total[truth[i]] = total.get(truth[i], 0) + 1
    n = sum(total.values())
    print(f"{n} truly anomalous windows of {args.dataset} [{args.split}] at N = {args.windows}")
    print("| head_weight | accuracy | " + " | ".join(sorted(total)) + " |")
    for w in weights:
        acc = sum(right[w].values()) / max(n, 1)
        per = " | ".join(f"{right[w].get(p, 0) / total[p]:.3f}" for p in sorted(total))
        print(f"| {w:g} | {acc:.4f} | {per} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
