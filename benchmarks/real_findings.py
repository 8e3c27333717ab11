"""Medium/high findings `traceap analyze` reports on real traces, natural cases told from false alarms.

    nice .venv/bin/python benchmarks/real_findings.py ../shared/traces examples \
        [--detector hybrid] [--windows 100] [--out DIR]

Runs the whole pipeline (`traceap.analysis.analyze`, the detector's default classifier) on every
trace of the given files/folders and lists each finding of severity medium or high.  A trace's natural labels are
those `traceap label` / `traceap inject` give its unmodified copy (`inject.natural_labels`, at
the reporting cut): a finding whose pattern is among them is a natural case, one that is not is
counted as a false alarm, and a trace with no natural label is healthy (issue 34's target:
<= 0.3 medium/high findings per healthy trace).  Traces without GPU work are left out.
Writes DIR/real_findings.json (one row per trace) when --out is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from traceap.analysis import analyze  # noqa: E402
from traceap.errors import TraceapError  # noqa: E402
from traceap.inject.natural import natural_labels  # noqa: E402
from traceap.load import find_traces, load  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--detector", default="hybrid")
    ap.add_argument("--windows", type=int, default=100)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    paths = find_traces(args.traces)
    rows = []
    t0 = time.time()
    for p in paths:
        try:
            t = load(p)
        except TraceapError as err:
            print(f"  skipped {p.name}: {err}")
            continue
        if not t.has_gpu:
            continue
        a = analyze(t, args.windows, detector=args.detector)
        labels = sorted({x for _, _, x in natural_labels(t).anomalies})
        found = [{"pattern": f.pattern, "severity": f.severity,
                  "gain_pct": None if f.gain_pct is None else round(float(f.gain_pct), 2)}
                 for f in a.findings if f.severity in ("medium", "high")]
        for f in found:
            f["natural"] = f["pattern"] in labels
        rows.append({"trace": str(p), "natural_labels": labels, "findings": found})
        tag = "natural " + ",".join(labels) if labels else "healthy"
        txt = ", ".join(f"{f['pattern']} {f['severity']} {f['gain_pct']}%"
                        + (" (natural)" if f["natural"] else " (FALSE ALARM)") for f in found)
        print(f"{p.parent.name}/{p.name}  [{tag}]  {txt or '-'}", flush=True)
    healthy = [r for r in rows if not r["natural_labels"]]
    n_false = sum(1 for r in rows for f in r["findings"] if not f["natural"])
    print(f"\n{len(rows)} traces ({time.time() - t0:.0f} s), detector {args.detector}, "
          f"N = {args.windows}")
    if healthy:
        per = sum(len(r["findings"]) for r in healthy) / len(healthy)
        print(f"healthy (no natural label): {len(healthy)} traces, {per:.2f} medium/high "
              f"findings per trace")
    print(f"all {len(rows)} traces: {sum(len(r['findings']) for r in rows) / max(len(rows), 1):.2f} "
          f"medium/high findings per trace; findings outside a trace's natural labels: {n_false}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "real_findings.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
