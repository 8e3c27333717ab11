"""One `traceap eval` result from the scores of several runs, with the hybrid stacked from them.

    python benchmarks/combine_scores.py --dataset /work/datasets/real --split test_unseen \
        --scores OUT/expert/scores.jsonl --scores OUT/model/scores.jsonl --out OUT/real

`traceap eval --out` keeps every window's score (scores.jsonl).  Scoring the expert rules once
and each model checkpoint once (numpy inference, fast) and stacking the hybrid from those
scores (`HybridParams.combine`, the bundled `data/hybrid.json` or `--hybrid`; a stack that
weighs the warm-up share reads each trace once for it) gives the same
numbers as `traceap eval --detectors expert,model,hybrid` without running the rules twice.
Detectors named `model[...]` go to the ablation table.  Writes OUT/eval.json (traceap.eval/v1,
with the by-source table; one result per split, merged); every detector flags where `traceap
eval` flags it: at 0.5, and the model (and its `model[...]` probes) at the checkpoint's own
`flag_threshold` (`--model`, default the bundled checkpoint).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from traceap.manifest import read_manifest
from traceap.detectors.hybrid import HybridParams
from traceap.detectors.stack import add_warmup
from traceap.eval.runner import EvalConfig, EvalResult, TraceRecord
from traceap.eval.scores import merge_scores


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--split", required=True, help="comma-separated splits")
    ap.add_argument("--scores", type=Path, action="append", required=True)
    ap.add_argument("--hybrid", type=Path, help="hybrid parameters (default: the bundled ones)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", type=Path, help="the checkpoint the model's scores came from")
    args = ap.parse_args(argv)
    from traceap.model.checkpoint import load_model
    model_threshold = float(load_model(args.model).meta.get("flag_threshold", 0.5))

    def threshold(detector: str) -> float:
        return model_threshold if detector.split("[")[0] == "model" else 0.5

    splits = tuple(args.split.split(","))
    source = {e.id: e.source for e in read_manifest(args.dataset)}
    merged = merge_scores(args.scores, splits)
    params = HybridParams.read(args.hybrid)
    if params.warmup_coef:   # the stack weighs each window's warm-up share: read the traces
        add_warmup(list(merged.values()), args.dataset)
    summary: dict | None = None
    for split in splits:   # one result per split: a split may lack the ablation's scores
        part = [r for r in merged.values() if r["split"] == split]
        if not part:
            continue
        names = set.intersection(*(set(r["scores"]) for r in part))
        records = []
        for r in part:
            scores = {k: np.asarray(v, np.float64) for k, v in r["scores"].items() if k in names}
            if "model" in scores and "expert" in scores:
                scores["hybrid"] = np.clip(params.combine(scores["model"], scores["expert"],
                                                          r.get("warmup")), 0, 1)
            records.append(TraceRecord(
                id=r["id"], split=r["split"], task=r["task"], bad=r["label"] == "bad",
                n=r["n_windows"], span_us=tuple(r["span_us"]),
                labels=np.asarray(r["labels"], bool), patterns=r["patterns"], scores=scores,
                flagged={k: v >= threshold(k) for k, v in scores.items()},
                source=source.get(r["id"])))
        dets = [d for d in ("rule", "clustering", "expert", "model", "hybrid")
                if d in records[0].scores]
        ablation = sorted(d for d in names if d.startswith("model["))
        ns = tuple(sorted({r.n for r in records}))
        one = dict(EvalResult(str(args.dataset), EvalConfig(windows=ns, splits=(split,)), dets,
                              [], records, ablation=ablation).summary)
        if summary is None:
            summary = one
            continue
        # merge the per-group tables of this split into the first split's summary
        summary["splits"] += one["splits"]
        summary["n_traces"].update(one["n_traces"])
        summary["tasks"].update(one["tasks"])
        for key in ("detection", "by_source", "trace_level"):
            for n, per in one.get(key, {}).items():
                for d, groups in per.items():
                    summary.setdefault(key, {}).setdefault(n, {}).setdefault(d, {}).update(groups)
        for d in one["detectors"] + one["ablation"]:
            if d not in summary["detectors"] + summary["ablation"]:
                summary["ablation" if d.startswith("model[") else "detectors"].append(d)
        print(f"{split}: {len(records)} trace-N pairs, detectors {', '.join(dets + ablation)}")
    if summary is None:
        raise SystemExit("no scores for the splits asked")
    summary["hybrid_params"] = params.to_json()
    try:
        summary["commit"] = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse", "--short",
             "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip() or None
    except OSError:
        summary["commit"] = None
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "eval.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {args.out}/eval.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
