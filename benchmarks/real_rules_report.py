"""The expert rules and the offline classifier on one split of a dataset, per pattern.

    .venv/bin/python benchmarks/real_rules_report.py --dataset datasets/real
    .venv/bin/python benchmarks/real_rules_report.py --dataset datasets/real --detectors expert \\
        --no-findings --by-base
    .venv/bin/python benchmarks/real_rules_report.py --dataset datasets/torchtraceap --split train

Reads DATASET/manifest.jsonl (docs/FORMATS.md), cuts every trace of the split (default
`validation`: tuning is done there, test splits are only reported) into N windows (default 100)
and prints, per detector:

- window AUC (pooled over the split's windows; a window is positive when it overlaps a
  labelled anomaly), trace-level AUC (trace score = max, and mean, of its window scores);
- per pattern: window AUC of that pattern's windows against the clean windows, the share of
  its windows flagged (score >= the detector's threshold), and the classifier's accuracy on
  its truly anomalous windows, all of them and the flagged ones (the issue's target), and on
  the flagged ones counting a call right when it names any anomaly overlapping the window
  (`window_pattern_sets`: a plant beside a natural anomaly of the base has two right answers);
- healthy traces (label good): share of windows flagged, medium-or-high findings per trace
  (`traceap.analysis.analyze` with that detector and its default classifier).

`--planted IDS` keeps the injected traces of those planted patterns only (`paper`: the paper's
eight), with every unmodified trace; `--json FILE` writes the numbers; `--ignore-below-cut`
leaves out of the clean windows those where the rules find a pattern under the reporting cut
(natural, not labelled: `inject.natural_labels(trace).below_cut` of each trace as scored).

The classifier is the one `traceap analyze` pairs with the detector: the offline rules, blended
with the detector's learned pattern head where it has one (hybrid, model).  Also prints the
confusion of the classifier (rows true, columns named) and, with --by-base, the window AUC and
accuracy per base trace, to see which workload a rule misreads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from traceap.analysis import analyze  # noqa: E402
from traceap.stages import resolve_classifier  # noqa: E402
from traceap.manifest import read_manifest, trace_path, window_labels, \
    window_pattern_sets, window_patterns  # noqa: E402
from traceap.patterns import PAPER, REGISTRY, pattern_ids  # noqa: E402
from traceap.detectors.registry import make_detector  # noqa: E402
from traceap.eval import metrics  # noqa: E402
from traceap.inject.natural import natural_labels  # noqa: E402
from traceap.load import load  # noqa: E402
from traceap.windows import Windows  # noqa: E402

PATTERNS = pattern_ids()  # the built-in pattern ids, in report order

SHORT = {"single_process_dataloading": "dataload", "no_pin_memory": "no_pin",
         "excessive_memcpy": "memcpy", "graph_break": "graph_brk", "cpu_bound": "cpu_bound",
         "small_nccl_kernels": "small_nccl", "nccl_blocks_compute_stream": "nccl_block",
         "nccl_compute_no_overlap": "nccl_expo"}
# the patterns beyond the paper's eight go by their registered confusion-matrix column
SHORT.update({p: REGISTRY[p].short for p in PATTERNS if p not in SHORT})


def healthy(e) -> bool:
    """A trace with no anomaly at all: an unmodified real trace labelled good."""
    return e.label == "good"


def run(dataset: Path, split: str, detectors: list[str], n: int, findings: bool,
        limit: int | None, options: dict | None = None,
        planted: list[str] | None = None, ignore_below_cut: bool = False) -> dict:
    """Every trace of the split once: labels, scores, calls, findings of healthy traces;
    with `planted`, only the injected traces whose planted pattern is one of them (and every
    unmodified trace)."""
    entries = [e for e in read_manifest(dataset) if e.split == split
               and (planted is None or e.source != "injected" or e.patterns[0] in planted)]
    if limit and len(entries) > limit:
        entries = entries[::-(-len(entries) // limit)]  # spread over the split, not its head
    if not entries:
        sys.exit(f"real_rules_report: no {split!r} traces in {dataset}")
    dets = {d: make_detector(d) for d in detectors}
    clfs = {d: resolve_classifier(None, det) for d, det in dets.items()}
    for c in clfs.values():
        if options:  # a classifier setting to compare on validation (OfflineConfig fields)
            c.config = replace(c.config, **options)
    recs = []
    t0 = time.time()
    for k, e in enumerate(entries, 1):
        t = load(trace_path(dataset, e))
        w = Windows(t, n)
        rec = {"id": e.id, "base": e.base or e.id, "bad": e.is_bad, "healthy": healthy(e),
               # the pattern planted into an injected trace comes first (inject.dataset)
               "planted": e.patterns[0] if e.source == "injected" and e.patterns else None,
               "labels": window_labels(e, w), "patterns": window_patterns(e, w),
               "sets": window_pattern_sets(e, w),
               "scores": {}, "flagged": {}, "calls": {}, "serious": {}, "findings": {}}
        rec["ignore"] = np.zeros(w.n, dtype=bool)
        if ignore_below_cut:  # what the rules find under the reporting cut: neither class
            for a, b, _ in natural_labels(t).below_cut:
                rec["ignore"][w.overlapping(a, b)] = True
            rec["ignore"] &= ~rec["labels"]
        idx = np.flatnonzero(rec["labels"])
        for name, det in dets.items():
            s = np.clip(np.nan_to_num(det.score_windows(w)), 0, 1)
            rec["scores"][name] = s
            rec["flagged"][name] = s >= float(0.5 if det.threshold is None else det.threshold)
            if len(idx):
                calls = clfs[name].classify(w, idx.tolist(), rec["labels"].astype(float))
                rec["calls"][name] = [None if c.false_alarm else c.pattern for c in calls]
            if findings and rec["healthy"]:
                a = analyze(t, n, det)
                rec["serious"][name] = sum(f.severity in ("medium", "high") for f in a.findings)
                rec["findings"][name] = [(f.pattern, f.severity, round(f.gain_pct, 2))
                                         for f in a.findings]
        recs.append(rec)
        if k % 25 == 0 or k == len(entries):
            print(f"  {k}/{len(entries)} traces ({time.time() - t0:.0f} s)", file=sys.stderr)
    return {"records": recs, "detectors": detectors}


def auc(y, s) -> float | None:
    return metrics.auc(np.asarray(y, bool), np.asarray(s, float))


def pct(x) -> str:
    return "  -  " if x is None or (isinstance(x, float) and np.isnan(x)) else f"{100 * x:5.1f}"


def summarise(recs: list[dict], name: str, planted_only: bool = False) -> dict:
    """The numbers of one detector over a list of records; with `planted_only`, the accuracy
    and confusion count only the windows of the pattern planted into an injected trace (the
    base's own anomalies beside it are left out of them)."""
    y = np.concatenate([r["labels"] for r in recs])
    s = np.concatenate([r["scores"][name] for r in recs])
    f = np.concatenate([r["flagged"][name] for r in recs])
    pats = np.array([p or "" for r in recs for p in r["patterns"]])
    keep = ~np.concatenate([r["ignore"] for r in recs])
    out = {"window_auc": auc(y[keep], s[keep]),
           "trace_auc_max": auc([r["bad"] for r in recs], [r["scores"][name].max() for r in recs]),
           "trace_auc_mean": auc([r["bad"] for r in recs],
                                 [r["scores"][name].mean() for r in recs])}
    truth, pred, flg, any_ok = [], [], [], []
    for r in recs:
        idx = np.flatnonzero(r["labels"])
        calls = r["calls"].get(name, [None] * len(idx))
        if planted_only:
            sel = [j for j, i in enumerate(idx) if r["patterns"][i] == r["planted"]]
            idx, calls = idx[sel], [calls[j] for j in sel]
        truth += [r["patterns"][i] for i in idx]
        pred += calls
        flg += [bool(r["flagged"][name][i]) for i in idx]
        any_ok += [c in r["sets"][i] for i, c in zip(idx, calls)]
    truth, pred = np.array(truth, dtype=object), np.array(pred, dtype=object)
    flg, any_ok = np.array(flg, dtype=bool), np.array(any_ok, dtype=bool)
    ok = truth == pred
    out["accuracy"] = float(ok.mean()) if len(ok) else None
    out["accuracy_flagged"] = float(ok[flg].mean()) if flg.any() else None
    # right when the named pattern is any of the window's anomalies (a plant beside a natural one)
    out["accuracy_any"] = float(any_ok.mean()) if len(any_ok) else None
    out["accuracy_any_flagged"] = float(any_ok[flg].mean()) if flg.any() else None
    clean = ~y & keep
    per = {}
    for p in PATTERNS:
        mine = pats == p
        sel = truth == p
        per[p] = {"n": int(mine.sum()),
                  "auc": auc(np.r_[np.ones(mine.sum()), np.zeros(clean.sum())],
                             np.r_[s[mine], s[clean]]) if mine.any() else None,
                  "recall": float(f[mine].mean()) if mine.any() else None,
                  "acc": float(ok[sel].mean()) if sel.any() else None,
                  "acc_flagged": float(ok[sel & flg].mean()) if (sel & flg).any() else None,
                  "acc_any_flagged": (float(any_ok[sel & flg].mean()) if (sel & flg).any()
                                      else None)}
    out["per_pattern"] = per
    good = [r for r in recs if r["healthy"]]
    out["healthy_flagged_share"] = (float(np.mean([r["flagged"][name].mean() for r in good]))
                                    if good else None)
    out["healthy_serious_per_trace"] = (float(np.mean([r["serious"][name] for r in good]))
                                        if good and name in good[0]["serious"] else None)
    out["confusion"] = metrics.confusion(list(truth), list(pred), PATTERNS)
    out["false_positive_share"] = float(f[clean].mean()) if clean.any() else None
    return out


def report(res: dict, by_base: bool, show_findings: bool, planted_only: bool = False) -> None:
    recs = res["records"]
    if planted_only:
        print("accuracy and confusion: the planted pattern's windows of injected traces only")
    n_bad = sum(r["bad"] for r in recs)
    n_h = sum(r["healthy"] for r in recs)
    print(f"{len(recs)} traces ({n_bad} bad, {n_h} healthy), "
          f"{sum(int(r['labels'].sum()) for r in recs)} anomalous windows of "
          f"{sum(len(r['labels']) for r in recs)}")
    for name in res["detectors"]:
        s = summarise(recs, name, planted_only)
        print(f"\n== {name}: window AUC {pct(s['window_auc'])}, trace AUC max "
              f"{pct(s['trace_auc_max'])} / mean {pct(s['trace_auc_mean'])}; accuracy "
              f"{pct(s['accuracy'])} (flagged {pct(s['accuracy_flagged'])}; any of the window's "
              f"patterns {pct(s['accuracy_any'])}, flagged {pct(s['accuracy_any_flagged'])}); "
              f"clean windows "
              f"flagged {pct(s['false_positive_share'])}%; healthy traces: "
              f"{pct(s['healthy_flagged_share'])}% of windows flagged, "
              + ("-" if s["healthy_serious_per_trace"] is None else
                 f"{s['healthy_serious_per_trace']:.2f}") + " medium+ findings per trace")
        print(f"{'pattern':<28}{'windows':>8}{'AUC':>7}{'recall':>8}{'acc':>7}{'acc|flag':>9}"
              f"{'any|flag':>9}")
        for p, v in s["per_pattern"].items():
            print(f"{p:<28}{v['n']:>8}{pct(v['auc']):>7}{pct(v['recall']):>8}"
                  f"{pct(v['acc']):>7}{pct(v['acc_flagged']):>9}{pct(v['acc_any_flagged']):>9}")
        labels = [SHORT[p] for p in PATTERNS] + ["none"]
        print("confusion (rows true, columns named):")
        print(" " * 11 + "".join(f"{x:>10}" for x in labels))
        for p, row in zip(PATTERNS, s["confusion"]):
            print(f"{SHORT[p]:<11}" + "".join(f"{int(v):>10}" for v in row))
        if by_base:
            groups = defaultdict(list)
            for r in recs:
                groups[r["base"]].append(r)
            print(f"\n{'base':<70}{'AUC':>7}{'acc':>7}{'healthy flag%':>14}")
            for b, rs in sorted(groups.items()):
                g = summarise(rs, name)
                print(f"{b[:69]:<70}{pct(g['window_auc']):>7}{pct(g['accuracy']):>7}"
                      f"{pct(g['healthy_flagged_share']):>14}")
        if show_findings:
            for r in recs:
                if r["healthy"] and r["findings"].get(name):
                    print(f"  healthy {r['id']}: {r['findings'][name]}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--detectors", default="expert,hybrid")
    ap.add_argument("--windows", type=int, default=100)
    ap.add_argument("--no-findings", action="store_true",
                    help="skip the analysis of healthy traces (medium+ findings)")
    ap.add_argument("--by-base", action="store_true", help="also a line per base trace")
    ap.add_argument("--show-findings", action="store_true",
                    help="list the findings of every healthy trace")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--planted-only", action="store_true",
                    help="accuracy and confusion over the planted pattern's windows only")
    ap.add_argument("--classifier-option", action="append", default=[], metavar="FIELD=VALUE",
                    help="override an OfflineConfig field, e.g. tie_by_lost=1 (repeatable)")
    ap.add_argument("--planted", metavar="IDS",
                    help="only the injected traces of these planted patterns (comma-separated; "
                         "'paper' for the paper's eight), with every unmodified trace")
    ap.add_argument("--ignore-below-cut", action="store_true",
                    help="leave out of the clean windows those holding a pattern the rules "
                         "find under the reporting cut (inject.natural_labels(...).below_cut)")
    ap.add_argument("--json", type=Path, metavar="FILE",
                    help="also write the numbers (detector -> summary, per pattern) as JSON")
    args = ap.parse_args(argv)
    options = {}
    for kv in args.classifier_option:
        k, v = kv.split("=", 1)
        options[k] = v.lower() in ("1", "true") if v.lower() in ("0", "1", "true", "false") \
            else float(v)
    if args.split.startswith("test"):
        print(f"note: {args.split} is for reporting the chosen values once, not for tuning",
              file=sys.stderr)
    res = run(args.dataset, args.split, [d for d in args.detectors.split(",") if d],
              args.windows, not args.no_findings, args.limit, options,
              None if not args.planted else
              list(PAPER) if args.planted == "paper" else args.planted.split(","),
              args.ignore_below_cut)
    report(res, args.by_base, args.show_findings, args.planted_only)
    if args.json:
        out = {name: summarise(res["records"], name, args.planted_only)
               for name in res["detectors"]}
        args.json.write_text(json.dumps(out, indent=1, default=lambda x: np.asarray(x).tolist()))


if __name__ == "__main__":
    main()
