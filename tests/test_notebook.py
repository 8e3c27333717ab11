"""Notebooks: `traceap.analyze(path)` shows as the HTML report inline (summary, idle and
time-lost bars, timeline, findings; self-contained), for a trace and for a job, and the
example notebook runs (issue #36, item 2)."""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest

import traceap

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "dlrm_a100_rank3.json.gz"
JOB = ROOT / "tests" / "data" / "dlrm_job"


def _page(cell_html: str) -> str:
    """The report page inside the notebook frame."""
    m = re.fullmatch(r'<iframe class="traceap-report" srcdoc="([^"]*)" .*</iframe>', cell_html,
                     re.DOTALL)
    assert m, cell_html[:200]
    return html.unescape(m.group(1))


def _self_contained(page: str) -> None:
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page), "an outside resource"
    assert "https://" not in page.split('<script id="traceap-data"')[0]


def test_an_analysis_shows_the_report_naming_its_findings():
    analysis = traceap.analyze(SAMPLE)
    assert isinstance(analysis, traceap.analysis.Analysis)
    page = _page(analysis._repr_html_())
    assert len(analysis.findings) >= 2
    for f in analysis.findings:
        assert html.escape(f.title) in page, f.title
    # the summary tiles, the idle and time-lost bars, the timeline, the findings
    for part in ("GPU busy", "Where the GPU's idle time goes", "Time lost per pattern",
                 "Window scores over the trace", f"Findings ({len(analysis.findings)})"):
        assert part in page, part
    assert analysis.trace_details is not None     # computed at load: showing reads no trace
    _self_contained(page)


def test_a_job_shows_its_ranks_and_cross_rank_findings():
    job = traceap.analyze(JOB)
    assert isinstance(job, traceap.job.JobAnalysis)
    page = _page(job._repr_html_())
    assert "Findings across ranks" in page and "Across ranks" in page
    assert job.findings and all(html.escape(f.title) in page for f in job.findings)
    _self_contained(page)


def test_the_example_notebook_runs_and_shows_the_report(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(ROOT / "examples" / "notebook.ipynb", as_version=4)
    # the kernel imports this tree's traceap
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT / "src")] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "examples")}}).execute()
    shown = nb.cells[1].outputs[0]["data"]
    expected = traceap.analyze(SAMPLE)
    page = _page(shown["text/html"])
    assert all(html.escape(f.title) in page for f in expected.findings)
    printed = "".join(o.get("text", "") for o in nb.cells[3].outputs)
    assert printed.splitlines()[0].startswith(f"1. {expected.findings[0].title}: ")
