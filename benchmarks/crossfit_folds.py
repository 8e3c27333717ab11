"""Fold views of a dataset's train split, for out-of-fold model scores (cross-fitted stacking).

    python benchmarks/crossfit_folds.py --dataset /work/datasets/real --out /work/datasets/folds \\
        --folds "attention,gemm,elementwise;moe,perf_model;inference;h100,mi300,mi210,b200,torch_compile_triton"

The hybrid's stack (`benchmarks/tune_hybrid.py`) is fitted on the validation split, which for the
real-based benchmark holds 12 bases, 10 of them one source: three parameters fitted on one kind
of workload.  The train split holds more kinds, but the shipped model trained on it, so its
scores there are in-sample.  This script cuts the train split into folds by base-name prefix
(whole workload families per fold: a model on another GPU is the same workload), and writes, per
fold K:

- OUT/foldK/train: the dataset without fold K's train traces (train a model on it, e.g.
  `benchmarks/transfer_experiments.py --real OUT/foldK/train ...`; validation and test entries
  stay, the validation split still chooses the epoch);
- OUT/foldK/holdout: fold K's train traces alone, as split `validation` (score them with that
  model: `traceap eval --dataset OUT/foldK/holdout --split validation --detectors model ...`).

Both views link to the dataset's `traces/` folder (no copies; feature caches are shared, keyed
by the resolved path).  Their scores join the stack fit through `tune_hybrid.py --oof train`
with the dataset itself as `--dataset`.  Every train base must match exactly one fold.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import msgspec

from traceap.eval.folds import write_view
from traceap.manifest import read_manifest


def fold_of(base: str, folds: list[list[str]]) -> int:
    """The fold whose prefixes the base name starts with (prefix up to the first "__")."""
    hits = [k for k, prefixes in enumerate(folds) if base.split("__")[0] in prefixes]
    if len(hits) != 1:
        raise SystemExit(f"crossfit_folds: base {base!r} matches {len(hits)} folds: "
                         "give every base-name prefix to exactly one fold")
    return hits[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--folds", required=True,
                    help="base-name prefixes per fold: 'a,b;c;d,e' (folds split by ';')")
    args = ap.parse_args(argv)
    folds = [[p.strip() for p in f.split(",") if p.strip()] for f in args.folds.split(";")]
    entries = read_manifest(args.dataset)
    fold = {e.id: fold_of(e.base or e.id, folds) for e in entries if e.split == "train"}
    counts = Counter(fold.values())
    for k in range(len(folds)):
        keep = [e for e in entries if fold.get(e.id, -1) != k]
        held = [msgspec.structs.replace(e, split="validation") for e in entries
                if fold.get(e.id) == k]
        write_view(args.out / f"fold{k + 1}" / "train", keep, args.dataset / "traces")
        write_view(args.out / f"fold{k + 1}" / "holdout", held, args.dataset / "traces")
        bases = {e.base or e.id for e in held}
        print(f"fold{k + 1}: {counts[k]} train traces held out, {len(bases)} bases "
              f"({', '.join(folds[k])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
