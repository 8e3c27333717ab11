"""Which rule flags the clean windows of a split: per pattern, clean windows where its score is the
highest and reaches the expert detector's threshold, by kind of trace (planted pattern, healthy).

    nice .venv/bin/python benchmarks/clean_flags.py --dataset datasets/real16 --split test_unseen \
        [--every 2] [--windows 100]

A clean window overlaps no labelled anomaly (docs/FORMATS.md).  The expert detector's score is
a combination of the pattern scores; the pattern with the top score names who flagged it.  Also
prints how many lie in the first profiler step (which natural labels leave out), and, per rule, the four bases with the most flagged clean windows.  `--every K` reads every K-th trace.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from traceap.detectors.registry import make_detector  # noqa: E402
from traceap.inject.natural import NaturalContext  # noqa: E402
from traceap.load import load  # noqa: E402
from traceap.manifest import read_manifest, trace_path, window_labels  # noqa: E402
from traceap.patterns import pattern_scores  # noqa: E402
from traceap.windows import Windows  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--windows", type=int, default=100)
    ap.add_argument("--every", type=int, default=1)
    args = ap.parse_args(argv)
    entries = [e for e in read_manifest(args.dataset) if e.split == args.split][::args.every]
    det = make_detector("expert")
    thr = float(0.5 if det.threshold is None else det.threshold)
    by_rule: Counter = Counter()
    by_kind: Counter = Counter()
    by_base: Counter = Counter()
    warm: Counter = Counter()
    n_clean = 0
    for e in entries:
        t = load(trace_path(args.dataset, e))
        w = Windows(t, args.windows)
        # natural labels start after the first profiler step (warm-up is not labelled)
        steady_from = NaturalContext(t).steady_from
        clean = ~window_labels(e, w)
        s = det.score_windows(w)
        ps = pattern_scores(w)
        ids = list(ps)
        mat = np.vstack([ps[p] for p in ids])
        flagged = clean & (s >= thr)
        n_clean += int(clean.sum())
        kind = (e.patterns[0] if e.source == "injected" else
                "healthy" if e.label == "good" else "natural")
        for i in np.flatnonzero(flagged):
            rule = ids[int(np.argmax(mat[:, i]))]
            by_rule[rule] += 1
            by_kind[kind, rule] += 1
            by_base[e.base, rule] += 1
            warm[rule] += int(w.end_us[i] <= steady_from)
    total = sum(by_rule.values())
    print(f"{len(entries)} traces, {n_clean} clean windows, {total} flagged "
          f"({100 * total / max(n_clean, 1):.1f}%)")
    print("by top rule:", ", ".join(f"{k} {v}" for k, v in by_rule.most_common()))
    print("of which in the first profiler step (warm-up, never naturally labelled):",
          ", ".join(f"{k} {warm[k]}" for k, _ in by_rule.most_common() if warm[k]))
    print("by trace kind (planted pattern / healthy / natural), top rule:")
    for (kind, rule), v in by_kind.most_common(25):
        print(f"  {kind:28s} {rule:28s} {v}")
    print("bases, per top rule (the 4 with the most flagged clean windows):")
    for rule, _ in by_rule.most_common():
        for (base, r), v in [x for x in by_base.most_common() if x[0][1] == rule][:4]:
            print(f"  {rule:28s} {base[:70]:70s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
