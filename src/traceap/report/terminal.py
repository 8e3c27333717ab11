"""The terminal summary of an analysis: header, a one-line timeline of window scores, findings.

    GPU, span, steps, GPU busy, detector
    ▁▁▃█▇▁▁▁▂▁▁▃█▇▁▁ ...   one block per window, height = score, colour = pattern
      C  CC      O           the pattern's letter under each flagged window (no colour needed)
    #1 HIGH  [C] CPU-bound ...  time lost, evidence in numbers, the fix as code

Everything fits the console width (80 columns in a pipe): lines break between fields and
words, never inside one; code lines are kept whole (a trailing comment moves above its line
when the line would not fit).
"""

from __future__ import annotations

import io
import re
import textwrap
import tokenize
from collections.abc import Sequence

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from ..findings import cost_sentence, finding_order
from ..units import fmt_us, plural
from ..patterns import patterns
from .colors import terminal_cause_colors, terminal_colors

BLOCKS = "▁▂▃▄▅▆▇█"
UNNAMED = "magenta"
SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}
#: Written under a flagged window no pattern was named for.
UNNAMED_LETTER = "?"
ELLIPSIS = "\u2026"


def pattern_letters() -> dict[str, str]:
    """Pattern id -> its letter (`AntiPattern.letter`), written under its flagged windows and
    beside its findings, so the timeline reads without colour (pipes, logs, colour-blind
    readers)."""
    return {p.id: p.letter for p in patterns()}


def letter(pattern: str | None) -> str:
    """The timeline letter of a pattern id ("?" for a flagged window without a pattern)."""
    return pattern_letters().get(pattern or "", UNNAMED_LETTER)


# -- fitting text to the console -------------------------------------------------------------
def console_width(console: Console) -> int:
    """The width to fit: the console's (80 in a pipe), never below 40."""
    return max(40, console.width or 80)


def wrap_words(text: str, width: int, indent: str = "", subsequent: str | None = None) -> list[str]:
    """Lines of at most `width` columns broken between words only (a long word, such as a
    kernel name or a path, stays whole on a line of its own)."""
    return textwrap.wrap(text, width, initial_indent=indent,
                         subsequent_indent=indent if subsequent is None else subsequent,
                         break_long_words=False, break_on_hyphens=False) or [indent.rstrip()]


def wrap_text(text: Text, width: int, subsequent: str = "") -> Text:
    """Styled `text` broken between words like `wrap_words` (its own leading spaces and the
    spaces between words on a line kept, so columns stay aligned), continuation lines starting
    with `subsequent`."""
    words = [m.span() for m in re.finditer(r"\S+", text.plain)]
    out, taken, line_start = text[:0], 0, 0   # line_start: where column 0 of this line falls
    for (_, gap), (start, end) in zip(words, words[1:]):
        if end - line_start > width:
            out.append_text(text[taken:gap])
            out.append("\n" + subsequent)
            taken, line_start = start, start - len(subsequent)
    out.append_text(text[taken:])
    return out


def wrap_fields(fields: Sequence[str], width: int, indent: str = "  ", sep: str = "   ") -> list[str]:
    """Fields joined by `sep`, a new line (at `indent`) before a field that would not fit."""
    lines: list[str] = []
    line = ""
    for f in fields:
        if line and len(line) + len(sep) + len(f) > width:
            lines.append(line)
            line = ""
        line = f"{line}{sep}{f}" if line else indent + f
    if line:
        lines.append(line)
    return lines


def shorten_middle(name: str, width: int) -> str:
    """`name` in at most `width` characters, cut in the middle with an ellipsis (the start
    says what a kernel is, the end its template arguments or variant)."""
    if len(name) <= width:
        return name
    if width < 2:
        return name[:width]
    head = width // 2
    tail = width - 1 - head
    return name[:head] + ELLIPSIS + (name[-tail:] if tail else "")


def drop_parameters(name: str) -> str:
    """A C++ kernel signature without its parameter list: `f<T>(int, float*)` -> `f<T>(…)`."""
    depth = 0
    for i, ch in enumerate(name):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0 and i > 0 and name.endswith(")"):
            return name[:i] + "(" + ELLIPSIS + ")"
    return name


def _cut_apart(full: list[str], width: int, taken: set[str]) -> list[str] | None:
    """One cut position (head + ellipsis + tail) at which the names all read differently."""
    for head in range(width - 1, -1, -1):
        tail = width - 1 - head
        cut = [n if len(n) <= width else n[:head] + ELLIPSIS + (n[-tail:] if tail else "")
               for n in full]
        if len(set(cut)) == len(full) and not set(cut) & taken:
            return cut
    return None


def shorten_names(names: Sequence[str], width: int) -> list[str]:
    """Each name in at most `width` characters, such that different names never read the same.

    A long C++ signature loses its parameter list first, then the name is cut in the middle;
    names that would collide get the cut moved (more of the start or of the end kept), and
    names no single cut tells apart are kept whole."""
    def short(n: str) -> str:
        return shorten_middle(drop_parameters(n) if len(n) > width else n, width)

    out = [short(n) for n in names]
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(out):
        groups.setdefault(s, []).append(i)
    taken = {s for s, ix in groups.items() if len({names[i] for i in ix}) == 1}
    for s, ix in groups.items():
        distinct = list(dict.fromkeys(names[i] for i in ix))
        if len(distinct) == 1:
            continue
        cut = None
        for form in ([drop_parameters(n) if len(n) > width else n for n in distinct], distinct):
            if len(set(form)) == len(form):
                cut = _cut_apart(form, width, taken)
                if cut is not None:
                    break
        chosen = dict(zip(distinct, cut or distinct))
        for i in ix:
            out[i] = chosen[names[i]]
        taken |= set(chosen.values())
    return out


def _comment_start(line: str) -> int | None:
    """Column of a trailing Python comment in one line of code (None: none, or not Python)."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.COMMENT:
                return tok.start[1]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # a line of a longer statement: the tokens before the error were read
    return None


def fit_code_line(line: str, width: int) -> list[str]:
    """A code line as is when it fits; else its trailing `# comment` moved onto its own line
    above it (same indent), which Python reads the same.  Code itself is never broken."""
    if len(line) <= width:
        return [line]
    at = _comment_start(line)
    code = line[:at].rstrip() if at else ""
    if not code.strip():
        return [line]
    pad = code[:len(code) - len(code.lstrip())]
    return [pad + line[at:], code]


# -- the timeline ----------------------------------------------------------------------------
def _bins(analysis, width: int) -> list[int]:
    """For each column, the window shown: the highest-scoring of the windows it covers."""
    scores = np.array([w.score for w in analysis.windows])
    n = len(scores)
    if not n:
        return []
    return [int(b[int(np.argmax(scores[b]))])
            for b in np.array_split(np.arange(n), min(n, width))]


def timeline(analysis, width: int = 100) -> Text:
    """One character per window (bins of windows beyond `width`): height by score, colour by
    pattern for flagged windows, grey otherwise."""
    text = Text()
    for k in _bins(analysis, width):
        w = analysis.windows[k]
        ch = BLOCKS[min(int(w.score * len(BLOCKS)), len(BLOCKS) - 1)]
        if w.flagged:
            style = terminal_colors().get(w.pattern, UNNAMED) if w.pattern else UNNAMED
        else:
            style = "grey42"
        text.append(ch, style=style)
    return text


def timeline_letters(analysis, width: int = 100) -> Text:
    """The row under the timeline: each flagged window's pattern letter, blank elsewhere."""
    text = Text()
    for k in _bins(analysis, width):
        w = analysis.windows[k]
        if w.flagged:
            text.append(letter(w.pattern), style=terminal_colors().get(w.pattern, UNNAMED)
                        if w.pattern else UNNAMED)
        else:
            text.append(" ")
    text.rstrip()
    return text


def _header(console: Console, a) -> None:
    from ..idle import busy_pct
    s = a.summary or {}
    busy = busy_pct(s.get("gpu_busy_fraction"))
    span = a.span_us[1] - a.span_us[0]
    width = console_width(console)
    rank = (f"rank {s['rank']}/{s['world_size']}" if s.get("world_size")
            else (f"rank {s['rank']}" if s.get("rank") is not None else ""))
    console.print(Text(str(a.trace_path), style="bold"), soft_wrap=True)
    fields = [f"detector {a.detector}, {a.n_windows} windows",
              f"GPU {s.get('gpu_name') or 'unknown'}"] + ([rank] if rank else []) + [
              f"span {fmt_us(span)}", _steps_field(a),
              f"GPU busy {'-' if busy is None else f'{busy}%'}",
              f"kernels {s.get('n_kernels', 0)}"]
    for line in wrap_fields(fields, width):
        console.print(Text(line), soft_wrap=True)


def _steps_field(a) -> str:
    """'steps 6', or 'steps 5 + 1 warm-up': the steady steps are the analysis' step basis (its
    JSON's `step_basis.n_steps`, what `traceap diff` counts), a warm-up step is said apart."""
    basis = getattr(a, "basis", None)
    acc = getattr(a, "idle", None)
    warm = len(acc.warmup_steps) if acc is not None else 0
    n = basis.n_steps if basis is not None else (a.summary or {}).get("n_profiler_steps", 0)
    return f"steps {n}" + (f" + {warm} warm-up" if warm else "")


def _axis(a, width: int) -> Text:
    """'0 ... span' under the timeline, with the middle time, so a window can be found."""
    span = a.span_us[1] - a.span_us[0]
    left, mid, right = "0", f"{fmt_us(span / 2)}", f"{fmt_us(span)}"
    gap1 = max(1, width // 2 - len(left) - len(mid) // 2)
    gap2 = max(1, width - len(left) - gap1 - len(mid) - len(right))
    return Text("  " + left + " " * gap1 + mid + " " * gap2 + right, style="dim")


def _legend(console: Console, windows_of: Sequence) -> None:
    """'L pattern_id   M other_id' (letter, id) for the patterns flagged, wrapped to fit."""
    seen: list[str | None] = []
    for windows in windows_of:
        for w in windows:
            if w.flagged and w.pattern not in seen:
                seen.append(w.pattern)
    if not seen:
        console.print(Text("  no window flagged", style="dim"))
        return
    fields = [f"{letter(p)} {p or 'flagged, no pattern named'}" for p in seen]
    colors = terminal_colors()
    style = {f: colors.get(p, UNNAMED) if p else UNNAMED for f, p in zip(fields, seen)}
    for line in wrap_fields(fields, console_width(console)):
        text = Text()
        for part in re.split(r"(\s{3,})", line):
            key = part.strip()
            if key in style:
                text.append(part[:len(part) - len(part.lstrip())])
                text.append(key[0], style=f"bold {style[key]}")
                text.append(key[1:], style="dim")
            else:
                text.append(part)
        console.print(text, soft_wrap=True)


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
    """Print text indented: prose re-wrapped to the console between words, code lines whole."""
    width = console_width(console)
    pad = " " * indent
    for para, is_code in _paragraphs(text):
        if is_code:
            for line in fit_code_line((pad + para) if para.strip() else "", width):
                console.print(Text(line, style=code_style or style), soft_wrap=True)
            continue
        for line in wrap_words(para, width, pad):
            console.print(Text(line, style=style), soft_wrap=True)


#: Short cause names for the one-line idle bar (letters stand in for colours in pipes).
CAUSE_SHORT = {"warmup": ("warm-up", "W"), "communication": ("communication", "C"),
               "compile_gaps": ("compile gaps", "G"), "host_copy_sync": ("copies/syncs", "H"),
               "data_loading": ("data loading", "D"), "launch_bound": ("launch-bound", "L"),
               "not_explained": ("not explained", "?")}


def idle_line(account, width: int = 24, letters: bool = False, columns: int = 80) -> Text:
    """GPU idle of the span and a bar split by cause on one line, then the causes with their
    time on indented lines of at most `columns` (a cause and its time never split)."""
    from ..idle import CAUSES
    text = Text("  ")
    if account is None or account.span_us <= 0:
        return text.append("GPU idle: no GPU activity", style="dim")
    span, tot = account.span_us, account.total_us
    text.append(f"GPU idle {fmt_us(tot)} of {fmt_us(span)} ({account.idle_pct}%) ", style="bold")
    by = account.by_cause
    parts = [("busy", span - tot)] + [(c, by[c]) for c in CAUSES]
    cells = _apportion([v for _, v in parts], width)
    for (cause, _), n in zip(parts, cells):
        ch = "=" if cause == "busy" else (CAUSE_SHORT[cause][1] if letters else "█")
        text.append(("░" if cause == "busy" and not letters else ch) * n,
                    style=terminal_cause_colors().get(cause, ""))
    named = sorted(((c, v) for c, v in by.items() if v > 0), key=lambda cv: -cv[1])
    items = [f"{CAUSE_SHORT[c][0]} {fmt_us(v)}" for c, v in named]
    lines: list[str] = []
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if lines and len(lines[-1]) + 1 + len(piece) <= columns - 4:
            lines[-1] += " " + piece
        else:
            lines.append(piece)
    for line in lines:
        text.append("\n    " + line, style="dim")
    return text


def inefficient_line(account, columns: int = 80) -> Text | None:
    """The busy side of the account, under the idle line: 'of the GPU busy time (X), Y spent
    inefficiently: FP32 without tensor cores Z, ...' (None when no busy-but-slow pattern costs
    any time)."""
    said = account.describe() if account is not None else None
    if not said:
        return None
    return Text("\n".join(wrap_words(said, columns, "  ", "    ")), style="dim")


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
    """One finding: rank, severity, letter and title, its cost, evidence, fix."""
    width = console_width(console)
    number = f"#{f.rank} " if isinstance(f.rank, int) and f.windows else "- "
    severity = f"{f.severity.upper():6s} "
    mark = f"[{letter(f.pattern)}] " if f.pattern in pattern_letters() else ""
    lead = len(number) + len(severity) + len(mark)
    color = terminal_colors().get(f.pattern, "")
    for i, line in enumerate(wrap_words(f"{f.title} ({f.pattern})", width - lead)):
        head = Text()
        if i == 0:
            head.append(number)
            head.append(severity, style=SEVERITY_STYLE.get(f.severity, ""))
            head.append(mark, style=f"bold {color}".strip())
        else:
            head.append(" " * lead)
        head.append(line, style=f"bold {color}".strip())
        console.print(head, soft_wrap=True)
    _block(console, cost_sentence(f), 4, "bold")
    _block(console, f.evidence, 4)
    if f.explanation:
        _block(console, f.explanation, 4, "dim italic")
    if show_fix and f.fix:
        console.print(Text("    fix:", style="bold green"))
        _block(console, f.fix, 6, code_style="cyan")


def _notes(console: Console, notes: Sequence[str]) -> None:
    width = console_width(console)
    for n in notes:
        for line in wrap_words(n, width, "  note: ", " " * 8):
            console.print(Text(line, style="dim"), soft_wrap=True)


def render(analysis, console: Console | None = None, show_fix: bool = True) -> None:
    """Print the summary of one `Analysis`."""
    console = console or Console()
    a = analysis
    _header(console, a)
    console.print(idle_line(getattr(a, "idle", None), letters=console.no_color or not console.is_terminal,
                            columns=console_width(console)))
    slow = inefficient_line(getattr(a, "inefficient", None), console_width(console))
    if slow is not None:
        console.print(slow, soft_wrap=True)
    width = max(20, min(a.n_windows, console_width(console) - 4))
    strip = timeline(a, width)
    console.print(Text("  ").append_text(strip), soft_wrap=True)
    marks = timeline_letters(a, width)
    if marks.plain.strip():
        console.print(Text("  ").append_text(marks), soft_wrap=True)
    console.print(_axis(a, len(strip)), soft_wrap=True)
    _legend(console, [a.windows])
    span = a.span_us[1] - a.span_us[0]
    if not a.findings:
        console.print("  [green]no anti-pattern found[/green]")
    for f in a.findings:
        console.print()
        render_finding(console, f, span, show_fix)
    _notes(console, a.notes)


def one_line(analysis) -> str:
    """One plain line for a profiled cycle (`traceap.trace_handler`, the callbacks): the trace's
    name, the median steady step, GPU idle, and the top finding with its gain."""
    from pathlib import Path

    a = analysis
    st = (a.summary or {}).get("step_time") or {}
    fields = [Path(str(a.trace_path)).name,
              f"step {fmt_us(st['median_us'])}" if st.get("median_us") else "no profiler steps"]
    if not getattr(a, "has_gpu", True):
        return "traceap: " + ", ".join(fields) + "; CPU-only trace: no GPU activity, so no GPU " \
                                                  "anti-pattern applies"
    acc = getattr(a, "idle", None)
    fields.append(f"GPU idle {acc.idle_pct}%" if acc is not None and acc.span_us > 0
                  else "GPU idle -")
    if a.findings:
        f = a.findings[0]
        per = " per step" if getattr(f, "time_lost_per_step_us", None) is not None else ""
        fields.append(f"top finding: {f.title} (fixing it gains about {fmt_us(f.gain_us)}{per}, "
                      f"{f.gain_pct:.1f}%)")
    else:
        fields.append("no anti-pattern found")
    return "traceap: " + ", ".join(fields)


def job_notes(job) -> list[str]:
    """The job's notes, then each rank's own (trace warnings such as duplicate rank ids, a
    CPU-only rank), a note shared by several ranks said once with the ranks it concerns."""
    ranks_of: dict[str, list] = {}
    for a in job.ranks:
        for n in a.notes:
            if n not in job.notes:
                ranks_of.setdefault(n, []).append(a.summary.get("rank"))
    out = list(job.notes)
    for n, ranks in ranks_of.items():
        if len(ranks) == len(job.ranks) and len(ranks) > 1:
            out.append(f"every rank: {n}")
        else:
            out.append(f"rank{'s' if len(ranks) > 1 else ''} "
                       f"{', '.join(str(r) for r in ranks)}: {n}")
    return out


def _render_separate(job, console: Console) -> None:
    """Traces in one folder that are not one job's ranks: the reason in one line, then each
    trace as `traceap analyze TRACE` prints it."""
    console.print(Text(job.notes[0], style="bold yellow"), soft_wrap=True)
    for a in job.ranks:
        console.print()
        render(a, console)
    rest = [n for n in job.notes[1:] if not any(n in a.notes for a in job.ranks)]
    _notes(console, rest)


def render_job(job, console: Console | None = None) -> None:
    """Print a job: a timeline per rank, cross-rank findings, then each rank's findings (fixes
    shown once per pattern)."""
    from ..idle import busy_pct
    console = console or Console()
    if getattr(job, "not_one_job", None):
        _render_separate(job, console)
        return
    console.print(Text(f"job {job.path}: {len(job.ranks)} ranks", style="bold"), soft_wrap=True)
    width = console_width(console)
    for a in job.ranks:
        r = a.summary.get("rank")
        # The idle account's busy and idle, the same two numbers as the rank's own report.
        busy = busy_pct(a.summary.get("gpu_busy_fraction"))
        lead = f"  rank {r if r is not None else '?':>3} "
        tail = (f" GPU busy {'-' if busy is None else f'{busy}%'}, "
                f"idle {'-' if busy is None else f'{100 - busy}%'}, "
                f"{plural(len(a.findings), 'finding')}")
        cols = max(20, min(a.n_windows, width - len(lead) - len(tail)))
        line = Text(lead)
        line.append_text(timeline(a, cols))
        line.append(tail, style="dim")
        console.print(line, soft_wrap=True)
        marks = timeline_letters(a, cols)
        if marks.plain.strip():
            console.print(Text(" " * len(lead)).append_text(marks), soft_wrap=True)
    _legend(console, [a.windows for a in job.ranks])
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
        for f in sorted(job.findings, key=finding_order):
            render_finding(console, f, span)
    shown: set[str] = set()
    for a in job.ranks:
        if not a.findings:
            continue
        console.print(f"\n[bold]rank {escape(str(a.summary.get('rank')))}[/bold]")
        span = a.span_us[1] - a.span_us[0]
        for f in a.findings:
            render_finding(console, f, span, show_fix=f.pattern not in shown)
            shown.add(f.pattern)
    _notes(console, job_notes(job))
