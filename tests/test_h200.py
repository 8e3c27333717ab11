"""Real H200 recordings with marked causes (benchmarks/h200): what the idle account and the
rules make of the user's code on the host."""

from __future__ import annotations

import numpy as np
import pytest

import traceap
from traceap import idle
from traceap.analysis import analyze
from traceap.manifest import read_manifest
from traceap.measures.compile_regions import FORWARD, BreakConfig, break_gaps, compiled_rows
from traceap.measures.host import compiled_graphs, host_compute, python_holes
from traceap.measures.signals import intersect

from .conftest import CNN, REPO

H200 = REPO / "benchmarks" / "h200"


def _trace(name: str):
    return traceap.load(H200 / "traces" / f"{name}-nvidia-h200.pt.trace.json.gz")


def _marked(name: str) -> tuple[np.ndarray, np.ndarray]:
    e = next(e for e in read_manifest(H200) if e.id == f"{name}-nvidia-h200")
    return (np.array([a.start_us for a in e.anomalies]), np.array([a.end_us for a in e.anomalies]))


def test_the_set_is_a_collect_dataset_with_ground_truth():
    entries = read_manifest(H200)
    assert len(entries) == 34
    assert all(e.source == "collected" and e.platform == "NVIDIA H200" for e in entries)
    bad = [e for e in entries if e.label == "bad"]
    assert len(bad) == 29
    assert all(e.anomalies and set(e.patterns) >= {a.pattern for a in e.anomalies} for e in bad)


def test_a_graph_break_is_labelled_only_where_the_graph_split():
    """The ViT-B recording's forced break never ran (its hook sat on a MultiheadAttention
    out_proj, which is never called): one compiled frame per step, relabelled healthy.  The
    ResNet-50's split the graph into several frames, and stays labelled."""
    from traceap.measures.compile_regions import frame_ids

    labels = {e.id: e.label for e in read_manifest(H200)}
    assert frame_ids(_trace("vit_b_16-train-graph_break-bs64")) == {8}
    assert labels["vit_b_16-train-graph_break-bs64-nvidia-h200"] == "good"
    assert len(frame_ids(_trace("resnet50-train-graph_break-bs128"))) >= 2
    assert labels["resnet50-train-graph_break-bs128-nvidia-h200"] == "bad"


@pytest.mark.parametrize("model", ["resnet50-train-cpu_bound-bs128",
                                   "vit_b_16-train-cpu_bound-bs64"])
def test_augmentation_on_host_tensors_is_the_users_code(model):
    """Per-sample augmentation in the loop runs ATen ops on CPU images that launch nothing: the
    GPU's idle time there is cpu_bound's (it was 'launch-bound', no finding)."""
    t = _trace(model)
    acc = idle.measure(t)
    m0, m1 = _marked(model)
    code = idle.MECHANISM_IDS.index("python_host")
    sel = acc.seg_code == code
    i0, i1 = intersect(acc.seg_start[sel], acc.seg_end[sel], m0, m1)
    # most of the augmentation's time is the user's code, and almost none of it elsewhere
    assert (i1 - i0).sum() > 0.8 * (m1 - m0).sum()
    assert acc.by_mechanism["python_host"] < 1.05 * (m1 - m0).sum()
    a = analyze(t)
    top = a.findings[0]
    assert top.pattern == "cpu_bound" and top.severity == "high"
    assert "aten::conv2d" in top.evidence


@pytest.mark.parametrize("model", ["resnet50-train-clean-bs128", "vit_b_16-train-clean-bs64",
                                   "fcn_resnet50-train-clean-bs16"])
def test_a_clean_h200_run_holds_no_host_compute(model):
    s, e = host_compute(_trace(model))
    assert (e - s).sum() < 1.0  # us


@pytest.mark.parametrize("model", ["resnet50-train-clean-bs128", "fcn_resnet50-train-clean-bs16"])
def test_a_clean_convolutional_h200_run_has_no_cpu_bound_finding(model):
    """(The clean ViT at batch 64 does: its forward's own Python between launches outlasts
    the H200's kernels, the medium finding it had before ops on host tensors counted.)"""
    assert "cpu_bound" not in {f.pattern for f in analyze(_trace(model)).findings}


def test_views_under_one_framework_op_are_not_host_compute():
    """DDP's unflatten_dense_tensors (212 views, 7-15 ms each call) launches nothing, but no
    stretch of it is computation: it stays the framework's."""
    t = traceap.load(CNN)
    s, e = host_compute(t)
    assert (e - s).sum() < 2000.0


def test_the_compiled_graphs_wrapper_python_is_not_the_users_code():
    """Inductor's generated wrapper launches its kernels from Python inside CompiledFunction:
    the framework's launch path, not a hole of user code."""
    t = _trace("vit_b_16-train-graph_break-bs64")
    c0, c1 = compiled_graphs(t)
    assert len(c0) >= 4
    p0, p1 = python_holes(t)
    i0, i1 = intersect(p0, p1, c0, c1)
    assert (i1 - i0).sum() == 0.0
    assert idle.measure(t).by_mechanism["python_host"] < 15_000.0


def test_the_starved_head_of_the_span_is_a_starved_gap():
    """The first step of the augmentation run: the host augments for 0.75 s before the first
    upload; that head of the span is the user's code too, not 'not explained'."""
    t = _trace("resnet50-train-cpu_bound-bs128")
    acc = idle.measure(t)
    assert acc.by_mechanism["not_explained"] < 10_000.0
    first = t.steps[0]
    code = idle.MECHANISM_IDS.index("python_host")
    sel = acc.seg_code == code
    i0, i1 = intersect(acc.seg_start[sel], acc.seg_end[sel],
                       np.array([first.start_us]), np.array([first.end_us]))
    assert (i1 - i0).sum() > 500_000.0


@pytest.mark.parametrize("model,pattern", [
    ("resnet50-train-no_mixed_precision-bs128", "no_mixed_precision"),
    ("vit_b_16-train-no_mixed_precision-bs64", "no_mixed_precision"),
    ("resnet50-train-no_channels_last-bs128", "no_channels_last"),
    ("resnet50-train-unfused_optimizer-bs128", "unfused_optimizer"),
    ("resnet50-train-cpu_tensor_init-bs128", "cpu_tensor_init"),
    ("resnet50-train-allocator_churn-bs128", "allocator_churn"),
    ("resnet50-train-single_process_dataloading-bs128", "single_process_dataloading"),
    ("resnet50-train-no_pin_memory-bs128", "no_pin_memory"),
    ("resnet50-train-excessive_memcpy-bs128", "excessive_memcpy"),
    ("fcn_resnet50-train-cpu_bound-bs16", "cpu_bound"),
    ("resnet50-train-graph_break-bs128", "graph_break"),
])
def test_each_recorded_cause_is_the_first_finding(model, pattern):
    assert analyze(_trace(model)).findings[0].pattern == pattern


def test_the_eager_code_between_graphs_inside_a_compiled_frame_is_the_break():
    """ResNet-50 compiled with a break in a layer's forward hook: Dynamo runs the rest of the
    forward as resumed frames inside frame 0/0, which spans the whole forward.  The break's
    eager stretches (guard checks, the resumed frames' bytecode) lie inside that region, between
    its graphs; read as compiled code they were the user's code (a cpu_bound finding first)."""
    t = _trace("resnet50-train-graph_break-bs128")
    rows = compiled_rows(t, FORWARD)
    names = {t.names[c] for c in t.name[rows]}
    assert "CompiledFunction" in names
    assert "Torch-Compiled Region: 0/0" not in names      # it holds the resumed frames
    g0, g1 = break_gaps(t, BreakConfig())
    forward = t.ts[rows].min(), t.end[rows].max()
    assert ((g0 >= forward[0]) & (g1 <= forward[1])).sum() > 20
    lost = {f.pattern: f.time_lost_us for f in analyze(t).findings}
    assert lost["graph_break"] > 20_000.0 > lost["cpu_bound"]
    # a compiled frame without nested ones keeps its region (ViT-B, whose break never ran)
    v = _trace("vit_b_16-train-graph_break-bs64")
    kept = compiled_rows(v, FORWARD)
    assert {v.names[c] for c in v.name[kept]} == {"Torch-Compiled Region: 8/0",
                                                   "CompiledFunction"}


def test_transposes_for_fp32_convolutions_ask_for_mixed_precision_not_channels_last():
    """ResNet-50 in channels_last and FP32 (TF32 off): cuDNN's FP32 kernels work in NCHW, so
    its tensors are transposed around each convolution.  Telling that user to move to
    channels_last would contradict what they did: the finding names the precision."""
    f = next(f for f in analyze(_trace("resnet50-train-no_mixed_precision-bs128")).findings
             if f.pattern == "no_channels_last")
    assert "FP32 convolutions" in f.title
    assert f.numbers["n_fp32_conv_kernels"] == f.numbers["n_conv_kernels"] > 0
    fix = " ".join(f.fix.split())
    assert "torch.autocast" in fix and "the model is in channels_last already" in fix
    assert "memory_format=torch.channels_last)" not in f.fix
    # in bf16 and NCHW the transposes are the layout's, and channels_last is the fix
    g = next(f for f in analyze(_trace("resnet50-train-no_channels_last-bs128")).findings
             if f.pattern == "no_channels_last")
    assert g.numbers["n_fp32_conv_kernels"] == 0
    assert "FP32" not in g.title and "memory_format=torch.channels_last)" in g.fix
