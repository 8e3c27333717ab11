"""A DDP stand-in validation set: simulated data-parallel ranks as bases for `traceap inject`.

    .venv/bin/python benchmarks/ddp_standin.py --synth /work/datasets/synth_new \
        --bases /work/datasets/ddp_bases --out /work/datasets/ddp_val

The real-based benchmark has no multi-GPU training base outside its test sources, so a rule
about collectives beside host-side stalls cannot be chosen on real validation.  This links rank
0 of every multi-GPU training job of a `traceap synth` dataset's `validation` split into
`--bases` and runs `traceap inject --split validation --copies 2 --seed 0` on them: host-side
plants land beside the simulated job's own collectives, and `traceap label` gives the bases'
natural anomalies.  With the set of commit 60554f2 (`traceap synth --seed 0` before 6e000ee):
16 bases, 234 traces.  A stand-in, not a benchmark: the bases are simulated, and their natural
labels are mostly cpu_bound stretches of small launch-bound models.  Read it with
`real_rules_report.py --dataset OUT --split validation` or `nccl_queued.py --dataset OUT`.

`--split train --copies 1` builds the same kind of set from the synth dataset's *train* ranks
(76 bases, 630 traces with the set of 60554f2; `--ranks all`: every rank of those jobs, 224
bases): training data for the model
(`transfer_experiments.py --extra-train OUT`), on bases disjoint from the validation stand-in's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from traceap.manifest import read_manifest, trace_path  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--synth", type=Path, required=True, help="a `traceap synth` dataset")
    ap.add_argument("--bases", type=Path, required=True, help="folder for the base links")
    ap.add_argument("--out", type=Path, required=True, help="the inject output")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--split", default="validation",
                    help="the synth split whose ranks are the bases, and the split they get "
                         "(`train` builds a training set from bases disjoint from validation's)")
    ap.add_argument("--copies", type=int, default=2, help="copies of each plant per base")
    ap.add_argument("--ranks", choices=("0", "all"), default="0",
                    help="the bases: rank 0 of every job (default), or every rank (3x the "
                         "bases of a synth dataset's train split)")
    args = ap.parse_args(argv)
    args.bases.mkdir(parents=True, exist_ok=True)
    picked = [e for e in read_manifest(args.synth) if e.split == args.split
              and (e.world_size or 1) > 1 and (args.ranks == "all" or (e.rank or 0) == 0)]
    for e in picked:
        src = trace_path(args.synth, e).resolve()
        dst = args.bases / src.name
        if not dst.exists():
            os.symlink(src, dst)
    print(f"{len(picked)} bases linked in {args.bases}", flush=True)
    return subprocess.call([str(Path(sys.executable).parent / "traceap"), "inject", str(args.bases),
                            "--out", str(args.out), "--split", args.split, "--copies", str(args.copies),
                            "--seed", "0", "--jobs", str(args.jobs), "--overwrite"])


if __name__ == "__main__":
    sys.exit(main())
