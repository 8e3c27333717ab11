"""The terminal summary of an analysis: header, a one-line timeline of window scores, findings.

    GPU, span, steps, GPU busy, detector
    ▁▁▃█▇▁▁▁▂▁▁▃█▇▁▁ ...   one block per window, height = score, colour = pattern
    #1 HIGH  CPU-bound ...  time lost, evidence in numbers, the fix as code
"""

from __future__ import annotations

import textwrap

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from ..findings import cost_sentence
from ..units import fmt_us
from .colors import TERMINAL_CAUSE_COLORS, TERMINAL_COLORS

BLOCKS = "▁▂▃▄▅▆▇█"
#: Colours per pattern (the HTML report's hues, as close as a terminal gets).
COLORS = TERMINAL_COLORS
UNNAMED = "magenta"
SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}


def timeline(analysis, width: int = 100) -> Text:
    """One character per window (bins of windows beyond `width`): height by score, colour by
    pattern for flagged windows, grey otherwise."""
    scores = np.array([w.score for w in analysis.windows])
    n = len(scores)
    bins = np.array_split(np.arange(n), min(n, width)) if n else []
    text = Text()
    for b in bins:
        k = b[int(np.argmax(scores[b]))]
        w = analysis.windows[k]
        ch = BLOCKS[min(int(w.score * len(BLOCKS)), len(BLOCKS) - 1)]
        if w.flagged:
            style = COLORS.get(w.pattern, UNNAMED) if w.pattern else UNNAMED
        else:
            style = "grey42"
        text.append(ch, style=style)
    return text


def _header(console: Console, a) -> None:
    s = a.summary or {}
    busy = s.get("gpu_busy_fraction")
    span = a.span_us[1] - a.span_us[0]
    rank = (f"   rank {s['rank']}/{s['world_size']}" if s.get("world_size")
            else (f"   rank {s['rank']}" if s.get("rank") is not None else ""))
    console.print(f"[bold]{escape(str(a.trace_path))}[/bold]   [dim]detector {a.detector}, "
                  f"{a.n_windows} windows[/dim]")
    console.print(f"  GPU {escape(str(s.get('gpu_name') or 'unknown'))}{rank}   span "
                  f"{fmt_us(span)}   steps {s.get('n_profiler_steps', 0)}   GPU busy "
                  f"{'-' if busy is None else f'{100 * busy:.0f}%'}   kernels "
                  f"{s.get('n_kernels', 0)}")


def _axis(a, width: int) -> Text:
    """'0 ... span' under the timeline, with the middle time, so a window can be found."""
    span = a.span_us[1] - a.span_us[0]
    left, mid, right = "0", f"{fmt_us(span / 2)}", f"{fmt_us(span)}"
    gap1 = max(1, width // 2 - len(left) - len(mid) // 2)
    gap2 = max(1, width - len(left) - gap1 - len(mid) - len(right))
    return Text("  " + left + " " * gap1 + mid + " " * gap2 + right, style="dim")


def _legend(a) -> Text:
    text = Text("  ")
    seen = []
    for w in a.windows:
        if w.flagged and w.pattern not in seen:
            seen.append(w.pattern)
    for p in seen:
        text.append("■ ", style=COLORS.get(p, UNNAMED) if p else UNNAMED)
        text.append(f"{p or 'unnamed'}  ", style="dim")
    if not seen:
        text.append("no window flagged", style="dim")
    return text


def _paragraphs(text: str) -> list[tuple[str, bool]]:
    """(paragraph, is_code): prose lines joined into paragraphs, indented code lines kept."""
    out: list[tuple[str, bool]] = []
    prose: list[str] = []
    for line in text.splitlines():
        if line.startswith("    ") or not line.strip():
            if prose:
                out.append((" ".join(prose), False))
                prose = []
            out.append((line, True))
        else:
            prose.append(line.strip())
    if prose:
        out.append((" ".join(prose), False))
    return out


def _block(console: Console, text: str, indent: int, style: str = "",
           code_style: str | None = None) -> None:
    """Print text indented: prose re-wrapped to the console, code lines never wrapped."""
    width = max(40, (console.width or 100) - indent)
    pad = " " * indent
    for para, is_code in _paragraphs(text):
        if is_code:
            line = (pad + para) if para.strip() else ""
            console.print(Text(line, style=code_style or style), soft_wrap=True)
            continue
        for line in textwrap.wrap(para, width) or [""]:
            console.print(Text(pad + line, style=style), soft_wrap=True)


#: Short cause names for the one-line idle bar (letters stand in for colours in pipes).
CAUSE_SHORT = {"warmup": ("warm-up", "W"), "communication": ("communication", "C"),
               "compile_gaps": ("compile gaps", "G"), "host_copy_sync": ("copies/syncs", "H"),
               "data_loading": ("data loading", "D"), "launch_bound": ("launch-bound", "L"),
               "not_explained": ("not explained", "?")}


def idle_line(account, width: int = 24, letters: bool = False) -> Text:
    """One line: GPU idle of the span, a bar split by cause, the causes with their time."""
    from ..idle import CAUSES
    text = Text("  ")
    if account is None or account.span_us <= 0:
        return text.append("GPU idle: no GPU activity", style="dim")
    span, tot = account.span_us, account.total_us
    text.append(f"GPU idle {fmt_us(tot)} of {fmt_us(span)} ({100 * tot / span:.0f}%) ", style="bold")
    by = account.by_cause
    parts = [("busy", span - tot)] + [(c, by[c]) for c in CAUSES]
    cells = _apportion([v for _, v in parts], width)
    for (cause, _), n in zip(parts, cells):
        ch = "=" if cause == "busy" else (CAUSE_SHORT[cause][1] if letters else "█")
        text.append(("░" if cause == "busy" and not letters else ch) * n,
                    style=TERMINAL_CAUSE_COLORS.get(cause, ""))
    named = sorted(((c, v) for c, v in by.items() if v > 0), key=lambda cv: -cv[1])
    text.append(" " + ", ".join(f"{CAUSE_SHORT[c][0]} {fmt_us(v)}" for c, v in named), style="dim")
    return text


def _apportion(values: list[float], width: int) -> list[int]:
    """Integer cell counts summing to `width`, proportional to `values` (largest remainders)."""
    v = np.maximum(np.asarray(values, dtype=float), 0.0)
    if v.sum() <= 0:
        return [0] * len(values)
    exact = v / v.sum() * width
    cells = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - cells))[:width - int(cells.sum())]:
        cells[i] += 1
    return cells.tolist()


def render_finding(console: Console, f, span_us: float, show_fix: bool = True) -> None:
    """One finding: rank, severity, title, time lost, evidence and fix."""
    head = Text(f"#{f.rank} " if isinstance(f.rank, int) and f.windows else "- ")
    head.append(f"{f.severity.upper():6s} ", style=SEVERITY_STYLE.get(f.severity, ""))
    head.append(f.title, style=f"bold {COLORS.get(f.pattern, '')}".strip())
    head.append(f"  ({f.pattern})", style="dim")
    console.print(head)
    _block(console, cost_sentence(f), 4, "bold")
    _block(console, f.evidence, 4)
    if f.explanation:
        _block(console, f.explanation, 4, "dim italic")
    if show_fix and f.fix:
        console.print(Text("    fix:", style="bold green"))
        _block(console, f.fix, 6, code_style="cyan")


def render(analysis, console: Console | None = None, show_fix: bool = True) -> None:
    """Print the summary of one `Analysis`."""
    console = console or Console()
    a = analysis
    _header(console, a)
    console.print(idle_line(getattr(a, "idle", None), letters=console.no_color or not console.is_terminal))
    width = max(20, min(a.n_windows, (console.width or 100) - 4))
    line = Text("  ")
    strip = timeline(a, width)
    line.append_text(strip)
    console.print(line)
    console.print(_axis(a, len(strip)))
    console.print(_legend(a))
    span = a.span_us[1] - a.span_us[0]
    if not a.findings:
        console.print("  [green]no anti-pattern found[/green]")
    for f in a.findings:
        console.print()
        render_finding(console, f, span, show_fix)
    for n in a.notes:
        console.print(f"  [dim]note: {escape(n)}[/dim]")


def render_job(job, console: Console | None = None) -> None:
    """Print a job: a timeline per rank, cross-rank findings, then each rank's findings (fixes
    shown once per pattern)."""
    console = console or Console()
    console.print(f"[bold]job {escape(job.path)}[/bold]: {len(job.ranks)} ranks")
    for a in job.ranks:
        r = a.summary.get("rank")
        busy = a.summary.get("gpu_busy_fraction")
        line = Text(f"  rank {r if r is not None else '?':>3} ")
        line.append_text(timeline(a, max(20, min(a.n_windows, (console.width or 100) - 42))))
        acc = getattr(a, "idle", None)
        idle = f"idle {100 * acc.total_us / acc.span_us:.0f}%" if acc and acc.span_us > 0 else "idle -"
        line.append(f" busy {'-' if busy is None else f'{100 * busy:.0f}%'}, {idle}, "
                    f"{len(a.findings)} findings", style="dim")
        console.print(line)
    for group in getattr(job, "copies", None) or []:
        console.print(f"  [yellow]{len(group)} inputs are copies of one trace: analysed once, "
                      f"not compared as ranks[/yellow]")
    totals = getattr(job, "totals", None)
    if totals:
        console.print(f"  [bold]GPU idle, all ranks: {fmt_us(totals['gpu_idle_us'])}[/bold]; "
                      f"findings of the ranks: {fmt_us(totals['time_lost_us'])} lost (cross-rank "
                      f"findings re-explain this time and are not added)")
    if job.findings:
        console.print("\n[bold]across ranks[/bold]")
        span = max((a.span_us[1] - a.span_us[0]) for a in job.ranks)
        for f in job.findings:
            render_finding(console, f, span)
    shown: set[str] = set()
    for a in job.ranks:
        if not a.findings:
            continue
        console.print(f"\n[bold]rank {a.summary.get('rank')}[/bold]")
        span = a.span_us[1] - a.span_us[0]
        for f in a.findings:
            render_finding(console, f, span, show_fix=f.pattern not in shown)
            shown.add(f.pattern)
    for n in job.notes:
        console.print(f"  [dim]note: {escape(n)}[/dim]")
