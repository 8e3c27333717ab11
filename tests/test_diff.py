"""`traceap diff BEFORE AFTER`: a real before/after pair recorded with `traceap collect` (CPU),
bundled real traces, a folder of ranks and analysis JSONs."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys

import orjson
import pytest
from rich.console import Console

import traceap
from traceap.collect import CollectConfig, collect
from traceap.diff import EXIT_SLOWER, FINDING_NUMBERS, SCHEMA, compare, side_of
from traceap.info import step_numbers
from traceap.report.diff import render, render_verdict

from .conftest import CNN, DATA, SAMPLE

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same tiny ResNet training recorded twice: num_workers=0, then 2 worker processes.

    128 px images make decoding a batch (about 4 ms on an idle core) clearly dearer than taking a
    ready one from a worker's queue (about 1.3 ms at any size), so the comparison holds on a
    loaded 2-core CI machine too; at the model's own 32 px the two were within 3%.
    """
    out = tmp_path_factory.mktemp("pair")
    common = dict(model="resnet_tiny", device="cpu", out=out, batch_size=4, steps=3,
                  image_size=128)
    before = collect(CollectConfig(patterns=("single_process_dataloading",), **common))
    after = collect(CollectConfig(patterns=(), **common))
    return before.trace, after.trace


def _diff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceap", "diff", *args],
                          capture_output=True, text=True)


def test_workers_cut_the_data_loading_time_and_the_verdict_says_so(pair, tmp_path):
    before, after = pair
    d = compare(before, after)
    b, a = d.before, d.after
    assert (b.n_steps, a.n_steps) == (3, 3) and b.kind == a.kind == "trace"
    # The loader's time per step, measured on the host: in-process decoding before, a ready
    # batch from a worker after.
    assert a.dataloader_us_per_step < 0.9 * b.dataloader_us_per_step
    assert "data loading per step -" in d.verdict and d.verdict.startswith("step time ")
    # CPU recordings: no GPU numbers, and the notes say why.
    assert b.gpu_busy_fraction is None and any("CPU-only" in n for n in b.notes)
    j = d.to_json()
    assert j["schema"] == SCHEMA and j["verdict"] == d.verdict
    assert j["change"]["dataloader_per_step_pct"] == pytest.approx(
        100 * (a.dataloader_us_per_step / b.dataloader_us_per_step - 1))
    # The CLI writes the same object and prints the verdict.
    p = _diff(str(before), str(after), "--json", str(tmp_path / "d.json"))
    assert p.returncode == 0, p.stderr
    written = orjson.loads((tmp_path / "d.json").read_bytes())
    assert written["before"]["dataloader_us_per_step"] == pytest.approx(b.dataloader_us_per_step)
    assert "data loading per step" in p.stdout and "step time" in p.stdout


def test_data_loading_time_is_the_union_of_loader_calls_inside_the_steps(pair):
    t = traceap.load(pair[0])
    m = step_numbers(t)
    rows = [i for i in range(len(t)) if "DataLoader" in t.name_of(i) and "__next__" in t.name_of(i)]
    lo, hi = t.steps[0].start_us, t.steps[-1].end_us
    inside = sum(min(t.end[i], hi) - max(t.ts[i], lo) for i in rows
                 if t.end[i] > lo and t.ts[i] < hi)
    assert m["n_steps"] == 3 and m["loader_calls"] == len(rows) >= 3
    assert m["dataloader_us"] == pytest.approx(inside, rel=1e-6)   # calls do not nest here
    assert m["step_us"] == pytest.approx(sorted(s.end_us - s.start_us for s in t.steps)[1])


def test_fail_if_slower_gates_on_the_step_time():
    fast = DATA / "amd_mi250_train.json.gz"       # 4.7 ms steps
    slow = CNN                                  # 222 ms steps
    p = _diff(str(fast), str(slow), "--fail-if-slower", "10", "-q")
    assert p.returncode == EXIT_SLOWER == 3
    assert p.stdout.startswith("step time +") and "more than --fail-if-slower 10%" in p.stdout
    p = _diff(str(slow), str(fast), "--fail-if-slower", "10", "-q")
    assert p.returncode == 0 and p.stdout.startswith("step time -")
    # No profiler steps on one side: nothing to gate on, said in one line.
    p = _diff(str(slow), str(DATA / "amd_mi300_gemm.json.gz"), "--fail-if-slower", "10", "-q")
    assert p.returncode == 2 and "step time is unknown" in p.stderr.splitlines()[-1]


@pytest.mark.parametrize("quiet", [[], ["-q"]], ids=["table", "quiet"])
def test_every_line_fits_100_columns_and_keeps_the_whole_verdict(quiet, monkeypatch):
    """The findings lines and the verdict were printed on one line each (up to 123 columns for
    this pair); they now break between words at the console's width."""
    monkeypatch.setenv("COLUMNS", "100")
    p = _diff(str(CNN), str(SAMPLE), *quiet)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert max(len(x) for x in lines) <= 100, max(lines, key=len)
    d = compare(CNN, SAMPLE)
    assert len(d.verdict) > 100 and " ".join(d.verdict.split()) in " ".join(p.stdout.split())
    # The command prints what the library's renderer draws from the comparison, so a notebook
    # or a script shows the same: `traceap.diff` compares, `traceap.report.diff` lays it out.
    shown = io.StringIO()
    (render_verdict if quiet else render)(d, Console(file=shown, width=100))
    assert shown.getvalue() == p.stdout


def test_same_recording_twice_is_no_change():
    d = compare(CNN, CNN)
    assert d.step_pct == 0 and "no significant change" in d.verdict
    assert {c.status for c in d.findings} <= {"same"}
    assert not d.slower


def test_findings_that_go_away_are_fixed_and_new_ones_appear():
    gpu = side_of(SAMPLE)
    assert gpu.findings, "the bundled DLRM trace has findings"
    cpu = side_of(DATA / "cpu_only_zoology.json.gz")
    d = compare(gpu, cpu)
    assert {c.status for c in d.findings} == {"fixed"}
    assert all(p in d.verdict for p in {f.pattern for f in gpu.findings})
    back = compare(cpu, gpu)
    assert {c.status for c in back.findings} == {"new"} and "appeared" in back.verdict
    # Time lost per step by pattern: the analysis' own per-step numbers, summed by pattern.
    lost = gpu.lost_per_step()
    assert set(lost) == {f.pattern for f in gpu.findings}
    for f in gpu.findings:
        assert f.time_lost_per_step_us is not None
        assert lost[f.pattern] == pytest.approx(
            sum(g.time_lost_per_step_us for g in gpu.findings if g.pattern == f.pattern))


def test_an_analysis_json_gives_the_same_numbers_as_its_trace(tmp_path):
    trace, out = tmp_path / "run.pt.trace.json.gz", tmp_path / "a.json"
    shutil.copy(CNN, trace)
    p = subprocess.run([sys.executable, "-m", "traceap", "analyze", str(trace), "-q",
                        "--json", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    from_json, from_trace = side_of(out), side_of(trace)
    assert from_json.kind == "analysis"
    assert from_json.step_us == from_trace.step_us and from_json.n_steps == 3
    assert from_json.dataloader_us_per_step == from_trace.dataloader_us_per_step
    assert [f.pattern for f in from_json.findings] == [f.pattern for f in from_trace.findings]
    # The finding numbers the JSON carries (docs/FORMATS.md) are read as they are.
    data = orjson.loads(out.read_bytes())
    for f, g in zip(data["findings"], from_json.findings):
        for k in FINDING_NUMBERS:
            if k in f:
                assert getattr(g, k) == pytest.approx(f[k])
    # Without its trace: the step time from the JSON's step_basis, data loading unknown.
    trace.unlink()
    s = side_of(out)
    assert s.step_us == pytest.approx(from_trace.step_us, abs=0.1)
    assert s.dataloader_us_per_step is None
    assert any("trace not found" in n for n in s.notes)
    assert compare(s, from_trace).step_pct == pytest.approx(0, abs=1e-3)


def test_a_folder_of_ranks_is_one_side():
    s = side_of(DATA / "dlrm_job")
    assert s.kind == "job" and s.ranks == 2 and s.n_steps == 2
    steps = sorted(step_numbers(t)["step_us"] for t in traceap.load_job(DATA / "dlrm_job"))
    assert s.step_us == pytest.approx(sum(steps) / 2)      # the median of the two ranks


def test_bad_inputs_are_one_clear_line(tmp_path):
    p = _diff(str(tmp_path / "missing.json"), str(CNN))
    assert p.returncode == 2 and "no such file or folder" in p.stderr.splitlines()[-1]
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "traceap.analysis/v1", "trace": ')
    p = _diff(str(bad), str(CNN))
    assert p.returncode == 2 and "not valid JSON" in p.stderr.splitlines()[-1]
    assert "Traceback" not in p.stderr


def test_two_analysis_jsons_of_cpu_recordings_keep_their_steps_and_gate(pair, tmp_path):
    """Issue #32 item 10: the analysis JSON of a CPU-only recording records the steps its
    terminal view prints, so a diff of two such JSONs (traces gone) has a step time to gate on."""
    jsons = []
    for name, trace in zip(("before", "after"), pair):
        copy, out = tmp_path / f"{name}.pt.trace.json.gz", tmp_path / f"{name}.json"
        shutil.copy(trace, copy)
        p = subprocess.run([sys.executable, "-m", "traceap", "analyze", str(copy), "--json",
                            str(out)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        basis = orjson.loads(out.read_bytes())["step_basis"]
        assert re.search(r"\bsteps (\d+)\b", p.stdout).group(1) == str(basis["n_steps"]) == "3"
        assert basis["step_us"] > 0 and basis["unit"] == "step"
        copy.unlink()  # the JSON alone: its step_basis is all the diff has
        jsons.append(str(out))
    d = compare(*jsons)
    assert (d.before.n_steps, d.after.n_steps) == (3, 3) and d.step_pct is not None
    assert not any("no ProfilerStep" in n for n in d.before.notes + d.after.notes)
    for pair_order in (jsons, jsons[::-1]):
        p = _diff(*pair_order, "--fail-if-slower", "0", "-q")
        assert p.returncode in (0, EXIT_SLOWER), p.stderr
        assert p.stdout.startswith("step time ") and "unknown" not in p.stdout + p.stderr
    # One of the two orders is slower by more than 0%: a real verdict, exit 3.
    codes = {_diff(*o, "--fail-if-slower", "0", "-q").returncode for o in (jsons, jsons[::-1])}
    assert EXIT_SLOWER in codes or d.step_pct == 0


def test_the_html_report_of_a_cpu_recording_shows_its_step_time_and_data_loading(pair, tmp_path):
    """Issue #32: on a CPU-only recording the step time and the DataLoader time per step are the
    only meaningful numbers; the HTML report (as `traceap profile --html` writes it) shows the
    ones `traceap diff` compares."""
    from traceap.units import fmt_us

    out = tmp_path / "r.html"
    p = subprocess.run([sys.executable, "-m", "traceap", "analyze", str(pair[0]), "-q",
                        "--html", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    m = step_numbers(traceap.load(pair[0]))
    assert (f'<div class="k">Step time (median)</div><div class="v">{fmt_us(m["step_us"])} '
            f'(3 steady steps)</div>') in html
    share = 100 * m["dataloader_us_per_step"] / m["step_us"]
    assert (f'<div class="k">Data loading</div><div class="v">'
            f'{fmt_us(m["dataloader_us_per_step"])} per step ({share:.0f}% of the step, on the '
            f'host)</div>') in html


# -- ranks are the processes' ranks ------------------------------------------------------------
def test_findings_carry_the_process_rank_not_their_position(tmp_path):
    # The issue: a rank-0 trace's findings read "rank 1/2/3" (their place in the ranking).
    rank0 = DATA / "dlrm_job" / "worker0.pt.trace.json.gz"
    d = compare(rank0, rank0)
    assert len(d.before.findings) > 1 and {f.rank for f in d.before.findings} == {0}
    assert {c["rank"] for c in d.to_json()["findings"]} == {0}
    assert {f.rank for f in side_of(SAMPLE).findings} == {3}
    # No rank information at all: no rank.
    assert {f.rank for f in side_of(DATA / "kineto2021_v100.json.gz").findings} == {None}
    # Two analysis JSONs (their traces beside them) say the same through the CLI.
    trace = tmp_path / "run.pt.trace.json.gz"
    shutil.copy(rank0, trace)
    for name in ("a.json", "b.json"):
        p = subprocess.run([sys.executable, "-m", "traceap", "analyze", str(trace), "-q",
                            "--json", str(tmp_path / name)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    p = _diff(str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json", str(tmp_path / "d.json"))
    assert p.returncode == 0, p.stderr
    j = orjson.loads((tmp_path / "d.json").read_bytes())
    assert j["findings"] and {(c["rank"], c["status"]) for c in j["findings"]} == {(0, "same")}
    assert "(rank 1)" not in p.stdout and "(rank 2)" not in p.stdout
    # The analysis JSON says its rank, so the JSON alone (its trace gone) gives it too.
    trace.unlink()
    assert {f.rank for f in side_of(tmp_path / "a.json").findings} == {0}
    # A job's JSON: each rank's findings under its own rank.
    p = subprocess.run([sys.executable, "-m", "traceap", "analyze", str(DATA / "dlrm_job"), "-q",
                        "--json", str(tmp_path / "job.json")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    by_rank = {(f.rank, f.cross_rank) for f in side_of(tmp_path / "job.json").findings}
    assert {r for r, cross in by_rank if not cross} == {0, 1}


# -- hidden, not new -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hidden_pair(tmp_path_factory):
    """A real trace (kineto2021, V100) with pageable copies planted (`traceap inject`), and the
    same with a single-process DataLoader planted on top, whose stall hides the copies' cost:
    the run before and after `num_workers=4`."""
    out = tmp_path_factory.mktemp("hidden")

    def inject(base, pattern, seed):
        p = subprocess.run([sys.executable, "-m", "traceap", "inject", str(base), "--out",
                            str(out / f"{pattern}{seed}"), "--patterns", pattern, "--seed",
                            str(seed)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return next((out / f"{pattern}{seed}" / "traces").glob(f"*__{pattern}__c0*"))
    base = DATA / "kineto2021_v100.json.gz"
    pinned_not = inject(base, "no_pin_memory", 0)
    both = inject(pinned_not, "single_process_dataloading", 1)
    return base, both, pinned_not


def test_a_pattern_hidden_by_a_bigger_cause_is_now_visible_not_new(hidden_pair):
    base, before, after = hidden_pair
    d = compare(before, after)
    c = next(c for c in d.findings if c.pattern == "no_pin_memory")
    # Not a finding before (the loader's stall took its idle time), one after ...
    assert c.before is None and c.after is not None
    # ... while its own measure did not move: the same pageable copies and bytes per step.
    b, a = c.amount["before"], c.amount["after"]
    assert b["n_copies"] > 0 and b["bytes"] > 0
    assert a["n_copies"] == pytest.approx(b["n_copies"]) and a["bytes"] == pytest.approx(b["bytes"])
    assert c.status == "now_visible" and c.hidden_by == "single_process_dataloading"
    assert "no_pin_memory now visible (was hidden by single_process_dataloading)" in d.verdict
    assert "no_pin_memory appeared" not in d.verdict
    j = d.to_json()
    entry = next(f for f in j["findings"] if f["pattern"] == "no_pin_memory")
    assert entry["status"] == "now_visible" and entry["hidden_by"] == "single_process_dataloading"
    assert j["before"]["amounts"]["no_pin_memory"] == pytest.approx(b)
    # The other way round (a stall added): the copies are hidden, not fixed.
    back = compare(after, before)
    c = next(c for c in back.findings if c.pattern == "no_pin_memory")
    assert (c.status, c.hidden_by) == ("now_hidden", "single_process_dataloading")
    assert "no_pin_memory now hidden by single_process_dataloading" in back.verdict
    assert not [x for x in back.findings if x.pattern == "no_pin_memory" and x.status == "fixed"]
    # Planting the copies into the clean trace is a real change: new, and said so.
    fresh = compare(base, after)
    c = next(c for c in fresh.findings if c.pattern == "no_pin_memory")
    assert c.status == "new" and "no_pin_memory appeared" in fresh.verdict
    # The CLI prints the status in words.
    p = _diff(str(before), str(after))
    assert p.returncode == 0, p.stderr
    # the status, then the pattern, then what hid it (not two pattern ids in a row)
    assert "now visible no_pin_memory (was hidden by single_process_dataloading):" in \
        " ".join(p.stdout.split())
    back_cli = _diff(str(after), str(before))
    assert "now hidden no_pin_memory (hidden by single_process_dataloading):" in \
        " ".join(back_cli.stdout.split())
