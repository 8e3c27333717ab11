"""The fold table of docs/RESULTS.md from a fold eval's eval.json (N = 100), cell for cell.

    python benchmarks/fold_table.py benchmarks/results/real_folds/ensemble_e8/eval.json

Prints the summary table (per fold and pooled; rules / model / hybrid) and the pooled
per-pattern table, as docs/RESULTS.md shows them (tests/test_folds.py checks the rows it reads
against the committed eval.json), so a rerun of the fold eval updates the document by copy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FOLDS = ("hta_param", "tracelens_zoology", "particle_kineto")
DETS = ("expert", "model", "hybrid")


def pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def main(argv=None) -> int:
    s = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    cols = [s["folds"][f]["eval"] for f in FOLDS] + [s["pooled"]]

    def src(e, d):
        return e["by_source"]["100"][d]["unseen"]

    def triple(get, suffix=""):
        return [" / ".join(pct(get(e, d)) for d in DETS) + suffix for e in cols]

    def nat(e, d):
        return src(e, d)["natural"]["auc"] if src(e, d).get("natural") else None

    def below(e):
        bp = e["by_pattern"]["100"]
        return sum(1 for p, v in bp["hybrid"].items()
                   if v.get("auc") is not None and bp["expert"][p].get("auc") is not None
                   and round(100 * v["auc"], 1) < round(100 * bp["expert"][p]["auc"], 1))

    rows = [
        ("window AUC", triple(lambda e, d: src(e, d)["all"]["auc"])),
        ("trace AUC (max)", triple(lambda e, d: src(e, d)["trace_auc_max"])),
        ("natural traces, window AUC", triple(nat)),
        ("cpu_bound", triple(lambda e, d: e["by_pattern"]["100"][d]["cpu_bound"]["auc"])),
        ("healthy windows flagged",
         triple(lambda e, d: src(e, d)["healthy"]["flagged_share"], "%")),
        ("patterns where the hybrid is below the rules",
         [str(below(e)) for e in cols[:-1]] + [f"{below(cols[-1])} of 16"]),
    ]
    fl = [e["classification"]["offline"]["100"]["flagged"] for e in cols]
    rows += [
        ("pattern accuracy on the planted windows the hybrid flags (offline): the planted "
         "pattern named", [pct(f["planted"]["overall"]) for f in fl]),
        ("pattern accuracy where the hybrid flags (offline), strict / either cause",
         [f"{pct(f['overall'])} / {pct(f['overall_any'])}" for f in fl]),
        ("pattern accuracy, every anomalous window (offline)",
         [pct(e["classification"]["offline"]["100"]["overall"]) for e in cols]),
    ]
    print("| N = 100, rules / model / hybrid | " + " | ".join(FOLDS) + " | pooled |")
    print("|---|---:|---:|---:|---:|")
    for title, cells in rows:
        cells = [c.replace("– / – / –", "–") for c in cells]
        print(f"| {title} | " + " | ".join(cells) + " |")
    print()
    e = s["pooled"]
    bp = e["by_pattern"]["100"]
    f = e["classification"]["offline"]["100"]["flagged"]
    print("| pattern (windows) | rules | model | hybrid | planted: named the plant "
          "| strict / either |")
    print("|---|---:|---:|---:|---:|---:|")
    for p, v in bp["hybrid"].items():
        pl = f["planted"]["by_pattern"].get(p, {})
        st = f["by_pattern"].get(p, {})
        print(f"| `{p}` ({v['n_windows']}) | {pct(bp['expert'][p]['auc'])} | "
              f"{pct(bp['model'][p]['auc'])} | {pct(v['auc'])} | "
              f"{pct(pl.get('accuracy'))} ({pl.get('n_windows', 0)}) | "
              f"{pct(st.get('accuracy'))} / {pct(st.get('accuracy_any'))} "
              f"({st.get('n_windows', 0)}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
