"""The terminal view of a comparison (`traceap diff BEFORE AFTER`): the two sides in columns,
the findings' fate, the verdict.

    d = traceap.diff.compare("before/", "after/")
    render(d)             # the table, the findings that changed, the notes, the verdict
    render_verdict(d)     # the verdict only (`traceap diff -q`)

`traceap.diff` compares and holds the numbers (`Diff`, `Side`, `FindingChange`); this module
only lays them out, in the console's width (80 columns in a pipe) like the analysis' report
(`report/terminal.py`).
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..diff import Diff, pct
from ..idle import busy_pct
from ..units import fmt_us
from .terminal import console_width, wrap_text, wrap_words

#: The colour of each finding status: gone or smaller green, new or bigger red, a pattern
#: hidden or uncovered by another cause yellow ("same" is not printed).
STATUS_STYLES = {"fixed": "green", "better": "green", "new": "red", "worse": "red",
                 "now_visible": "yellow", "now_hidden": "yellow"}


def render(d: Diff, console: Console | None = None) -> None:
    """Side by side: step time, GPU busy and idle, data loading, time lost per pattern,
    the findings' fate, the verdict."""
    console = console or Console()
    # the lines below the table break between words at the console's width (80 in a pipe)
    width = console_width(console)
    console.print(_table(d))
    for c in d.findings:
        if c.status == "same":
            continue
        style = STATUS_STYLES[c.status]
        where = f" (rank {c.rank})" if c.rank is not None else ""
        # the status in the first column, what hid the finding after its pattern: "now hidden
        # no_pin_memory (by X)", never "now hidden by X no_pin_memory" (two patterns in a row)
        status = c.status.replace("_", " ")
        hidden = ""
        if c.hidden_by:
            hidden = (f" (was hidden by {escape(c.hidden_by)})" if c.status == "now_visible"
                      else f" (hidden by {escape(c.hidden_by)})")
        line = Text.from_markup(f"  [{style}]{status:6s}[/{style}] {escape(c.pattern)}{where}"
                                f"{hidden}: {escape(c.title)}")
        console.print(wrap_text(line, width, " " * 9), soft_wrap=True)
    b, a = d.before, d.after
    for n in dict.fromkeys(b.notes + a.notes):
        where = ("both" if n in b.notes and n in a.notes else
                 "before" if n in b.notes else "after")
        console.print(wrap_text(Text.from_markup(f"  [dim]{where}: {escape(n)}[/dim]"), width,
                                "    "), soft_wrap=True)
    style = "bold red" if d.slower else "bold"
    console.print(wrap_text(Text(d.verdict, style=style), width, "  "), soft_wrap=True)


def render_verdict(d: Diff, console: Console | None = None) -> None:
    """The verdict alone, plain, broken between words at the console's width."""
    console = console or Console()
    console.print("\n".join(wrap_words(d.verdict, console_width(console), "", "  ")),
                  markup=False, highlight=False, soft_wrap=True)


def _table(d: Diff) -> Table:
    """The two sides' numbers per step in columns, with the change of each."""
    b, a = d.before, d.after
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    t.add_column("")
    t.add_column("before", justify="right")
    t.add_column("after", justify="right")
    t.add_column("change", justify="right")

    def row(label, x, y, fmt=fmt_us, change=None):
        c = pct(x, y) if change is None else change
        t.add_row(label, fmt(x), fmt(y), "-" if c is None else f"{c:+.0f}%")

    t.add_row("input", escape(_short(b.input)), escape(_short(a.input)), "")
    t.add_row("profiler steps", str(b.n_steps or "-"), str(a.n_steps or "-"), "")
    row("step time (median)", b.step_us, a.step_us)

    def frac(x):
        return "-" if x is None else f"{busy_pct(x)}%"
    busy_pts = (None if b.gpu_busy_fraction is None or a.gpu_busy_fraction is None
                else 100 * (a.gpu_busy_fraction - b.gpu_busy_fraction))
    # The same GPU busy as `traceap analyze` and `info` print: of the GPU span, idle the rest.
    t.add_row("GPU busy", frac(b.gpu_busy_fraction), frac(a.gpu_busy_fraction),
              "-" if busy_pts is None else f"{busy_pts:+.0f} pts")
    row("GPU idle per step", b.gpu_idle_per_step_us, a.gpu_idle_per_step_us)
    bc, ac = b.to_json()["gpu_idle"], a.to_json()["gpu_idle"]
    causes = sorted(set((bc or {}).get("by_cause_per_step_us") or {}) |
                    set((ac or {}).get("by_cause_per_step_us") or {}))
    for cause in causes:
        row(f"  idle: {cause}", ((bc or {}).get("by_cause_per_step_us") or {}).get(cause),
            ((ac or {}).get("by_cause_per_step_us") or {}).get(cause))
    # The busy side: the part of the GPU busy time busy-but-slow patterns cost, by pattern.
    bs, as_ = b.to_json()["gpu_inefficient"], a.to_json()["gpu_inefficient"]
    bsp = (bs or {}).get("by_pattern_per_step_us") or {}
    asp = (as_ or {}).get("by_pattern_per_step_us") or {}
    if any(v > 0 for v in [*bsp.values(), *asp.values()]):
        row("GPU busy, inefficient per step", b.gpu_inefficient_per_step_us,
            a.gpu_inefficient_per_step_us)
        for pid in [p for p in dict.fromkeys([*bsp, *asp]) if bsp.get(p) or asp.get(p)]:
            row(f"  inefficient: {pid}", bsp.get(pid), asp.get(pid))
    row("data loading per step", b.dataloader_us_per_step, a.dataloader_us_per_step)
    for r in d.pattern_rows():
        row(f"lost: {r['pattern']}", r["before_us_per_step"], r["after_us_per_step"])
    return t


def _short(path: str, limit: int = 40) -> str:
    """A path cut to its last `limit` characters, the cut marked."""
    return path if len(path) <= limit else "..." + path[-(limit - 3):]


__all__ = ["STATUS_STYLES", "render", "render_verdict"]
