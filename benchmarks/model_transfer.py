"""Why the learned detector does (not) transfer: window-level numbers of model checkpoints on
a dataset split, from the feature cache (no trace is re-read once featurised), with probes.

    python benchmarks/model_transfer.py --dataset /work/datasets/real --split validation \
        --model src/traceap/data/model.pt [--model other.pt ...] [--windows 100] \
        [--probe names_masked --probe platform_unknown ...] [--cache benchmarks/out/cache]

Per checkpoint and probe it prints (and with --json writes) for the split:
  window AUC      pooled over all windows of the split (the benchmark's number);
  natural AUC     the same on unmodified traces with natural anomalies;
  within AUC      mean over bad traces of the AUC inside one trace (ranking inside a trace);
  centred AUC     pooled after subtracting each trace's median score (trace offsets removed);
  trace AUC       good vs bad by the trace's max window score;
  flagged         share of windows >= 0.5 on good traces (false alarms);
  offset corr     Spearman correlation, over good traces, of the trace's median score with
                  its GPU idle share (does the model score whole idle traces as bad?).
Probes change the inputs at scoring time: `names_masked` (every event nameless),
`platform_unknown` (the unseen-platform row), `summary_relative_only` (the absolute half of
the summary replaced by the trace's median window, so only differences between windows
remain), `time_median` (every event's absolute delay/duration replaced by the trace's median
level, so only names, order and summary remain).  Validation/test only: reads the anomalies.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

from traceap.manifest import read_manifest
from traceap.model.checkpoint import load_model
from traceap.model.features import STAT_KEYS, batch_arrays
from traceap.model.text import TextEncoder
from traceap.model.train import featurize_entries, window_labels_of

PROBES = ("none", "names_masked", "platform_unknown", "summary_relative_only", "time_median")


def _auc(y, s):
    y = np.asarray(y, bool)
    return float(roc_auc_score(y, s)) if 0 < y.sum() < y.size else None


def probe_batch(arrays: dict, probe: str, cfg) -> dict:
    """Apply a scoring-time probe to a batch of model inputs (a copy)."""
    a = {k: v.copy() for k, v in arrays.items()}
    if probe == "names_masked":
        a["kernel"][:] = 0
        a["cpu_op"][:] = 0
    elif probe == "platform_unknown":
        a["platform"][:] = 0
    elif probe == "summary_relative_only" and "summary" in a and cfg.summary_absolute:
        s = a["summary"]
        half = s.shape[-1] // (2 if cfg.summary_relative else 1)
        med = np.sort(s[..., :half], axis=1)[:, (s.shape[1] - 1) // 2][:, None]
        s[..., :half] = med
    elif probe == "time_median":
        for k in ("delay", "dur"):
            if k in a:
                v = a[k]
                m = a["mask"]
                for b in range(v.shape[0]):
                    lv = v[b][m[b] & (v[b] < cfg.time_vocab)]
                    v[b][m[b]] = int(np.median(lv)) if lv.size else cfg.time_vocab
    return a


def scores_of(ckpt, feats, probe: str, text: TextEncoder) -> list[np.ndarray]:
    """Window scores of each trace (torch model, eval mode) under a probe."""
    model = ckpt.model
    out = []
    with torch.no_grad():
        for f in feats:
            names = [str(n) for n in f.names[1:]]
            table = dict(zip(names, text.embed(names))) if names else {}
            arrays = batch_arrays([f], model.platform_id, ckpt.config, table)
            arrays = probe_batch(arrays, probe, ckpt.config)
            res = model({k: torch.from_numpy(v) for k, v in arrays.items()})
            out.append(res["scores"][0].numpy().astype(np.float64))
    return out


def metrics(entries, feats, scores) -> dict:
    """The numbers listed in the module docstring."""
    ys = [window_labels_of(e, f) for e, f in zip(entries, feats)]
    y, s = np.concatenate(ys), np.concatenate(scores)
    nat = [i for i, e in enumerate(entries) if e.source == "natural" and e.is_bad]
    within = [_auc(ys[i], scores[i]) for i, e in enumerate(entries) if e.is_bad]
    within = [w for w in within if w is not None]
    centred = np.concatenate([sc - np.median(sc) for sc in scores])
    good = [i for i, e in enumerate(entries) if not e.is_bad]
    idle = STAT_KEYS.index("gpu_busy_frac")
    med = [float(np.median(scores[i])) for i in good]
    busy = [float(np.mean(feats[i].stats[:, idle])) for i in good]
    corr = spearmanr(med, busy).statistic if len(good) > 2 else None
    return {
        "window_auc": _auc(y, s),
        "natural_auc": _auc(np.concatenate([ys[i] for i in nat]),
                            np.concatenate([scores[i] for i in nat])) if nat else None,
        "within_auc": float(np.mean(within)) if within else None,
        "centred_auc": _auc(y, centred),
        "trace_auc": _auc([e.is_bad for e in entries], [sc.max() for sc in scores]),
        "flagged": float(np.mean([(scores[i] >= 0.5).mean() for i in good])) if good else None,
        "offset_corr_idle": None if corr is None else -float(corr),
        "positives": float(y.mean()),
        "n_traces": len(entries),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True, type=Path)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--windows", type=int, default=100)
    ap.add_argument("--probe", action="append", default=[], choices=PROBES)
    ap.add_argument("--cache", type=Path, default=Path("benchmarks/out/cache"))
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    entries = [e for e in read_manifest(args.dataset) if e.split == args.split]
    if args.limit:
        entries = entries[:: max(1, len(entries) // args.limit)]
    rows = []
    text = TextEncoder()
    for path in args.model:
        ckpt = load_model(path)
        cfg = replace(ckpt.config)
        per = featurize_entries(args.dataset, entries, (args.windows,), cfg, args.cache)
        feats = [per[e.id][args.windows] for e in entries]
        for probe in ["none"] + [p for p in args.probe if p != "none"]:
            m = metrics(entries, feats, scores_of(ckpt, feats, probe, text))
            rows.append({"model": path, "probe": probe, **m})
            cells = " ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                             for k, v in m.items())
            print(f"{Path(path).name} [{probe}] {cells}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
