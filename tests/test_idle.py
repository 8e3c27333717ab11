"""GPU idle accounting (`traceap.idle`): every idle microsecond in exactly one cause, on real
traces, and the same figures in the JSON, `traceap info`, the terminal and the HTML report."""

from __future__ import annotations

import copy
import io
import re

import numpy as np
import pytest
from rich.console import Console

import traceap
import traceap.idle as idle
from traceap.analysis import analyze
from traceap.findings import cost_sentence
from traceap.info import summarize
from traceap.measures.communication import host_late_under_nccl
from traceap.measures.gaps import first_batch_start, queued_intervals
from traceap.measures.host import HostConfig, unrecorded_host
from traceap.measures.signals import busy_rows, intersect
from traceap.measures.warmup import warmup_intervals
from traceap.report.html import render_html
from traceap.report.idle_text import describe, launch_bound_note
from traceap.report.terminal import render
from traceap.trace import CopyKind, Kind, Trace, busy_union, merged_intervals
from traceap.units import fmt_us
from traceap.windows import Windows

from .conftest import CNN, DATA, SHARED_TRACES, needs_shared, shared_trace_files

BUNDLED = sorted(DATA.glob("*.json.gz")) + sorted((DATA / "dlrm_job").glob("*.json.gz")) + [CNN]


@pytest.fixture(scope="module")
def ddp() -> Trace:
    return traceap.load(CNN)


def measured_idle(trace: Trace) -> float:
    """The idle time by its definition, straight from the columns: the span of GPU work
    (widened to whole steps) less the union of compute kernels, memsets and on-device copies."""
    g = trace.gpu_work_rows
    if not len(g):
        return 0.0
    lo, hi = float(trace.ts[g].min()), float(trace.end[g].max())
    if trace.steps:
        lo = min(lo, min(s.start_us for s in trace.steps))
        hi = max(hi, max(s.end_us for s in trace.steps))
    else:  # the first batch the GPU waited for
        lo = min(lo, first_batch_start(trace, lo))
    kind = trace.kind[g]
    busy = g[((kind == Kind.KERNEL) & ~trace.is_nccl[g]) | (kind == Kind.GPU_MEMSET)
             | np.isin(trace.copy_kind[g], (CopyKind.DTOD, CopyKind.PTOP))]
    return (hi - lo) - busy_union(np.clip(trace.ts[busy], lo, hi), np.clip(trace.end[busy], lo, hi))


def check_partition(trace: Trace) -> idle.IdleAccount:
    acc = idle.measure(trace)
    truth = measured_idle(trace)
    assert acc.total_us == pytest.approx(truth, rel=1e-3, abs=1.0)
    assert sum(acc.by_cause.values()) == pytest.approx(acc.total_us, rel=1e-3, abs=1.0)
    assert sum(acc.by_mechanism.values()) == pytest.approx(acc.total_us, rel=1e-3, abs=1.0)
    assert all(v >= 0 for v in acc.by_mechanism.values())
    # Segments: disjoint, sorted, each with one cause, summing to the total.
    s, e = acc.seg_start, acc.seg_end
    assert np.all(e >= s) and np.all(s[1:] >= e[:-1] - 1e-6)
    assert float(np.sum(e - s)) == pytest.approx(acc.total_us, rel=1e-3, abs=1.0)
    return acc


# -- every microsecond in exactly one bucket -------------------------------------------------------
@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.name)
def test_buckets_sum_to_the_measured_idle_time(path):
    check_partition(traceap.load(path))


@pytest.mark.slow
@needs_shared
def test_buckets_sum_to_the_measured_idle_time_on_every_shared_trace():
    files = shared_trace_files()
    assert len(files) > 50
    for path in files:
        check_partition(traceap.load(path))


def test_per_window_and_per_step_figures_add_up_to_the_totals(ddp):
    acc = idle.measure(ddp)
    for n in (7, 100):
        by = idle.cause_per_window(Windows(ddp, n))
        for cause, v in by.items():
            assert v.sum() == pytest.approx(acc.by_cause[cause], rel=1e-6, abs=1e-3), cause
    steps = idle.per_step(ddp)
    assert [s["number"] for s in steps] == [4, 5, 6]
    inside = sum(s["idle_us"] for s in steps)
    assert 0.9 * acc.total_us < inside <= acc.total_us + 1.0  # the steps cover the GPU span


# -- what each cause means ------------------------------------------------------------------------
def _exposed(t: Trace) -> float:
    nccl = np.flatnonzero(t.is_nccl)
    busy = busy_rows(t)
    both = np.concatenate((nccl, busy))
    return busy_union(t.ts[both], t.end[both]) - busy_union(t.ts[busy], t.end[busy])


def test_exposed_communication_is_nccl_with_no_compute_beside_it_or_queued(ddp, readme_sample):
    """Communication = NCCL running with no compute beside it, less the time nothing waited for
    it (no compute launched and queued, the host in no sync): then the host was late, and that
    idle is the host's (the CNN's collectives: launch-bound, so almost all of it)."""
    for t in (ddp, readme_sample):
        acc = idle.measure(t)
        l0, l1 = host_late_under_nccl(t)
        late = float(np.sum(l1 - l0))
        assert acc.by_cause["communication"] == pytest.approx(_exposed(t) - late, rel=1e-3)
        # Nothing was queued in the host-late time.
        q0, q1 = queued_intervals(t)
        assert float(np.sum(np.subtract(*intersect(l0, l1, q0, q1)[::-1]))) == 0.0
        # `traceap info` reports the same number, not its own overlap arithmetic.
        info = summarize(t)
        assert info["nccl"]["exposed_us"] == pytest.approx(acc.by_cause["communication"], abs=0.01)
        assert info["gpu_idle_us"] == pytest.approx(acc.total_us, abs=0.01)
        assert info["gpu_idle"]["by_cause"] == {k: round(v, 1) for k, v in acc.by_cause.items()}
    # The CNN: 39.6 ms of NCCL with no compute beside it, 5% of it with compute queued.
    cnn = idle.measure(ddp)
    assert _exposed(ddp) > 39_000 and cnn.by_cause["communication"] < 0.1 * _exposed(ddp)
    assert cnn.by_mechanism["launch_bound"] > 0.9 * cnn.total_us
    # The DLRM sample: the optimizer queued behind its all-reduces, most of it stays.
    assert idle.measure(readme_sample).by_cause["communication"] > 0.75 * _exposed(readme_sample)


def test_device_to_device_copies_and_free_syncs_cost_no_copy_time(ddp):
    """The sample has only DtoD copies and 16 event syncs of 3 us: the syncs can cost at most
    the time the host waited in them, never the 8 ms gap that follows."""
    assert set(np.unique(ddp.copy_kind[ddp.rows(Kind.GPU_MEMCPY)])) == {CopyKind.DTOD}
    acc = idle.measure(ddp)
    sync = np.flatnonzero(ddp.is_sync)
    assert acc.by_mechanism["input_copies"] == 0.0
    assert acc.by_cause["host_copy_sync"] <= float(ddp.dur[sync].sum())
    assert acc.by_cause["host_copy_sync"] < 100.0


def test_a_sync_is_charged_the_lead_it_lost_in_later_gaps_too(readme_sample):
    """The README's DLRM rank fetches split sizes with blocking DtoH copies that wait ~4-5 ms
    for a deep queue.  The later starved gaps, up to the compute the device ran while the host
    waited, are the sync's (`sync_debt`), beyond the gap it returns into (`sync_bubbles`); none
    is charged outside a starved gap, and no more than the leads lost."""
    from traceap.measures.copies import _blocking_calls, sync_bubbles, sync_debt
    from traceap.measures.signals import starved_gaps
    t = readme_sample
    d0, d1 = sync_debt(t, 20.0)
    b0, b1 = sync_bubbles(t, 20.0)
    g0, g1, _ = starved_gaps(t)
    assert len(d0) and np.all(d1 > d0)
    j = np.searchsorted(g0, d0, side="right") - 1
    assert np.all(j >= 0) and np.all(d1 <= g1[j] + 1e-6)               # inside a starved gap
    rows, _ = _blocking_calls(t, 20.0)
    busy = busy_rows(t)
    bs, be = merged_intervals(t.ts[busy], t.end[busy])
    lead = sum(float(np.clip(np.minimum(be, t.end[r]) - np.maximum(bs, t.ts[r]), 0, None).sum())
               for r in rows)
    only_debt = float(np.sum(d1 - d0)) - float(np.sum(b1 - b0))
    assert 1000.0 < only_debt <= lead                                  # us: more than the bubbles
    acc = idle.measure(t)
    assert acc.by_mechanism["host_copies_syncs"] > float(np.sum(b1 - b0)) + 1000.0


def _idle_in_label(tmp_path, pattern: str) -> dict[str, float]:
    """`pattern` planted into the DLRM sample (seed [7, 0]): the idle inside its label, per
    mechanism of the planted trace's account."""
    from traceap.inject.core import inject_one
    from traceap.inject.edit import Doc
    from traceap.inject.mechanisms import Base
    from .conftest import SAMPLE
    o = inject_one(Base.of(Doc(SAMPLE), SAMPLE.name), pattern, np.random.default_rng([7, 0]))
    f = tmp_path / "planted.json"
    f.write_bytes(o.data)
    acc = idle.measure(traceap.load(f))
    s, e = merged_intervals(np.array([a for a, _ in o.anomalies]),
                            np.array([b for _, b in o.anomalies]))
    return {m: acc.time_in(m, s, e) for m in idle.MECHANISM_IDS}


def test_a_burst_of_item_calls_after_a_deep_queue_is_a_copy_habit_not_launch_bound(tmp_path):
    """`.item()` calls planted into the DLRM rank drain its deep queue; the GPU then starves
    while the host relaunches at the device's pace.  That idle is the syncs' (the plant's label),
    not the launch-bound host's: without them the host keeps its lead.  While the host rebuilds
    its lead the GPU still waits 20-150 us at some launches, which reads as launch-bound where
    it happens (6% of the label's idle).  None of it is unexplained: the replay moved every
    queued kernel by each host delay, and 8.4 of the label's 27.8 ms of idle were gaps the
    planted syncs did not cause."""
    mine = _idle_in_label(tmp_path, "excessive_memcpy")
    total = sum(mine.values())
    assert mine["host_copies_syncs"] >= 0.6 * total
    assert mine["launch_bound"] + mine["python_host"] <= 0.1 * total
    assert mine["not_explained"] <= 0.01 * total


def test_small_collectives_are_charged_the_host_calls_between_them(tmp_path):
    """Many small all-reduces planted into the DLRM sample: between two of their kernels the GPU
    waits while the host is in the c10d call that launches the next one.  The account gave
    only the kernels' time to `small_nccl` (41% of the label's idle; 0.41 of the idle the plants
    add on every base of the benchmark) and the calls' gaps to launch_bound (55%).  Bucketing
    removes both, so both are the pattern's time lost."""
    mine = _idle_in_label(tmp_path, "small_nccl_kernels")
    total = sum(mine.values())
    assert total > 10_000.0
    assert mine["small_nccl"] >= 0.85 * total
    assert mine["launch_bound"] + mine["python_host"] <= 0.1 * total


def test_warmup_first_step_and_module_loading_are_not_the_steady_state():
    """An AMD toy training run: its first step is 190x the second and starts with slow first
    kernel launches (lazy module loading): warm-up, left out of the per-step figures."""
    t = traceap.load(DATA / "amd_mi250_train.json.gz")
    acc = idle.measure(t)
    assert acc.warmup_steps == [1] and [n for _, _, n in acc.steady_steps] == [2]
    assert acc.by_cause["warmup"] > 0.95 * acc.total_us
    assert set(acc.warmup_sources) == {"first launches (module loading)", "first profiler step"}
    a = analyze(t, detector="expert")
    assert a.findings == [] and any(n.startswith("warm-up:") for n in a.notes)
    assert a.basis.n_steps == 1


def test_warmup_claims_its_time_before_the_launch_bound_host(ddp):
    """A compile call on the host (here DDP's unflatten, renamed) is warm-up in the first step
    and a recompile after it: the idle under it moves from launch-bound to those two,
    microsecond for microsecond."""
    rows = np.flatnonzero(ddp.name == ddp.code_of("aten::unflatten_dense_tensors"))
    names = list(ddp.names) + ["torch/_inductor/compile_fx.py(1234): compile_fx"]
    code = ddp.name.copy()
    code[rows] = len(names) - 1
    cols = {c: getattr(ddp, c) for c in Trace.COLUMNS}
    cols["name"] = code
    t = Trace(names, cols, copy.copy(ddp.meta), list(ddp.steps))
    before, after = idle.measure(ddp), idle.measure(t)
    moved = after.by_cause["warmup"] + after.by_mechanism["recompilation"]
    assert moved > 30_000  # DDP unflattens buckets for ~22 ms per step with the GPU idle
    assert after.by_mechanism["warmup"] > 0 and after.by_mechanism["recompilation"] > 0
    first = min(t.steps, key=lambda s: s.start_us)
    assert after.time_in("recompilation", [first.start_us], [first.end_us]) == 0.0
    assert after.by_cause["launch_bound"] == pytest.approx(
        before.by_cause["launch_bound"] - moved, abs=1.0)
    assert after.total_us == pytest.approx(before.total_us)
    # DDP's own bookkeeping is the framework's dispatch, not user Python: no cpu_bound finding.
    assert "cpu_bound" not in [f.pattern for f in analyze(t, detector="expert").findings]


@needs_shared
def test_first_multiprocess_next_far_longer_than_the_rest_is_worker_startup():
    path = SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis/trace_diff__test__test.json.gz"
    t = traceap.load(path)
    nxt = np.flatnonzero(t.name == t.code_of("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"))
    assert len(nxt) >= 2
    assert "DataLoader worker start-up" not in warmup_intervals(t)[2]
    dur = t.dur.copy()
    dur[nxt[0]] = 10 * np.median(t.dur[nxt[1:]]) + 1000.0
    cols = {c: getattr(t, c) for c in Trace.COLUMNS}
    cols["dur"] = dur
    slow = Trace(t.names, cols, copy.copy(t.meta), list(t.steps))
    assert "DataLoader worker start-up" in warmup_intervals(slow)[2]


def test_python_between_calls_is_cpu_bound_and_dispatch_is_the_steady_state():
    """A launch-bound small model: nearly all its idle time is the framework dispatching op
    after op (launch_bound, no pattern); the user's Python between calls (python_host, the
    cpu_bound pattern's time) is a small part."""
    t = traceap.load(DATA / "particle_transformer_bs8.json.gz")
    acc = check_partition(t)
    assert acc.by_mechanism["launch_bound"] > 0.8 * acc.total_us
    assert acc.by_pattern["cpu_bound"] == acc.by_mechanism["python_host"] < 0.1 * acc.total_us
    assert launch_bound_note(acc).startswith("launch-bound run:")


@needs_shared
def test_a_host_that_records_nothing_is_not_explained_not_launch_bound():
    """particle_transformer's gpu_working trace: after its first kernel the host records no op
    and no runtime call for 370 ms (set-up the profiler did not see).  The GPU idle then is not
    launch overhead: nothing in the trace says what the host did."""
    t = traceap.load(SHARED_TRACES / "harryjmoss__particle_transformer/gpu_working_chrome_trace.json.gz")
    acc = check_partition(t)
    h0, h1 = unrecorded_host(t, HostConfig().unrecorded_host_us)
    assert (h1 - h0).max() > 300_000
    assert acc.by_mechanism["unrecorded_host"] > 300_000
    assert acc.by_cause["launch_bound"] < 0.1 * acc.by_mechanism["unrecorded_host"]
    assert acc.by_cause["not_explained"] >= acc.by_mechanism["unrecorded_host"]


# -- must show: the bundled sample -----------------------------------------------------------------
def test_bundled_sample_names_a_cause_for_most_idle_time_and_says_the_rest(ddp):
    acc = idle.measure(ddp)
    assert idle.explained_share(acc) >= 0.80
    text = describe(acc)
    assert "not explained" in text and fmt_us(acc.by_cause["not_explained"]) in text
    assert text.startswith(f"GPU idle {fmt_us(acc.total_us)} of {fmt_us(acc.span_us)}")


# -- one set of numbers --------------------------------------------------------------------------
def test_terminal_html_json_and_info_show_the_same_figures(readme_sample):
    ddp = readme_sample
    a = analyze(ddp, detector="expert")
    j = a.to_json()
    acc = a.idle
    assert j["gpu_idle"]["total_us"] == round(acc.total_us, 1)
    assert j["gpu_idle"]["by_cause"] == {k: round(v, 1) for k, v in acc.by_cause.items()}
    assert summarize(ddp)["gpu_idle_us"] == pytest.approx(j["gpu_idle"]["total_us"], abs=0.1)
    out = io.StringIO()
    render(a, Console(file=out, width=200, no_color=True))
    term = out.getvalue()
    html = render_html(a, ddp)
    figures = [fmt_us(acc.total_us), fmt_us(acc.span_us)] + [
        fmt_us(v) for v in acc.by_cause.values() if v > 0]
    for fig in figures:
        assert fig in term, fig
        assert f"<b>{fig}</b>" in html or f"{fig} " in html, fig
    for f, jf in zip(a.findings, j["findings"]):
        sentence = cost_sentence(f)
        assert sentence in term.replace("\n    ", " ")
        assert sentence in html
        assert jf["time_lost_us"] == round(f.time_lost_us, 1)
        assert jf["gain_pct"] == round(f.gain_pct, 3)
        assert f.time_lost_us == pytest.approx(acc.by_pattern[f.pattern])
    # The terminal's idle line comes first, before the window timeline.
    assert term.index("GPU idle") < term.index("\u2581") if "\u2581" in term else True
    # The HTML bar: one part per cause with time, each cause with a finding links to its card.
    parts = re.findall(r'<a (?:href="#(r0-f\d+)" )?class="idle-part[^"]*" data-cause="(\w+)"', html)
    assert {c for _, c in parts} == {"busy"} | {c for c, v in acc.by_cause.items() if v > 0}
    links = {c: h for h, c in parts if h}
    named = [f.pattern for f in a.findings]
    assert links.get("launch_bound") == (f"r0-f{named.index('cpu_bound')}"
                                         if "cpu_bound" in named else None)
    assert links["communication"] == (
        f"r0-f{[f.pattern for f in a.findings].index('nccl_compute_no_overlap')}")
    for h in links.values():
        assert f'id="{h}"' in html


# -- must show: healthy real traces ----------------------------------------------------------------
#: Unmodified real GPU traces with no natural anti-pattern, by category (issue 14).  Left out:
#: hand-sliced or event-sampled traces, traces without GPU events, and runs with a known
#: anti-pattern (the DDP sample's host-bound step, DLRM's exposed all-to-all and num_workers=0,
#: the particle-transformer batch sweep below 256, eager decode at 2-14% GPU busy).
HEALTHY = {
    "microbenchmark": [
        "AMD-AGI__TraceLens/attention__sdpa_01_long_seq_low_eff__sdpa_01_long_seq_low_eff.json.gz",
        "AMD-AGI__TraceLens/attention__sdpa_02_very_long_seq_head_waste__sdpa_02_very_long_seq_head_waste.json.gz",
        "AMD-AGI__TraceLens/attention__sdpa_03_short_seq_overhead__sdpa_03_short_seq_overhead.json.gz",
        "AMD-AGI__TraceLens/attention__sdpa_04_large_head_dim__sdpa_04_large_head_dim.json.gz",
        "AMD-AGI__TraceLens/elementwise__elem_01_add_poor_bw__elem_01_add_poor_bw.json.gz",
        "AMD-AGI__TraceLens/gemm__gemm_01_compute_few_tiles__gemm_01_compute_few_tiles.json.gz",
        "AMD-AGI__TraceLens/gemm__gemm_02_compute_non_pow2__gemm_02_compute_non_pow2.json.gz",
        "AMD-AGI__TraceLens/gemm__gemm_03_compute_misaligned__gemm_03_compute_misaligned.json.gz",
        "AMD-AGI__TraceLens/gemm__gemm_04_memory_tall_skinny__gemm_04_memory_tall_skinny.json.gz",
        "AMD-AGI__TraceLens/moe__moe_01_many_experts_few_tokens__moe_01_many_experts_few_tokens.json.gz",
        "AMD-AGI__TraceLens/moe__moe_02_few_experts_many_tokens__moe_02_few_experts_many_tokens.json.gz",
        "AMD-AGI__TraceLens/moe__moe_03_top1_sparse__moe_03_top1_sparse.json.gz",
        "AMD-AGI__TraceLens/moe__moe_04_top2_dense__moe_04_top2_dense.json.gz",
        "AMD-AGI__TraceLens/moe__moe_05_large_capacity__moe_05_large_capacity.json.gz",
        "AMD-AGI__TraceLens/moe__moe_06_tiny_batch_many_experts__moe_06_tiny_batch_many_experts.json.gz",
        "AMD-AGI__TraceLens/perf_model__normalization__normalization_layer_test.json.gz",
    ],
    "compiled graph or graph replay": [
        "AMD-AGI__TraceLens/torch_compile_triton__trace.json.gz",
        "facebookresearch__HolisticTraceAnalysis/triton_example__triton_example.json.gz",
        "AMD-AGI__TraceLens/inference__vllm_decode_full__graph_execution.json.gz",
        "AMD-AGI__TraceLens/inference__vllm_prefilldecode_piecewise__graph_execution.json.gz",
    ],
    "start-up / graph capture phase": [
        "AMD-AGI__TraceLens/inference__vllm_decode_full__capture_traces__graph_capture_rank_0.1773709742341309550.pt.trace.json.gz",
        "AMD-AGI__TraceLens/inference__vllm_prefilldecode_piecewise__capture_traces__graph_capture_rank_0.1773709679453551615.pt.trace.json.gz",
        "AMD-AGI__TraceLens/inference__sglang_decode__capture_traces__bs_32_rank0.json.gz",
        "AMD-AGI__TraceLens/inference__xdit_flux.1__capture_traces__capture_trace_rank_0.json.gz",
        "AMD-AGI__TraceLens/inference__xdit_flux.1_aiter_sage__capture_traces__capture_trace_rank_0.json.gz",
    ],
    "small-model inference": [
        "AMD-AGI__TraceLens/h100__gaunernst_bert-small-uncased__1016001.json.gz",
        "AMD-AGI__TraceLens/mi300__gaunernst_bert-small-uncased__1016001.json.gz",
        "AMD-AGI__TraceLens/h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
        "AMD-AGI__TraceLens/mi300__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    ],
    "GPU-bound run (>= 85% busy)": [
        "facebookresearch__HolisticTraceAnalysis/trace_diff__test__test.json.gz",
        "AMD-AGI__TraceLens/mi210__gpu_only_trace__gpu_only_trace.json.gz",
        "AMD-AGI__TraceLens/inference__xdit_flux.1_aiter_sage__profile_trace_rank_0.json.gz",
    ],
}


def medium_or_high_per_trace(detector) -> tuple[float, dict[str, list[str]]]:
    per, found = [], {}
    for files in HEALTHY.values():
        for name in files:
            a = analyze(SHARED_TRACES / name, detector=detector)
            serious = [f"{f.severity}:{f.pattern}:{f.gain_pct:.1f}%" for f in a.findings
                       if f.severity in ("medium", "high")]
            per.append(len(serious))
            if serious:
                found[name] = serious
    return float(np.mean(per)), found


@pytest.mark.slow
@needs_shared
def test_healthy_real_traces_get_at_most_half_a_serious_finding_each():
    missing = [n for fs in HEALTHY.values() for n in fs if not (SHARED_TRACES / n).exists()]
    if missing:
        pytest.skip(f"{len(missing)} healthy traces are absent")
    from traceap.stages import resolve_detector
    for det in (resolve_detector(None, []), "expert"):  # the default, and the rules alone
        rate, found = medium_or_high_per_trace(det)
        assert rate <= 0.5, (det, rate, found)
