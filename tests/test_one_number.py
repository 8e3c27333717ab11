"""One number per quantity (issue #32): every number a user can read twice, in the terminal,
the HTML report, the analysis JSON, `traceap info`, the job view and `traceap diff`, is the same
number, or its label says why not.  Read from the real outputs of the real CLI on real traces."""

from __future__ import annotations

import re

import orjson
import pytest
from typer.testing import CliRunner

from traceap.cli import app
from traceap.units import fmt_us

from .conftest import CNN, DATA, REPO, SAMPLE

runner = CliRunner()
DLRM_JOB = DATA / "dlrm_job"


def _cli(*args: str) -> str:
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def _flat(text: str) -> str:
    """Terminal text with its line wrapping undone (a sentence may break anywhere)."""
    return re.sub(r"\s+", " ", text)


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The README's sample through `analyze --json --html` and `info` (text and JSON)."""
    out = tmp_path_factory.mktemp("sample")
    text = _cli("analyze", str(SAMPLE), "--json", str(out / "a.json"), "--html",
                str(out / "a.html"))
    return {"terminal": text, "json": orjson.loads((out / "a.json").read_bytes()),
            "html": (out / "a.html").read_text(), "info": _cli("info", str(SAMPLE)),
            "info_json": orjson.loads(_cli("info", str(SAMPLE), "--json"))}


# -- item 7: one GPU busy, one GPU idle, over one span --------------------------------------------
def test_gpu_busy_and_idle_are_one_pair_adding_up_to_the_span_everywhere(sample):
    g = sample["json"]["gpu_idle"]
    span = g["gpu_span_us"][1] - g["gpu_span_us"][0]
    assert g["busy_us"] + g["total_us"] == pytest.approx(span, abs=0.5)
    busy = round(100 * g["busy_us"] / span)
    idle, idle_t, span_t = 100 - busy, fmt_us(g["total_us"]), fmt_us(span)
    assert busy == 61  # DLRM rank 3: compute 285.3 ms of the 465.2 ms GPU span

    # terminal: the header's GPU busy and the idle line's GPU idle
    term = sample["terminal"]
    assert f"GPU busy {busy}%" in term
    assert f"GPU idle {idle_t} of {span_t} ({idle}%)" in term
    assert f"GPU idle {idle_t} of {span_t} ({idle}% of the GPU span)" in _flat(term)
    # HTML: the tiles, the idle bar's head and its busy part
    html = sample["html"]
    assert f'<div class="k">GPU busy</div><div class="v">{busy}%</div>' in html
    assert f'<div class="k">GPU idle</div><div class="v">{idle_t} ({idle}%)</div>' in html
    assert f"GPU idle <b>{idle_t}</b> of {span_t} ({idle}% of the GPU span" in html
    assert f"GPU busy: {fmt_us(g['busy_us'])} ({busy}% of the GPU span)" in html
    assert "GPU utilisation" not in html
    # info: text and JSON
    info = _flat(sample["info"])
    assert f"GPU busy {busy}%, idle {idle_t} ({idle}%) of the {span_t} GPU span" in info
    ij = sample["info_json"]
    assert ij["gpu_busy_fraction"] == pytest.approx(g["busy_us"] / span, abs=1e-5)
    assert ij["gpu_idle_us"] == pytest.approx(g["total_us"], abs=0.1)
    # The second quantity has its own name, and no report calls it "busy".
    assert ij["gpu_active_fraction"] > ij["gpu_busy_fraction"]
    assert f"any GPU work incl. NCCL and copies {round(100 * ij['gpu_active_fraction'])}%" in info
    assert re.findall(r"GPU busy (\d+)%", term + info) == [str(busy)] * 2


def test_job_view_and_diff_print_the_ranks_own_busy_and_idle(tmp_path):
    job = _cli("analyze", str(DLRM_JOB))
    # 4 idle-time findings each and the single-tensor Adagrad (unfused_optimizer, low): the
    # rank's line counts what its own analysis reports
    for worker, rank, n in (("worker0", 0, 5), ("worker1", 1, 5)):
        _cli("analyze", str(DLRM_JOB / f"{worker}.pt.trace.json.gz"), "-q", "--json",
             str(tmp_path / f"{worker}.json"))
        assert len(orjson.loads((tmp_path / f"{worker}.json").read_bytes())["findings"]) == n
        one = orjson.loads(_cli("info", str(DLRM_JOB / f"{worker}.pt.trace.json.gz"), "--json"))
        busy = round(100 * one["gpu_busy_fraction"])
        line = next(ln for ln in job.splitlines() if ln.startswith(f"  rank   {rank} "))
        assert line.endswith(f"GPU busy {busy}%, idle {100 - busy}%, {n} findings"), line
        assert busy + round(100 * one["gpu_idle_us"] / (one["gpu_idle"]["gpu_span_us"][1]
                                                        - one["gpu_idle"]["gpu_span_us"][0])) == 100
    # diff of the trace against its own analysis JSON (no summary in it): the same GPU busy.
    _cli("analyze", str(SAMPLE), "-q", "--json", str(tmp_path / "a.json"))
    d = _cli("diff", str(SAMPLE), str(tmp_path / "a.json"))
    assert re.search(r"GPU busy\s+61%\s+61%\s+\+0 pts", d), d


# -- item 8: each pair of numbers that read alike ------------------------------------------------
def _idle_line_causes(term: str) -> dict[str, str]:
    """'launch-bound 75.4 ms, communication 70.2 ms, ...' under the idle bar (above the
    timeline of window scores)."""
    head = term.split("\u2581")[0]
    return {m.group(1): m.group(2) for m in re.finditer(
        r"(launch-bound|communication|copies/syncs|not explained|data loading|warm-up"
        r"|compile gaps) (\d[\d.]* (?:us|ms|s))\b", head)}


def test_exposed_nccl_is_the_communication_idle_and_the_rest_is_labelled(sample):
    term = _flat(sample["terminal"])
    f = next(f for f in sample["json"]["findings"] if f["pattern"] == "nccl_compute_no_overlap")
    n = f["numbers"]
    alone = n["comm_us"] - n["overlapped_us"]  # NCCL with no compute kernel beside it
    exposed = sample["json"]["gpu_idle"]["by_cause"]["communication"]
    assert fmt_us(alone) == "87.9 ms" and fmt_us(exposed) == "70.2 ms"
    # The NCCL time with no compute is said as such, and the exposed part of it named apart.
    assert (f"{fmt_us(alone)} with no compute kernel beside it, of which {fmt_us(exposed)} "
            f"exposed") in term
    assert "exposed (no compute beside it)" not in term
    # The same exposed time in the idle line and in info.
    assert _idle_line_causes(sample["terminal"])["communication"] == fmt_us(exposed)
    assert f"exposed {fmt_us(exposed)}" in _flat(sample["info"])


def test_a_findings_idle_time_names_its_causes_total_when_they_differ(sample):
    """copies/syncs 24.2 ms in the idle line vs excessive_memcpy's 8.3 ms; launch-bound 75.4 ms
    vs cpu_bound's 10.5 ms: each finding says the cause it is a part of, and the rest."""
    term = _flat(sample["terminal"])
    causes = _idle_line_causes(sample["terminal"])
    by_cause = sample["json"]["gpu_idle"]["by_cause"]
    assert causes["copies/syncs"] == fmt_us(by_cause["host_copy_sync"]) == "24.2 ms"
    short = {"host_copy_sync": "host<->device copies and syncs",
             "launch_bound": "launch-bound host (CPU-bound)",
             "communication": "waiting on communication"}
    cause_of = {"excessive_memcpy": "host_copy_sync", "cpu_bound": "launch_bound",
                "nccl_compute_no_overlap": "communication"}
    for f in sample["json"]["findings"]:
        lost, total = fmt_us(f["time_lost_us"]), fmt_us(by_cause[cause_of[f["pattern"]]])
        said = f"{lost} of GPU idle time over the trace"
        assert said in _flat(f["evidence"])
        if lost != total:
            assert f"{said} (of the {total} {short[cause_of[f['pattern']]]}: also " in term
    memcpy = next(f for f in sample["json"]["findings"] if f["pattern"] == "excessive_memcpy")
    assert ("8.3 ms of GPU idle time over the trace (of the 24.2 ms host<->device copies and "
            "syncs: also large pinned input uploads (no anti-pattern) 15.9 ms)") in term
    assert fmt_us(memcpy["time_lost_us"]) == "8.3 ms"


def test_info_counts_the_host_blocking_syncs_the_finding_counts(sample):
    ev = _flat(next(f["evidence"] for f in sample["json"]["findings"]
                    if f["pattern"] == "excessive_memcpy"))
    n_finding = int(re.search(r"(\d+) host-blocking syncs \(.*?; (\d[\d.]* \w+)\)", ev).group(1))
    t_finding = re.search(r"\d+ host-blocking syncs \(.*?; (\d[\d.]* \w+)\)", ev).group(1)
    la = sample["info_json"]["launch"]
    assert la["host_blocking_syncs"] == n_finding == 61
    assert fmt_us(la["host_blocking_sync_time_us"]) == t_finding
    # 247 sync calls: the label says what the others are.
    assert la["sync_calls"] == 247
    assert (f"sync calls 247: {n_finding} host-blocking ({t_finding}), 186 device-side waits"
            in _flat(sample["info"]))


def test_the_launch_bound_note_says_its_part_of_the_launch_bound_cause():
    term = _flat(_cli("analyze", str(CNN)))
    header = _idle_line_causes(_cli("analyze", str(CNN)))["launch-bound"]
    assert header == "543.8 ms"
    assert ("launch-bound run: 531.0 ms (97% of the idle time) the GPU waits for the framework "
            "to dispatch the next kernel (of the 543.8 ms launch-bound host (CPU-bound): also "
            "the user's code (Python between framework calls, ops on host tensors) 12.8 ms)"
            ) in term


# -- item 6: a part within its whole -------------------------------------------------------------
def test_dataloader_idle_is_a_part_of_the_loader_time_on_the_real_job_rank():
    term = _flat(_cli("analyze", str(DLRM_JOB / "worker0.pt.trace.json.gz")))
    m = re.search(r"DataLoader\.__next__ takes (\S+ \w+), of which (\S+ \w+) \((\d+)%\) with the "
                  r"GPU idle", term)
    assert m, term
    assert int(m.group(3)) <= 100
    # The larger charge of the data-loading cause (1.8 ms) is said with what it holds.
    assert "the GPU idle charged to data loading (1.8 ms) also holds the rest of each idle gap" in term


def _loader_trace(path):
    """One kernel, a 650 us `__next__`, then a kernel 1.1 ms after the first ended: the loader
    fills 59% of the GPU gap, so the data-loading cause takes the whole 1.1 ms gap."""
    next_ = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    ev = [{"ph": "X", "cat": "kernel", "name": "k0", "pid": 0, "tid": 7, "ts": 1000, "dur": 100,
           "args": {"stream": 7, "correlation": 1, "device": 0}},
          {"ph": "X", "cat": "user_annotation", "name": next_, "pid": 1, "tid": 1,
           "ts": 1150, "dur": 650},
          {"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": 7, "ts": 2200, "dur": 100,
           "args": {"stream": 7, "correlation": 2, "device": 0}}]
    path.write_bytes(orjson.dumps({"traceEvents": ev}))
    return path


def test_dataloader_idle_is_intersected_with_the_calls_on_a_constructed_trace(tmp_path):
    import traceap
    from traceap.patterns import REGISTRY
    from traceap.windows import Windows

    t = traceap.load(_loader_trace(tmp_path / "loader.json"))
    w = Windows(t, 10)
    ev = REGISTRY["single_process_dataloading"].evidence(w, range(w.n), where=range(w.n))
    assert ev.numbers["loader_us"] == pytest.approx(650)
    assert ev.numbers["time_lost_us"] == pytest.approx(1100)      # the whole gap: the cause
    assert ev.numbers["gpu_idle_in_loader_us"] == pytest.approx(650)  # inside the calls
    assert "takes 650 us, of which 650 us (100%) with the GPU idle" in ev.text


# -- item 10 and small items ---------------------------------------------------------------------
def test_findings_are_ordered_by_severity_then_time_lost_in_the_job_html(tmp_path):
    _cli("analyze", str(DLRM_JOB), "-q", "--html", str(tmp_path / "j.html"))
    html = (tmp_path / "j.html").read_text()
    order = {"high": 0, "medium": 1, "low": 2}
    cards = re.findall(r'<div class="card" id="([^"]+)-f\d+".*?class="badge (\w+)"', html)
    groups: dict[str, list[int]] = {}
    for prefix, sev in cards:
        groups.setdefault(prefix, []).append(order[sev])
    assert len(groups) >= 2 and any(len(g) > 1 for g in groups.values())
    for prefix, sevs in groups.items():
        assert sevs == sorted(sevs), (prefix, sevs)


def test_grammar_of_counts():
    # the rules alone flag the sample's exposed NCCL in eleven places: "... and 1 more place"
    term = _flat(_cli("analyze", str(SAMPLE), "--detector", "expert"))
    assert "and 1 more place (" in term and "1 more places" not in term
    job = _cli("analyze", str(DLRM_JOB))
    assert not re.search(r"\b1 findings\b", job)


def test_the_readme_states_the_shipped_checkpoints_flag_threshold():
    import torch

    meta = torch.load(REPO / "src" / "traceap" / "data" / "model.pt", map_location="cpu",
                      weights_only=False)["meta"]
    readme = _flat((REPO / "README.md").read_text())
    said = re.search(r"stored as `flag_threshold` in the checkpoint: ([\d.]+) in the shipped one",
                     readme)
    assert said and float(said.group(1)) == pytest.approx(meta["flag_threshold"], abs=5e-4)
    assert "0.991" not in readme


@pytest.mark.parametrize("trace", [SAMPLE, CNN, DATA / "amd_mi250_train.json.gz"],
                         ids=lambda p: p.name)
def test_the_terminal_prints_the_steps_the_analysis_json_counts(trace, tmp_path):
    """Item 10: 'steps N' is the JSON's step_basis.n_steps (the steady steps); a warm-up first
    step (the MI250 toy run's) is said apart instead of counted in."""
    text = _cli("analyze", str(trace), "--json", str(tmp_path / "a.json"))
    j = orjson.loads((tmp_path / "a.json").read_bytes())
    m = re.search(r"\bsteps (\d+)( \+ (\d+) warm-up)?", text)
    assert int(m.group(1)) == j["step_basis"]["n_steps"] == j["gpu_idle"]["steady_steps"]
    assert int(m.group(3) or 0) == len(j["gpu_idle"]["warmup_steps"])


def test_results_states_the_bundled_stack_as_it_is():
    """docs/RESULTS.md's opening gives the bundled hybrid stack's three coefficients: they are
    hybrid.json's, to the digits shown."""
    stack = orjson.loads((REPO / "src" / "traceap" / "data" / "hybrid.json").read_bytes())
    text = _flat((REPO / "docs" / "RESULTS.md").read_text())
    said = re.search(r"`src/traceap/data/hybrid\.json`: ([\d.]+) logit\(model\) \+ ([\d.]+) "
                     r"logit\(expert\) - ([\d.]+),", text)
    assert said, "RESULTS.md no longer states the bundled stack"
    a, b, c = (float(x) for x in said.groups())
    assert a == pytest.approx(stack["model_coef"], abs=5e-4)
    assert b == pytest.approx(stack["expert_coef"], abs=5e-4)
    assert -c == pytest.approx(stack["bias"], abs=5e-4)


def test_the_cpu_bound_waiting_time_is_the_launch_bound_idle_as_a_share_of_the_gpu_span(sample):
    g = sample["json"]["gpu_idle"]
    span = g["gpu_span_us"][1] - g["gpu_span_us"][0]
    lb = g["by_cause"]["launch_bound"]
    assert (f"the GPU waited for the host {fmt_us(lb)} ({round(100 * lb / span)}% of the GPU "
            f"span)") in _flat(sample["terminal"])
