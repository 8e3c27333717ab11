"""Side by side: every detector on the simulated test splits and on the real-based benchmark
(planted, natural, healthy traces), from the outputs of `benchmarks/run_real_tables.sh`.

    python benchmarks/real_tables.py --out benchmarks/results/real_tables

Reads OUT/real/eval.json (`traceap eval` on the real-based benchmark, validation and
test_unseen, with its by-source table, and the names-masked model of `--ablation` when it was
run), OUT/synth/eval.json (the generated dataset's test splits, same detectors) and, when
present, OUT/healthy/healthy_findings.json (`benchmarks/healthy_findings.py`); writes
OUT/tables.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TITLES = {"rule": "Rule", "clustering": "Clustering", "expert": "Expert rules",
          "model": "Model", "hybrid": "Hybrid"}


def pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def table(real: dict, synth: dict | None, healthy: dict | None, group: str, split: str,
          names: list[str]) -> str:
    """One row per N and detector for one real split group ("validation" or "unseen")."""
    head = ["N", "Detector", "synthetic seen", "synthetic unseen", "real planted",
            "real natural", "real all", "real trace AUC (max)",
            "medium/high findings per healthy trace", "flagged windows, healthy"]
    if healthy is None:   # findings come from benchmarks/healthy_findings.py only
        head.remove("medium/high findings per healthy trace")
    lines = ["| " + " | ".join(head) + " |", "|---:|---|" + "---:|" * (len(head) - 2)]
    for n in real["windows"]:
        for d in names:
            by = real.get("by_source", {}).get(str(n), {}).get(d, {}).get(group)
            if by is None:
                continue
            # the synthetic test splits beside the real test split only
            det = (synth or {}).get("detection", {}).get(str(n), {}).get(d, {}) \
                if group == "unseen" else {}
            h = (healthy or {}).get(f"{d}|{n}|{split}")
            lines.append("| " + " | ".join([
                str(n), TITLES.get(d, d), pct(det.get("seen", {}).get("avg")),
                pct(det.get("unseen", {}).get("avg")), pct(by["injected"]["auc"]),
                pct(by["natural"]["auc"]), pct(by["all"]["auc"]), pct(by["trace_auc_max"])]
                + ([] if healthy is None else
                   ["–" if h is None else f"{h['medium_high_findings_per_trace']:.2f}"])
                + [pct(by["healthy"]["flagged_share"])]) + " |")
    return "\n".join(lines)


def ablation(real: dict | None, synth: dict | None) -> str:
    """The shipped model vs its names-masked twin (`model[names_masked]`): real validation /
    test (planted, natural, healthy flagged) and synthetic seen / unseen, per N."""
    if real is None or not real.get("ablation"):
        return ""
    head = ["N", "Variant", "real val. all", "real val. flagged healthy", "real test planted",
            "real test natural", "real test flagged healthy", "synthetic seen", "synthetic unseen"]
    lines = ["| " + " | ".join(head) + " |", "|---:|---|" + "---:|" * (len(head) - 2)]
    for n in real["windows"]:
        for v in [d for d in ("model",) if d in real["detectors"]] + real["ablation"]:
            by = real["by_source"][str(n)][v]
            val, test = by.get("validation", {}), by.get("unseen", {})
            det = (synth or {}).get("detection", {}).get(str(n), {}).get(v, {})
            lines.append("| " + " | ".join([
                str(n), f"`{v}`", pct(val.get("all", {}).get("auc")),
                pct(val.get("healthy", {}).get("flagged_share")),
                pct(test.get("injected", {}).get("auc")), pct(test.get("natural", {}).get("auc")),
                pct(test.get("healthy", {}).get("flagged_share")),
                pct(det.get("seen", {}).get("avg")), pct(det.get("unseen", {}).get("avg"))]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/real_tables"))
    args = ap.parse_args(argv)
    real = load(args.out / "real" / "eval.json")
    if real is None:
        raise SystemExit(f"{args.out}/real/eval.json: run benchmarks/run_real_tables.sh first")
    synth = load(args.out / "synth" / "eval.json")
    healthy = load(args.out / "healthy" / "healthy_findings.json")
    names = [d for d in ("rule", "clustering", "expert", "model", "hybrid") if d in real["detectors"]]
    parts = [f"Real-based benchmark `{Path(real['dataset']).name}` at commit `{real.get('commit')}`"
             + (f"; synthetic `{Path(synth['dataset']).name}` at `{synth.get('commit')}`" if synth else "")
             + ".  Window AUC (%) pooled over the windows of each group; planted = traces with "
             "an anti-pattern planted by `traceap inject`, natural = unmodified traces (healthy "
             "or with natural anomalies); trace AUC = good vs bad by the max window score; "
             "findings = medium- or high-severity findings of `traceap analyze` on healthy "
             "(unmodified, good) traces; flagged = share of their windows flagged."]
    for group, split, title in (("unseen", "test_unseen", "Test (`test_unseen`, reported only)"),
                                ("validation", "validation", "Validation (every choice made here)")):
        if any(group in real["by_source"][str(n)][names[0]] for n in real["windows"]):
            parts += [f"### {title}", table(real, synth, healthy, group, split, names)]
    abl = ablation(real, synth)
    if abl:
        parts += ["### Names masked (shortcut check)", "The shipped model scored with every "
                  "event name hidden (`traceap ship model --names-masked-out`: the same "
                  "weights, config `names_masked`), beside the model as shipped.", abl]
    (args.out / "tables.md").write_text("\n\n".join(parts) + "\n")
    print("\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
