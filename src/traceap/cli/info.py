"""`traceap info TRACE [--json]`."""

from __future__ import annotations

from pathlib import Path

import orjson
import typer
from rich.console import Console
from rich.table import Table

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


def _print(console: Console, s: dict) -> None:
    console.print(f"[bold]{s['trace']}[/bold]")
    busy = s["gpu_busy_fraction"]
    rank = f"rank {s['rank']}/{s['world_size']}" if s["world_size"] else (
        f"rank {s['rank']}" if s["rank"] is not None else "single process")
    console.print(f"  span {_fmt_us(s['duration_us'])}   steps {s['n_profiler_steps']}   "
                  f"GPU {s['gpu_name'] or 'unknown'}   {rank}")
    console.print(f"  events {s['n_events']}: " + ", ".join(
        f"{k} {v}" for k, v in s["events_per_kind"].items()))
    console.print(f"  kernels {s['n_kernels']} on streams {s['gpu_streams']}   "
                  f"GPU busy {'-' if busy is None else f'{100 * busy:.1f}%'}   "
                  f"idle {_fmt_us(s['gpu_idle_us'])}")
    m = s["memcpy"]
    if m["count"]:
        parts = []
        for d, v in m["by_direction"].items():
            mem = ", ".join(f"{k} {x['count']}" for k, x in v["by_memory"].items())
            parts.append(f"{d} {v['count']} ({_fmt_bytes(v['bytes'])}, {_fmt_us(v['time_us'])}; {mem})")
        console.print("  memcpy " + "; ".join(parts))
    n = s["nccl"]
    if n["count"]:
        exp = n["exposed_fraction"]
        console.print(f"  NCCL kernels {n['count']} ({_fmt_us(n['time_us'])}) on streams "
                      f"{n['streams']}, exposed {_fmt_us(n['exposed_us'])}"
                      + (f" ({100 * exp:.0f}%)" if exp is not None else ""))
    la = s["launch"]
    console.print(f"  launch delay median {_fmt_us(la['launch_delay_median_us'])}, p95 "
                  f"{_fmt_us(la['launch_delay_p95_us'])}; sync calls {la['sync_calls']} "
                  f"({_fmt_us(la['sync_time_us'])})")
    if s["top_kernels"]:
        table = Table(title="top kernels by GPU time", show_edge=False, title_justify="left")
        for col in ("share", "total", "count", "mean", "kernel"):
            if col == "kernel":  # long C++ names: one line each, cut with an ellipsis
                table.add_column(col, no_wrap=True, overflow="ellipsis", min_width=20)
            else:
                table.add_column(col, justify="right", no_wrap=True, min_width=len(col) + 2)
        for k in s["top_kernels"]:
            table.add_row(f"{100 * k['share']:.1f}%", _fmt_us(k["total_us"]), str(k["count"]),
                          _fmt_us(k["mean_us"]), k["name"])
        console.print(table)
    for w in s["warnings"]:
        console.print(f"  [yellow]warning:[/yellow] {w}")
