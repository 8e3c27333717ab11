"""Leave-one-source-out folds (issue #35): the real-based benchmark's fold plan, fold views of
an injected dataset, and `traceap eval --folds` on a tiny one built from the bundled traces.

The tiny dataset is `traceap inject` run over the bundled traces sorted into project folders
the way ../shared/traces is (so the inject stamp records 'project/file' for each base).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from collections import Counter
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pytest

from traceap.cli import main
from traceap.errors import DatasetError
from traceap.eval.folds import HELD_OUT, FoldPlan, dataset_assignment, write_views
from traceap.eval.tables import pct
from traceap.manifest import read_manifest

from .conftest import DATA, REPO, SHARED_TRACES, needs_shared

REAL_FOLDS = REPO / "benchmarks" / "real_folds.yaml"
#: The bundled traces, filed under the projects they stand for.
PROJECTS = {
    "AMD-AGI__TraceLens": [DATA / "amd_mi300_gemm.json.gz"],
    "facebookresearch__HolisticTraceAnalysis": [DATA / "amd_mi250_train.json.gz",
                                                DATA / "backward_thread.json.gz"],
    "facebookresearch__param": sorted((DATA / "dlrm_job").glob("*.json.gz")),
    "pytorch__kineto": [DATA / "kineto2021_v100.json.gz"],
}
TINY_FOLDS = """\
folds:
  meta:
    sources: ["facebookresearch__HolisticTraceAnalysis/*", "facebookresearch__param/*"]
    inner_validation: ["facebookresearch__HolisticTraceAnalysis/backward_thread*"]
  amd:
    sources: ["AMD-AGI__TraceLens/*"]
  kin:
    sources: ["pytorch__kineto/*"]
    inner_validation: ["pytorch__kineto/*"]
"""


@dataclass
class Run:
    exit_code: int
    stdout: str
    output: str    # stdout and stderr


def cli(*args) -> Run:
    """`traceap ARGS` in this process, as the installed command runs (errors: one line, exit 2)."""
    out, err = io.StringIO(), io.StringIO()
    with command_line(["traceap", *map(str, args)]), redirect_stdout(out), redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
    return Run(code, out.getvalue(), out.getvalue() + err.getvalue())


@contextmanager
def command_line(argv: list[str]):
    old, sys.argv = sys.argv, argv
    try:
        yield
    finally:
        sys.argv = old


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """(dataset, fold plan): two patterns planted into six bundled bases of four projects."""
    root = tmp_path_factory.mktemp("folds")
    for project, files in PROJECTS.items():
        (root / "src" / project).mkdir(parents=True)
        for f in files:
            shutil.copyfile(f, root / "src" / project / f.name)
    (root / "splits.yaml").write_text(
        "splits:\n  train: ['AMD-AGI__TraceLens/*']\n  validation: ['pytorch__kineto/*']\n"
        "  test_unseen: ['facebookresearch__HolisticTraceAnalysis/*', "
        "'facebookresearch__param/*']\n")
    r = cli("inject", root / "src", "--split-plan", root / "splits.yaml", "--out", root / "ds",
            "--patterns", "single_process_dataloading,no_pin_memory")
    assert r.exit_code == 0, r.output
    (root / "folds.yaml").write_text(TINY_FOLDS)
    return root / "ds", root / "folds.yaml"


# -- the real-based benchmark's plan -------------------------------------------------------

def test_real_plan_keeps_the_dlrm_family_in_one_fold():
    """HTA's DLRM / TorchRec traces and PARAM's DLRM ranks are one model family: one fold."""
    plan = FoldPlan.read(REAL_FOLDS)
    dlrm = ["facebookresearch__HolisticTraceAnalysis/trace_diff__control__control.json.gz",
            "facebookresearch__HolisticTraceAnalysis/timeline_analysis__sampled_rank-0.json.gz",
            "facebookresearch__HolisticTraceAnalysis/negative_queue_length_values_check__rank0.json.gz",
            "facebookresearch__param/dlrm_kineto.tar.gz__dlrm_kineto__worker0_step_12"
            ".1694128201545.pt.trace.json.gz"]
    assert {plan.fold_of(rel).name for rel in dlrm} == {"hta_param"}
    assert plan.names == ["hta_param", "tracelens_zoology", "particle_kineto"]


@needs_shared
def test_real_plan_puts_every_catalogued_base_in_exactly_one_fold():
    plan = FoldPlan.read(REAL_FOLDS)
    catalog = json.loads((SHARED_TRACES / "catalog.json").read_text())
    folds = Counter(plan.fold_of(e["file"]).name for e in catalog)   # raises on none or two
    assert folds == {"tracelens_zoology": 35, "hta_param": 28, "particle_kineto": 12}
    # every fold's inner-validation slice is about a quarter of it, never all of it
    inner = Counter(plan.fold_of(e["file"]).name for e in catalog
                    if plan.fold_of(e["file"]).inner(e["file"]))
    assert inner == {"tracelens_zoology": 10, "hta_param": 7, "particle_kineto": 4}
    # a repository never spans two folds
    by_repo: dict[str, set[str]] = {}
    for e in catalog:
        by_repo.setdefault(e["repo"], set()).add(plan.fold_of(e["file"]).name)
    assert all(len(f) == 1 for f in by_repo.values())


# -- fold views ----------------------------------------------------------------------------

def test_views_hold_each_fold_out_once(tiny, tmp_path):
    dataset, plan_path = tiny
    plan = FoldPlan.read(plan_path)
    entries, a = dataset_assignment(dataset, plan)
    views = write_views(dataset, plan, tmp_path / "views")
    held = Counter()
    for fold, view in views.items():
        v = {e.id: e for e in read_manifest(view)}
        assert set(v) == {e.id for e in entries}
        for e in entries:
            expect = HELD_OUT if a.fold[e.id] == fold else \
                "validation" if a.inner[e.id] else "train"
            assert v[e.id].split == expect, (fold, e.id)
        held.update(i for i, e in v.items() if e.split == HELD_OUT)
        # the traces are the dataset's, linked, not copied
        assert (view / "traces").is_symlink()
        assert all((view / e.path).is_file() for e in v.values())
    assert set(held) == {e.id for e in entries} and set(held.values()) == {1}
    # the DLRM job's two ranks and the HTA traces sit in one fold
    assert {a.fold[e.id] for e in entries if "worker" in e.id} == {"meta"}


# -- traceap eval --folds ------------------------------------------------------------------

def test_eval_over_folds_scores_every_trace_once_with_the_rules(tiny, tmp_path):
    """`--detectors expert` needs no fold models: per fold and pooled, per pattern."""
    dataset, plan = tiny
    out = tmp_path / "out"
    r = cli("eval", "--dataset", dataset, "--folds", plan, "--detectors", "expert",
            "--windows", "50", "--out", out)
    assert r.exit_code == 0, r.output
    s = orjson.loads((out / "eval.json").read_bytes())
    assert s["schema"] == "traceap.eval-folds/v1"
    n = len(read_manifest(dataset))
    assert [f["n_traces"] for f in s["folds"].values()] == [10, 3, 3]
    assert sum(f["n_traces"] for f in s["folds"].values()) == n
    assert len((out / "scores.jsonl").read_text().splitlines()) == n
    pooled = s["pooled"]["by_pattern"]["50"]["expert"]
    assert set(pooled) >= {"single_process_dataloading", "no_pin_memory"}
    assert all(0.0 <= x["auc"] <= 1.0 and x["n_windows"] > 0 for x in pooled.values())
    assert s["folds"]["amd"]["eval"]["by_pattern"]["50"]["expert"]["no_pin_memory"]["n_windows"] > 0
    acc = s["pooled"]["classification"]["offline"]["50"]["by_pattern"]
    assert acc["single_process_dataloading"]["n_windows"] == \
        pooled["single_process_dataloading"]["n_windows"]
    md = (out / "eval.md").read_text()
    assert "| Pattern | meta | amd | kin | pooled |" in md
    assert "Expert rules: window AUC (%) per pattern" in md
    # the accuracy on the windows the rules flag (no hybrid scored: the first detector's)
    flagged = s["pooled"]["classification"]["offline"]["50"]["flagged"]
    assert flagged["detector"] == "expert"
    assert "## Pattern accuracy (%) of the `offline` classifier on windows `expert` flags, " \
           "N<sub>w</sub> = 50" in md
    cells = [f"**{pct(x['overall'], 1)} / {pct(x['overall_any'], 1)} ({x['n_windows']})**" for x in
             [f["eval"]["classification"]["offline"]["50"]["flagged"]
              for f in s["folds"].values()] + [flagged]]
    assert "| **flagged windows** | " + " | ".join(cells) + " |" in md


def test_eval_over_folds_never_replaces_a_file_it_did_not_write(tiny, tmp_path):
    """`--folds --out` claims its folder as plain eval does: a user's eval.md stops the run
    before anything is scored, and is kept; a rerun replaces only the folds eval's own files,
    and other files in the folder stay."""
    dataset, plan = tiny
    out = tmp_path / "out"
    out.mkdir()
    (out / "eval.md").write_text("my notes")
    (out / "other.txt").write_text("mine")
    args = ("eval", "--dataset", dataset, "--folds", plan, "--detectors", "expert",
            "--classifier", "", "--windows", "50", "--out", out)
    r = cli(*args)
    assert r.exit_code == 2 and "eval.md exists and was not written by traceap eval" in r.output
    assert (out / "eval.md").read_text() == "my notes" and not (out / "eval.json").exists()
    (out / "eval.md").unlink()
    assert cli(*args).exit_code == 0
    first = (out / "eval.json").read_bytes()
    r = cli(*args)
    assert r.exit_code == 0, r.output
    assert "replaced 3 files of an earlier eval run" in r.output
    assert orjson.loads((out / "eval.json").read_bytes())["schema"] == \
        orjson.loads(first)["schema"] == "traceap.eval-folds/v1"
    assert (out / "eval.md").read_text().startswith("Dataset `")
    assert (out / "other.txt").read_text() == "mine"


def test_flagged_accuracy_over_folds_is_the_share_of_flagged_planted_windows_named_right(tiny):
    """Issue #35's target, per fold and pooled, by hand from the records: of the anomalous
    windows the expert rules flag, the share the offline classifier names right."""
    from traceap.classify import make_classifier
    from traceap.detectors import make_detector
    from traceap.eval import EvalConfig
    from traceap.eval.folds import evaluate_folds

    dataset, plan = tiny
    res = evaluate_folds(dataset, FoldPlan.read(plan), lambda fold: {
        "expert": make_detector("expert")}, EvalConfig(windows=(50,)),
        lambda fold, dets: {"offline": make_classifier("offline")}, on_warning=lambda m: None)

    def by_hand(records) -> tuple[float, int, int]:
        right = total = unflagged = 0
        for r in records:
            anomalous = np.flatnonzero(r.labels)
            for k, w in enumerate(anomalous):
                if not r.flagged["expert"][w]:
                    unflagged += 1
                    continue
                total += 1
                right += r.calls["offline"][k] == r.patterns[w]
        return right / total, total, unflagged

    for result in [*res.per_fold.values(), res.pooled]:
        c = result.summary["classification"]["offline"]["50"]
        acc, total, unflagged = by_hand(result.records)
        assert c["flagged"]["detector"] == "expert"
        assert c["flagged"]["overall"] == pytest.approx(acc)
        assert c["flagged"]["n_windows"] == total
        assert sum(x["n_windows"] for x in c["flagged"]["by_pattern"].values()) == total
    # the rules miss some planted windows, and the two accuracies differ there
    c = res.pooled.summary["classification"]["offline"]["50"]
    assert unflagged > 0
    assert c["flagged"]["n_windows"] + unflagged == sum(
        x["n_windows"] for x in c["by_pattern"].values())
    assert c["flagged"]["overall"] != pytest.approx(c["overall"])


def test_eval_over_folds_reads_each_folds_model_and_stack(tiny, tmp_path):
    """model and hybrid come from DIR/<fold>/model.pt and hybrid.json (here the shipped ones)."""
    dataset, plan = tiny
    models = tmp_path / "models"
    for fold in ("meta", "amd", "kin"):
        (models / fold).mkdir(parents=True)
        shutil.copyfile(REPO / "src" / "traceap" / "data" / "model.pt", models / fold / "model.pt")
        shutil.copyfile(REPO / "src" / "traceap" / "data" / "hybrid.json",
                        models / fold / "hybrid.json")
    r = cli("eval", "--dataset", dataset, "--folds", plan, "--fold-models", models,
            "--detectors", "expert,model,hybrid", "--windows", "50", "--classifier", "",
            "--json")
    assert r.exit_code == 0, r.output
    s = orjson.loads(r.stdout[r.stdout.index("{"):])
    assert s["pooled"]["detectors"] == ["expert", "model", "hybrid"]
    assert set(s["pooled"]["by_pattern"]["50"]["hybrid"]) >= {"no_pin_memory"}
    (models / "kin" / "hybrid.json").unlink()
    r = cli("eval", "--dataset", dataset, "--folds", plan, "--fold-models", models,
            "--detectors", "hybrid", "--windows", "50")
    assert r.exit_code == 2 and "kin/hybrid.json" in r.output, r.output


def test_eval_over_folds_counts_the_warnings_it_does_not_show(tiny, tmp_path):
    """The terminal shows the first ten warnings and says how many more eval.json holds, with
    --folds as without (it once dropped the rest without a word)."""
    dataset, plan = tiny
    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    entries, assignment = dataset_assignment(copy, FoldPlan.read(plan))
    kept = {assignment.fold[e.id]: e for e in entries}        # one trace left in each fold
    gone = [e for e in entries if e not in kept.values()]
    assert len(gone) > 10
    for e in gone:
        (copy / e.path).unlink()
    out = tmp_path / "out"
    r = cli("eval", "--dataset", copy, "--folds", plan, "--detectors", "expert",
            "--windows", "50", "--classifier", "", "--out", out)
    assert r.exit_code == 0, r.output
    saved = orjson.loads((out / "eval.json").read_bytes())["warnings"]
    missing = [w for w in saved if "is missing" in w]
    assert len(missing) == len(gone)
    shown = [ln for ln in r.output.splitlines() if ln.startswith("traceap: warning: ")]
    assert len(shown) == 11, r.output
    assert shown[-1] == (f"traceap: warning: ... and {len(saved) - 10} more "
                         f"(--out lists them all in eval.json)")


@pytest.mark.parametrize("args, says", [
    (("--detectors", "model"), "needs --fold-models"),
    (("--fold-models", "nowhere"), "--fold-models: no folder"),
    (("--model", "x.pt"), "--model does not go with --folds"),
    (("--fold", "nope"), "--fold: no fold 'nope'"),
    (("--classifier", "offline+model"), "offline+model with --folds needs --fold-models"),
])
def test_eval_over_folds_bad_options(tiny, args, says):
    dataset, plan = tiny
    r = cli("eval", "--dataset", dataset, "--folds", plan, "--windows", "50", *args)
    assert r.exit_code == 2, r.output
    assert says in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("plan, says", [
    (TINY_FOLDS.replace('["AMD-AGI__TraceLens/*"]', '["AMD-AGI__TraceLens/*", "*kineto*"]'),
     "is in two folds (amd, kin)"),
    (TINY_FOLDS.replace('"pytorch__kineto/*"]\n    inner', '"nothing/*"]\n    inner'),
     "kineto2021_v100.json.gz is in no fold"),
    ("splits: {train: ['*']}\n", "needs a 'folds' mapping"),
    ("folds:\n  only:\n    sources: ['*']\n", "at least two folds"),
    ("folds:\n  a:\n    inner_validation: ['*']\n  b:\n    sources: ['*']\n",
     "give its sources"),
    (TINY_FOLDS + "  extra:\n    sources: ['gone/*']\n", "fold 'extra' holds no trace"),
    ("folds: [unclosed\n", "cannot read the fold plan"),
])
def test_a_bad_fold_plan_is_one_line_and_exit_2(tiny, tmp_path, plan, says):
    dataset, _ = tiny
    path = tmp_path / "plan.yaml"
    path.write_text(plan)
    r = cli("eval", "--dataset", dataset, "--folds", path, "--detectors", "expert")
    assert r.exit_code == 2, r.output
    assert says in r.output and len(r.output.strip().splitlines()) == 1
    with pytest.raises(DatasetError):
        dataset_assignment(dataset, FoldPlan.read(path))


def _fold_models(*args):
    """benchmarks/fold_models.py ARGS, run as a user runs it (this checkout's traceap)."""
    import subprocess
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "fold_models.py"),
                           *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})


def test_fold_models_keeps_the_held_out_fold_out_of_training_and_pretraining(tiny, tmp_path):
    """benchmarks/fold_models.py --dry-run: the commands of one fold, on its view; the
    pretraining view (--ssl) holds every trace but the held-out fold's."""
    dataset, plan = tiny
    out = tmp_path / "models"
    r = _fold_models("--dataset", dataset, "--folds", plan, "--out", out, "--fold", "amd",
                     "--windows", "50", "--ssl", "10", "--every-source", "--dry-run")
    assert r.returncode == 0, r.stderr
    steps = [line for line in r.stdout.splitlines() if line.startswith("+ ")]
    assert [s.split(" traceap ")[1].split()[0:2] for s in steps] == \
        [["train", "--dataset"], ["eval", "--dataset"], ["ship", "model"], ["ship", "stack"]] * 2
    assert f"--val {out}/views/amd" in steps[0] and f"--pretrain-on {out}/views/amd-pretrain" in steps[0]
    assert "--split validation" in steps[1] and "--split validation" in steps[3]
    held = {e.id for e in read_manifest(out / "views" / "amd") if e.split == HELD_OUT}
    pre = {e.id for e in read_manifest(out / "views" / "amd-pretrain")}
    assert held and not held & pre
    assert pre | held == {e.id for e in read_manifest(dataset)}
    # the shipped model's view: every source, inner-validation slices for its choices
    every = Counter(e.split for e in read_manifest(out / "views" / "every_source"))
    assert set(every) == {"train", "validation"} and sum(every.values()) == len(pre | held)
    assert f"--out {out}/every_source/train.pt" in steps[4]


def test_single_source_views_train_on_one_fold_and_score_the_others_slices(tiny):
    """Out-of-source stacking's views: fold J alone trains (its slice validates), the other
    folds' inner-validation slices are scored, nothing else is there; a slice view holds one
    fold's slice."""
    dataset, plan_path = tiny
    entries, a = dataset_assignment(dataset, FoldPlan.read(plan_path))
    for fold in ("meta", "amd", "kin"):
        view = {e.id: e.split for e in a.single_view(entries, fold)}
        for e in entries:
            if a.fold[e.id] == fold:
                assert view[e.id] == ("validation" if a.inner[e.id] else "train"), (fold, e.id)
            elif a.inner[e.id]:
                assert view[e.id] == HELD_OUT, (fold, e.id)
            else:
                assert e.id not in view, (fold, e.id)
        sliced = a.slice_view(entries, fold)
        assert {e.id for e in sliced} == {e.id for e in entries
                                          if a.fold[e.id] == fold and a.inner[e.id]}
        assert {e.split for e in sliced} <= {HELD_OUT}
    # the plan has slices in two folds and training traces in all three
    assert {a.fold[i] for i, inner in a.inner.items() if inner} == {"meta", "kin"}
    assert {a.fold[i] for i, inner in a.inner.items() if not inner} == {"meta", "amd"}


def _dry_run(*args) -> list[str]:
    """The commands `fold_models.py ARGS --dry-run` prints."""
    r = _fold_models(*args, "--dry-run")
    assert r.returncode == 0, r.stderr
    return [line[2:] for line in r.stdout.splitlines() if line.startswith("+ ")]


def test_cross_fit_stacks_on_slices_scored_by_a_model_that_never_saw_their_source(tiny, tmp_path):
    """fold_models.py --single-source trains fold J alone and scores the other slices;
    --cross-fit fits fold K's stack on those of the other two folds' single-source models, and
    every_source's on each fold's slice scored by that fold's own model."""
    dataset, plan = tiny
    single, out = tmp_path / "single", tmp_path / "folds"
    steps = _dry_run("--dataset", dataset, "--folds", plan, "--out", single, "--single-source",
                     "--windows", "50")
    assert [s.split(" traceap ")[1].split()[0] for s in steps] == ["train", "eval"] * 3
    for fold, (train, ev) in zip(("meta", "amd", "kin"), zip(steps[::2], steps[1::2])):
        assert f"--val {single}/views/only_{fold} " in train
        assert f"--split {HELD_OUT} " in ev and f"--model {single}/only_{fold}/train.pt " in ev
        assert ev.endswith(f"--out {single}/only_{fold}/out_of_source")
        held = {e.id for e in read_manifest(single / "views" / f"only_{fold}") if e.split == HELD_OUT}
        trained = {e.id for e in read_manifest(single / "views" / f"only_{fold}")
                   if e.split in ("train", "validation")}
        assert held and trained and not held & trained
    steps = _dry_run("--dataset", dataset, "--folds", plan, "--out", out, "--cross-fit", single,
                     "--every-source", "--windows", "50")
    stacks = [s for s in steps if " ship stack " in s]
    assert len(stacks) == 4
    for fold, stack in zip(("meta", "amd", "kin"), stacks):
        others = [f for f in ("meta", "amd", "kin") if f != fold]
        assert [w for w in stack.split() if "out_of_source" in w] == \
            [f"{single}/only_{f}/out_of_source/scores.jsonl" for f in others]
    # every_source: each fold's slice scored by that fold's model, before its stack
    # (amd has no slice: nothing of it to score)
    k = steps.index(stacks[3])
    assert [s.split("--model ")[1].split()[0] for s in steps[k - 2:k]] == \
        [f"{out}/{f}/model.pt" for f in ("meta", "kin")]
    assert " ship model " in steps[k - 3]
    assert [w for w in stacks[3].split() if "out_of_source" in w] == \
        [f"{out}/{f}/out_of_source/scores.jsonl" for f in ("meta", "kin")]
    assert {e.split for e in read_manifest(out / "views" / "slice_kin")} == {HELD_OUT}
    # without the single-source scores it refuses, in one line
    r = _fold_models("--dataset", dataset, "--folds", plan, "--out", out, "--cross-fit",
                     tmp_path / "none")
    assert r.returncode != 0 and "run --single-source" in r.stderr and "Traceback" not in r.stderr


def test_a_view_never_replaces_a_folder_it_did_not_write(tmp_path):
    """A manifest or a traces link that is not this dataset's view stays as it was."""
    from traceap.errors import DatasetError
    from traceap.eval.folds import write_view
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "manifest.jsonl").write_text("my dataset\n")
    traces = tmp_path / "traces"
    traces.mkdir()
    with pytest.raises(DatasetError, match="not a fold view"):
        write_view(mine, [], traces)
    assert (mine / "manifest.jsonl").read_text() == "my dataset\n"
    other = tmp_path / "other"
    other.mkdir()
    (other / "traces").symlink_to(tmp_path)
    with pytest.raises(DatasetError, match="give another folder"):
        write_view(other, [], traces)
    assert (other / "traces").resolve() == tmp_path.resolve()
    view = write_view(tmp_path / "view", [], traces)       # its own view: rewritten
    assert write_view(view, [], traces) == view


SHIPPED_FOLDS = REPO / "benchmarks" / "fold_models" / "ensemble_e8"


def test_the_fold_table_s_models_ship_one_per_fold_of_the_real_plan():
    """docs/RESULTS.md's fold table is reproduced by one `traceap eval --fold-models` command
    on the shipped fold models: one model and stack per fold of benchmarks/real_folds.yaml,
    each loading as eval loads it, each its own fold's (three different models, none the
    every-source checkpoint)."""
    import hashlib

    from traceap.cli.eval import fold_detectors
    from traceap.windows import Windows
    import traceap

    plan = FoldPlan.read(REAL_FOLDS)
    folds = [f.name for f in plan.folds]
    assert sorted(p.name for p in SHIPPED_FOLDS.iterdir() if p.is_dir()) == sorted(folds)
    dets = fold_detectors(["expert", "model", "hybrid"], True, folds, SHIPPED_FOLDS,
                          lambda m: pytest.fail(m))
    w = Windows(traceap.load(DATA / "particle_transformer_bs8.json.gz"), 50)
    scores = {f: np.asarray(d["model"].score_windows(w)) for f, d in dets.items()}
    for f, s in scores.items():
        assert s.shape == (50,) and np.isfinite(s).all() and (0 <= s).all() and (s <= 1).all()
        h = np.asarray(dets[f]["hybrid"].score_windows(w))
        assert h.shape == (50,) and np.isfinite(h).all()
    digest = {f: hashlib.sha256((SHIPPED_FOLDS / f / "model.pt").read_bytes()).hexdigest()
              for f in folds}
    shipped = hashlib.sha256((REPO / "src" / "traceap" / "data" / "model.pt").read_bytes())
    assert len(set(digest.values())) == len(folds)
    assert shipped.hexdigest() not in digest.values()
    results = (REPO / "docs" / "RESULTS.md").read_text()
    assert "--fold-models benchmarks/fold_models/ensemble_e8" in results


def _results_row(title: str) -> list[str]:
    """The cells of docs/RESULTS.md's fold-table row `title` (hta_param, tracelens_zoology,
    particle_kineto, pooled)."""
    text = (REPO / "docs" / "RESULTS.md").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {title} |"))
    return [c.strip() for c in line.strip("|").split("|")[1:]]


def test_the_results_fold_table_reads_as_the_committed_fold_eval():
    """Every number shown twice reads the same: the fold table of docs/RESULTS.md is the one in
    benchmarks/results/real_folds/ensemble_e8/eval.json, which the command above it writes."""
    s = orjson.loads((REPO / "benchmarks" / "results" / "real_folds" / "ensemble_e8"
                      / "eval.json").read_bytes())
    cols = [s["folds"][f]["eval"] for f in ("hta_param", "tracelens_zoology", "particle_kineto")]
    cols.append(s["pooled"])

    def src(e: dict, det: str) -> dict:
        return e["by_source"]["100"][det]["unseen"]

    def triple(get) -> list[str]:
        return [" / ".join(pct(get(e, d), 1) for d in ("expert", "model", "hybrid")) for e in cols]
    assert _results_row("window AUC") == triple(lambda e, d: src(e, d)["all"]["auc"])
    assert _results_row("trace AUC (max)") == triple(lambda e, d: src(e, d)["trace_auc_max"])
    assert _results_row("healthy windows flagged") == [
        c + "%" for c in triple(lambda e, d: src(e, d)["healthy"]["flagged_share"])]
    flagged = [e["classification"]["offline"]["100"]["flagged"] for e in cols]
    assert _results_row("pattern accuracy on the planted windows the hybrid flags (offline): "
                        "the planted pattern named") == [pct(f["planted"]["overall"], 1)
                                                         for f in flagged]
    assert _results_row("pattern accuracy where the hybrid flags (offline), strict / either "
                        "cause") == [f"{pct(f['overall'], 1)} / {pct(f['overall_any'], 1)}"
                                     for f in flagged]


def test_benchmarks_fold_table_prints_the_results_tables_as_they_are():
    """benchmarks/fold_table.py turns the committed fold eval into docs/RESULTS.md's summary and
    per-pattern tables: every row it prints is in the document, so a rerun updates it by copy."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fold_table.py"),
                          str(REPO / "benchmarks" / "results" / "real_folds" / "ensemble_e8"
                              / "eval.json")], capture_output=True, text=True, check=True).stdout
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and not ln.startswith("|---")]
    assert len(rows) == 2 + 9 + 16
    results = (REPO / "docs" / "RESULTS.md").read_text().splitlines()
    missing = [r for r in rows if r not in results]
    assert not missing, missing
