"""The learned detector: features, shapes, losses, training, checkpoints, the bundled model."""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from traceap.manifest import read_manifest, trace_path
from traceap.patterns import PAPER, pattern_ids
from traceap.errors import ModelError
from traceap.load import load
from traceap.model import ModelConfig, Predictor, create_model, load_model, preset, save_model
from traceap.model.features import (HOST_KINDS, MODEL_MECHANISMS, STAT_KEYS, SUMMARY_DIM,
                                     SUMMARY_IDLE, featurize, host_pick, longest_idle,
                                     quantize_ratio, quantize_time, summary_dim)
from traceap.model.losses import (cluster_loss, pattern_loss, select_windows, smooth_loss,
                                  svm_loss, total_loss, trace_loss, window_loss,
                                  window_pattern_loss)
from traceap.model.net import collate
from traceap.model.text import hashing_embedding
from traceap.model.train import examples_from, featurize_entries, fit, score_examples
from traceap.windows import Windows

from .conftest import CNN

#: What a new model's pattern head predicts: every registered pattern (config.head_patterns ());
#: the bundled checkpoint (trained on every real source, issue #35) names all sixteen too.
PATTERNS = pattern_ids()
BUNDLED_HEAD = PATTERNS

TINY = replace(preset("small"), d=16, layers=1, heads=2, max_events=16, windows=(20,),
               dropout=0.0, platform_dropout=0.0, lr=3e-3)
#: `traceap train --set` arguments of a model that size, for the CLI runs.
TINY_SETS = ("--set", "d=16", "--set", "layers=1", "--set", "heads=2", "--set", "max_events=16")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEAP_CACHE", str(tmp_path / "cache"))
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def sample_windows():
    return Windows(load(CNN), 100)


def hashed_table(names) -> dict[str, np.ndarray]:
    names = sorted({str(n) for n in names if n})
    return dict(zip(names, hashing_embedding(names).astype(np.float16)))


# -- features ---------------------------------------------------------------------------------
def test_quantize_time_is_eq3_log_scale():
    cfg = preset("small")
    q = quantize_time(np.array([0.01, cfg.t_min_us, 10.0, 100.0, cfg.t_max_us, 1e9, np.nan]), cfg)
    assert q[0] == q[1] == 0 and q[4] == q[5] == cfg.time_vocab - 1
    assert 0 < q[2] < q[3] < q[4]
    assert q[6] == cfg.time_vocab                     # unknown gets its own level
    # equal ratios, equal steps: log quantisation
    assert abs(int(quantize_time(np.array([1e3]), cfg)[0]) - 2 * int(q[3]) + int(q[2])) <= 1


def test_featurize_caps_and_keeps_order(sample_windows):
    cfg = preset("small")
    f = featurize(sample_windows, cfg)
    n, k = sample_windows.n, cfg.max_events
    assert f.kernel.shape == f.cpu_op.shape == f.delay_us.shape == f.t_rel.shape == (n, k)
    assert f.stats.shape == (n, len(STAT_KEYS))
    x = f.inputs(cfg)
    assert x["delay"].shape == (n, k) and (x["delay"][~f.mask] == cfg.time_vocab).all()
    assert x["summary"].shape == (n, summary_dim(cfg)) == (n, 2 * SUMMARY_DIM)
    assert np.isfinite(x["summary"]).all()
    counts = np.diff(sample_windows.anchor_ptr)
    assert (f.mask.sum(1) == np.minimum(counts, k)).all()
    assert (f.n_events == counts).all() and counts.max() > k      # the cap is exercised
    assert f.names[0] == "" and (f.kernel[f.mask] > 0).all() and (f.kernel[~f.mask] == 0).all()
    # strided subsample keeps time order inside a window, and relative starts lie in [0, 1]
    busiest = int(np.argmax(counts))
    t = f.t_rel[busiest][f.mask[busiest]]
    assert (np.diff(t) >= 0).all() and 0.0 <= t.min() and t.max() <= 1.0
    assert f.platform.startswith("NVIDIA A100")
    kernel_names = {str(f.names[i]) for i in np.unique(f.kernel[f.mask])}
    assert any("nccl" in s.lower() for s in kernel_names)          # a DDP trace: NCCL anchors
    assert set(np.unique(f.stream[f.mask])) == {0, 1}               # compute + NCCL stream


def test_relative_inputs_are_scale_free(sample_windows):
    """The relative time levels and the relative summary do not change when every time of the
    trace is stretched (another GPU, another batch size); the absolute ones do."""
    cfg = replace(preset("small"), time_relative=True, summary_absolute=False, summary_extra=True)
    f = featurize(sample_windows, cfg)
    g = replace(f, delay_us=f.delay_us * 4, dur_us=f.dur_us * 4, gap_us=f.gap_us * 4,
                dur_ref_us=f.dur_ref_us * 4, ref=f.ref * 4, width_us=f.width_us * 4)
    a, b = f.inputs(cfg), g.inputs(cfg)
    for key in ("delay_rel", "gap_rel", "dur_rel"):
        assert np.array_equal(a[key], b[key]), key
    a_abs = f.inputs(replace(cfg, time_absolute=True))
    b_abs = g.inputs(replace(cfg, time_absolute=True))
    assert not np.array_equal(a_abs["dur"], b_abs["dur"])
    # durations of one name relative to its median: the median itself is the middle level
    typical = np.isclose(f.dur_us, f.dur_ref_us) & f.mask
    middle = (cfg.time_vocab - 1) // 2
    assert typical.any() and (a["dur_rel"][typical] == middle).all()
    assert a["summary"].shape[1] == summary_dim(cfg) and np.isfinite(a["summary"]).all()
    q = quantize_ratio(np.array([0.0, 1.0, 1e9, np.nan]), cfg)
    assert q[0] == 0 and q[2] == cfg.time_vocab - 1 and q[3] == cfg.time_vocab


def test_idle_summary_is_the_idle_account_per_window(sample_windows):
    """`summary_idle` feeds each window's GPU-idle time by mechanism (idle.py) as shares of the
    window: absolute, then against the trace's median window; the shares and the rest of the
    idle time add up to the window's idle time."""
    from traceap.measures.gaps import gpu_span
    from traceap.measures.signals import busy_per_window
    from traceap.model.features import model_idle
    cfg = replace(preset("small"), summary_idle=True, summary_absolute=False)
    f = featurize(sample_windows, cfg)
    s = f.inputs(cfg)["summary"]
    k = len(SUMMARY_IDLE)
    assert s.shape[1] == summary_dim(cfg) == summary_dim(replace(cfg, summary_idle=False)) + 2 * k
    width = sample_windows.width_us
    want = np.stack([v / width for v in model_idle(sample_windows).values()], 1)
    absolute, relative = s[:, -2 * k:-k], s[:, -k:]
    assert np.allclose(absolute, want, atol=1e-6) and want.sum() > 0
    assert np.allclose(relative, want - np.sort(want, 0)[(len(want) - 1) // 2], atol=1e-6)
    busy = busy_per_window(sample_windows) / width
    inside = np.diff(np.clip(sample_windows.edges, *gpu_span(sample_windows.trace))) / width
    assert np.allclose(absolute.sum(1) + busy, inside, atol=1e-4)
    assert featurize(sample_windows, replace(cfg, summary_idle=False)).inputs(
        replace(cfg, summary_idle=False))["summary"].shape[1] == s.shape[1] - 2 * k


@pytest.mark.parametrize("pattern,column", [("no_mixed_precision", "busy_no_mixed_precision"),
                                            ("allocator_churn", "idle_allocator_churn")])
def test_split_summary_gives_the_newer_mechanisms_and_busy_losses_their_own_inputs(
        pattern, column, tmp_path):
    """`summary_split` takes each mechanism added with the sixteen patterns out of the input it
    declares (allocator churn out of warm-up, ...) onto its own input, and adds the busy-time
    patterns' inefficient GPU time: planted into the bundled CNN, the pattern's input holds
    time inside its label, the idle inputs still add up to the same idle time, and the busy
    inputs are the rules' own `window_lost`."""
    from traceap.idle import per_window
    from traceap.inject.core import inject_one
    from traceap.inject.edit import Doc
    from traceap.inject.mechanisms import Base
    from traceap.model.features import BUSY_PATTERNS, SPLIT_MECHANISMS, SUMMARY_SPLIT
    from traceap.patterns import REGISTRY
    o = inject_one(Base.of(Doc(CNN), CNN.name), pattern, np.random.default_rng(7))
    path = tmp_path / "planted.json"
    path.write_bytes(o.data)
    windows = Windows(load(path), 50)
    cfg = replace(preset("small"), summary_idle=True, summary_absolute=False)
    split = replace(cfg, summary_split=True)
    f = featurize(windows, cfg)
    old, new = f.inputs(cfg)["summary"], f.inputs(split)["summary"]
    k, j, m = len(SUMMARY_IDLE), len(SUMMARY_SPLIT), len(SPLIT_MECHANISMS)
    assert new.shape[1] == summary_dim(split) == old.shape[1] + 2 * j
    width = windows.width_us
    base = new.shape[1] - 2 * (k + j)          # the absolute idle block, then the relative one
    folded, mine, busy = (new[:, base:base + k], new[:, base + k:base + k + m],
                          new[:, base + k + m:base + k + j])
    assert np.allclose(folded.sum(1) + mine.sum(1), old[:, -2 * k:-k].sum(1), atol=1e-5)
    idle = per_window(windows)
    assert np.allclose(mine, np.stack([idle[x] / width for x in SPLIT_MECHANISMS], 1), atol=1e-6)
    want = np.stack([REGISTRY[x].window_lost(windows) / width for x in BUSY_PATTERNS], 1)
    assert np.allclose(busy, np.clip(want, 0, 1), atol=1e-6)
    col = new[:, base + k + SUMMARY_SPLIT.index(column)]
    mid = (windows.edges[:-1] + windows.edges[1:]) / 2
    inside = np.zeros(windows.n, bool)
    for a, b in o.anomalies:
        inside |= (mid >= a) & (mid <= b)
    assert col[inside].sum() > 0 and col[inside].mean() > col[~inside].mean()


def test_a_split_model_reads_the_inputs_it_was_built_with(sample_windows, tmp_path):
    """A `summary_split` model records its split inputs when built and reads those, not the
    ones of the traceap scoring with it: a checkpoint built before a busy-time pattern was
    added keeps its input width and columns; one reading an input this traceap no longer
    measures is refused in one line."""
    from traceap.model.features import SUMMARY_SPLIT, split_inputs
    cfg = replace(preset("small"), summary_idle=True, summary_split=True, summary_absolute=False)
    assert cfg.with_head().split_inputs == SUMMARY_SPLIT
    assert ModelConfig.from_dict(cfg.with_head().to_dict()).split_inputs == SUMMARY_SPLIT
    older = replace(cfg, split_inputs=SUMMARY_SPLIT[:-1])   # before the last one was added
    assert older.with_head().split_inputs == SUMMARY_SPLIT[:-1]
    f = featurize(sample_windows, cfg)
    now, then = f.inputs(cfg)["summary"], f.inputs(older)["summary"]
    assert then.shape[1] == summary_dim(older) == now.shape[1] - 2
    k = len(SUMMARY_IDLE) + len(SUMMARY_SPLIT)      # the absolute idle block, then relative
    assert np.allclose(then, np.delete(now, [now.shape[1] - k - 1, now.shape[1] - 1], axis=1))
    model = create_model(older.with_head(), ["unknown"])
    path = save_model(model, tmp_path / "older.pt", {})
    assert load_model(path).config.split_inputs == SUMMARY_SPLIT[:-1]
    assert len(Predictor(path).predict(sample_windows).scores) == sample_windows.n
    with pytest.raises(ModelError, match="busy_gone_pattern.*does not measure"):
        split_inputs(replace(cfg, split_inputs=("busy_gone_pattern",)))


def test_longest_idle_is_the_longest_gpu_gap_in_each_window(sample_windows):
    t = sample_windows.trace
    edges = sample_windows.edges
    got = longest_idle(t, edges)
    rows = t.gpu_work_rows
    for w in (0, 17, 50, 99):   # brute force over the GPU work overlapping the window
        a, b = edges[w], edges[w + 1]
        r = rows[(t.ts[rows] < b) & (t.end[rows] > a)]
        iv = sorted((max(t.ts[i], a), min(t.end[i], b)) for i in r)
        longest, cur = 0.0, a
        for s, e in iv:
            longest = max(longest, s - cur)
            cur = max(cur, e)
        longest = max(longest, b - cur)
        assert got[w] == pytest.approx(longest, abs=1e-3)
    assert 0 < got.max() <= sample_windows.width_us + 1e-2   # float64 us on a ~1e15 clock


def test_host_events_are_the_longest_distinct_names_of_each_window(sample_windows):
    t, edges = sample_windows.trace, sample_windows.edges
    win, rows = host_pick(t, edges, 4)
    assert len(win) and np.bincount(win, minlength=sample_windows.n).max() <= 4
    host = t.rows(*HOST_KINDS)
    for w in np.unique(win)[:5]:
        a, b = edges[w], edges[w + 1]
        picked = rows[win == w]
        assert (t.ts[picked] < b).all() and (t.end[picked] > a).all()
        assert len({t.name[r] for r in picked}) == len(picked)          # one per name
        assert (np.diff(t.ts[picked]) >= 0).all()                        # in start order
        cand = host[(t.ts[host] < b) & (t.end[host] > a)]
        inside = np.minimum(t.end[cand], b) - np.maximum(t.ts[cand], a)
        best: dict[int, float] = {}
        for r, x in zip(cand, inside):
            best[t.name[r]] = max(best.get(t.name[r], 0.0), x)
        top = sorted(best.values(), reverse=True)[:4]
        got = sorted((min(t.end[r], b) - max(t.ts[r], a) for r in picked), reverse=True)
        assert np.allclose(got, top)
    cfg = replace(preset("small"), host_events=4)
    f = featurize(sample_windows, cfg)
    x = f.inputs(cfg)
    k = cfg.max_events
    assert x["kernel"].shape == (sample_windows.n, k + 4)
    assert (x["stream"][:, k:][x["mask"][:, k:]] == cfg.max_streams).all()
    assert (x["delay"][:, k:] == cfg.time_vocab).all()              # host events: no launch delay
    names = {str(f.names[i]) for i in np.unique(x["kernel"][:, k:][x["mask"][:, k:]])}
    assert any(n.startswith("ProfilerStep") for n in names) and any("cuda" in n for n in names)


# -- model shapes -----------------------------------------------------------------------------
@pytest.mark.parametrize("ablation", [(), ("no_event_adapter",), ("no_transformer",),
                                      ("no_relation",)])
def test_model_output_shapes(sample_windows, ablation):
    cfg = TINY.with_ablations(ablation)
    f = featurize(sample_windows, cfg)
    model = create_model(cfg, [f.platform]).eval()
    batch = collate([f, f], model, hashed_table(f.names))
    with torch.no_grad():
        out = model(batch)
    n = sample_windows.n
    assert out["scores"].shape == (2, n) and out["logits"].shape == (2, n)
    assert out["emb"].shape == (2, n, cfg.D)
    assert out["pattern_logits"].shape == (2, n, len(PATTERNS))
    assert ((out["scores"] > 0) & (out["scores"] < 1)).all()
    assert torch.allclose(out["scores"][0], out["scores"][1], atol=1e-6)


def test_paper_preset_is_the_paper():
    cfg = preset("paper")
    assert (cfg.d, cfg.D, cfg.layers, cfg.heads, cfg.lr, cfg.batch_size) == (128, 256, 6, 8, 1e-4, 8)
    with pytest.raises(ValueError):
        cfg.with_ablations(["no_such_thing"])


# -- losses -----------------------------------------------------------------------------------
def test_trace_loss_is_bce_of_the_mean():
    scores = torch.tensor([[0.1, 0.3], [0.8, 0.6]])
    y = torch.tensor([0.0, 1.0])
    expected = -(np.log(1 - 0.2) + np.log(0.7)) / 2
    assert trace_loss(scores, y).item() == pytest.approx(expected, rel=1e-5)
    assert trace_loss(scores, y, "topk", 0.5).item() == pytest.approx(
        -(np.log(1 - 0.3) + np.log(0.8)) / 2, rel=1e-5)


def test_svm_loss_selects_top_windows_and_hinges():
    scores = torch.tensor([[0.1, 0.9, 0.2, 0.3], [0.5, 0.4, 0.95, 0.1]])
    y = torch.tensor([0.0, 1.0])
    sel, label = select_windows(scores, y, s_pos=0.25, s_neg=0.25)
    assert sel[0].tolist() == [False, True, False, False]   # normal trace: its top window
    assert sel[1].tolist() == [False, False, True, False]   # abnormal trace: its top window
    w = torch.zeros(3)
    good = torch.tensor([[0.0, -2.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0]])
    bad = -good
    assert svm_loss(good, sel, label, w).item() == pytest.approx(0.0)
    assert svm_loss(bad, sel, label, w).item() == pytest.approx((3.0 + 4.0) / 2)


def test_cluster_loss_prefers_embeddings_that_follow_the_scores():
    scores = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    keep = torch.ones(1, 4, dtype=torch.bool)
    aligned = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]])
    mixed = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]])
    assert cluster_loss(aligned, scores, keep).item() == pytest.approx(0.0, abs=1e-6)
    assert cluster_loss(mixed, scores, keep).item() > 0.1


def test_smooth_and_pattern_losses():
    assert smooth_loss(torch.full((2, 5), 0.3)).item() == 0.0
    assert smooth_loss(torch.tensor([[0.0, 1.0, 0.0]])).item() == pytest.approx(1.0)
    target = torch.tensor([[1.0, 0.0]])
    right = torch.tensor([[[6.0, -6.0], [-6.0, -6.0]]])     # one window shows pattern 0
    wrong = torch.tensor([[[-6.0, 6.0], [-6.0, 6.0]]])
    assert pattern_loss(right, target, 0.5).item() < 0.01 < pattern_loss(wrong, target, 0.5).item()


def test_window_loss_counts_only_traces_whose_windows_are_known():
    scores = torch.tensor([[0.9, 0.1], [0.5, 0.5]])
    labels = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    only_first = window_loss(scores, labels, torch.tensor([True, False])).item()
    assert only_first == pytest.approx(-np.log(0.9), rel=1e-5)
    assert window_loss(scores, labels, torch.tensor([True, True])).item() == pytest.approx(
        -(2 * np.log(0.9) + 2 * np.log(0.5)) / 4, rel=1e-5)
    assert window_loss(scores, labels, torch.tensor([False, False])).item() == 0.0
    logits = torch.tensor([[[6.0, -6.0], [-6.0, -6.0]], [[6.0, 6.0], [6.0, 6.0]]])
    patterns = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]])
    assert window_pattern_loss(logits, patterns, torch.tensor([True, False])).item() < 0.01
    assert window_pattern_loss(logits, patterns, torch.tensor([True, True])).item() > 2.0


# -- training ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    """A few train traces: from datasets/tiny in a dev checkout, else generated (traceap.synth)."""
    from .conftest import REPO
    dev = REPO / "datasets" / "tiny"
    if (dev / "manifest.jsonl").is_file():
        return dev
    from traceap.synth import SynthConfig, generate
    out = tmp_path_factory.mktemp("synth")
    generate(out, SynthConfig(traces=10, seed=3, jobs=1, bad_fraction=0.5, world_sizes=(1,),
                              world_size_p=(1.0,)))
    return out


def test_training_lowers_the_loss(tiny_dataset, tmp_path):
    train = [e for e in read_manifest(tiny_dataset) if e.split == "train"]
    entries = [e for e in train if not e.is_bad][:4] + [e for e in train if e.is_bad][:4]
    assert {e.label for e in entries} == {"good", "bad"}
    for e in entries:   # weak supervision: strip the intervals so training cannot read them
        e.anomalies = []
    feats = featurize_entries(tiny_dataset, entries, TINY.windows, TINY, tmp_path / "feat")
    table = hashed_table(n for per_n in feats.values() for f in per_n.values() for n in f.names)
    examples = examples_from(entries, feats)

    def loss_of(model):
        model.eval()
        batch_ex = [x for x in examples if x.label == 0][:2] + [x for x in examples if x.label][:2]
        batch = collate([x.feats[20] for x in batch_ex], model, table)
        y = torch.tensor([x.label for x in batch_ex], dtype=torch.float32)
        with torch.no_grad():
            return total_loss(model(batch), y, torch.from_numpy(np.stack([x.patterns for x in batch_ex])),
                              model.svm.fc.weight, TINY)["total"].item()

    before, _ = fit(examples, TINY, table, epochs=0)
    after, log = fit(examples, TINY, table, epochs=15)
    assert log.steps > 0 and len(log.epochs) == 15
    assert loss_of(after) < 0.8 * loss_of(before)
    _, short = fit(examples, TINY, table, epochs=2, steps_per_epoch=3)   # screening budget
    assert short.steps == 6 and len(short.epochs) == 2

    # a saved checkpoint reloads and gives identical scores
    path = save_model(after, tmp_path / "m.pt", table)
    w = Windows(load(trace_path(tiny_dataset, entries[0])), 20)
    p1 = Predictor(load_model(path)).predict(w)
    p2 = Predictor(path).predict(w)
    assert np.array_equal(p1.scores, p2.scores) and np.array_equal(p1.patterns, p2.patterns)
    assert p1.scores.shape == (20,) and p1.patterns.shape == (20, len(PATTERNS))


def test_training_is_the_same_in_every_process_for_one_seed(tiny_dataset, tmp_path):
    """Two `traceap train` runs of one recipe and seed, each in its own process (its own hash
    seed, its own feature cache), names hidden at random (`name_dropout`) and dropout on: the
    same weights to the bit.  The fold table's models and the shipped one are reproduced by
    rerunning their commands, and a recipe is compared with another only where this holds."""
    import os
    import subprocess
    import sys
    runs = []
    for i, hash_seed in enumerate(("1", "2")):
        out = tmp_path / f"run{i}" / "m.pt"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed,
               "TRACEAP_CACHE": str(tmp_path / f"cache{i}")}
        r = subprocess.run([sys.executable, "-m", "traceap", "train", "--dataset",
                            str(tiny_dataset), "--out", str(out), "--epochs", "1",
                            "--steps-per-epoch", "4", "--windows", "20", "--threads", "1",
                            "--cache", str(tmp_path / f"feat{i}"), *TINY_SETS,
                            "--set", "name_dropout=0.5", "--set", "dropout=0.2",
                            "--set", "seed=3"],
                           capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr
        runs.append(torch.load(out, weights_only=False))
    a, b = (x["state_dict"] for x in runs)
    assert a.keys() == b.keys() and len(a) > 10
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert runs[0]["names"] == runs[1]["names"]
    first = [e["total"] for e in runs[0]["meta"]["history"]]
    assert first == [e["total"] for e in runs[1]["meta"]["history"]] and len(first) == 1


def test_window_supervision_reads_the_anomalies_and_places_them(tiny_dataset, tmp_path):
    """`w_window` > 0: train traces with known anomalies teach each window's score; with the
    paper's weak supervision (0) the anomalies stay unread, so the window term is absent."""
    from sklearn.metrics import roc_auc_score
    train = [e for e in read_manifest(tiny_dataset) if e.split == "train"]
    entries = [e for e in train if not e.is_bad][:4] + [e for e in train if e.is_bad][:4]
    feats = featurize_entries(tiny_dataset, entries, TINY.windows, TINY, tmp_path / "feat")
    table = hashed_table(n for per_n in feats.values() for f in per_n.values() for n in f.names)
    weak = examples_from(entries, feats)
    assert all(not x.window_labels and not x.labels_known for x in weak)
    known = examples_from(entries, feats, with_window_labels=True)
    assert all(x.labels_known for x in known)              # good, or bad with its anomalies
    bad = [x for x in known if x.label]
    assert all(x.window_labels[20].any() for x in bad)

    def window_auc(model):
        scores = score_examples(model, bad, 20, table)
        return roc_auc_score(np.concatenate([x.window_labels[20] for x in bad]),
                             np.concatenate(scores))

    assert all(x.window_patterns[20][x.window_labels[20]].sum(1).min() >= 1 for x in bad)
    assert all(not x.window_patterns[20][~x.window_labels[20]].any() for x in known)
    cfg = replace(TINY, w_window=1.0, w_window_pattern=0.5)
    sup, log = fit(known, cfg, table, epochs=25)
    assert "window" in log.epochs[-1] and "window_pattern" in log.epochs[-1]
    _, log0 = fit(weak, cfg, table, epochs=1)
    assert log0.epochs[-1]["window"] == 0.0                  # nothing known: no signal
    plain, log_plain = fit(known, TINY, table, epochs=25)
    assert "window" not in log_plain.epochs[-1]
    assert window_auc(sup) > 0.9 and window_auc(sup) > window_auc(plain) + 0.1


# -- checkpoints and the bundled model ---------------------------------------------------------
def test_bad_checkpoints_raise_model_error(tmp_path):
    with pytest.raises(ModelError, match="no such model checkpoint"):
        load_model(tmp_path / "missing.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ModelError, match="not a readable model checkpoint"):
        load_model(junk)
    other = tmp_path / "other.pt"
    torch.save({"format": "something/else"}, other)
    with pytest.raises(ModelError, match="not a traceap model checkpoint"):
        load_model(other)


def test_cli_train_on_a_non_dataset_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    from traceap.cli import main
    monkeypatch.setattr(sys, "argv", ["traceap", "train", "--dataset", str(tmp_path),
                                      "--out", str(tmp_path / "m.pt")])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "no manifest.jsonl" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_train_never_replaces_a_file_it_did_not_write(tmp_path, monkeypatch, capsys):
    """Issue #32 item 1 for train --out: a file that is not a checkpoint is never replaced, an
    earlier checkpoint only with --overwrite; both refused before any featurising."""
    import shutil

    from traceap.cli import main
    from traceap.model.checkpoint import bundled_model_path
    (tmp_path / "manifest.jsonl").write_text("")
    notes = tmp_path / "notes.pt"
    notes.write_text("my notes")
    earlier = tmp_path / "earlier.pt"
    shutil.copy(bundled_model_path(), earlier)
    for out, message in ((notes, "exists and is not a traceap checkpoint"),
                         (earlier, "holds the checkpoint of an earlier traceap train run"),
                         (tmp_path / "notes.pt" / "m.pt", "is not a folder")):
        monkeypatch.setattr(sys, "argv", ["traceap", "train", "--dataset", str(tmp_path),
                                          "--out", str(out)])
        with pytest.raises(SystemExit) as exc:
            main()
        err = capsys.readouterr().err
        assert exc.value.code == 2 and message in err, err
        assert len(err.strip().splitlines()) == 1
    assert notes.read_text() == "my notes"
    assert earlier.read_bytes() == bundled_model_path().read_bytes()


def test_bundled_model_scores_the_sample_under_a_second(sample_windows):
    from traceap.detectors.learned import LearnedDetector
    det = LearnedDetector()
    ckpt = det.predictor.checkpoint
    assert ckpt.meta.get("n_train", 0) >= 100          # trained on the generated dataset
    names = featurize(sample_windows, det.predictor.cfg).names[1:].tolist()
    assert det.predictor.text.missing(names) == []     # the shipped cache covers the sample
    fresh = Windows(sample_windows.trace, 100)
    t0 = time.perf_counter()
    scores = det.score_windows(fresh)
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0
    assert scores.shape == (100,) and ((scores >= 0) & (scores <= 1)).all()
    probs = det.pattern_probabilities(fresh)
    assert list(probs) == list(BUNDLED_HEAD) and all(p.shape == (100,) for p in probs.values())


def test_model_detector_flags_at_its_checkpoints_calibrated_threshold(tmp_path):
    """`meta["flag_threshold"]` (set on validation by `traceap ship model --calibrate`) is
    where `analyze --detector model` flags; without it, 0.5."""
    from traceap.analysis import analyze
    from traceap.detectors.learned import LearnedDetector
    from traceap.model.checkpoint import bundled_model_path
    shipped = LearnedDetector()
    meta = shipped.predictor.checkpoint.meta
    assert shipped.threshold == meta["flag_threshold"] and 0.0 < shipped.threshold < 1
    assert meta["calibration"]["healthy_flagged"] <= meta["calibration"]["max_healthy_flagged"]
    obj = torch.load(bundled_model_path(), weights_only=False)
    obj["meta"] = {k: v for k, v in obj["meta"].items() if k != "flag_threshold"}
    torch.save(obj, tmp_path / "plain.pt")
    # a threshold under most of the sample's window scores (the shipped model scores a healthy
    # run's windows far below its own threshold)
    plain_scores = np.array([w.score for w in analyze(CNN, 50, detector=LearnedDetector(
        bundled_model_path()), classifier="offline").windows])
    low_t = float(np.quantile(plain_scores, 0.25))
    assert low_t < shipped.threshold
    obj["meta"]["flag_threshold"] = low_t
    torch.save(obj, tmp_path / "low.pt")
    assert LearnedDetector(tmp_path / "plain.pt").threshold == 0.5
    low = LearnedDetector(tmp_path / "low.pt")
    a = analyze(CNN, 50, detector=low, classifier="offline")
    scores = np.array([w.score for w in a.windows])
    assert [w.flagged for w in a.windows] == (scores >= low_t).tolist()
    assert (scores >= low_t).sum() > (scores >= shipped.threshold).sum()


# -- the pattern head's list: part of the config and the checkpoint (issue #35) ---------------
def _cli(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    """The real CLI entry point (errors: one line, exit 2): (exit code, stdout, stderr)."""
    from traceap.cli import main
    monkeypatch.setattr(sys, "argv", ["traceap", *map(str, args)])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def planted_new(tmp_path_factory):
    """A train split of three real traces of tests/data and the plants of two patterns beyond
    the paper in them (`traceap inject --patterns unfused_optimizer,no_pin_memory`)."""
    from typer.testing import CliRunner

    from traceap.cli import app
    from .conftest import DATA
    out = tmp_path_factory.mktemp("planted") / "ds"
    res = CliRunner().invoke(app, ["inject", str(DATA / "amd_mi250_train.json.gz"),
                                   str(DATA / "kineto2021_v100.json.gz"),
                                   str(DATA / "particle_transformer_bs8.json.gz"),
                                   "--patterns", "unfused_optimizer,no_pin_memory",
                                   "--split", "train", "--out", str(out)])
    assert res.exit_code == 0, res.output
    planted = {p for e in read_manifest(out) for p in e.patterns}
    assert planted == {"unfused_optimizer", "no_pin_memory"}
    return out


def _train_tiny(monkeypatch, capsys, dataset, out, *extra) -> tuple[int, str, str]:
    return _cli(monkeypatch, capsys, "train", "--dataset", dataset, "--out", out,
                "--epochs", "1", "--steps-per-epoch", "2", "--windows", "20",
                "--cache", out.parent / "feat", *TINY_SETS, "--overwrite", *extra)


def test_a_new_model_names_every_registered_pattern(planted_new, tmp_path, monkeypatch, capsys):
    """`traceap train` builds the pattern head over every registered pattern (the sixteen, not
    the paper's eight), trains it on targets over that list (a planted unfused_optimizer is a
    target of its own column) and stores the list in the checkpoint: predictions have a column
    per pattern and the model detector's pattern head names them, in order."""
    from traceap.detectors.learned import LearnedDetector
    assert len(PATTERNS) == 16 and set(PAPER) < set(PATTERNS)
    path = tmp_path / "m.pt"
    code, _, err = _train_tiny(monkeypatch, capsys, planted_new, path)
    assert code == 0, err
    ckpt = load_model(path)
    assert ckpt.config.head_patterns == PATTERNS
    assert list(torch.load(path, weights_only=True)["config"]["head_patterns"]) == list(PATTERNS)
    bad = next(e for e in read_manifest(planted_new) if e.patterns == ["unfused_optimizer"])
    w = Windows(load(trace_path(planted_new, bad)), 20)
    pred = Predictor(path).predict(w)
    assert pred.patterns.shape == (20, 16)
    head = LearnedDetector(path).pattern_head(w)
    assert list(head) == list(PATTERNS) and all(p.shape == (20,) for p in head.values())
    assert np.array_equal(head["unfused_optimizer"],
                          np.clip(pred.patterns[:, PATTERNS.index("unfused_optimizer")], 0, 1))
    # the targets follow the model's list: the new pattern has its column
    entries = read_manifest(planted_new)
    feats = featurize_entries(planted_new, entries, (20,), ckpt.config, tmp_path / "feat")
    x = next(x for x in examples_from(entries, feats, with_window_labels=True,
                                      patterns=ckpt.config.head_patterns) if x.id == bad.id)
    col = PATTERNS.index("unfused_optimizer")
    assert x.patterns.tolist() == [float(i == col) for i in range(16)]
    assert x.window_patterns[20][:, col].any() and x.window_patterns[20].sum(0)[col] == \
        x.window_patterns[20].sum()


def test_head_patterns_is_a_setting_and_ensembles_share_it(planted_new, tmp_path, monkeypatch,
                                                           capsys):
    """`--set head_patterns=a,b` trains a head over those patterns only; an unknown id is one
    line, exit 2; checkpoints whose heads differ do not join an ensemble (one line, exit 2);
    the bundled checkpoint names all sixteen, and one that names no list (written before the
    list was saved) loads with the paper's eight."""
    from traceap.detectors.learned import LearnedDetector
    two = tmp_path / "two.pt"
    code, _, err = _train_tiny(monkeypatch, capsys, planted_new, two, "--set",
                               "head_patterns=unfused_optimizer,no_pin_memory")
    assert code == 0, err
    assert load_model(two).config.head_patterns == ("unfused_optimizer", "no_pin_memory")
    w = Windows(load(CNN), 20)
    assert Predictor(two).predict(w).patterns.shape == (20, 2)
    assert list(LearnedDetector(two).pattern_head(w)) == ["unfused_optimizer", "no_pin_memory"]

    code, _, err = _train_tiny(monkeypatch, capsys, planted_new, tmp_path / "no.pt", "--set",
                               "head_patterns=unfused_optimizer,fast_path")
    assert code == 2 and "unknown pattern 'fast_path' in head_patterns" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "no.pt").exists()

    every = tmp_path / "every.pt"
    assert _train_tiny(monkeypatch, capsys, planted_new, every)[0] == 0
    code, _, err = _cli(monkeypatch, capsys, "ship", "ensemble", every, two,
                        "--out", tmp_path / "ens.pt")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "pattern head names 2 patterns" in err and "16" in err
    assert not (tmp_path / "ens.pt").exists()

    bundled = load_model()
    assert list(torch.load(bundled.path, weights_only=True)["config"]["head_patterns"]) == \
        list(BUNDLED_HEAD)
    assert bundled.config.head_patterns == BUNDLED_HEAD
    assert list(LearnedDetector().pattern_head(w)) == list(BUNDLED_HEAD)

    # a checkpoint written before the config named its head (the one shipped until #35) has
    # the paper's eight outputs and no list: it loads with the paper's eight
    paper = tmp_path / "paper.pt"
    assert _train_tiny(monkeypatch, capsys, planted_new, paper, "--set",
                       "head_patterns=" + ",".join(PAPER))[0] == 0
    obj = torch.load(paper, weights_only=False)
    del obj["config"]["head_patterns"]
    torch.save(obj, tmp_path / "legacy.pt")
    assert load_model(tmp_path / "legacy.pt").config.head_patterns == PAPER
    assert list(LearnedDetector(tmp_path / "legacy.pt").pattern_head(w)) == list(PAPER)


# -- self-supervised pretraining --------------------------------------------------------------
def test_masked_window_pretraining_learns_to_pick_hidden_windows_out():
    """On two real traces, the masked-window objective's loss falls from chance (ln N) and
    hidden windows are picked out far above chance; the detector's layout is unchanged."""
    from traceap.model.features import featurize
    from traceap.model.net import TraceAPModel
    from traceap.model.pretrain import MaskedWindows, pretrain
    from .conftest import SAMPLE

    cfg = replace(TINY, windows=(20,))
    feats = [{20: featurize(Windows(load(p), 20), cfg)} for p in (CNN, SAMPLE)]
    table = hashed_table(n for f in feats for n in f[20].names)
    torch.manual_seed(0)
    model = TraceAPModel(cfg, [f[20].platform for f in feats])
    keys = set(model.state_dict())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    m = MaskedWindows(cfg.D).mask(8, 20, torch.Generator().manual_seed(0))
    assert m.any(1).all() and (~m).any(1).all()       # hidden windows, never all of a trace
    rows = pretrain(model, feats, 150, lambda fs, r: collate(fs, model, table, 0.0, r), (20,),
                    batch_size=4, lr=3e-3, weight_decay=0.0, seed=0)
    assert len(rows) == 6 and rows[0]["loss"] < np.log(20) + 0.5
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert rows[-1]["pick_acc"] > 0.3                  # chance: 1 in 20
    assert set(model.state_dict()) == keys             # no extra weights in the checkpoint
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert pretrain(model, feats, 0, None, (20,), 4, 1e-3, 0.0, 0) == []


def test_cli_train_pretrains_on_a_folder_of_a_users_traces(tiny_dataset, tmp_path, monkeypatch,
                                                           capsys):
    """`traceap train --pretrain-on FOLDER`: the bundled real traces, unlabelled, pretrain the
    encoders first; the checkpoint records it.  Without traces to pretrain on, pretrain_steps
    is a one-line error, not a silent no-op; a missing folder too."""
    from traceap.cli import main
    from .conftest import REPO

    def run(*extra):
        monkeypatch.setattr(sys, "argv", [
            "traceap", "train", "--dataset", str(tiny_dataset), "--out", str(tmp_path / "m.pt"),
            "--epochs", "1", "--steps-per-epoch", "2", "--windows", "20",
            "--cache", str(tmp_path / "cache"), "--set", "d=16", "--set", "layers=1",
            "--overwrite", *extra])
        try:
            main()
            return 0
        except SystemExit as exc:
            return exc.code

    import shutil
    own = tmp_path / "mine"      # a user's folder: two GPU traces, a CPU-only one, a stray JSON
    (own / "sub").mkdir(parents=True)
    shutil.copy(CNN, own / CNN.name)
    shutil.copy(REPO / "examples" / "dlrm_a100_rank3.json.gz", own / "sub" / "dlrm.json.gz")
    shutil.copy(REPO / "tests" / "data" / "cpu_only_zoology.json.gz", own / "cpu.json.gz")
    (own / "notes.json").write_text('{"not": "a trace"}')
    assert run("--pretrain-on", str(own), "--pretrain-steps", "4") in (0, None)
    out = capsys.readouterr().out
    assert "2 unlabelled traces to pretrain on" in out and "pretrained 4 steps" in out
    assert "skipped (cannot featurise)" in out and "notes.json" in out
    meta = load_model(tmp_path / "m.pt").meta
    assert meta["pretrain"]["traces"] == 2 and meta["pretrain"]["steps"] == 4
    assert load_model(tmp_path / "m.pt").config.pretrain_steps == 4
    assert run("--set", "pretrain_steps=10") == 2
    err = capsys.readouterr().err
    assert "needs --pretrain-on" in err and len(err.strip().splitlines()) == 1
    assert run("--pretrain-on", str(tmp_path / "nowhere")) == 2
    err = capsys.readouterr().err
    assert "no such file or folder" in err and len(err.strip().splitlines()) == 1


def test_a_trace_that_cannot_be_featurised_is_read_once(tmp_path, monkeypatch):
    """A stray file in a user's folder fails once: the reason is cached under the file's key
    and said again on the next run without reading it; rewriting the file tries it again."""
    import os
    import shutil

    import traceap.model.train as train_mod
    from traceap.model.train import pretrain_pool

    own = tmp_path / "mine"
    own.mkdir()
    shutil.copy(CNN, own / CNN.name)
    stray = own / "notes.json"
    stray.write_text('{"not": "a trace"}')
    read = []
    real = train_mod.featurize_trace

    def counting(work, job):
        read.append(os.path.basename(job[1]))
        return real(work, job)

    monkeypatch.setattr(train_mod, "featurize_trace", counting)
    cfg = replace(preset("small"), d=16, layers=1)

    def pool():
        said = []
        feats = pretrain_pool([own], (20,), cfg, cache=tmp_path / "cache", log=said.append)
        return len(feats), said

    n, said = pool()
    assert n == 1 and sorted(read) == [CNN.name, "notes.json"]
    assert len(said) == 1 and "notes.json" in said[0] and "traceEvents" in said[0]
    assert len(list((tmp_path / "cache" / "features").glob("*.failed"))) == 1
    read.clear()
    n, again = pool()
    assert n == 1 and read == [] and again == said       # neither file read again
    shutil.copy(CNN, stray)                                # the file rewritten: tried again
    n, said = pool()
    assert n == 2 and read == ["notes.json"] and said == []


def test_a_mechanism_added_after_the_checkpoint_keeps_the_model_inputs(sample_windows):
    """The bundled checkpoint reads the idle account of its day (`MODEL_MECHANISMS`): a newer
    mechanism (`allocator_churn`, issue #34) adds no input and feeds the mechanism its time went
    to before (`Mechanism.model_as`), so every idle us still reaches the model once."""
    from traceap import idle
    from traceap.model.features import MODEL_MECHANISMS, SUMMARY_IDLE, model_idle
    assert len(SUMMARY_IDLE) == len(MODEL_MECHANISMS) == 13
    assert set(idle.MECHANISM_IDS) > set(MODEL_MECHANISMS)
    got = model_idle(sample_windows)
    pw = idle.per_window(sample_windows)
    assert list(got) == list(MODEL_MECHANISMS)
    assert np.allclose(sum(got.values()), sum(pw.values()))
