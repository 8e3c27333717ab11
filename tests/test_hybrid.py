"""The default detector: the trained model and the expert rules, stacked (tuned on validation)."""

from __future__ import annotations

import json

import numpy as np

import traceap
from traceap.analysis import analyze
from traceap.detectors.expert import ExpertDetector
import pytest

from traceap.detectors.hybrid import HybridDetector, HybridParams, bundled_params_path
from traceap.errors import ModelError
from traceap.detectors.learned import LearnedDetector
from traceap.detectors.registry import make_detector
from traceap.windows import Windows

from .conftest import CNN, SAMPLE


def test_hybrid_is_the_stack_of_model_and_rules(sample_trace, tmp_path):
    w = Windows(sample_trace, 100)
    model = LearnedDetector().score_windows(w)
    rules = ExpertDetector().score_windows(w)
    p = HybridParams.read()
    assert p == HybridParams.read(bundled_params_path())
    logit = lambda x: np.log(np.clip(x, p.eps, 1 - p.eps)) - np.log1p(-np.clip(x, p.eps, 1 - p.eps))
    expected = 1 / (1 + np.exp(-(p.model_coef * logit(model) + p.expert_coef * logit(rules) + p.bias)))
    assert np.allclose(HybridDetector().score_windows(w), expected)
    # more weight on a part moves the stack towards it; a file says where its numbers came from
    mine = HybridParams(model_coef=5.0, expert_coef=0.0, bias=0.0, tuned_on={"split": "validation"})
    path = tmp_path / "hybrid.json"
    path.write_text(__import__("json").dumps(mine.to_json()))
    assert HybridParams.read(path) == mine
    stacked = HybridDetector(params=path).score_windows(w)
    assert (np.diff(stacked[np.argsort(model)]) >= -1e-12).all()    # the model's order alone
    path.write_text("{}")
    with pytest.raises(ModelError, match="not a readable hybrid"):
        HybridParams.read(path)
    own = ExpertDetector(nearby_reach=0).score_windows(w)   # the mean: the rules' own evidence
    assert np.allclose(HybridDetector(model_weight=0.5).score_windows(w), (model + own) / 2)
    assert np.allclose(HybridDetector(model_weight=1.0).score_windows(w), model)
    assert np.allclose(HybridDetector(model_weight=0.0).score_windows(w), own)


def test_default_analysis_uses_the_hybrid_and_finds_the_exposed_allreduce():
    a = analyze(traceap.load(SAMPLE))
    assert a.detector == "hybrid"
    assert isinstance(make_detector("hybrid"), HybridDetector)
    # The sample's known problem: all-reduces the optimizer waits behind (rank 3 of 8, A100).
    assert a.findings[0].pattern == "nccl_compute_no_overlap"
    assert a.findings[0].severity == "high"
    assert all(f.time_lost_us > 0 for f in a.findings)


def test_the_stack_weighs_the_warm_up_share_of_each_window(tmp_path):
    """A real AMD run of two profiler steps, 9.2 of its 9.4 ms idle one-off start-up: with a
    warm-up weight d the stacked logit drops by d x the window's warm-up share (windows with
    none keep their score), a file without `warmup_coef` reads as d = 0 (the stack of earlier
    releases), and the weight is never applied without the shares."""

    from traceap.idle import warmup_share
    from traceap.load import load
    from .conftest import DATA

    w = Windows(load(DATA / "amd_mi250_train.json.gz"), 100)
    share = warmup_share(w)
    assert share.max() == pytest.approx(1.0) and (share > 0.5).sum() > 80 and share[0] == 0
    base = HybridParams(model_coef=0.6, expert_coef=0.2, bias=-0.2)
    warm = HybridParams(model_coef=0.6, expert_coef=0.2, bias=-0.2, warmup_coef=-5.0)
    path = tmp_path / "hybrid.json"
    path.write_text(json.dumps(warm.to_json()))
    assert HybridParams.read(path) == warm
    plain, weighed = (HybridDetector(params=p).score_windows(w) for p in (base, warm))
    logit = lambda x: np.log(x) - np.log1p(-x)  # noqa: E731
    assert np.allclose(logit(weighed), logit(plain) - 5.0 * share, atol=1e-9)
    assert (weighed[share > 0.5] < plain[share > 0.5]).all()
    assert np.array_equal(weighed[share == 0], plain[share == 0])
    old = {k: v for k, v in warm.to_json().items() if k != "warmup_coef"}
    path.write_text(json.dumps(old))
    assert HybridParams.read(path).warmup_coef == 0.0
    with pytest.raises(ValueError, match="warm-up share"):
        warm.combine(np.full(3, 0.5), np.full(3, 0.5))


def _script(name: str):
    import importlib.util

    from .conftest import REPO
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tune_hybrid():
    return _script("tune_hybrid")


def test_flag_bias_raises_the_bias_only_while_healthy_windows_stay_unflagged():
    """`traceap ship stack` (`traceap.detectors.stack.flag_bias`, on unless --no-flag-bias):
    the bias goes up (more anomalous windows flagged at 0.5) until one more step would flag a
    window of a healthy trace that the fitted bias left alone."""
    from traceap.detectors.stack import flag_bias
    rng = np.random.default_rng(0)
    rows = []
    for i in range(12):
        good = i < 4
        y = np.zeros(100, int) if good else (np.arange(100) >= 60).astype(int)
        expert = np.where(y == 1, rng.uniform(0.45, 0.75, 100), rng.uniform(0.2, 0.3, 100))
        if good:
            expert[7] = 0.42          # the healthy window closest to the flag
        rows.append({"n_windows": 100, "label": "good" if good else "bad", "labels": y,
                     "scores": {"model": np.full(100, 0.5), "expert": expert}})
    fitted = HybridParams(0.0, 1.0, -0.6)
    raised = flag_bias(fitted, rows, [100], lambda r: None)
    # 0.42 crosses 0.5 once the bias passes logit(0.5) - logit(0.42) = 0.323
    assert raised.bias == pytest.approx(-0.6 + 0.05 * 18)     # 0.30, the last step below 0.323
    assert (raised.model_coef, raised.expert_coef) == (0.0, 1.0)
    healthy = [r for r in rows if r["label"] == "good"]
    assert not any((raised.combine(r["scores"]["model"], r["scores"]["expert"]) >= 0.5).any()
                   for r in healthy)
    bad = [r for r in rows if r["label"] == "bad"]
    recall = lambda p: np.mean(np.concatenate([p.combine(r["scores"]["model"], r["scores"]["expert"])
                                               [r["labels"] == 1] >= 0.5 for r in bad]))
    assert recall(raised) > recall(fitted)


def _manifest_rows() -> list[dict]:
    """A dataset manifest: two train families, one validation and one test base."""
    rows = []
    for split, base in (("train", "gemm__a.json.gz"), ("train", "gemm__b.json.gz"),
                        ("train", "moe__c.json.gz"), ("validation", "val__d.json.gz"),
                        ("test_unseen", "hta__e.json.gz")):
        stem = base.split(".")[0]
        common = {"split": split, "task": "other", "model": stem, "platform": "NVIDIA H100",
                  "world_size": 1, "rank": 0, "base": base}
        rows.append({"id": stem, "path": f"traces/{stem}.json.gz", "label": "good",
                     "source": "natural", **common})
        rows.append({"id": f"{stem}__cpu_bound__c0", "path": f"traces/{stem}__c0.json.gz",
                     "label": "bad", "source": "injected", "patterns": ["cpu_bound"], **common})
    return rows


def _write_dataset(path, rows):
    path.mkdir()
    (path / "traces").mkdir()
    (path / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_crossfit_folds_hold_out_whole_families_and_keep_validation(tmp_path):
    """crossfit_folds.py: fold K's train view lacks exactly its families' train traces and keeps
    every validation and test entry; its holdout view holds them alone, as split validation;
    a base no fold claims is refused."""
    folds = _script("crossfit_folds")
    data = tmp_path / "real"
    _write_dataset(data, _manifest_rows())
    out = tmp_path / "folds"
    assert folds.main(["--dataset", str(data), "--out", str(out), "--folds", "gemm;moe"]) == 0

    def ids(view, split=None):
        rows = [json.loads(x) for x in (out / view / "manifest.jsonl").read_text().splitlines()]
        return {r["id"] for r in rows if split is None or r["split"] == split}
    assert ids("fold1/train", "train") == {"moe__c", "moe__c__cpu_bound__c0"}
    assert ids("fold1/holdout") == ids("fold1/holdout", "validation") == {
        "gemm__a", "gemm__a__cpu_bound__c0", "gemm__b", "gemm__b__cpu_bound__c0"}
    assert ids("fold2/holdout") == {"moe__c", "moe__c__cpu_bound__c0"}
    for k in ("fold1", "fold2"):
        assert ids(f"{k}/train", "validation") == {"val__d", "val__d__cpu_bound__c0"}
        assert ids(f"{k}/train", "test_unseen") == {"hta__e", "hta__e__cpu_bound__c0"}
        assert (out / k / "holdout" / "traces").resolve() == (data / "traces").resolve()
    with pytest.raises(SystemExit, match="matches 0 folds"):
        folds.main(["--dataset", str(data), "--out", str(tmp_path / "f2"), "--folds", "gemm"])


def test_tune_hybrid_pools_out_of_fold_scores_by_the_manifest_split(tmp_path):
    """tune_hybrid --oof train: the train traces join the fit with the fold runs' scores, matched
    by trace id whatever split the fold's own view called them (`traceap.eval.scores.
    read_scores`); test traces never join, and --oof test_* is refused."""
    from traceap.eval.scores import read_scores
    tune = _tune_hybrid()
    data = tmp_path / "real"
    rows = _manifest_rows()
    _write_dataset(data, rows)

    def rec(r, split, det, n=4):
        return json.dumps({"id": r["id"], "split": split, "n_windows": n, "label": r["label"],
                           "labels": [0, 0, 1, 1] if r["label"] == "bad" else [0] * 4,
                           "scores": {det: [0.1, 0.2, 0.7, 0.9]}}) + "\n"
    by_split = {s: [r for r in rows if r["split"] == s] for s in ("train", "validation", "test_unseen")}
    expert = tmp_path / "expert.jsonl"
    expert.write_text("".join(rec(r, r["split"], "expert") for r in rows))
    val_model = tmp_path / "val_model.jsonl"
    val_model.write_text("".join(rec(r, "validation", "model") for r in by_split["validation"]))
    fold = tmp_path / "fold_model.jsonl"     # a fold's holdout view: its train traces as validation
    fold.write_text("".join(rec(r, "validation", "model") for r in by_split["train"] + by_split["test_unseen"]))
    got = read_scores([expert, val_model, fold], data, "validation", ("train",))
    assert {(r["id"], r["split"]) for r in got} == {(r["id"], r["split"]) for r in
                                                    by_split["train"] + by_split["validation"]}
    assert all(set(r["scores"]) == {"model", "expert"} for r in got)
    only_val = read_scores([expert, val_model, fold], data, "validation")
    assert {r["id"] for r in only_val} == {r["id"] for r in by_split["validation"]}
    out = tmp_path / "hybrid.json"
    assert tune.main(["--dataset", str(data), "--windows", "4", "--scores", str(expert),
                      "--scores", str(val_model), "--scores", str(fold), "--oof", "train",
                      "--out", str(out)]) == 0
    tuned = json.loads(out.read_text())["tuned_on"]
    assert set(tuned["oof"]) == {"train"} and set(tuned["validation"]) == {"4"}
    with pytest.raises(SystemExit, match="never on a test split"):
        tune.main(["--dataset", str(data), "--scores", str(expert), "--oof", "test_unseen"])
