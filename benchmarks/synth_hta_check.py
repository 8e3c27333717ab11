"""Do generated traces load in Holistic Trace Analysis?  Run in a throwaway venv, never ours:

    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install HolisticTraceAnalysis
    /tmp/hta-venv/bin/python benchmarks/synth_hta_check.py datasets/torchtraceap [--limit N]

Each job (all ranks of a multi-GPU job together, as HTA wants) is copied into a temporary
folder and opened with `hta.trace_analysis.TraceAnalysis`; then the temporal breakdown (and,
for multi-rank jobs, the communication/computation overlap) is computed.  Single-GPU traces
carry no `distributedInfo`, as torch.profiler writes them without torch.distributed; HTA then
assumes rank 0.  Prints one line per failure and a summary; exit 1 when any job fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--limit", type=int, default=0, help="check at most N jobs (0 = all)")
    args = ap.parse_args()

    import logging

    logging.disable(logging.WARNING)       # HTA logs every file it parses
    from hta.trace_analysis import TraceAnalysis

    root = Path(args.dataset)
    jobs: dict[str, list[dict]] = defaultdict(list)
    for line in (root / "manifest.jsonl").read_text().splitlines():
        if line.strip():
            e = json.loads(line)
            jobs[e.get("job") or e["id"]].append(e)
    names = sorted(jobs)
    if args.limit:
        step = max(1, len(names) // args.limit)
        names = names[::step][: args.limit]
    ok = fail = 0
    t0 = time.time()
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            for e in jobs[name]:
                shutil.copy(root / e["path"], Path(tmp) / f"rank{e['rank']}.json.gz")
            try:
                ta = TraceAnalysis(trace_dir=tmp)
                tb = ta.get_temporal_breakdown(visualize=False)
                if len(tb) != len(jobs[name]):
                    raise RuntimeError(f"temporal breakdown has {len(tb)} rows for "
                                       f"{len(jobs[name])} ranks")
                if len(jobs[name]) > 1:
                    ta.get_comm_comp_overlap(visualize=False)
                ok += 1
            except Exception as exc:  # noqa: BLE001 - report every failure, keep going
                fail += 1
                print(f"FAIL {name}: {type(exc).__name__}: {exc}")
                traceback.print_exc(limit=2)
    n_traces = sum(len(jobs[n]) for n in names)
    print(f"HTA TraceAnalysis: {ok}/{ok + fail} jobs ({n_traces} traces) loaded and analysed "
          f"in {time.time() - t0:.0f} s")
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
