"""`traceap synth`: a dataset in the FORMATS.md layout whose traces load, deterministic by seed."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
import numpy as np

import traceap
from traceap.manifest import read_manifest, trace_path, window_labels
from traceap.patterns import PAPER
from traceap.errors import DatasetError, OutputError
from traceap.synth import SynthConfig, generate, plan, split_counts
from traceap.synth.dataset import planned_files, simulate_job
from traceap.synth.workloads import all_models
from traceap.synth.platforms import PLATFORMS
from traceap.synth.simulator import RunConfig, simulate
from traceap.synth.switches import TABLE2_WEIGHTS
from traceap.windows import Windows

from .conftest import DATA

#: The patterns the simulated dataset samples: the paper's eight (`switches.TABLE2_WEIGHTS`),
#: what the learned model's pattern head predicts; the patterns added since have switches
#: (`switches.apply`) but are not sampled until the model learns them.
PATTERNS = PAPER


def _digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_split_counts_follow_the_paper():
    # the paper's 460 training traces become 400 train + 60 validation (FORMATS.md splits)
    assert split_counts(610) == {"train": 400, "validation": 60, "test_seen": 75, "test_unseen": 75}
    c = split_counts(40)
    assert sum(c.values()) == 40 and min(c.values()) >= 1
    c = split_counts(3)
    assert c["validation"] == 0 and sum(c.values()) == 3 and min(c[s] for s in c if s != "validation") == 1


def test_default_plan_mixes_tasks_platforms_world_sizes_and_patterns():
    jobs = plan(SynthConfig())
    assert sum(j.world_size for j in jobs) == 610
    assert sum(j.world_size for j in jobs if j.split == "validation") == 60
    seen = {j.task for j in jobs if j.split != "test_unseen"}
    unseen = {j.task for j in jobs if j.split == "test_unseen"}
    assert seen == {"image_classification", "object_detection", "image_segmentation"}
    assert unseen == {"image_generation", "depth_estimation", "pose_estimation", "action_recognition"}
    assert {j.platform for j in jobs} == set(PLATFORMS)
    assert {j.world_size for j in jobs} >= {1, 2, 4}
    planned = {p for j in jobs for p in j.patterns}
    assert planned == set(PATTERNS)
    # NCCL patterns only where there is more than one rank
    assert all(j.world_size > 1 for j in jobs if any(p.startswith("nccl") or p.startswith("small_nccl")
                                                       for p in j.patterns))


@pytest.mark.parametrize("n", [15, 16, 20, 24, 30, 40, 48, 60])
def test_small_plans_hold_every_pattern(n):
    """From MIN_TRACES_ALL_PATTERNS traces on, every seed's plan carries all eight patterns,
    the NCCL ones on multi-GPU training jobs (before: `--traces 48 --seed 11` lacked
    nccl_blocks_compute_stream and nccl_compute_no_overlap; 924 of 1,600 plans of 20-99
    traces lacked one)."""
    from traceap.synth.switches import MULTI_GPU
    for seed in range(40):
        jobs = plan(SynthConfig(traces=n, seed=seed))
        assert sum(j.world_size for j in jobs) == n
        assert {p for j in jobs for p in j.patterns} == set(PATTERNS), (n, seed)
        assert all(len(j.patterns) <= 2 for j in jobs)
        assert all(j.world_size > 1 and j.settings["mode"] == "train"
                   for j in jobs if set(j.patterns) & MULTI_GPU)
    from traceap.synth import MIN_TRACES_ALL_PATTERNS
    assert n >= MIN_TRACES_ALL_PATTERNS


def test_a_plan_that_holds_every_pattern_is_kept():
    """Coverage is repaired only where a pattern is missing: a dataset that already held all
    eight (`--traces 96 --seed 11`, the paper's 610) keeps its plan, hence its bytes."""
    from traceap.synth.dataset import cover_every_pattern
    for n, seed in [(96, 11), (610, 0)]:
        jobs = plan(SynthConfig(traces=n, seed=seed))
        before = [(j.index, j.split, j.world_size, j.patterns, j.seed) for j in jobs]
        assert cover_every_pattern(jobs) is jobs
        assert [(j.index, j.split, j.world_size, j.patterns, j.seed) for j in jobs] == before


def test_a_small_dataset_labels_all_eight_patterns(tmp_path):
    """The generated manifest, not only the plan: every pattern has labelled intervals."""
    rep = generate(tmp_path / "ds", SynthConfig(traces=48, seed=11))
    assert all(rep.pattern_counts[p] > 0 for p in PATTERNS), rep.pattern_counts
    small = generate(tmp_path / "small", SynthConfig(traces=6, seed=1))
    assert any("guaranteed from --traces 15" in n for n in small.notes)


def test_dataset_is_valid_and_loads(tmp_path):
    rep = generate(tmp_path / "ds", SynthConfig(traces=8, seed=3))
    entries = read_manifest(tmp_path / "ds")
    assert rep.n_traces == len(entries) == 8
    assert {e.split for e in entries} == {"train", "validation", "test_seen", "test_unseen"}
    for e in entries:
        t = traceap.load(trace_path(tmp_path / "ds", e))
        assert len(t.steps) in (2, 3)
        assert t.meta.device_properties and t.gpu_name
        lo, hi = t.span
        for a in e.anomalies:
            assert lo - 1 <= a.start_us < a.end_us <= hi + 1
        assert (e.label == "bad") == bool(e.patterns)
        assert sorted({a.pattern for a in e.anomalies}) == e.patterns
        y = window_labels(e, Windows(t, 100))
        if e.label == "bad":
            # the pattern acts in some windows, never in all of them
            assert 0 < y.sum() < 100
        else:
            assert y.sum() == 0
        # every launch links to its kernel
        k = t.rows(traceap.trace.Kind.KERNEL)
        assert (t.launch[k] >= 0).all()


def test_same_seed_same_bytes_whatever_the_jobs(tmp_path):
    generate(tmp_path / "a", SynthConfig(traces=6, seed=9, jobs=1))
    generate(tmp_path / "b", SynthConfig(traces=6, seed=9, jobs=2))
    generate(tmp_path / "c", SynthConfig(traces=6, seed=10, jobs=1))
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")


def test_multi_rank_job_one_line_per_rank(tmp_path):
    jobs = [j for j in plan(SynthConfig()) if j.world_size == 2][:1]
    (tmp_path / "traces").mkdir()
    out = simulate_job((jobs[0], str(tmp_path)))
    assert [e.rank for e, _ in out] == [0, 1]
    assert len({e.job for e, _ in out}) == 1 and out[0][0].job
    ranks = [traceap.load(tmp_path / e.path) for e, _ in out]
    assert [t.meta.rank for t in ranks] == [0, 1]
    assert all(t.meta.world_size == 2 for t in ranks)
    assert all(t.is_nccl.sum() > 0 for t in ranks)


def test_every_model_simulates_with_plausible_shape():
    """Each Table-1 model gives a GPU-bound healthy step with hundreds of kernels."""
    for name, m in all_models().items():
        cfg = RunConfig(m, PLATFORMS["a100"], m.batch_choices[0], m.res_choices[0], steps=2,
                        seed=1, t0_us=1e12, log_item=False)
        res = simulate(cfg)
        assert 100 < res.n_kernels < 12000, name
        lo, hi = res.span
        assert 1e3 < hi - lo < 5e6, name


def test_event_names_follow_pytorch():
    m = all_models()["resnet50"]
    cfg = RunConfig(m, PLATFORMS["h100"], 32, 160, dt="bf16", world_size=2, steps=2, seed=2,
                    t0_us=1e12)
    names = {e["name"] for e in simulate(cfg).events}
    for n in ("ProfilerStep#5", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
              "Memcpy HtoD (Pinned -> Device)", "aten::conv2d", "aten::cudnn_convolution",
              "autograd::engine::evaluate_function: ConvolutionBackward0",
              "Optimizer.step#SGD.step", "DistributedDataParallel.forward", "nccl:all_reduce",
              "record_param_comms", "cudaLaunchKernel", "aten::_local_scalar_dense"):
        assert n in names, n
    assert any(n.startswith("ncclDevKernel_AllReduce_Sum_f32_RING_") for n in names)
    assert any(n.startswith("sm90_xmma_fprop_implicit_gemm_bf16") for n in names)


def test_cli_writes_a_dataset_and_rejects_bad_input(tmp_path):
    exe = [sys.executable, "-m", "traceap"]
    r = subprocess.run(exe + ["synth", "--out", str(tmp_path / "d"), "--traces", "4", "--seed", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "wrote 4 traces" in r.stdout
    # the splits as a table: a header, one row per split with good and bad, a total
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()
            if line.startswith("  ")}
    assert rows["split"] == ["traces", "good", "bad"] and rows["total"][0] == "4"
    assert {"train", "test_seen", "test_unseen"} <= set(rows)
    assert len(read_manifest(tmp_path / "d")) == 4
    r = subprocess.run(exe + ["synth", "--out", str(tmp_path / "e"), "--traces", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "traces" in r.stderr


def test_regenerating_in_place_drops_only_stale_traces(tmp_path):
    exe = [sys.executable, "-m", "traceap", "synth", "--out", str(tmp_path / "d"), "--seed", "2"]
    assert subprocess.run(exe + ["--traces", "6"], capture_output=True).returncode == 0
    (tmp_path / "d" / "my_notes.txt").write_text("mine")
    # the same settings again: regenerated in place, same bytes
    before = _digest(tmp_path / "d")
    assert subprocess.run(exe + ["--traces", "6"], capture_output=True).returncode == 0
    assert _digest(tmp_path / "d") == before
    # other settings: refused, nothing touched ...
    r = subprocess.run(exe + ["--traces", "4"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--overwrite" in r.stderr
    assert _digest(tmp_path / "d") == before
    # ... unless --overwrite: the stale traces of the previous run go, the user's file stays
    assert subprocess.run(exe + ["--traces", "4", "--overwrite"], capture_output=True).returncode == 0
    listed = {e.path for e in read_manifest(tmp_path / "d")}
    on_disk = {f"traces/{p.name}" for p in (tmp_path / "d" / "traces").iterdir()}
    assert listed == on_disk and len(listed) == 4
    assert (tmp_path / "d" / "my_notes.txt").read_text() == "mine"


def _collected_dataset(folder):
    """A dataset of one real trace, as `traceap collect` would leave it."""
    from traceap.manifest import Entry, write_manifest
    (folder / "traces").mkdir(parents=True)
    real = folder / "traces" / "resnet-train-clean.pt.trace.json.gz"
    real.write_bytes((DATA / "kineto2021_v100.json.gz").read_bytes())
    write_manifest(folder, [Entry(id="resnet-train-clean", path=f"traces/{real.name}",
                                  split="test_seen", task="image_classification", model="resnet",
                                  platform="V100", world_size=1, rank=0, label="good",
                                  source="collected")])
    return real


def test_synth_never_deletes_a_collected_dataset(tmp_path):
    ds = tmp_path / "collected"
    real = _collected_dataset(ds)
    before = _digest(ds)
    with pytest.raises(OutputError, match="not written by traceap synth"):
        generate(ds, SynthConfig(traces=4, seed=1))
    assert _digest(ds) == before
    # --overwrite writes beside it: the real trace stays byte for byte, its manifest is kept
    rep = generate(ds, SynthConfig(traces=4, seed=1), overwrite=True)
    assert real.read_bytes() == (DATA / "kineto2021_v100.json.gz").read_bytes()
    kept = ds / "manifest.before-synth.jsonl"
    assert [e.source for e in read_manifest(kept)] == ["collected"]
    assert any("kept" in n for n in rep.notes)
    assert len(read_manifest(ds)) == 4
    # and a later synth run of other settings still never touches the collected trace
    generate(ds, SynthConfig(traces=3, seed=1), overwrite=True)
    assert real.is_file() and kept.is_file()


def test_synth_refuses_a_file_in_the_way_even_with_overwrite(tmp_path):
    ds = tmp_path / "d"
    (ds / "traces").mkdir(parents=True)
    first = planned_files(plan(SynthConfig(traces=4, seed=1)))[0]
    (ds / first).write_bytes(b"not ours")
    with pytest.raises(OutputError, match="not written by traceap synth"):
        generate(ds, SynthConfig(traces=4, seed=1), overwrite=True)
    assert (ds / first).read_bytes() == b"not ours"


def test_nccl_kernel_names_follow_the_library_version():
    """Three dialects of NCCL kernel names, as real traces spell them (2.10, 2.12-2.18, 2.19+)."""
    from traceap.synth.ops import nccl_kernel
    from traceap.trace import is_nccl_name

    names = [nccl_kernel("AllReduce", "fp32", "LL", "2.21.5"),
             nccl_kernel("AllReduce", "fp32", "LL", "2.14.3"),
             nccl_kernel("AllReduce", "fp32", "LL128", "2.10.3"),
             nccl_kernel("Broadcast", "i8", "LL", "2.14.3"),
             nccl_kernel("AllGather", "bf16", "LL", "2.21.5"),
             nccl_kernel("ReduceScatter", "bf16", "SIMPLE", "2.19.3")]
    assert names == [
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclKernel_AllReduce_RING_LL128_Sum_float(ncclWorkElem)",
        "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_SIMPLE(ncclDevKernelArgsStorage<4096ul>)"]
    assert all(is_nccl_name(n) for n in names)


def test_cnn_kernel_mix_and_launch_calls_look_like_real_ones():
    """An fp32 ResNet-50 on an A100 runs 1x1 convolutions as CUTLASS GEMMs and its linear head
    through cuBLAS (TF32 off), as the HTA A100 DDP trace does; launch calls have a long tail."""
    m = all_models()["resnet50"]
    res = simulate(RunConfig(m, PLATFORMS["a100"], 32, 224, steps=2, seed=4, t0_us=1e12))
    kernels = [e for e in res.events if e.get("cat") == "kernel"]
    names = {e["name"] for e in kernels}
    assert any("cutlass_80_tensorop_s1688gemm" in n for n in names)
    assert any(n.startswith("sm80_xmma_fprop_implicit_gemm") for n in names)
    assert any(n.startswith("ampere_sgemm") or "gemvx" in n or "simt_sgemm" in n for n in names)
    gemm = sum(e["dur"] for e in kernels if "gemm" in e["name"] and "implicit" not in e["name"])
    assert gemm > 0.05 * sum(e["dur"] for e in kernels)
    launches = np.array([e["dur"] for e in res.events if e.get("name") == "cudaLaunchKernel"])
    assert 5.0 < np.median(launches) < 12.0 and np.percentile(launches, 99) > 1.8 * np.median(launches)
    # the profiler stops with a device synchronize on the main thread
    last = max((e for e in res.events if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    assert last["name"] == "cudaDeviceSynchronize"
