"""Make a large, realistic Kineto trace by replaying a real one back to back.

The source trace (by default the bundled DDP CNN trace, 3 profiler steps on an A100) is copied
as many times as it takes to reach the target size.  Copy ``c`` is shifted in time by
``c * (span + gap)`` and every id that links events is renumbered so that links stay exact
and never collide across copies: correlation ids and ``ac2g`` flow ids share one offset (they
are equal in real traces), External ids, flow ids, record-function ids and Python ids get
their own.  ``ProfilerStep#N`` names continue the step numbering.  Metadata events (``ph: M``)
and the top-level keys (deviceProperties, distributedInfo, ...) are written once.

    .venv/bin/python benchmarks/make_large_trace.py --size 200MB -o benchmarks/out/t200.json

The copies count (and so exact event counts: ``copies x`` the source's) is printed and stored
in ``<output>.meta.json`` so tests and benchmarks can check what they load.
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT / "examples" / "ddp_cnn_a100_rank0.json.gz"

#: args keys holding ids that must stay unique per copy (each with its own offset).
_ID_ARGS = ("External id", "external id", "Record function id", "Ev Idx", "Python id",
            "Python parent id")
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_size(text: str) -> int:
    """'200MB' -> 200_000_000 (decimal units, as file sizes are usually quoted)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMG]?B?)\s*", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 54MB, 1GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def read_trace(path: Path) -> dict:
    """The source trace as a dict (gzip or plain JSON)."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = orjson.loads(raw)
    return {"traceEvents": doc} if isinstance(doc, list) else doc


class Replicator:
    """Produces copy ``c`` of the source's events, time-shifted and renumbered."""

    def __init__(self, doc: dict, gap_us: float = 1000.0):
        events = doc["traceEvents"]
        self.meta_events = [e for e in events if e.get("ph") == "M"]
        self.events = [e for e in events if e.get("ph") != "M"]
        timed = [e for e in self.events if isinstance(e.get("ts"), (int, float))]
        start = min(e["ts"] for e in timed)
        end = max(e["ts"] + (e.get("dur") or 0) for e in timed)
        self.period = (end - start) + gap_us

        def max_arg(key):
            return max((a[key] for e in self.events if isinstance(a := e.get("args"), dict)
                        and isinstance(a.get(key), int)), default=0)

        flow_ids = [e["id"] for e in self.events if isinstance(e.get("id"), int)]
        # Correlation ids and ac2g flow ids share one offset: in real traces they are equal.
        self.corr_step = max(max_arg("correlation"), max(flow_ids, default=0)) + 1
        self.id_steps = {k: max_arg(k) + 1 for k in _ID_ARGS}
        steps = [int(m.group(1)) for e in self.events
                 if (m := _STEP_RE.match(e.get("name") or ""))]
        self.step_span = (max(steps) - min(steps) + 1) if steps else 0

    def copy(self, c: int) -> list[dict]:
        """Copy number ``c`` (0 = the source unchanged)."""
        if c == 0:
            return self.events
        shift = c * self.period
        corr_off = c * self.corr_step
        id_offs = {k: c * s for k, s in self.id_steps.items()}
        step_off = c * self.step_span
        out = []
        append = out.append
        for e in self.events:
            e = dict(e)
            ts = e.get("ts")
            if isinstance(ts, (int, float)):
                e["ts"] = round(ts + shift, 3)
            fid = e.get("id")
            if isinstance(fid, int):
                e["id"] = fid + corr_off
            name = e.get("name")
            if step_off and name and name.startswith("ProfilerStep#"):
                m = _STEP_RE.match(name)
                if m:
                    e["name"] = f"ProfilerStep#{int(m.group(1)) + step_off}"
            args = e.get("args")
            if args:
                args = dict(args)
                v = args.get("correlation")
                if isinstance(v, int) and v >= 0:
                    args["correlation"] = v + corr_off
                for k, off in id_offs.items():
                    v = args.get(k)
                    if isinstance(v, int) and v >= 0:
                        args[k] = v + off
                e["args"] = args
            append(e)
        return out


def write_large(source: Path, out: Path, target_bytes: int, gap_us: float = 1000.0,
                copies: int | None = None, meta_path: Path | None = None) -> dict:
    """Write the replicated trace to ``out`` (plain JSON); return what was written.

    What was written also goes to ``meta_path`` (default ``<out>.meta.json``).
    """
    doc = read_trace(source)
    rep = Replicator(doc, gap_us)
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    out.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    n = 0
    with open(out, "wb") as f:
        # Top-level keys first, then the event list streamed copy by copy.
        prefix = orjson.dumps(head)[:-1] + (b"," if head else b"") + b'"traceEvents":['
        f.write(prefix)
        body = orjson.dumps(rep.meta_events)[1:-1]
        f.write(body)
        written += len(prefix) + len(body)
        sep = b"," if body else b""
        while (copies is None and written < target_bytes) or (copies is not None and n < copies):
            chunk = sep + orjson.dumps(rep.copy(n))[1:-1]
            f.write(chunk)
            written += len(chunk)
            sep = b","
            n += 1
        f.write(b"]}")
        written += 2
    info = {"source": str(source), "copies": n, "bytes": written,
            "events_per_copy": len(rep.events), "meta_events": len(rep.meta_events),
            "n_events_json": n * len(rep.events) + len(rep.meta_events)}
    meta_path = meta_path or Path(str(out) + ".meta.json")
    meta_path.write_bytes(orjson.dumps(info, option=orjson.OPT_INDENT_2))
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, required=True, help="output .json path")
    ap.add_argument("--size", type=parse_size, default=parse_size("200MB"),
                    help="target uncompressed size (e.g. 54MB, 200MB, 1GB); default 200MB")
    ap.add_argument("--copies", type=int, default=None,
                    help="exact number of copies instead of a size")
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE,
                    help=f"real trace to replicate (default {DEFAULT_SOURCE.relative_to(ROOT)})")
    ap.add_argument("--gap-us", type=float, default=1000.0,
                    help="idle gap between copies, in us (default 1000)")
    args = ap.parse_args(argv)
    info = write_large(args.source, args.output, args.size, args.gap_us, args.copies)
    print(f"{args.output}: {info['bytes'] / 1e6:.1f} MB, {info['copies']} copies of "
          f"{info['events_per_copy']} events ({info['n_events_json']} JSON events)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
