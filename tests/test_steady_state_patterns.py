"""Three patterns beyond the paper, each planted into a real trace by `traceap inject`, found by
its rule in `traceap analyze --detector expert` with a time lost close to what the plant cost,
absent from the healthy real traces, and labelled by `traceap label`:

- recompilation: torch.compile compiling again in a later step;
- grad_accum_allreduce: every micro-step of a gradient-accumulation loop all-reduces;
- dataparallel: nn.DataParallel's replicate/scatter on one process driving several GPUs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import traceap
from traceap import idle
from traceap.analysis import analyze
from traceap.cli import app
from traceap.inject.natural import natural_labels
from traceap.trace import merged_intervals
from traceap.windows import covered_time

from .conftest import CNN, DATA, SAMPLE

#: Real traces with none of these patterns (bundled samples and test data with a GPU).
HEALTHY = [CNN, SAMPLE, DATA / "kineto2021_v100.json.gz", DATA / "amd_mi250_train.json.gz",
           DATA / "particle_transformer_bs8.json.gz", DATA / "amd_mi300_gemm.json.gz"]
NEW = ("recompilation", "grad_accum_allreduce", "dataparallel")
#: Time lost within this share of the planted cost (issue 34's target).
TOLERANCE = 0.30


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """`traceap inject` of the three patterns into the bundled samples and two test traces
    (A100 DDP CNN, A100 DLRM, V100 2021 dialect, A100 transformer), with the real CLI."""
    out = tmp_path_factory.mktemp("planted")
    bases = [CNN, SAMPLE, DATA / "kineto2021_v100.json.gz",
             DATA / "particle_transformer_bs8.json.gz"]
    res = CliRunner().invoke(app, ["inject", *map(str, bases), "-o", str(out),
                                   "--patterns", ",".join(NEW), "--seed", "3"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]
    return {(r["base"], r["patterns"][0]): (out / r["path"], r) for r in rows
            if r["label"] == "bad" and r.get("source") != "natural"}


def _planted_cost(tr, anomalies) -> float:
    """GPU idle inside the labels (the time the plant costs, as `traceap inject` labels it)."""
    acc = idle.measure(tr)
    s, e = merged_intervals(np.array([a["start_us"] for a in anomalies]),
                            np.array([a["end_us"] for a in anomalies]))
    f = covered_time(acc.seg_start, acc.seg_end, np.concatenate((s, e)))
    return float(np.sum(f[len(s):] - f[:len(s)]))


def _check_found(planted, pattern):
    """Every plant is found at medium or high severity and labelled by `traceap label`; the
    median over plants of time lost / planted cost is within TOLERANCE of 1 (issue 34's
    target: a plant's label also holds idle it caused far away, e.g. a DLRM collective moved)."""
    ratios = []
    for (_base, p), (path, row) in planted.items():
        if p != pattern:
            continue
        tr = traceap.load(path)
        found = {f.pattern: f for f in analyze(tr, detector="expert").findings}
        assert pattern in found and found[pattern].severity in ("medium", "high"), \
            (path.name, {k: f.severity for k, f in found.items()})
        ratios.append(found[pattern].time_lost_us / _planted_cost(tr, row["anomalies"]))
        assert pattern in {x for _, _, x in natural_labels(tr).anomalies}, path.name
    assert len(ratios) >= 2
    assert abs(float(np.median(ratios)) - 1) <= TOLERANCE, ratios


@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: p.name.split(".")[0])
def test_healthy_real_traces_have_none_of_the_three(path):
    tr = traceap.load(path)
    found = {f.pattern: f.severity for f in analyze(tr, detector="expert").findings}
    for p in NEW:
        assert found.get(p) not in ("medium", "high"), (path.name, p)
        assert p not in {x for _, _, x in natural_labels(tr).anomalies}


# -- recompilation ------------------------------------------------------------------------------
def test_a_recompile_in_a_later_step_is_found_with_its_cost(planted):
    _check_found(planted, "recompilation")


def test_a_recompile_is_not_warm_up_but_the_first_steps_compile_is(planted):
    """The idle account gives compile work after the first step to `recompilation`, before
    warm-up, which names the same calls; the planted recompiled region is `F/C` with C > 0."""
    from traceap.measures.compile_regions import recompiled_frames
    path, _ = planted[(CNN.name, "recompilation")]
    tr = traceap.load(path)
    acc = idle.measure(tr)
    assert acc.by_mechanism["recompilation"] > 0.5 * acc.by_mechanism["warmup"]
    assert recompiled_frames(tr) and all(not f.endswith("/0") for f in recompiled_frames(tr))
    first = min(tr.steps, key=lambda s: s.start_us)
    assert acc.time_in("recompilation", [first.start_us], [first.end_us]) == 0.0


# -- dataparallel -------------------------------------------------------------------------------
def test_dataparallel_scatter_and_replicate_are_found_with_their_cost(planted):
    _check_found(planted, "dataparallel")


def test_dataparallel_drives_several_gpus_and_its_broadcasts_are_its_own(planted):
    """The plant adds work on other GPUs from the one process; the idle under
    DataParallel.forward (its NCCL broadcasts included) is the dataparallel mechanism's, not
    exposed communication's."""
    from traceap.measures.dataparallel import cross_device_copies, gpu_devices
    path, _ = planted[(CNN.name, "dataparallel")]
    tr = traceap.load(path)
    assert len(gpu_devices(tr)) >= 2 and len(cross_device_copies(tr)) > 0
    acc, base = idle.measure(tr), idle.measure(traceap.load(CNN))
    assert acc.by_mechanism["dataparallel"] > 0
    assert acc.by_mechanism["nccl"] <= base.by_mechanism["nccl"] + 1.0


def test_a_dataparallel_forward_on_one_gpu_is_not_the_pattern():
    """DataParallel with one device calls the module directly: the DDP CNN with its
    `DistributedDataParallel.forward` renamed to `DataParallel.forward` drives one GPU only."""
    import copy
    from traceap.trace import Trace
    cnn = traceap.load(CNN)
    names = list(cnn.names)
    names[cnn.code_of("DistributedDataParallel.forward")] = "DataParallel.forward"
    t = Trace(names, {c: getattr(cnn, c) for c in Trace.COLUMNS}, copy.copy(cnn.meta),
              list(cnn.steps))
    assert idle.measure(t).by_mechanism["dataparallel"] == 0.0
    assert "dataparallel" not in {f.pattern for f in analyze(t, detector="expert").findings}


# -- grad_accum_allreduce -----------------------------------------------------------------------
def test_an_all_reducing_micro_step_is_found_with_its_cost(planted):
    _check_found(planted, "grad_accum_allreduce")


def test_the_wasted_all_reduce_is_not_also_exposed_communication(planted):
    """The DDP CNN with a planted micro-step: 2 all-reducing micro-steps per optimizer step;
    the idle under the planted round is the accum_allreduce mechanism's, and the NCCL
    mechanisms keep only what the base had (the final micro-step's all-reduce): no microsecond
    counted twice."""
    from traceap.measures.accumulation import accumulation
    path, _ = planted[(CNN.name, "grad_accum_allreduce")]
    tr, base = traceap.load(path), traceap.load(CNN)
    acc = accumulation(tr)
    assert acc.micro_steps == 2 and acc.n_updates == len(tr.steps)
    assert accumulation(base).n_updates == 0  # one micro-step per update: healthy DDP
    a, b = idle.measure(tr), idle.measure(base)
    assert a.by_mechanism["accum_allreduce"] > 0
    for m in ("nccl", "small_nccl", "nccl_on_compute_stream"):
        assert a.by_mechanism[m] <= b.by_mechanism[m] + 500.0, m
    found = {f.pattern: f for f in analyze(tr, detector="expert").findings}
    assert found["grad_accum_allreduce"].numbers["micro_steps"] == 2


def test_the_simulator_recompiles_where_its_ground_truth_says(tmp_path):
    """`synth.switches.apply("recompilation")`: the simulated step compiles again on the host
    (dynamo_timed phases, `Torch-Compiled Region: 0/1`), its ground truth holds the stall, and
    the rule finds it there."""
    from traceap.synth import switches
    from traceap.synth.platforms import PLATFORMS
    from traceap.synth.simulator import RunConfig, simulate
    from traceap.synth.workloads import resnet50
    from traceap.synth.writer import trace_document, write_trace
    cfg = RunConfig(resnet50(), PLATFORMS["a100"], batch=32, res=160, steps=3, seed=11,
                    t0_us=2.0e12)
    switches.healthy(cfg, np.random.default_rng(3))
    cfg.benign_idle_us = 0.0
    switches.apply("recompilation", cfg, np.random.default_rng(5))
    res = simulate(cfg)
    path = tmp_path / "recompile.pt.trace.json.gz"
    write_trace(path, trace_document(res, 1_700_000_000_000_000_000))
    tr = traceap.load(path)
    truth = [(a, b) for a, b, p in res.anomalies if p == "recompilation"]
    assert len(truth) == 1 and truth[0][1] - truth[0][0] > 0.5 * cfg.recompile_us
    found = {f.pattern: f for f in analyze(tr, detector="expert").findings}
    assert found["recompilation"].severity == "high"
    assert found["recompilation"].time_lost_us == pytest.approx(truth[0][1] - truth[0][0],
                                                                rel=TOLERANCE)


def test_the_shipped_checkpoint_still_reads_a_trace_with_the_new_mechanisms(planted):
    """The model's idle inputs stay the checkpoint's (`model.features.MODEL_MECHANISMS`): the
    new mechanisms' time feeds the input that held it before, so the default (hybrid) analysis
    loads the bundled model and still reports the planted pattern by its rule."""
    from traceap.idle import MECHANISMS
    from traceap.model.features import SUMMARY_IDLE
    assert len(SUMMARY_IDLE) == 13
    model_as = {m.id: m.model_as for m in MECHANISMS}
    assert model_as["recompilation"] == "warmup"
    assert model_as["accum_allreduce"] == model_as["dataparallel"] == "nccl"
    path, _ = planted[(CNN.name, "recompilation")]
    a = analyze(traceap.load(path))
    assert a.detector == "hybrid" and "recompilation" in {f.pattern for f in a.findings}
