"""`traceap info TRACE [--json]`."""

from __future__ import annotations

from pathlib import Path

import orjson
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..info import summarize
from ..load import load, load_job
from ..units import fmt_bytes as _fmt_bytes
from ..units import fmt_us as _fmt_us


def register(app: typer.Typer) -> None:
    app.command("info")(info)


def info(
    trace: Path = typer.Argument(..., help="A trace (.json / .json.gz) or a folder of per-rank traces."),
    json_out: bool = typer.Option(False, "--json", help="Write the traceap.info/v1 JSON to stdout."),
    top: int = typer.Option(10, help="How many top kernels to list."),
) -> None:
    """Summarise a trace: span, steps, events per kind, GPU busy time, memcpys, NCCL, warnings."""
    traces = load_job(trace).traces if trace.is_dir() else [load(trace)]
    summaries = [summarize(t, top=top) for t in traces]
    if json_out:
        obj = summaries[0] if len(summaries) == 1 else {"schema": "traceap.info/v1+job",
                                                        "job": str(trace), "ranks": summaries}
        typer.echo(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode())
        return
    console = Console()
    for s in summaries:
        _print(console, s)


def gpu_time_fields(s: dict) -> list[str]:
    """'GPU busy 61%, idle 179.9 ms (39%) of the 465.2 ms GPU span; any GPU work incl. NCCL and
    copies 84%' in fields: the idle account's busy and idle (they add up to the span), then the
    second quantity under its own name."""
    from ..idle import busy_pct

    b = busy_pct(s.get("gpu_busy_fraction"))
    if b is None:
        return ["GPU busy -, idle -: no GPU activity"]
    span = s["gpu_idle"]["gpu_span_us"]
    active = busy_pct(s.get("gpu_active_fraction"))
    return [f"GPU busy {b}%,", f"idle {_fmt_us(s['gpu_idle_us'])} ({100 - b}%)",
            f"of the {_fmt_us(span[1] - span[0])} GPU span;",
            f"any GPU work incl. NCCL and copies {'-' if active is None else f'{active}%'}"]


def _print(console: Console, s: dict) -> None:
    from ..report.terminal import console_width, shorten_names, wrap_fields, wrap_words

    width = console_width(console)

    def fields(parts: list[str], sep: str = "   ") -> None:
        # lines break between fields, never inside one (pipes and 80-column terminals)
        for line in wrap_fields(parts, width, sep=sep):
            console.print(Text(line), soft_wrap=True)

    console.print(Text(s["trace"], style="bold"), soft_wrap=True)
    rank = f"rank {s['rank']}/{s['world_size']}" if s["world_size"] else (
        f"rank {s['rank']}" if s["rank"] is not None else "single process")
    fields([f"span {_fmt_us(s['duration_us'])}", f"steps {s['n_profiler_steps']}",
            f"GPU {s['gpu_name'] or 'unknown'}", rank])
    kinds = [f"{k} {v}" for k, v in s["events_per_kind"].items()]
    fields([f"events {s['n_events']}:"] + [k + "," for k in kinds[:-1]] + kinds[-1:], sep=" ")
    fields([f"kernels {s['n_kernels']} on streams {s['gpu_streams']}"])
    fields(gpu_time_fields(s), sep=" ")
    m = s["memcpy"]
    if m["count"]:
        parts = []
        for d, v in m["by_direction"].items():
            mem = ", ".join(f"{k} {x['count']}" for k, x in v["by_memory"].items())
            parts.append(f"{d} {v['count']} ({_fmt_bytes(v['bytes'])}, {_fmt_us(v['time_us'])}; {mem})")
        fields(["memcpy"] + [p + ";" for p in parts[:-1]] + parts[-1:], sep=" ")
    n = s["nccl"]
    if n["count"]:
        exp = n["exposed_fraction"]
        fields([f"NCCL kernels {n['count']} ({_fmt_us(n['time_us'])}) on streams {n['streams']},",
                f"exposed {_fmt_us(n['exposed_us'])}" + (f" ({100 * exp:.0f}%)" if exp is not None
                                                         else "")], sep=" ")
    la = s["launch"]
    fields([f"launch delay median {_fmt_us(la['launch_delay_median_us'])},",
            f"p95 {_fmt_us(la['launch_delay_p95_us'])};",
            f"sync calls {la['sync_calls']}: {la['host_blocking_syncs']} host-blocking",
            f"({_fmt_us(la['host_blocking_sync_time_us'])}),",
            f"{la['sync_calls'] - la['host_blocking_syncs']} device-side waits"], sep=" ")
    if s["top_kernels"]:
        table = Table(title="top kernels by GPU time", show_edge=False, title_justify="left")
        numbers = [(f"{100 * k['share']:.1f}%", _fmt_us(k["total_us"]), str(k["count"]),
                    _fmt_us(k["mean_us"])) for k in s["top_kernels"]]
        heads = ("share", "total", "count", "mean")
        sizes = [max(len(h), *(len(r[i]) for r in numbers)) for i, h in enumerate(heads)]
        for col, size in zip(heads, sizes):
            table.add_column(col, justify="right", no_wrap=True, min_width=size)
        # Long C++ names cut in the middle so two kernels never read the same; a name no cut
        # tells apart wraps (the kernel column is the only one that may: the numbers stay whole).
        room = max(20, width - sum(size + 3 for size in sizes) - 2)
        names = shorten_names([k["name"] for k in s["top_kernels"]], room)
        table.add_column("kernel", overflow="fold",
                         min_width=min(room, max(len(n) for n in names)))
        for row, name in zip(numbers, names):
            table.add_row(*row, name)
        console.print(table)
    for w in s["warnings"]:
        for i, line in enumerate(wrap_words(w, width, "  warning: ", " " * 11)):
            console.print(Text(line, style="yellow" if i == 0 else ""), soft_wrap=True)
