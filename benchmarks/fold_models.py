"""Train each leave-one-source-out fold's model and stack without that fold (issue #35).

    python benchmarks/fold_models.py --dataset /work/datasets/real16 \\
        --folds benchmarks/real_folds.yaml --out benchmarks/out/folds \\
        [--fold hta_param] [--extra-train datasets/synth_v3 --extra-train datasets/ddp_train2] \\
        [--windows 50,100,200 --epochs 8 --steps-per-epoch 75 --threads 1] \\
        [--set time_relative=true ...] [--ssl 300] [--dry-run]

then score every fold's held-out traces with its own fold's model:

    traceap eval --dataset /work/datasets/real16 --folds benchmarks/real_folds.yaml \\
        --fold-models benchmarks/out/folds --detectors expert,model,hybrid --windows 100

For each fold K (all, or those of --fold), on the fold view OUT/views/K
(`traceap.eval.folds`: train = the other folds minus their inner-validation slices,
validation = those slices, test_unseen = fold K), it runs the commands a shipped model goes
through, each choice made on the inner validation split only:

1. `traceap train --dataset OUT/views/K [--dataset EXTRA...] --val OUT/views/K`: weights,
   the best epoch picked on the inner validation;
2. `traceap eval --dataset OUT/views/K --split validation --detectors expert,model`: the
   inner validation's window scores;
3. `traceap ship model`: OUT/K/model.pt, its flag threshold calibrated on those scores;
4. `traceap ship stack --split validation`: OUT/K/hybrid.json, the hybrid's stack.

`--every-source` also trains OUT/every_source/ the same way on every fold (train = every
fold outside its inner-validation slice, validation = the slices): the shipped checkpoint and
stack with the recipe the folds chose (`traceap ship model|stack --into-package` from there);
`--fold every_source` trains only that one.  `--join RUN_OUT` (twice or more) trains nothing:
each fold's checkpoint is the ensemble of those runs' (`traceap ship ensemble`), calibrated and
stacked on the inner validation like a trained one (the shipped recipe: two runs joined).
`--ssl STEPS` pretrains on the unmodified traces of the view's train and validation splits
(OUT/views/K-pretrain: fold K left out, as from everything else).  `--extra-train` datasets
(the synthetic ones of docs/RESULTS.md's recipe) join training whole: they hold no real trace.

Out-of-source stacking.  A fold's inner-validation slices share their sources with its
model's training traces, so the model reads better there than on a source it never saw, and
a stack fitted there weighs it by that.  `--single-source` trains OUT/only_<J>/ on fold J
alone (train = J outside its slice, validation = J's slice) and scores the other folds'
slices with it (OUT/only_<J>/out_of_source/scores.jsonl; with `--join`, the runs' only_<J>
joined).  `--cross-fit SINGLE_OUT` then fits fold K's stack on the other folds' slices, each
scored by the single-source model of the third fold (trained on neither it nor K), and
every_source's (the shipped stack) on every fold's slice, each scored by that fold's own
model (OUT/<K>/out_of_source: trained on the other folds): every stack weighs the model as it
scores sources it never saw.  The flag threshold stays calibrated on the model's own inner
validation.  With more than three folds a slice scored by two single-source models keeps the
later one's scores (plan order).
Each command is printed before it runs; --dry-run prints them only.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

from traceap.eval.folds import (HELD_OUT, FoldPlan, dataset_assignment, describe, write_view,
                                write_views)

#: The output folder of --every-source: the model of every fold together (the shipped one).
EVERY = "every_source"
#: --single-source's folder of fold J: OUT/only_J.
SINGLE = "only_"
#: Where a model's scores of slices it never saw go (OUT/<fold>/out_of_source/scores.jsonl).
OOS = "out_of_source"


def score(view: Path, ckpt: Path, out: Path, split: str, args) -> list[str]:
    """`traceap eval` of a view's split by the rules and a checkpoint, scores to OUT."""
    return [sys.executable, "-m", "traceap", "eval", "--dataset", str(view), "--split", split,
            "--detectors", "expert,model", "--model", str(ckpt), "--windows", args.windows,
            "--classifier", "", "--out", str(out)]


def commands(view: Path, pretrain: Path | None, fold_dir: Path, args,
             stack_scores: list[Path] | None = None, single: bool = False) -> list[list[str]]:
    """The four steps of one fold (module docstring); the eval step's tables go to its
    --out folder, not the terminal.  `stack_scores`: the scores the stack is fitted on
    (default: the model's own inner validation); `single`: a --single-source run (train,
    then score the other folds' slices)."""
    tr = [sys.executable, "-m", "traceap"]
    ckpt = fold_dir / "train.pt"
    scores = fold_dir / "inner_validation"
    train = [*tr, "train", "--dataset", str(view), *[x for d in args.extra_train
                                                      for x in ("--dataset", str(d))],
             "--val", str(view), "--out", str(ckpt), "--windows", args.windows,
             "--threads", str(args.threads), "--overwrite"]
    train += ["--epochs", str(args.epochs)] if args.epochs else []
    train += ["--steps-per-epoch", str(args.steps_per_epoch)] if args.steps_per_epoch else []
    train += ["--mix", args.mix] if args.mix else []
    train += [x for s in args.set for x in ("--set", s)]
    if pretrain is not None:
        train += ["--pretrain-on", str(pretrain), "--pretrain-steps", str(args.ssl)]
    if args.join:
        # the recipe is an ensemble of runs made before: join each run's checkpoint of this fold
        train = [*tr, "ship", "ensemble", *[str(d / fold_dir.name / "train.pt") for d in args.join],
                 "--out", str(ckpt), "--overwrite"]
    if single:
        return [train, score(view, ckpt, fold_dir / OOS, HELD_OUT, args)]
    stack_scores = stack_scores or [scores / "scores.jsonl"]
    return [
        train,
        score(view, ckpt, scores, "validation", args),
        [*tr, "ship", "model", str(ckpt), "--calibrate", str(scores / "scores.jsonl"),
         "--out", str(fold_dir), "--overwrite"],
        [*tr, "ship", "stack", "--dataset", str(view),
         *[x for f in stack_scores for x in ("--scores", str(f))],
         "--split", "validation", "--windows", args.windows, "--model",
         str(fold_dir / "model.pt"), "--out", str(fold_dir), "--overwrite"],
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", type=Path, required=True,
                    help="an inject output with every split (traceap inject --split-plan)")
    ap.add_argument("--folds", type=Path, required=True, help="fold plan (YAML)")
    ap.add_argument("--out", type=Path, required=True, help="OUT/<fold>/model.pt, hybrid.json")
    ap.add_argument("--fold", action="append", default=[], help="only these folds")
    ap.add_argument("--extra-train", type=Path, action="append", default=[],
                    help="another dataset whose train split joins training (synthetic)")
    ap.add_argument("--windows", default="50,100,200")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--steps-per-epoch", type=int)
    ap.add_argument("--mix", default="", help="traceap train --mix (one weight per dataset)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="traceap train --set (the recipe's config changes)")
    ap.add_argument("--ssl", type=int, default=0, metavar="STEPS",
                    help="self-supervised pretraining steps on the fold's non-held-out traces")
    ap.add_argument("--every-source", action="store_true",
                    help="also train OUT/every_source on every fold (the shipped model)")
    ap.add_argument("--join", type=Path, action="append", default=[], metavar="RUN_OUT",
                    help="instead of training: join RUN_OUT/<fold>/train.pt of each run (two or "
                         "more) into one ensemble, then calibrate and stack it as a trained one")
    ap.add_argument("--single-source", action="store_true",
                    help="train OUT/only_<fold>/ on each fold alone and score the other folds' "
                         "inner-validation slices with it (what --cross-fit reads)")
    ap.add_argument("--cross-fit", type=Path, metavar="SINGLE_OUT",
                    help="fit each stack on slices scored by a model that never saw their "
                         "source: SINGLE_OUT's single-source models for the folds, each "
                         "fold's own model for every_source (module docstring)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    try:
        plan = FoldPlan.read(args.folds)
        # `--fold every_source` alone: only the shipped model (the folds were run before)
        if EVERY in args.fold:
            args.every_source = True
            args.fold = [f for f in args.fold if f != EVERY]
            only_every = not args.fold
        else:
            only_every = False
        unknown = [f for f in args.fold if f not in plan.names]
        if len(args.join) == 1:
            raise SystemExit("fold_models: --join needs two or more runs")
        if unknown:
            raise SystemExit(f"fold_models: unknown fold {unknown[0]!r}; the plan has "
                             f"{', '.join(plan.names)}")
        if args.single_source and (args.every_source or args.cross_fit):
            raise SystemExit("fold_models: --single-source trains the models --cross-fit "
                             "reads: run it on its own")
        if args.cross_fit and len(plan.names) < 3:
            raise SystemExit("fold_models: --cross-fit needs three folds or more (a slice is "
                             "scored by a model of a third fold)")
        entries, a = dataset_assignment(args.dataset, plan)
        if args.single_source:
            views = {SINGLE + f: write_view(args.out / "views" / (SINGLE + f),
                                            a.single_view(entries, f), args.dataset / "traces")
                     for f in plan.names}
        else:
            views = write_views(args.dataset, plan, args.out / "views", (entries, a))
        if args.cross_fit:
            missing = [p for f in plan.names
                       if not (p := args.cross_fit / (SINGLE + f) / OOS / "scores.jsonl").is_file()]
            if missing and not args.dry_run:
                raise SystemExit(f"fold_models: {missing[0]}: no such scores (run "
                                 f"--single-source --out {args.cross_fit} first)")
        if args.every_source:
            if EVERY in plan.names:
                raise SystemExit(f"fold_models: a fold is named {EVERY!r}; rename it")
            views[EVERY] = write_view(args.out / "views" / EVERY, a.view(entries, None),
                                      args.dataset / "traces")
    except Exception as exc:   # DatasetError and friends: one line
        raise SystemExit(f"fold_models: {exc}") from None
    for line in describe(entries, a):
        print(line, flush=True)
    folds = [] if only_every else (args.fold or plan.names)
    if args.single_source:
        folds = [SINGLE + f for f in folds]
    for fold in folds + ([EVERY] if args.every_source else []):
        pretrain = None
        if args.ssl:
            view_entries = (a.single_view(entries, fold.removeprefix(SINGLE))
                            if args.single_source
                            else a.view(entries, None if fold == EVERY else fold))
            pretrain = write_view(args.out / "views" / f"{fold}-pretrain",
                                  [e for e in view_entries if e.split != HELD_OUT],
                                  args.dataset / "traces")
        stack_scores, before = None, []
        if args.cross_fit and fold == EVERY:
            # each fold's slice scored by that fold's model, which never saw it
            sliced = {f: s for f in plan.names if (s := a.slice_view(entries, f))}
            stack_scores = [args.out / f / OOS / "scores.jsonl" for f in sliced]
            for f, slice_entries in sliced.items():
                view = write_view(args.out / "views" / f"slice_{f}", slice_entries,
                                  args.dataset / "traces")
                before.append(score(view, args.out / f / "model.pt", args.out / f / OOS,
                                    HELD_OUT, args))
        elif args.cross_fit:
            # the other folds' slices, each scored by the third fold's single-source model
            stack_scores = [args.cross_fit / (SINGLE + f) / OOS / "scores.jsonl"
                            for f in plan.names if f != fold]
        t0 = time.perf_counter()
        steps = commands(views[fold], pretrain, args.out / fold, args, stack_scores,
                         args.single_source)
        for cmd in [*steps[:-1], *before, steps[-1]]:   # the slices scored before the stack
            print("+ " + shlex.join(cmd), flush=True)
            if not args.dry_run:
                quiet = cmd[3] == "eval"   # its tables are in OUT/K/inner_validation/eval.md
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if quiet else None)
        print(f"fold {fold}: {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
