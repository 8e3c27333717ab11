"""Join checkpoints of one recipe (seeds) into an ensemble checkpoint.

    python benchmarks/make_ensemble.py OUT.pt FIRST.pt OTHER.pt [OTHER.pt ...]

OUT holds FIRST (its config, platforms, meta) with the weights of every OTHER as `members`
(docs/FORMATS.md, "Model checkpoint"): `traceap` scores each window with every member and
averages their window logits and pattern logits.  The members must share config, platforms
and text encoder (runs of one recipe with other seeds); their vocabularies are merged.  Then
score a validation split with OUT and ship it with `benchmarks/ship_model.py OUT --calibrate`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from traceap.model.checkpoint import add_members, load_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("first", type=Path)
    ap.add_argument("others", type=Path, nargs="+")
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    add_members(args.first, args.others, out=args.out,
                meta={"ensemble_of": [str(p) for p in [args.first, *args.others]]})
    ckpt = load_model(args.out)
    print(f"wrote {args.out}: {len(ckpt.states)} members, {len(ckpt.text_table)} names")
    return 0


if __name__ == "__main__":
    sys.exit(main())
