"""A self-contained HTML report: header, where the GPU's idle time goes (a stacked bar whose parts
link to their findings), window-score timeline (Figure 7, interactive), findings.

One file, no network: the CSS and the small drawing script (``traceap/data/report``) are inlined,
the data the script draws sits in a JSON block.  Trace-derived strings are escaped on the way
in (``html.escape`` for markup, ``<``/``>``/``&`` as JSON escapes inside the data block) and the
script only ever writes them through ``textContent``.

Per-window digests for the hover (top kernels, top CPU ops, launch delays) and the events that
prove each finding are computed here from the trace, with numpy per window, never per event.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import orjson

from .. import idle as idle_mod
from ..findings import cost_sentence, finding_order
from ..measures.signals import busy_per_window, outer_cpu_ops
from ..patterns.proof import Proof, longest_gpu_events, merge_spans
from ..trace import Kind, Trace
from ..units import fmt_us, plural
from ..windows import Windows
from .colors import BUSY_COLOR, cause_colors, pattern_colors

UNKNOWN_COLOR = "#7b3294"
TOP = 3  # kernels / CPU ops per window in the hover
PROOF_ROWS = 8  # events listed under each finding
DIGEST_NAME_CHARS = 64  # names in the hover are folded to this length
NOTEBOOK_HEIGHT_PX = 720  # the notebook frame: the header, bars and timeline; findings scroll


# -- public API --------------------------------------------------------------------------------
def write_html(analysis, path: str | os.PathLike, trace=None) -> Path:
    """Write the report of an `Analysis` (or of a job's analyses) to `path`; returns the path.

    `trace` (a `Trace`, a `Job` or a list of traces, one per rank) feeds the hover digests and
    the proving events; when omitted, a rank's `TraceDetails` computed where it was analysed
    (``analysis.trace_details``) are used, else its trace is read again from
    ``analysis.trace_path``, one rank at a time.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(analysis, trace), encoding="utf-8")
    return out


def render_html(analysis, trace=None) -> str:
    """The report as one HTML string (see `write_html`)."""
    ranks, cross, job_path = _ranks_of(analysis, trace)
    sections = [_RankView.build(r, k) for k, r in enumerate(ranks)]
    # Sorted: the same report byte for byte from one run to the next (and across workers).
    titles = {p: pattern_title(p) for p in sorted(_all_patterns(sections, cross))}
    data = {"colors": pattern_colors(), "titles": titles,
            "ranks": [s.data for s in sections]}
    is_job = len(sections) > 1 or job_path is not None
    title = Path(job_path or ranks[0].analysis.trace_path or "trace").name
    body = [f"<h1>traceap report: {_e(title)}</h1>",
            f'<p class="sub">{_e(job_path or ranks[0].analysis.trace_path)}</p>']
    if is_job:
        body.append(_job_header(sections, cross))
        body.append(_ranks_view(sections))
        body.append("<h2>Findings across ranks</h2>")
        body.append(_cards(cross, "job", None) if cross else
                    '<p class="none">No cross-rank finding.</p>')
        job_notes = [] if isinstance(analysis, (list, tuple)) else getattr(analysis, "notes", [])
        if job_notes:
            body.append('<ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in job_notes)
                        + "</ul>")
        body.append('<h2>Ranks</h2><div class="tabs">' + "".join(
            f'<button data-rank="{k}">{_e(s.label)}</button>' for k, s in enumerate(sections))
            + "</div>")
    for k, s in enumerate(sections):
        body.append(f'<section class="rank-section" data-rank="{k}">')
        if is_job:
            body.append(f"<h2>{_e(s.label)}</h2>")
        body.append(s.header())
        body.append(s.timeline(k))
        body.append(f"<h2>Findings ({len(s.findings)})</h2>")
        body.append(s.cards() if s.findings else
                    '<p class="none">No anti-pattern found in this trace.</p>')
        if s.notes:
            body.append('<ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in s.notes)
                        + "</ul>")
        body.append("</section>")
    values = {"TITLE": _e(f"traceap: {title}"), "CSS": _asset("report.css"),
              "BODY": "\n".join(body), "DATA": _json_for_script(data), "JS": _asset("report.js")}
    # One pass over the template: text put in is never scanned for markers again.
    return re.sub(r"@([A-Z]+)@", lambda m: values[m.group(1)], _PAGE)


def notebook_html(analysis, trace=None, height_px: int = NOTEBOOK_HEIGHT_PX) -> str:
    """The report (`render_html`) for a notebook cell: the whole page in an ``<iframe srcdoc>``.

    The frame keeps the report's CSS and ids from touching the notebook's page and lets two
    reports sit in one notebook; its drawing script runs inside the frame, and everything is
    inline, so it shows the same offline and in a saved notebook.  (No ``sandbox``: Chromium
    then drew an empty frame; the script writes trace text only through ``textContent``.)"""
    page = render_html(analysis, trace)
    return (f'<iframe class="traceap-report" srcdoc="{_e(page)}" title="traceap report" '
            f'style="width:100%;height:{int(height_px)}px;border:1px solid #ddd;resize:vertical">'
            f'</iframe>')


def pattern_title(pattern: str | None) -> str:
    """The human name of a pattern id (from the pattern registry)."""
    if not pattern:
        return "unclassified anomaly"
    try:
        from ..patterns import REGISTRY
        return REGISTRY[pattern].title
    except (ImportError, KeyError, AttributeError):
        return pattern.replace("_", " ")


# -- per-window digests (the hover) ------------------------------------------------------------
def window_digests(windows: Windows, top: int = TOP) -> list[dict]:
    """Per window: top kernels, top CPU ops, launch delays, memcpy and NCCL counts, GPU busy.

    Kernels and memcpys are the window's anchors (they start in it); CPU ops are the outermost
    ones, with their time clipped to the window.
    """
    t = windows.trace
    # Busy and idle as `traceap.idle` defines them (the numbers of every other report).
    busy = busy_per_window(windows) / windows.width_us
    causes = idle_mod.cause_per_window(windows)
    outer = outer_cpu_ops(t)
    o_ts, o_end = t.ts[outer], t.end[outer]
    longest = float(t.dur[outer].max()) if len(outer) else 0.0
    short = _short_names(t)
    out = []
    for w in range(windows.n):
        a, b = windows.edges[w], windows.edges[w + 1]
        rows = windows.anchors(w)
        kinds = t.kind[rows]
        kernels = rows[kinds == Kind.KERNEL]
        memcpy = rows[kinds == Kind.GPU_MEMCPY]
        d = {"busy": round(float(busy[w]), 3), "nk": int(len(kernels)), "k": [], "o": [],
             "ld": None, "mc": None, "nc": int(t.is_nccl[kernels].sum()) if len(kernels) else 0,
             "ic": [[c, round(float(v[w]), 1)] for c, v in
                    sorted(causes.items(), key=lambda cv: -cv[1][w]) if v[w] > 0][:3]}
        if len(kernels):
            d["k"] = _top_by_name(t.name[kernels], t.dur[kernels], top, short)
            delay = t.launch_delay[kernels]
            ok = np.isfinite(delay)
            if ok.any():
                j = int(np.argmax(np.where(ok, delay, -np.inf)))
                d["ld"] = [round(float(np.median(delay[ok])), 1), round(float(delay[j]), 1),
                           short[t.name[kernels[j]]]]
        if len(memcpy):
            d["mc"] = [int(len(memcpy)), round(float(np.nansum(t.bytes[memcpy])) / 1e6, 2)]
        lo = np.searchsorted(o_ts, a - longest, side="left")
        hi = np.searchsorted(o_ts, b, side="left")
        cand = np.arange(lo, hi)
        cand = cand[o_end[cand] > a]
        if len(cand):
            clipped = np.minimum(o_end[cand], b) - np.maximum(o_ts[cand], a)
            d["o"] = _top_by_name(t.name[outer[cand]], clipped, top, short)
        out.append(d)
    return out


def _top_by_name(codes: np.ndarray, values: np.ndarray, top: int, short: list[str]) -> list:
    uniq, inv = np.unique(codes, return_inverse=True)
    total = np.bincount(inv, weights=values)
    count = np.bincount(inv)
    best = np.argsort(-total, kind="stable")[:top]
    return [[short[int(uniq[i])], int(count[i]), round(float(total[i]), 1)] for i in best]


_TEMPLATE_RE = re.compile(r"<[^<>]*>")
_FOLDED = "\x00"  # a folded template, bracket-free so that the enclosing one folds next


def short_name(name: str, limit: int = 90) -> str:
    """A readable kernel name: parameter list, then C++ template arguments folded until it fits."""
    if len(name) <= limit or name.startswith(("Memcpy", "Memset")):
        return name if len(name) <= limit else name[:limit - 1] + "\u2026"
    s = name[5:] if name.startswith("void ") else name
    s = s.replace("(anonymous namespace)", "{anon}")  # a scope, not a parameter list
    depth = 0
    for i, ch in enumerate(s):  # the parameter list starts at the first "(" outside templates
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0 and i > 0:
            s = s[:i] + "(\u2026)"
            break
    for _ in range(8):  # nested templates: fold the innermost first, while still too long
        if len(s.replace(_FOLDED, "<\u2026>")) <= limit:
            break
        folded = _TEMPLATE_RE.sub(_FOLDED, s)
        if folded == s:
            break
        s = folded
    s = s.replace(_FOLDED, "<\u2026>")
    return s if len(s) <= limit else s[:limit - 1] + "\u2026"


def _short_names(t: Trace) -> list[str]:
    return [short_name(n, DIGEST_NAME_CHARS) for n in t.names]


# -- the events that prove a finding -----------------------------------------------------------
def proof_events(trace: Trace, finding, spans: Sequence[tuple[float, float]] | None = None,
                 limit: int = PROOF_ROWS) -> Proof:
    """The events in a finding's windows that show its pattern, most telling first.

    `spans` are the (start, end) of the finding's windows (default: its whole time range).
    Returns a caption (what the rows are) and rows with ``t_ms`` (from the trace start),
    ``dur_us``, ``kind``, ``name``, ``where`` (stream or thread) and ``detail``: the pattern's
    own choice (`AntiPattern.proof_events`), the longest GPU events for any other finding.
    """
    from ..patterns import REGISTRY
    runs = merge_spans(spans or [(float(finding.start_us), float(finding.end_us))])
    rule = REGISTRY.get(finding.pattern)
    if rule is None:  # a cross-rank finding (straggler, imbalance) or an unknown id
        return longest_gpu_events(trace, runs, limit)
    return rule.proof_events(trace, runs, limit)


# -- what a rank's trace gives the report --------------------------------------------------------
@dataclass
class TraceDetails:
    """What the report needs from one rank's trace: hover digests, profiler steps and the events
    that prove each finding.  Small and picklable, so a worker that has the trace loaded can
    compute it (`traceap analyze DIR --workers N --html`) and no rank is read twice."""

    t0: float                  # the trace's first timestamp (finding times are shown from it)
    digests: list[dict]
    steps: list[list]          # [start_ms, end_ms, number] from the first window's start
    #: (caption, rows) per finding of the analysis, in its order.
    proofs: list[tuple[str, list[dict]]]


def trace_details(analysis, trace: Trace) -> TraceDetails:
    """The parts of `analysis`'s report that need its trace (see `TraceDetails`)."""
    ws = list(analysis.windows)
    n = len(ws)
    t0 = float(ws[0].start_us) if ws else 0.0
    span = (float(ws[-1].end_us) - t0) if ws else 1.0
    digests: list[dict] = []
    steps: list[list] = []
    if n:
        digests = window_digests(Windows(trace, n, start_us=t0, end_us=t0 + span))
        steps = [[(s.start_us - t0) / 1e3, (s.end_us - t0) / 1e3, s.number]
                 for s in trace.steps if s.end_us > t0 and s.start_us < t0 + span]
    bounds = [(float(w.start_us), float(w.end_us)) for w in ws]
    proofs = []
    for f in analysis.findings:
        spans = [bounds[int(w)] for w in f.windows if 0 <= int(w) < len(bounds)]
        proofs.append(proof_events(trace, f, spans or None))
    return TraceDetails(float(trace.span[0]), digests, steps, proofs)


# -- turning inputs into per-rank views --------------------------------------------------------
@dataclass
class _Rank:
    label: str
    analysis: object
    #: A `Trace`, its `TraceDetails`, or None (then read from the analysis' trace_path when
    #: its view is built: one trace in memory at a time).
    source: object


def _ranks_of(analysis, trace) -> tuple[list[_Rank], list, str | None]:
    """(per-rank views, cross-rank findings, job path or None) for one analysis or a job."""
    per_rank = None
    cross: list = []
    job_path = None
    if isinstance(analysis, (list, tuple)):
        per_rank = list(analysis)
    else:
        for attr in ("ranks", "analyses", "per_rank"):
            if isinstance(getattr(analysis, attr, None), (list, tuple)):
                per_rank = list(getattr(analysis, attr))
                cross = list(getattr(analysis, "findings", None) or
                             getattr(analysis, "cross_rank", None) or [])
                job_path = str(getattr(analysis, "path", None) or
                               getattr(analysis, "job_path", None) or "") or None
                break
    if per_rank is None:
        return [_Rank(_rank_label(analysis, 0), analysis, _source_for(analysis, trace, 0))], [], None
    if not per_rank:
        raise ValueError("a job report needs at least one rank analysis")
    return ([_Rank(_rank_label(a, i), a, _source_for(a, trace, i)) for i, a in enumerate(per_rank)],
            cross, job_path)


def _rank_label(analysis, i: int) -> str:
    rank = (getattr(analysis, "summary", None) or {}).get("rank")
    return f"rank {rank if rank is not None else i}"


def _source_for(analysis, trace, i: int):
    if isinstance(trace, (Trace, TraceDetails)):
        return trace
    if trace is not None:
        traces = list(getattr(trace, "traces", trace))
        if i < len(traces) and traces[i] is not None:
            return traces[i]
    return getattr(analysis, "trace_details", None)


def _details_for(r: _Rank) -> TraceDetails | None:
    """The rank's trace details: given, computed from a given trace, or from its file."""
    if isinstance(r.source, TraceDetails):
        return r.source
    trace = r.source if isinstance(r.source, Trace) else None
    if trace is None:
        path = getattr(r.analysis, "trace_path", None)
        if not (path and Path(path).is_file()):
            return None
        from ..load import load
        trace = load(path)
    return trace_details(r.analysis, trace)


@dataclass
class _RankView:
    label: str
    analysis: object
    details: TraceDetails | None
    findings: list
    data: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    #: (start_us, end_us) of every window, by index.
    bounds: list = field(default_factory=list)
    #: Position among the report's ranks.
    index: int = 0

    @classmethod
    def build(cls, r: _Rank, k: int) -> _RankView:
        a = r.analysis
        ws = list(a.windows)
        findings = list(a.findings)
        details = _details_for(r)
        view = cls(r.label, a, details, findings, notes=list(getattr(a, "notes", None) or []),
                   bounds=[(float(w.start_us), float(w.end_us)) for w in ws], index=k)
        t0 = float(ws[0].start_us) if ws else 0.0
        span = (float(ws[-1].end_us) - t0) if ws else 1.0
        n = len(ws)
        finding_of = [-1] * n
        for j, f in enumerate(findings):
            for w in f.windows:
                if 0 <= int(w) < n and finding_of[int(w)] < 0:
                    finding_of[int(w)] = j
        data = {"id": f"r{k}", "label": r.label, "n": n,
                "span_ms": span / 1e3 or 1e-3, "width_ms": span / max(n, 1) / 1e3,
                "score": [round(float(w.score), 4) for w in ws],
                "flagged": [1 if w.flagged else 0 for w in ws],
                "pattern": [w.pattern if w.flagged else None for w in ws],
                "conf": [None if w.confidence is None else round(float(w.confidence), 3)
                         for w in ws],
                "pscores": {p: [round(float(v), 4) for v in s]
                            for p, s in (getattr(a, "pattern_scores", None) or {}).items()
                            if len(s) == n and p in {w.pattern for w in ws if w.flagged}},
                "threshold": _threshold(a), "finding_of": finding_of,
                "steps": [], "busy": None, "digests": None}
        if details is not None and n:
            data["digests"] = details.digests
            data["busy"] = [d["busy"] for d in details.digests]
            data["steps"] = details.steps
        else:
            view.notes.append("The trace file was not available: hover details and the events "
                              "behind each finding are missing.")
        view.data = data
        return view

    # -- markup ------------------------------------------------------------------------------
    @property
    def summary(self) -> dict:
        return getattr(self.analysis, "summary", None) or {}

    def time_lost(self) -> dict[str, float]:
        lost: dict[str, float] = {}
        for f in self.findings:
            lost[f.pattern] = lost.get(f.pattern, 0.0) + float(getattr(f, "time_lost_us", 0.0) or 0.0)
        return dict(sorted(lost.items(), key=lambda kv: -kv[1]))

    def header(self) -> str:
        s = self.summary
        steps = s.get("steps") or []
        st = s.get("step_time") or {}
        busy = idle_mod.busy_pct(s.get("gpu_busy_fraction"))
        dur = s.get("duration_us")
        if dur is None and s.get("span_us"):
            dur = s["span_us"][1] - s["span_us"][0]
        lost = self.time_lost()
        tiles = [("GPU", s.get("gpu_name") or "unknown", False),
                 ("Duration", fmt_us(dur) if dur else "-", False),
                 ("Profiler steps", f"{len(steps) or s.get('n_profiler_steps', 0)}", False),
                 ("Step time (median)", _step_time(st), False),
                 ("Data loading", _loader(st), False),
                 ("GPU busy", f"{busy}%" if busy is not None else "-",
                  busy is not None and busy < 50),
                 ("Kernels", f"{s.get('n_kernels', 0):,}", False),
                 ("Flagged windows", f"{sum(self.data['flagged'])} / {self.data['n']}", False),
                 ("GPU idle", self.idle_tile(), False),
                 ("Time lost", fmt_us(sum(lost.values())) if lost else "none found", bool(lost))]
        if s.get("world_size"):
            tiles.insert(1, ("Rank", f"{s.get('rank')} of {s.get('world_size')}", False))
        det = getattr(self.analysis, "detector", None)
        if det:
            tiles.append(("Detector", str(det), False))
        out = ['<div class="tiles">'] + [
            f'<div class="tile{" bad" if bad else ""}"><div class="k">{_e(k)}</div>'
            f'<div class="v">{_e(v)}</div></div>' for k, v, bad in tiles] + ["</div>"]
        out.append(self.idle_bar())  # where the idle time goes, first
        out.append(_inefficient_panel(getattr(self.analysis, "inefficient", None),
                                      self.findings, self.data["id"]))
        if lost:
            out.append(_lost_bars(lost, self.titles()))
        return "".join(out)

    def titles(self) -> dict[str, str]:
        """The findings' own titles by pattern (a title says which form the evidence shows)."""
        return {f.pattern: getattr(f, "title", None) or pattern_title(f.pattern)
                for f in self.findings}

    def idle_tile(self) -> str:
        acc = getattr(self.analysis, "idle", None)
        if acc is None or acc.span_us <= 0:
            return "-"
        return f"{fmt_us(acc.total_us)} ({acc.idle_pct}%)"

    def idle_bar(self) -> str:
        """Where the GPU's idle time goes: busy + one part per cause, each linked to its finding."""
        acc = getattr(self.analysis, "idle", None)
        if acc is None or acc.span_us <= 0:
            return ""
        return _idle_bar(acc, self.findings, self.data["id"])

    def timeline(self, k: int) -> str:
        return ('<h2>Window scores over the trace</h2><div class="panel">'
                f'<div class="timeline" id="timeline-{k}" data-rank="{k}" '
                f'data-windows="{self.data["n"]}"></div><div class="legend"></div>'
                '<p class="notes">Bars: each window\'s anomaly score; coloured when flagged, by '
                'pattern. Hover a window for its top kernels, CPU ops and launch delays; click a '
                'flagged one to jump to its finding.</p></div>')

    def cards(self) -> str:
        return _cards(self.findings, self.data["id"], self.details, self.index)


def _step_time(st: dict) -> str:
    """The median steady step (`traceap.info.step_numbers`): what `traceap diff` compares."""
    if not st.get("median_us"):
        return "- (no profiler steps)"
    return f"{fmt_us(st['median_us'])} ({plural(st['n_steps'], 'steady step')})"


def _loader(st: dict) -> str:
    """Host time in DataLoader.__next__ per step, and its share of the step."""
    if not st.get("loader_calls"):
        return "no DataLoader calls"
    per, step = st.get("dataloader_us_per_step"), st.get("median_us")
    if per is None or not step:
        return f"{plural(st['loader_calls'], 'DataLoader call')} (no profiler steps)"
    return f"{fmt_us(per)} per step ({100 * per / step:.0f}% of the step, on the host)"


def _threshold(a) -> float | None:
    for attr in ("threshold",):
        v = getattr(a, attr, None)
        if isinstance(v, (int, float)) and np.isfinite(v):
            return float(v)
    return None


def _all_patterns(sections: Sequence[_RankView], cross: list) -> set[str]:
    out = set(pattern_colors())
    for s in sections:
        out |= {p for p in s.data["pattern"] if p}
        out |= {f.pattern for f in s.findings}
    out |= {f.pattern for f in cross}
    return out


def _lost_bars(lost: dict[str, float], titles: dict[str, str] | None = None) -> str:
    most = max(lost.values()) or 1.0
    rows = ['<div class="lost"><div class="k" style="color:var(--muted);font-size:12px;'
            'text-transform:uppercase">Time lost per pattern</div>']
    for p, us in lost.items():
        rows.append(f'<div class="lost-row"><div><span class="swatch" style="background:'
                    f'{_color(p)}"></span>{_e((titles or {}).get(p) or pattern_title(p))}</div><div><div class="lost-bar" '
                    f'style="width:{100 * us / most:.1f}%;background:{_color(p)}"></div></div>'
                    f'<div class="n">{_e(fmt_us(us))}</div></div>')
    rows.append("</div>")
    return "".join(rows)


def _idle_bar(acc, findings: list, prefix: str) -> str:
    """The stacked bar: the GPU span as busy time and idle time by cause; a cause's part links to
    the finding its time belongs to (the largest one of that cause's patterns)."""
    cause_of = {idle_mod.pattern_of(m.id): m.cause for m in idle_mod.MECHANISMS
                if idle_mod.pattern_of(m.id)}
    target: dict[str, tuple[float, int]] = {}
    for k, f in enumerate(findings):
        c = cause_of.get(f.pattern)
        if c and float(f.time_lost_us) > target.get(c, (-1.0, -1))[0]:
            target[c] = (float(f.time_lost_us), k)
    span, tot = acc.span_us, acc.total_us
    parts = [("busy", span - tot)] + [(c, v) for c, v in acc.by_cause.items()]
    bar, legend = [], []
    for cause, us in parts:
        if us <= 0:
            continue
        color = BUSY_COLOR if cause == "busy" else cause_colors()[cause]
        name = "GPU busy" if cause == "busy" else idle_mod.CAUSE_TITLES[cause]
        share = (f"{acc.busy_pct}% of the GPU span" if cause == "busy" else
                 f"{100 * us / max(tot, 1e-9):.1f}% of the idle time")
        tip = f"{name}: {fmt_us(us)} ({share})"
        link = target.get(cause)
        if link is not None:
            tip += " — click for its finding"
            attrs = f'href="#{_e(prefix)}-f{link[1]}" class="idle-part link"'
        else:
            attrs = 'class="idle-part"'
        bar.append(f'<a {attrs} data-cause="{_e(cause)}" title="{_e(tip)}" style="width:'
                   f'{100 * us / span:.3f}%;background:{color}"></a>')
        legend.append(f'<span><span class="swatch" style="background:{color}"></span>'
                      f'{_e(name)} <b>{_e(fmt_us(us))}</b></span>')
    unexplained = acc.by_cause["not_explained"]
    plain = (f"{fmt_us(unexplained)} of the idle time ({100 * unexplained / max(tot, 1e-9):.0f}%) "
             f"is not explained by any cause." if unexplained > 0 else
             "Every idle microsecond has a cause.")
    return ('<h2>Where the GPU\'s idle time goes</h2><div class="panel idle">'
            f'<div class="idle-head">GPU idle <b>{_e(fmt_us(tot))}</b> of {_e(fmt_us(span))} '
            f'({acc.idle_pct}% of the GPU span, {_e(plural(len(acc.steady_steps), "steady step"))}'
            f'). {_e(plain)}</div>'
            f'<div class="idle-bar">{"".join(bar)}</div><div class="legend">{"".join(legend)}</div>'
            '<p class="notes">Idle: no compute kernel, memset or on-device copy running. Each '
            'idle microsecond is counted once, in the first cause that covers it (warm-up, '
            'communication, compile gaps, copies and syncs, data loading, launch-bound host). '
            'Click a part to open its finding.</p></div>')


def _inefficient_panel(acc, findings: list, prefix: str) -> str:
    """The busy side of the account: the part of the GPU busy time the busy-but-slow patterns
    cost, one part per pattern in its colour, linked to its finding ('' when none costs any)."""
    said = acc.describe() if acc is not None else None
    if not said:
        return ""
    card = {f.pattern: k for k, f in enumerate(findings)}
    legend = []
    for pid, us in sorted(acc.by_pattern.items(), key=lambda kv: -kv[1]):
        if us <= 0:
            continue
        name = _e(acc.titles.get(pid, pid))
        if pid in card:
            name = f'<a href="#{_e(prefix)}-f{card[pid]}">{name}</a>'
        legend.append(f'<span><span class="swatch" style="background:'
                      f'{pattern_colors().get(pid, BUSY_COLOR)}"></span>{name} '
                      f'<b>{_e(fmt_us(us))}</b></span>')
    return ('<h2>GPU time spent inefficiently</h2><div class="panel inefficient">'
            f'<div class="idle-head">{_e(said)}.</div><div class="legend">{"".join(legend)}'
            '</div><p class="notes">Part of the busy time, not beside it: the GPU was running '
            'kernels, but slower ones than it has (no tensor cores, layout transposes, '
            'per-parameter kernels). Each part is its pattern\'s own measured estimate (its '
            'finding says how); GPU busy and idle still add up to the GPU span.</p></div>')


def _cards(findings: list, prefix: str, details: TraceDetails | None,
           rank_index: int | None = None) -> str:
    order = sorted(range(len(findings)), key=lambda k: finding_order(findings[k]))
    parts = ['<div class="cards">']
    t0 = details.t0 if details is not None else None
    for k in order:
        f = findings[k]
        c = _color(f.pattern)
        sev = str(getattr(f, "severity", "") or "")
        wins = list(f.windows)
        if not wins:  # a cross-rank finding: about one rank of the job, or all of them
            rank = getattr(f, "rank", None)
            where = f"rank {rank}" if rank is not None else "every rank"
        elif t0 is not None:
            where = f"{fmt_us(float(f.start_us) - t0)} \u2013 {fmt_us(float(f.end_us) - t0)} from the start"
        else:
            where = f"{fmt_us(float(f.end_us) - float(f.start_us))} long"
        badge = f'<span class="badge {_e(sev.lower())}">{_e(sev)}</span>' if sev else ""
        meta = [where] + ([f"windows {_ranges(wins)}"] if wins else []) + [cost_sentence(f)]
        show = (f'<button class="show" data-rank="{rank_index}" data-windows="'
                f'{_e(orjson.dumps(sorted(int(w) for w in wins)).decode())}">'
                'show on the timeline</button>' if wins and rank_index is not None else "")
        parts.append(f'<div class="card" id="{_e(prefix)}-f{k}" style="border-left-color:{c}">'
                     f'<h3><span class="swatch" style="background:{c}"></span>'
                     f'{_e(getattr(f, "title", None) or pattern_title(f.pattern))}{badge}</h3>'
                     f'<div class="meta">{_e(" · ".join(meta))}{show}</div>')
        parts.append(f'<div class="evidence">{_e(f.evidence)}</div>')
        expl = getattr(f, "explanation", "") or ""
        if expl:
            parts.append(f'<div class="evidence">{_e(expl)}</div>')
        if details is not None and k < len(details.proofs):
            parts.append(_proof_table(*details.proofs[k]))
        parts.append(f'<div class="fix"><b>How to fix it</b>{_format_fix(f.fix)}</div></div>')
    parts.append("</div>")
    return "".join(parts)


def _proof_table(caption: str, rows: list[dict]) -> str:
    if not rows:
        return (f'<details><summary>Events that prove it</summary><p class="none">'
                f'{_e(caption)}: none in this range.</p></details>')
    body = "".join(
        f'<tr><td class="n">{r["t_ms"]:.3f}</td><td class="n">{_e(fmt_us(r["dur_us"]))}</td>'
        f'<td>{_e(r["kind"])}</td><td>{_e(r["where"])}</td>'
        f'<td><code title="{_e(r["name"])}">{_e(short_name(r["name"], 120))}</code></td>'
        f'<td>{_e(r["detail"])}</td></tr>' for r in rows)
    return (f'<details open><summary>Events that prove it</summary><div class="notes">'
            f'{_e(caption)}</div><table class="ev"><tr><th class="n">start (ms)</th>'
            f'<th class="n">duration</th><th>kind</th><th>where</th><th>name</th><th>detail</th>'
            f'</tr>{body}</table></details>')


def _job_header(sections: Sequence[_RankView], cross: list) -> str:
    # The ranks' findings only: a cross-rank finding re-explains time already in the ranks'
    # accounts (who waits for whom) and is never added to the job's total.
    lost: dict[str, float] = {}
    for s in sections:
        for p, us in s.time_lost().items():
            lost[p] = lost.get(p, 0.0) + us
    accounts = [getattr(s.analysis, "idle", None) for s in sections]
    idle_total = sum(a.total_us for a in accounts if a is not None)
    gpu = next((s.summary.get("gpu_name") for s in sections if s.summary.get("gpu_name")), None)
    busy = [idle_mod.busy_pct(s.summary.get("gpu_busy_fraction")) for s in sections
            if s.summary.get("gpu_busy_fraction") is not None]
    tiles = [("Ranks", str(len(sections))), ("GPU", gpu or "unknown"),
             ("GPU busy", f"{min(busy)}\u2013{max(busy)}%" if busy else "-"),
             ("Findings", f"{sum(len(s.findings) for s in sections)} in ranks + "
                          f"{len(cross)} across"),
             ("GPU idle (all ranks)", fmt_us(idle_total) if any(accounts) else "-"),
             ("Time lost (all ranks)", fmt_us(sum(lost.values())) if lost else "none found")]
    out = '<div class="tiles">' + "".join(
        f'<div class="tile"><div class="k">{_e(k)}</div><div class="v">{_e(v)}</div></div>'
        for k, v in tiles) + "</div>"
    return out + (_lost_bars(dict(sorted(lost.items(), key=lambda kv: -kv[1]))) if lost else "")


def _ranks_view(sections: Sequence[_RankView]) -> str:
    rows = []
    for k, s in enumerate(sections):
        busy = idle_mod.busy_pct(s.summary.get("gpu_busy_fraction"))
        step = (s.summary.get("step_time") or {}).get("median_us")  # steady steps, as the tile
        rows.append(f'<tr class="rankrow" data-rank="{k}"><td>{_e(s.label)}</td>'
                    f'<td style="width:60%"><div class="rankstrip" data-rank="{k}"></div></td>'
                    f'<td class="n">{f"{busy}%" if busy is not None else "-"}</td>'
                    f'<td class="n">{_e(s.idle_tile())}</td>'
                    f'<td class="n">{_e(fmt_us(step)) if step else "-"}</td>'
                    f'<td class="n">{sum(s.data["flagged"])}</td>'
                    f'<td class="n">{_e(fmt_us(sum(s.time_lost().values())))}</td></tr>')
    return ('<h2>Across ranks</h2><div class="panel ranks"><table class="ev"><tr><th>rank</th>'
            '<th>window scores (flagged windows in their pattern colour)</th>'
            '<th class="n">GPU busy</th><th class="n">GPU idle</th><th class="n">median step</th>'
            '<th class="n">flagged</th><th class="n">time lost</th></tr>' + "".join(rows)
            + '</table><p class="notes">Click a rank to open its timeline and findings.</p></div>')


# -- small helpers -----------------------------------------------------------------------------
def _e(s) -> str:
    return html.escape(str(s), quote=True)


def _color(p: str | None) -> str:
    return pattern_colors().get(p or "", UNKNOWN_COLOR)


def _ranges(ws: list[int]) -> str:
    ws = sorted(int(w) for w in ws)
    if not ws:
        return "-"
    out, start, prev = [], ws[0], ws[0]
    for w in ws[1:] + [None]:
        if w is not None and w == prev + 1:
            prev = w
            continue
        out.append(str(start) if start == prev else f"{start}\u2013{prev}")
        if w is not None:
            start = prev = w
    return ", ".join(out)


_FENCE_RE = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)
_INLINE_RE = re.compile(r"`([^`\n]+)`")


def _format_fix(text: str) -> str:
    """Curated advice as markup: fenced or indented blocks become code, the rest paragraphs."""
    text = str(text or "").strip()
    if not text:
        return '<p class="none">No curated fix for this pattern.</p>'
    parts, pos = [], 0
    for m in _FENCE_RE.finditer(text):
        parts.append(("text", text[pos:m.start()]))
        parts.append(("code", m.group(1)))
        pos = m.end()
    parts.append(("text", text[pos:]))
    out = []
    for kind, chunk in parts:
        if kind == "code":
            out.append(f"<pre><code>{_e(chunk.rstrip())}</code></pre>")
            continue
        para, code = [], []
        for line in chunk.split("\n") + [""]:
            if code and not line.strip():
                code.append("")  # a blank line inside a code block; trailing ones are dropped
                continue
            if line.startswith(("    ", "\t", ">>> ")):
                if para:
                    out.append(_para(para))
                    para = []
                code.append(line[4:] if line.startswith("    ") else line)
                continue
            if code:
                out.append(f"<pre><code>{_e(chr(10).join(code).rstrip())}</code></pre>")
                code = []
            if line.strip():
                para.append(line.strip())
            elif para:
                out.append(_para(para))
                para = []
    return "".join(out)


def _para(lines: list[str]) -> str:
    text = _e(" ".join(lines))
    return "<p>" + _INLINE_RE.sub(r"<code>\1</code>", text) + "</p>"


def _json_for_script(data) -> str:
    # Inside <script>, "</script>" or "<!--" in a kernel name would end the block: escape <, >, &.
    raw = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    return raw.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _asset(name: str) -> str:
    return resources.files("traceap").joinpath("data", "report", name).read_text(encoding="utf-8")


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>@TITLE@</title>
<style>@CSS@</style></head>
<body><main>
@BODY@
<p class="notes">Made by traceap. Times are measured from the first event of each trace.</p>
</main>
<script id="traceap-data" type="application/json">@DATA@</script>
<script>@JS@</script>
</body></html>
"""
