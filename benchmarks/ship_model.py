"""Bundle a trained checkpoint as the package default (`src/traceap/data/model.pt`).

    python benchmarks/ship_model.py benchmarks/out/screen/mix+relative+idle.pt

Copies the checkpoint and adds to its name table the embeddings of every event name of the
bundled traces (`examples/`, `tests/data/`) at N = 50 / 100 / 200, so that `traceap analyze`
on them never runs the text encoder (a cold start stays fast).  The checkpoint's weights,
config and training record (`meta`) are kept as they are.

`--calibrate SCORES.jsonl` (the `scores.jsonl` of `traceap eval --detectors model` on a
VALIDATION split, scored with this checkpoint) sets the model's flagging threshold (`meta
["flag_threshold"]`, read by `LearnedDetector.threshold`): the score that best separates
anomalous from normal windows there (Youden's J over the pooled windows of every N) among those
that flag at most `--max-healthy-flagged` (default 5%) of the windows of healthy traces.  The
scores themselves, and so every AUC, are unchanged.

`--names-masked-out PATH` also writes the names-masked probe: the same weights with config
`names_masked` on, so every event is scored nameless (`traceap eval --ablation` reports it as
`model[names_masked]`: how much the shipped model leans on event names).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from traceap.load import load
from traceap.model.checkpoint import bundled_model_path, load_model
from traceap.model.features import featurize
from traceap.model.text import TextEncoder
from traceap.windows import Windows

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))   # sibling benchmark scripts


def bundled_trace_names(cfg) -> set[str]:
    """Event names the model reads in the traces that ship with the repository."""
    names: set[str] = set()
    files = sorted((REPO / "examples").glob("*.json*")) + sorted((REPO / "tests" / "data").glob("*.json*"))
    for f in files:
        try:
            trace = load(f)
        except Exception:   # fixtures of broken traces are there on purpose
            continue
        for n in (50, 100, 200):
            names |= {str(s) for s in featurize(Windows(trace, n), cfg).names[1:]}
    return names


def calibrate(scores_jsonl: Path, max_healthy_flagged: float) -> dict:
    """The flagging threshold chosen on a validation split's model scores (see the docstring).
    Records of other splits in the file are ignored, so a test split never sets it."""
    from tune_hybrid import merge_scores   # the scores.jsonl reader the other benchmarks use
    records = list(merge_scores([scores_jsonl], ("validation",)).values())
    if not records:
        raise SystemExit(f"{scores_jsonl}: no validation-split scores; calibrate on validation")
    scores = [np.asarray(r["scores"]["model"], float) for r in records]
    y = np.concatenate([np.asarray(r["labels"], bool) for r in records])
    s = np.concatenate(scores)
    # healthy: the good traces (in the real-based benchmark, the unmodified healthy ones)
    healthy = [sc for r, sc in zip(records, scores) if r["label"] == "good"]
    best = None
    for t in np.unique(np.round(np.quantile(s, np.linspace(0.5, 0.999, 400)), 4)):
        flagged = float(np.mean([(h >= t).mean() for h in healthy])) if healthy else 0.0
        if flagged > max_healthy_flagged:
            continue
        j = float((s[y] >= t).mean() - (s[~y] >= t).mean())
        if best is None or j > best["youden_j"]:
            best = {"flag_threshold": float(t), "youden_j": j, "healthy_flagged": flagged,
                    "windows": int(y.size), "healthy_traces": len(healthy)}
    if best is None:
        raise SystemExit("no threshold keeps the healthy windows under the limit")
    return {**best, "calibrated_on": str(scores_jsonl),
            "max_healthy_flagged": max_healthy_flagged}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--out", type=Path, default=bundled_model_path())
    ap.add_argument("--names-masked-out", type=Path)
    ap.add_argument("--calibrate", type=Path, help="model scores.jsonl of a validation split")
    ap.add_argument("--max-healthy-flagged", type=float, default=0.05)
    args = ap.parse_args(argv)
    cfg = load_model(args.checkpoint).config
    obj = torch.load(args.checkpoint, weights_only=False)
    have = set(obj["names"])
    extra = sorted(bundled_trace_names(cfg) - have)
    if extra:
        emb = TextEncoder().embed(extra, persist=False)
        names = list(obj["names"]) + extra
        table = np.concatenate([obj["name_embeddings"].numpy(), emb.astype(np.float16)])
        order = np.argsort(names)
        obj["names"] = [names[i] for i in order]
        obj["name_embeddings"] = torch.from_numpy(np.ascontiguousarray(table[order]))
    obj["meta"] = {**obj.get("meta", {}), "shipped_from": str(args.checkpoint),
                   "bundled_trace_names": len(extra)}
    if args.calibrate:
        cal = calibrate(args.calibrate, args.max_healthy_flagged)
        obj["meta"].update(flag_threshold=cal["flag_threshold"], calibration=cal)
        print(f"flag threshold {cal['flag_threshold']:.4f}: Youden J {cal['youden_j']:.3f}, "
              f"healthy windows flagged {cal['healthy_flagged']:.1%} on {args.calibrate}")
    torch.save(obj, args.out)
    print(f"wrote {args.out} ({len(obj['names'])} names, {len(extra)} added from bundled traces)")
    if args.names_masked_out:
        probe = {**obj, "config": {**obj["config"], "names_masked": True},
                 "meta": {**obj["meta"], "probe": "names_masked at scoring time"}}
        args.names_masked_out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(probe, args.names_masked_out)
        print(f"wrote {args.names_masked_out} (names-masked probe)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
