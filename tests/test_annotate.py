"""The annotated trace: every original event kept, plus a "traceap findings" track."""

from __future__ import annotations

import gzip
from collections import Counter
from dataclasses import replace

import orjson
import pytest

import traceap
from traceap.analysis import analyze
from traceap.load import read_bytes
from traceap.report.annotate import CATEGORY, TRACK_NAME, write_annotated
from traceap.trace import Kind

from .conftest import DATA, SAMPLE


@pytest.fixture(scope="module")
def trace():
    return traceap.load(SAMPLE)


@pytest.fixture(scope="module")
def analysis(trace):
    return analyze(trace, n_windows=100, detector="expert")


def track_events(path_or_events):
    """The events our track added (those on the pid named TRACK_NAME)."""
    events = path_or_events
    if not isinstance(events, list):
        events = orjson.loads(read_bytes(path_or_events))["traceEvents"]
    pid = next(e["pid"] for e in events
               if e.get("ph") == "M" and e.get("name") == "process_name"
               and e["args"].get("name") == TRACK_NAME)
    return [e for e in events if e.get("pid") == pid]


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_annotated_trace_keeps_every_event_and_loads_back(tmp_path, trace, analysis, suffix):
    out = write_annotated(analysis, trace, tmp_path / f"annotated{suffix}")
    assert (out.read_bytes()[:2] == b"\x1f\x8b") == suffix.endswith(".gz")
    again = traceap.load(out)
    annotated = orjson.loads(read_bytes(out))["traceEvents"]
    ours = track_events(annotated)
    added = [e for e in ours if e["ph"] == "X"]
    assert added
    before, after = Counter(trace.kind.tolist()), Counter(again.kind.tolist())
    assert after - before == Counter({int(Kind.OTHER): len(added)})  # only our slices are new
    assert before - after == Counter()
    assert again.meta.n_flows == trace.meta.n_flows
    assert again.span == trace.span
    # Byte for byte, the original events come first and unchanged.
    original = orjson.loads(read_bytes(SAMPLE))["traceEvents"]
    assert annotated[:len(original)] == original
    assert len(annotated) == len(original) + len(ours)


def test_slices_cover_the_findings_windows_with_evidence_and_fix(tmp_path, trace, analysis):
    out = write_annotated(analysis, trace, tmp_path / "a.json")
    events = track_events(out)
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in slices} == {CATEGORY}
    by_pattern: dict[str, list] = {}
    for e in slices:
        by_pattern.setdefault(e["args"]["pattern"], []).append(e)
    assert set(by_pattern) == {f.pattern for f in analysis.findings}
    w = analysis.windows
    for f in analysis.findings:
        got = by_pattern[f.pattern]
        assert {e["name"] for e in got} == {f.title}
        assert all(e["args"]["evidence"] == f.evidence and e["args"]["fix"] == f.fix for e in got)
        covered = sorted((e["ts"], e["ts"] + e["dur"]) for e in got)
        expected = sorted((w[i].start_us, w[i].end_us) for i in f.windows)
        # Contiguous windows become one slice: same total time, same ends.
        assert sum(b - a for a, b in covered) == pytest.approx(sum(b - a for a, b in expected))
        assert covered[0][0] == pytest.approx(expected[0][0])
        assert covered[-1][1] == pytest.approx(expected[-1][1])
        scores = [w[i].score for i in f.windows]
        assert max(e["args"]["score_max"] for e in got) == pytest.approx(max(scores), abs=1e-4)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {f.title for f in analysis.findings} <= names
    counter = [e for e in events if e["ph"] == "C"]
    assert len(counter) == len(w) + 1 and counter[0]["args"]["score"] == pytest.approx(w[0].score)


def test_overlapping_and_unclaimed_windows_get_rows_of_their_own(tmp_path, trace, analysis):
    f = analysis.findings[0]
    twin = replace(f, windows=list(f.windows), evidence="the same windows, another finding")
    flagged_free = next(x.index for x in analysis.windows if not x.flagged)
    windows = list(analysis.windows)
    windows[flagged_free] = replace(windows[flagged_free], flagged=True, pattern=None, score=0.9)
    a = replace(analysis, findings=[f, twin], windows=windows)
    events = track_events(write_annotated(a, trace, tmp_path / "b.json"))
    threads = {e["tid"]: e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(threads.values()) == sorted([f.title, f"{f.title} (2)", "flagged, no finding"])
    # Within one thread, slices never overlap (viewers need them nested).
    for tid in threads:
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                       if e["ph"] == "X" and e["tid"] == tid)
        assert all(b0 <= a1 + 1e-6 for (_, b0), (a1, _) in zip(spans, spans[1:]))
    loose = [e for e in events if e["ph"] == "X" and threads[e["tid"]] == "flagged, no finding"]
    unclaimed = [x for x in windows if x.flagged and x.index not in f.windows]
    assert sum(e["dur"] for e in loose) == pytest.approx(sum(x.end_us - x.start_us
                                                             for x in unclaimed))
    mid = (windows[flagged_free].start_us + windows[flagged_free].end_us) / 2
    assert any(e["ts"] <= mid <= e["ts"] + e["dur"] for e in loose)


def test_track_pid_is_new_and_string_pids_are_fine(tmp_path):
    # An AMD trace (string and int pids mixed) annotated with a real analysis.
    path = DATA / "amd_mi250_train.json.gz"
    t = traceap.load(path)
    a = analyze(t, n_windows=20, detector="expert")
    out = write_annotated(a, t, tmp_path / "amd.json.gz")
    original = orjson.loads(read_bytes(path))["traceEvents"]
    ours = track_events(out)
    assert ours[0]["pid"] not in {e.get("pid") for e in original}
    assert len(traceap.load(out)) == len(t) + sum(e["ph"] == "X" for e in ours)


def test_cli_writes_both_reports(tmp_path):
    from typer.testing import CliRunner

    from traceap.cli import app

    html, ann = tmp_path / "r.html", tmp_path / "r.json.gz"
    res = CliRunner().invoke(app, ["analyze", str(SAMPLE), "--detector", "expert", "--quiet",
                                   "--html", str(html), "--annotate", str(ann)])
    assert res.exit_code == 0, res.output
    assert html.read_text(encoding="utf-8").count('class="wmark"') == 0  # drawn by the script
    assert 'id="timeline-0"' in html.read_text(encoding="utf-8")
    with gzip.open(ann) as fh:
        assert TRACK_NAME.encode() in fh.read()


def test_array_form_traces_are_annotated_too(tmp_path):
    # Chrome's other trace form: a bare event list (here: a real trace's events, re-wrapped).
    events = orjson.loads(read_bytes(DATA / "particle_transformer_bs8.json.gz"))["traceEvents"]
    src = tmp_path / "array_form.json"
    src.write_bytes(orjson.dumps(events))
    t = traceap.load(src)
    a = analyze(t, n_windows=20, detector="expert")
    out = write_annotated(a, t, tmp_path / "array_form.annotated.json")
    annotated = orjson.loads(out.read_bytes())
    assert isinstance(annotated, list) and annotated[:len(events)] == events
    ours = track_events(annotated)
    assert len(annotated) == len(events) + len(ours)
    assert len(traceap.load(out)) == len(t) + sum(e["ph"] == "X" for e in ours)


def test_a_job_gets_one_annotated_trace_per_rank(tmp_path):
    from traceap.job import analyze_job
    from traceap.load import load_job

    job = load_job(DATA / "dlrm_job")
    result = analyze_job(job, n_windows=50, detector="expert")
    folder = write_annotated(result, job, tmp_path / "annotated")
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["worker0.pt.trace.traceap.json.gz", "worker1.pt.trace.traceap.json.gz"]
    for t, name in zip(job.traces, files):
        again = traceap.load(folder / name)
        ours = track_events(folder / name)
        assert len(again) == len(t) + sum(e["ph"] == "X" for e in ours)
