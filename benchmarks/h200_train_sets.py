"""The H200 recordings as training data (the `h2` experiment of benchmarks/README.md).

    python benchmarks/h200_train_sets.py [--h200 benchmarks/h200] [--out datasets] [--jobs 2] \\
        [--copies 4]

Writes two datasets whose every trace is in the train split, for `traceap train --dataset`
(or `fold_models.py --extra-train`):

- OUT/h200_inj: `traceap inject` into the set's clean recordings (one per model), 4 copies per
  pattern: planted patterns on real single-GPU CNN / ViT training steps;
- OUT/h200_train: the set's other recordings, each with its cause switched on by the user's
  code and its window-level ground truth (manifest.jsonl, split rewritten to train; the traces
  are a link to the set's, not a copy).

Both are deterministic (inject's seed 0).  A model trained on them has seen the H200 set: its
numbers there are no longer a check on traces it never saw.  Run again, it replaces only what it
wrote (inject's `--overwrite` keeps files inject did not write; OUT/h200_train is refused, with
nothing written anywhere, when it holds a manifest or a `traces` entry this script did not
write, as its MARK file says).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

#: Written beside OUT/h200_train/manifest.jsonl: the folder is this script's to rewrite.
MARK = ".h200_train_sets"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--h200", type=Path, default=Path("benchmarks/h200"))
    ap.add_argument("--out", type=Path, default=Path("datasets"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--copies", type=int, default=4, help="inject's copies per pattern")
    args = ap.parse_args()
    dest = args.out / "h200_train"
    link = dest / "traces"
    if not (dest / MARK).exists() and ((dest / "manifest.jsonl").exists()
                                       or link.exists() or link.is_symlink()):
        print(f"error: {dest} holds a dataset this script did not write; choose another --out",
              file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in (args.h200 / "manifest.jsonl").read_text().splitlines()
            if line.strip()]
    clean = [r for r in rows if r["label"] == "good" and not r["patterns"]
             and "-clean-" in r["id"]]
    subprocess.run([sys.executable, "-m", "traceap", "inject",
                    *[str(args.h200 / r["path"]) for r in clean], "--split", "train",
                    "--copies", str(args.copies), "--jobs", str(args.jobs),
                    "--task", "image_classification",
                    "--out", str(args.out / "h200_inj"), "--overwrite"], check=True)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MARK).write_text("written by benchmarks/h200_train_sets.py\n")
    if not link.is_symlink():
        link.symlink_to((args.h200 / "traces").resolve(), target_is_directory=True)
    others = [dict(r, split="train") for r in rows if r not in clean]
    (dest / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in others))
    print(f"{args.out / 'h200_inj'}: inject into {len(clean)} clean recordings; "
          f"{dest}: {len(others)} recordings with their causes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
