"""The HTML report: self-contained, escaped, right numbers; drawn in a real headless Chromium.

The browser tests drive Debian's chromium over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: fds 3 and 4, NUL-separated JSON), so they need no websocket
library and no network.  They skip when no chromium is installed (``.ci/run`` installs it).
Set TRACEAP_SCREENSHOT=path.png to keep the screenshot the test takes.
"""

from __future__ import annotations

import base64
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import traceap
from traceap.analysis import analyze
from traceap.job import analyze_job
from traceap.load import load_job
from traceap.patterns import REGISTRY
from traceap.report.html import (DIGEST_NAME_CHARS, render_html, short_name, window_digests,
                                 write_html)
from traceap.trace import Kind
from traceap.windows import Windows

from .conftest import DATA, SAMPLE

EVIL = '</script><script>window.PWNED=1</script><b onclick="x">&amp;'


@pytest.fixture(scope="module")
def trace():
    """The README's sample: DLRM training with exposed all-reduces (findings to draw)."""
    return traceap.load(SAMPLE)


@pytest.fixture(scope="module")
def analysis(trace):
    return analyze(trace, n_windows=100, detector="expert")


@pytest.fixture(scope="module")
def job():
    return load_job(DATA / "dlrm_job")


@pytest.fixture(scope="module")
def job_analysis(job):
    return analyze_job(job, n_windows=100, detector="expert")


def evil_trace():
    """The sample trace with its busiest kernel renamed to markup that would run if unescaped."""
    t = traceap.load(SAMPLE)
    kernels = t.rows(Kind.KERNEL)
    code = int(np.bincount(t.name[kernels], weights=t.dur[kernels]).argmax())
    t.names = list(t.names)
    t.names[code] = EVIL
    return t, code


# -- the file ----------------------------------------------------------------------------------
def test_report_is_one_self_contained_file(tmp_path, trace, analysis):
    out = write_html(analysis, tmp_path / "report.html", trace=trace)
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", text)  # nothing fetched
    text_urls = text.replace('"http://www.w3.org/2000/svg"', "")  # a namespace name, not a fetch
    assert "http://" not in text_urls and "https://" not in text_urls
    assert len(text.encode()) < 400_000  # 100 windows of digests, a few cards
    assert text.count('class="timeline"') == 1
    assert f'data-windows="{analysis.n_windows}"' in text


def test_header_shows_gpu_steps_utilisation_and_time_lost(trace, analysis):
    text = render_html(analysis, trace)
    s = analysis.summary
    assert s["gpu_name"] in text
    assert f"{s['gpu_busy_fraction'] * 100:.0f}%" in text
    from traceap.units import fmt_us
    # "6 steady steps": the median steady step, the step time `traceap diff` compares.
    assert f">{fmt_us(s['step_time']['median_us'])} ({s['n_profiler_steps']} steady steps)<" in text
    assert "Time lost per pattern" in text
    # Where the idle time goes, above the timeline, in the terminal's and the JSON's numbers.
    assert text.index("Where the GPU's idle time goes") < text.index('class="timeline"')
    from traceap.units import fmt_us
    assert f"GPU idle <b>{fmt_us(analysis.idle.total_us)}</b>" in text
    for f in analysis.findings:
        assert REGISTRY[f.pattern].title.replace("<", "&lt;").replace(">", "&gt;") in text


def test_a_card_per_finding_with_evidence_events_and_fix_code(trace, analysis):
    assert analysis.findings, "the sample trace has findings (cpu_bound, nccl, memcpy)"
    text = render_html(analysis, trace)
    assert text.count('<div class="card"') == len(analysis.findings)
    for k, f in enumerate(analysis.findings):
        card = text[text.index(f'id="r0-f{k}"'):]
        card = card[:card.index('<div class="card"', 10) if '<div class="card"' in card[10:] else None]
        assert f.evidence.replace("<", "&lt;").replace(">", "&gt;")[:60] in card
        assert "Events that prove it" in card
        code = [ln.strip() for ln in f.fix.splitlines() if ln.startswith("    ")][0]
        assert "<pre><code>" in card and code.split("#")[0].strip()[:30].replace(
            "<", "&lt;").replace(">", "&gt;") in card


def test_memcpy_finding_lists_the_copies_in_its_windows(trace):
    from traceap.report.html import proof_events

    from .test_patterns import syncing_ddp
    # The sample's copies are device-to-device (no host copy finding): make them `.cpu()`s.
    trace = syncing_ddp(trace)
    analysis = analyze(trace, n_windows=100, detector="expert")
    f = next(f for f in analysis.findings if f.pattern == "excessive_memcpy")
    spans = [(analysis.windows[w].start_us, analysis.windows[w].end_us) for w in f.windows]
    caption, rows = proof_events(trace, f, spans)
    assert "syncs" in caption and rows
    assert all(r["kind"] in ("gpu_memcpy", "cuda_runtime") for r in rows)
    assert any("Synchronize" in r["name"] or "Memcpy" in r["name"] for r in rows)
    durs = [r["dur_us"] for r in rows]
    assert durs == sorted(durs, reverse=True)
    t0 = trace.span[0]
    for r in rows:  # every listed copy overlaps one of the finding's windows
        ts = t0 + r["t_ms"] * 1e3
        assert any(a - r["dur_us"] - 1e-3 <= ts < b + 1e-3 for a, b in spans)


def test_exposed_nccl_finding_lists_the_kernels_compute_does_not_hide(trace, analysis):
    from traceap.report.html import proof_events
    f = next(f for f in analysis.findings if f.pattern == "nccl_compute_no_overlap")
    spans = [(analysis.windows[w].start_us, analysis.windows[w].end_us) for w in f.windows]
    caption, rows = proof_events(trace, f, spans)
    assert rows and all(r["kind"] == "kernel" and r["name"].startswith("nccl") for r in rows)
    hidden = [float(re.search(r"(\d+)% hidden", r["detail"]).group(1)) / 100 for r in rows]
    exposed = [r["dur_us"] * (1 - h) for r, h in zip(rows, hidden)]
    # Most exposed first (the percentages are rounded: allow 1% of the longest kernel).
    slack = 0.01 * max(r["dur_us"] for r in rows)
    assert all(a >= b - slack for a, b in zip(exposed, exposed[1:]))


def test_window_digest_matches_a_direct_count(trace):
    windows = Windows(trace, 50)
    digests = window_digests(windows)
    assert len(digests) == 50
    w = int(np.argmax([d["nk"] for d in digests]))
    rows = windows.anchors(w)
    kernels = rows[trace.kind[rows] == Kind.KERNEL]
    assert digests[w]["nk"] == len(kernels)
    names, counts = np.unique(trace.name[kernels], return_counts=True)
    totals = {n: trace.dur[kernels][trace.name[kernels] == n].sum() for n in names}
    best = max(totals, key=totals.get)
    name, count, total = digests[w]["k"][0]
    assert name == short_name(trace.names[best], DIGEST_NAME_CHARS)
    assert count == counts[list(names).index(best)]
    assert total == pytest.approx(totals[best], abs=0.1)
    assert 0.0 <= digests[w]["busy"] <= 1.0
    assert digests[w]["ld"][0] <= digests[w]["ld"][1]  # median launch delay <= max


def test_trace_strings_are_escaped_everywhere(analysis):
    t, _ = evil_trace()
    text = render_html(analysis, t)
    assert "<script>window.PWNED" not in text and "<b onclick" not in text
    data = text[text.index('id="traceap-data"'):]
    data = data[data.index(">") + 1:data.index("</script>")]
    assert "\\u003c/script\\u003e\\u003cscript\\u003ewindow.PWNED" in data  # kept, as JSON escapes
    digests = json.loads(data)["ranks"][0]["digests"]
    assert EVIL in {k[0] for d in digests for k in d["k"]}  # decodes back to the exact name


def test_short_names_fold_templates_and_arguments():
    long = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
            "at::detail::Array<char*, 3>)")
    assert short_name(long) == "at::native::vectorized_elementwise_kernel<\u2026>(\u2026)"
    assert short_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD (Pageable -> Device)"


def test_job_report_has_a_ranks_view_and_a_section_per_rank(job, job_analysis, tmp_path):
    out = write_html(job_analysis, tmp_path / "job.html", trace=job)
    text = out.read_text(encoding="utf-8")
    n = len(job_analysis.ranks)
    assert n == 2
    assert "Across ranks" in text and text.count('class="rankstrip"') == n
    assert text.count('class="rank-section"') == n and text.count('class="timeline"') == n
    assert "Findings across ranks" in text
    for f in job_analysis.findings:
        assert f.title in text


def test_report_reads_the_trace_itself_and_says_when_it_cannot(analysis, tmp_path):
    from dataclasses import replace
    text = render_html(analysis)  # no trace given: read again from analysis.trace_path
    assert '"digests":[{' in text
    gone = replace(analysis, trace_path=str(tmp_path / "moved_away.json.gz"))
    text = render_html(gone)
    assert '"digests":null' in text and "trace file was not available" in text
    assert text.count('<div class="card"') == len(analysis.findings)


@pytest.mark.parametrize("path", sorted(DATA.glob("*.json.gz")), ids=lambda p: p.name)
def test_every_bundled_trace_gets_a_report(path):
    # AMD, 2021-era, CPU-only and backward-thread traces: all render, with a digest per window.
    t = traceap.load(path)
    a = analyze(t, n_windows=40, detector="expert")
    text = render_html(a, t)
    data = text[text.index('id="traceap-data"'):]
    data = json.loads(data[data.index(">") + 1:data.index("</script>")])
    rank = data["ranks"][0]
    assert rank["n"] == 40 and len(rank["digests"]) == 40 and len(rank["score"]) == 40
    assert sum(d["nk"] for d in rank["digests"]) == int((t.kind == Kind.KERNEL).sum())
    assert text.count('<div class="card"') == len(a.findings)


# -- in a real browser -------------------------------------------------------------------------
def chromium_binary() -> str | None:
    for name in (os.environ.get("TRACEAP_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


needs_chromium = pytest.mark.skipif(
    chromium_binary() is None,
    reason="no chromium on PATH (apt-get install -y chromium; .ci/run installs it as root)")


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe; one page."""

    def __init__(self, binary: str, width: int = 1280, height: int = 900):
        self.profile = tempfile.mkdtemp(prefix="traceap-chromium-")
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()

        def child_fds():  # the protocol pipe is fds 3 (commands in) and 4 (answers out)
            a, b = os.dup(to_child), os.dup(from_child)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-extensions", "--disable-dev-shm-usage", "--mute-audio",
             f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
             f"--window-size={width},{height}", "about:blank"],
            pass_fds=(3, 4, to_child, from_child), preexec_fn=child_fds,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.page(f"{domain}.enable")
        self.page("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def page(self, method: str, params: dict | None = None) -> dict:
        return self.send(method, params, session=self.session)

    def wait_for(self, method: str, timeout: float = 30.0) -> dict:
        for i, m in enumerate(self.events):
            if m.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("method") == method:
                return m
            self.events.append(m)

    def open(self, path: Path) -> None:
        self.page("Page.navigate", {"url": path.resolve().as_uri()})
        self.wait_for("Page.loadEventFired")

    def js(self, expression: str):
        res = self.page("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in res:
            raise AssertionError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def poll(self, expression: str, expected, timeout: float = 10.0) -> bool:
        """Wait until `expression` evaluates to `expected` (True), or give up (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.js(expression) == expected:
                return True
            time.sleep(0.05)
        return False

    def hover(self, selector: str) -> None:
        x, y = self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
                       "e.scrollIntoView({block: 'center'}); const b = e.getBoundingClientRect(); "
                       "return [b.x + b.width / 2, b.y + b.height / 2]; })()")
        self.page("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    def click(self, selector: str) -> None:
        self.hover(selector)
        x, y = self.js(f"(() => {{ const b = document.querySelector({json.dumps(selector)})"
                       ".getBoundingClientRect(); return [b.x + b.width / 2, b.y + b.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            self.page("Input.dispatchMouseEvent",
                      {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen so far."""
        while True:  # drain what is already there
            r, _, _ = select.select([self._in], [], [], 0.2)
            if not r:
                break
            try:
                self.events.append(self._read(time.monotonic() + 1.0))
            except TimeoutError:
                break
        out = []
        for m in self.events:
            p = m.get("params", {})
            if m.get("method") == "Runtime.exceptionThrown":
                out.append(str(p.get("exceptionDetails")))
            elif m.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(str(p.get("args")))
            elif m.get("method") == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def screenshot(self, path: Path, height: int = 1400) -> Path:
        png = self.page("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1}})
        path.write_bytes(base64.b64decode(png["data"]))
        return path

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            r, _, _ = select.select([self._in], [], [], left)
            if r:
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe (did it start?)")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._out)
        os.close(self._in)
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium)")
    b = Browser(binary)
    yield b
    b.close()


@needs_chromium
def test_browser_draws_the_timeline_without_errors(browser, analysis, tmp_path):
    t, evil_code = evil_trace()
    out = write_html(analysis, tmp_path / "report.html", trace=t)
    browser.open(out)
    n = analysis.n_windows
    assert browser.errors() == []
    assert browser.js("document.querySelectorAll('#timeline-0 svg .wmark').length") == n
    assert browser.js("document.getElementById('timeline-0').dataset.drawn") == str(n)
    flagged = [w.index for w in analysis.windows if w.flagged]
    assert browser.js("document.querySelectorAll('#timeline-0 .wmark.flag').length") == len(flagged)
    # Flagged bars carry their pattern's colour, the others grey.
    w = analysis.windows[flagged[0]]
    from traceap.report.colors import pattern_colors
    fill = browser.js(f"document.querySelectorAll('#timeline-0 .wbar')[{w.index}].getAttribute('fill')")
    assert fill == pattern_colors()[w.pattern]
    # Hover: the tooltip names the window's kernels; the markup in a name stays text.
    rows = Windows(t, n).anchors
    evil_w = next(i for i in range(n) if (t.name[rows(i)] == evil_code).any())
    browser.hover(f"#timeline-0 .wmark[data-w='{evil_w}']")
    tip = browser.js("document.querySelector('#timeline-0 .tip').textContent")
    assert browser.js("document.querySelector('#timeline-0 .tip').style.display") == "block"
    assert tip.startswith(f"Window {evil_w}") and "Top kernels" in tip and EVIL in tip
    assert browser.js("typeof window.PWNED") == "undefined"
    # Click a flagged window: its finding card is brought into view and flashes.
    k = next(i for i, f in enumerate(analysis.findings) if flagged[0] in f.windows)
    browser.click(f"#timeline-0 .wmark[data-w='{flagged[0]}']")
    assert browser.js(f"document.getElementById('r0-f{k}').classList.contains('flash')")
    # ... and back: a card's button outlines its finding's windows on the timeline.
    browser.click(f"#r0-f{k} button.show")
    assert browser.js("document.querySelectorAll('#timeline-0 .sel').length") == len(
        analysis.findings[k].windows)
    browser.click(f"#r0-f{k} .fix button.copy")
    # The clipboard answers asynchronously.
    assert browser.poll(f"document.querySelector('#r0-f{k} .fix button.copy').textContent",
                        "copied")
    # The idle bar above the timeline: a cause's part opens the finding its time belongs to.
    browser.js("document.querySelectorAll('.card.flash').forEach(c => c.classList.remove('flash'))")
    part = "a.idle-part[data-cause='communication']"
    card = browser.js(f"document.querySelector(\"{part}\").getAttribute('href')")[1:]
    assert card == f"r0-f{[f.pattern for f in analysis.findings].index('nccl_compute_no_overlap')}"
    browser.click(part)
    assert browser.js(f"document.getElementById('{card}').classList.contains('flash')")
    width = browser.js(f"document.querySelector(\"{part}\").getBoundingClientRect().width")
    bar = browser.js("document.querySelector('.idle-bar').getBoundingClientRect().width")
    acc = analysis.idle
    assert width / bar == pytest.approx(acc.by_cause["communication"] / acc.span_us, abs=0.01)
    assert browser.errors() == []


@needs_chromium
def test_browser_job_view_and_screenshot(browser, analysis, trace, job, job_analysis, tmp_path):
    out = write_html(job_analysis, tmp_path / "job.html", trace=job)
    browser.open(out)
    assert browser.errors() == []
    n = job_analysis.ranks[0].n_windows
    assert browser.js("document.querySelectorAll('.rankstrip .rcell').length") == 2 * n
    assert browser.js("document.querySelectorAll('#timeline-0 .wmark').length") == n
    assert browser.js("document.querySelectorAll('#timeline-1 .wmark').length") == 0  # hidden tab
    browser.click(".tabs button[data-rank='1']")
    assert browser.js("document.querySelectorAll('#timeline-1 .wmark').length") == n
    assert browser.js("document.querySelector(\".rank-section[data-rank='0']\").hidden") is True
    assert browser.errors() == []

    # The screenshot for people: the single-trace report with a window hovered.
    single = write_html(analysis, tmp_path / "report.html", trace=trace)
    browser.open(single)
    flagged = [w.index for w in analysis.windows if w.flagged]
    browser.hover(f"#timeline-0 .wmark[data-w='{flagged[len(flagged) // 3]}']")
    shot = browser.screenshot(tmp_path / "report.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    keep = os.environ.get("TRACEAP_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
    assert browser.errors() == []
