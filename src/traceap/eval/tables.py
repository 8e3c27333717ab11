"""The evaluation summary as Markdown tables (the paper's layout) and as JSON.

Both render `EvalResult.summary` (schema traceap.eval/v1), so the Markdown in the results pages and
the JSON a script reads always hold the same numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import orjson

from ..outputs import Claim, Owner, claim
from ..patterns import get_pattern, is_pattern
from .metrics import NO_PATTERN

TASK_TITLES = {
    "image_classification": "Image Classification",
    "object_detection": "Object Detection",
    "image_segmentation": "Image Segmentation",
    "image_generation": "Image Generation",
    "depth_estimation": "Depth Estimation",
    "pose_estimation": "Pose Estimation",
    "action_recognition": "Action Recognition",
    "other": "Other",
}
DETECTOR_TITLES = {"rule": "Rule", "clustering": "Clustering", "expert": "Expert rules",
                   "model": "Model (ours)", "llm": "Pure LLM"}
GROUP_TITLES = {"seen": "Seen", "unseen": "Unseen", "train": "Train", "validation": "Validation"}


def pct(x: float | None, digits: int = 2) -> str:
    """A fraction as a percentage with fixed digits; "–" when undefined."""
    return "–" if x is None else f"{100.0 * x:.{digits}f}"


def num(x: float | None, digits: int = 2) -> str:
    """A plain number with fixed digits; "–" when undefined."""
    return "–" if x is None else f"{x:.{digits}f}"


def pattern_short(pattern: str) -> str:
    """A pattern's short column name for the confusion matrix (`AntiPattern.short`); "none"
    for no pattern, the id itself for one no longer registered."""
    if pattern == NO_PATTERN:
        return "none"
    return get_pattern(pattern).short if is_pattern(pattern) else pattern


def _title(name: str, titles: dict[str, str]) -> str:
    return titles.get(name, name)


def _table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = [{"r": "---:", "c": ":---:"}.get(a, "---") for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def detection_table(s: dict, names: list[str] | None = None) -> str:
    """Table 3: window-level AUC-ROC (%) per task with seen and unseen averages, per N."""
    names = s["detectors"] if names is None else names
    header = ["N<sub>w</sub>", "Detector"]
    for group, tasks in s["tasks"].items():
        header += [_title(t, TASK_TITLES) for t in tasks] + [f"{GROUP_TITLES[group]} avg"]
    rows = []
    for n in s["windows"]:
        for d in names:
            det = s["detection"][str(n)][d]
            row = [str(n), _title(d, DETECTOR_TITLES)]
            for group, tasks in s["tasks"].items():
                row += [pct(det[group]["tasks"][t]) for t in tasks] + [f"**{pct(det[group]['avg'])}**"]
            rows.append(row)
    return _table(header, rows, ["r", "l"] + ["r"] * (len(header) - 2))


def classification_table(s: dict, classifier: str) -> str:
    """Table 4: pattern accuracy (%) per task on truly anomalous windows, per N."""
    c = s["classification"][classifier]
    ns = [str(n) for n in s["windows"]]
    header = ["Task"] + [f"N<sub>w</sub> = {n}" for n in ns]
    tasks = list(c[ns[0]]["tasks"])
    rows = []
    for t in tasks:
        base, _, group = t.partition(" (")
        label = _title(base, TASK_TITLES) + (f" ({group}" if group else "")
        rows.append([label] + [f"{pct(c[n]['tasks'][t]['accuracy'])} "
                               f"({c[n]['tasks'][t]['n_windows']})" for n in ns])
    rows.append(["**Avg** (over tasks)"] + [f"**{pct(c[n]['avg'])}**" for n in ns])
    rows.append(["All windows"] + [pct(c[n]["overall"]) for n in ns])
    return _table(header, rows)


def flagged_detector(c: dict) -> str | None:
    """The detector whose flags a classifier's `flagged` accuracy counts (None: no detector
    scored, or a summary written before the key)."""
    return next((v["flagged"]["detector"] for v in c.values() if v.get("flagged")), None)


def _accuracy_cell(x: dict | None, key: str = "accuracy") -> str:
    """"accuracy (windows)" of a by_pattern row (key "overall": of a `flagged` object); with
    the either-cause accuracy beside it where the row has one: "strict / any (windows)"."""
    if not x:
        return "–"
    any_key = f"{key}_any"
    both = f"{pct(x[key], 1)} / {pct(x[any_key], 1)}" if any_key in x else pct(x[key], 1)
    return f"{both} ({x['n_windows']})"


def flagged_table(s: dict, classifier: str) -> str:
    """Pattern accuracy (%) per pattern, per N, on the truly anomalous windows the flagging
    detector flagged (what a user is told); then all flagged windows, and every anomalous
    window (the accuracy of Table 4) to compare."""
    c = s["classification"][classifier]
    ns = [str(n) for n in s["windows"]]
    header = ["Pattern"] + [f"N<sub>w</sub> = {n}" for n in ns]
    present = list(dict.fromkeys(p for n in ns for p in (c[n].get("flagged") or {}).get(
        "by_pattern", {})))
    rows = [[f"`{p}`"] + [_accuracy_cell((c[n].get("flagged") or {}).get("by_pattern", {}).get(p))
                          for n in ns] for p in present]
    rows.append(["**flagged windows**"] + [f"**{_accuracy_cell(c[n].get('flagged'), 'overall')}**"
                                           for n in ns])
    rows.append(["every anomalous window"] + [pct(c[n]["overall"], 1) for n in ns])
    return _table(header, rows)


def confusion_table(s: dict, classifier: str, n: int) -> str:
    """Confusion matrix over the eight patterns (+ "none") at window count n."""
    conf = s["classification"][classifier][str(n)]["confusion"]
    labels = conf["labels"]
    header = ["true \\ predicted"] + [pattern_short(p) for p in labels]
    rows = []
    for p, row in zip(labels, conf["matrix"]):
        if p == NO_PATTERN:
            continue
        rows.append([f"{pattern_short(p)} `{p}`"] + [f"**{v}**" if q == p and v else str(v)
                                                      for q, v in zip(labels, row)])
    return _table(header, rows)


def trace_level_table(s: dict) -> str:
    """Trace-level AUC (good vs bad, mean and max window score) and false findings."""
    groups = [g for g in s["tasks"]]
    header = ["N<sub>w</sub>", "Detector"]
    header += [f"trace AUC mean ({GROUP_TITLES[g]})" for g in groups]
    header += [f"trace AUC max ({GROUP_TITLES[g]})" for g in groups]
    header += ["false findings / healthy trace", "flagged windows / healthy trace",
               "window recall (bad)", "window precision (bad)"]
    rows = []
    for n in s["windows"]:
        for d in s["detectors"]:
            t = s["trace_level"][str(n)][d]
            row = [str(n), _title(d, DETECTOR_TITLES)]
            row += [pct(t[g]["auc_mean"]) for g in groups]
            row += [pct(t[g]["auc_max"]) for g in groups]
            row += [num(t["false_findings_per_healthy_trace"]),
                    num(t["flagged_windows_per_healthy_trace"]),
                    pct(t["window_recall_bad"], 1), pct(t["window_precision_bad"], 1)]
            rows.append(row)
    return _table(header, rows, ["r", "l"] + ["r"] * (len(header) - 2))


def source_table(s: dict) -> str:
    """The real-based benchmark by source, per split group: window AUC on planted, natural and
    all traces, trace AUC, and false alarms on healthy (unmodified, good) traces."""
    header = ["N<sub>w</sub>", "Detector", "Split", "window AUC injected", "window AUC natural",
              "window AUC all", "trace AUC (max)", "trace AUC (mean)",
              "findings / healthy trace", "flagged share (healthy)"]
    rows = []
    for n in s["windows"]:
        for d in s["detectors"] + s["ablation"]:
            for group, row in s["by_source"][str(n)][d].items():
                h = row["healthy"]
                rows.append([str(n), _title(d, DETECTOR_TITLES), GROUP_TITLES.get(group, group),
                             pct(row["injected"]["auc"]), pct(row["natural"]["auc"]),
                             pct(row["all"]["auc"]), pct(row["trace_auc_max"]),
                             pct(row["trace_auc_mean"]), num(h["findings_per_trace"]),
                             pct(h["flagged_share"], 1)])
    return _table(header, rows, ["r", "l", "l"] + ["r"] * (len(header) - 3))


ABLATION_MODULES = (("no_event_adapter", "Event adapter"), ("no_transformer", "Transformer encoder"),
                    ("no_relation", "Relation modelling"), ("names_masked", "Event names"))


def ablation_table(s: dict) -> str:
    """Table 5: seen and unseen average window AUC (%) of each model variant, per N.

    Variants named `model[<switches>]` (as `traceap eval --ablation` names them: "full" or
    the ablation switches joined by "+") get the paper's check-mark columns.
    """
    header = ["Variant"] + [title for _, title in ABLATION_MODULES]
    for n in s["windows"]:
        header += [f"Seen AUC N={n}", f"Unseen AUC N={n}"]
    rows = []
    fixed = ["l"] + ["c"] * len(ABLATION_MODULES)
    for v in s["ablation"]:
        inner = v[v.find("[") + 1:-1] if v.endswith("]") else v
        switches = set(inner.split("+"))
        known = inner == "full" or switches <= {k for k, _ in ABLATION_MODULES}
        row = [f"`{v}`"] + [("–" if k in switches else "✓") if known else "?"
                            for k, _ in ABLATION_MODULES]
        for n in s["windows"]:
            det = s["detection"][str(n)][v]
            row += [pct(det.get("seen", {}).get("avg")), pct(det.get("unseen", {}).get("avg"))]
        rows.append(row)
    return _table(header, rows, fixed + ["r"] * (len(header) - len(fixed)))


def timing_table(s: dict) -> str:
    """Mean seconds per trace spent in each detector / classifier (trace load excluded)."""
    names = s["detectors"] + s["ablation"] + s["classifiers"]
    header = ["N<sub>w</sub>"] + [_title(k, DETECTOR_TITLES) for k in names]
    rows = [[n] + [num(s["seconds_per_trace"][n].get(k), 3) for k in names]
            for n in s["seconds_per_trace"]]
    return _table(header, rows)


def _middle(ns: list[int]) -> int:
    return min(ns, key=lambda n: (abs(n - 100), n))


#: What the flagged-accuracy tables count (issue #35's target is stated on these windows).
_FLAGGED_NOTE = ("Of the truly anomalous windows, those `{det}` flags (the default detector "
                 "when it was scored, else the first one), the share the classifier names "
                 "right (a window it names no pattern counts as wrong): the accuracy a user "
                 "sees. Strict / any: the pattern covering most of the window / any pattern "
                 "overlapping it (a pattern planted into a base with a natural one gives its "
                 "windows two right answers); windows in parentheses.")

_PLANTED_NOTE = ("Of the windows `{det}` flags that a planted anomaly overlaps (issue #35's "
                 "\"pattern accuracy on flagged planted windows\"), the share the classifier "
                 "names the planted pattern / any pattern the window holds (a natural anomaly "
                 "beside the plant), per planted pattern; windows in parentheses.")


def _planted(c: dict) -> dict | None:
    """A classifier-at-N summary's `planted` object (None: nothing planted, or a summary
    written before the key)."""
    return (c.get("flagged") or {}).get("planted")


def planted_table(titles: list[str], columns: list[dict | None]) -> str:
    """Accuracy on flagged planted windows per planted pattern, one column per `planted`
    object (per N, or per fold and pooled; `titles` their headers); then all planted
    windows."""
    present = list(dict.fromkeys(p for x in columns if x for p in x["by_pattern"]))
    rows = [[f"`{p}`"] + [_accuracy_cell((x or {}).get("by_pattern", {}).get(p)) for x in columns]
            for p in present]
    rows.append(["**planted windows**"] + [f"**{_accuracy_cell(x, 'overall')}**" for x in columns])
    return _table(["Planted pattern"] + titles, rows)


def markdown(s: dict, heading: str = "##") -> str:
    """Every table of the summary as one Markdown document (sub-headings at `heading`)."""
    h = heading
    counts = ", ".join(f"{GROUP_TITLES[g]}: {c['good']} good + {c['bad']} bad"
                       for g, c in s["n_traces"].items())
    parts = [f"Dataset `{Path(s['dataset']).name}` — test traces {counts}"
             + (f" (at most {s['limit']} per split)" if s.get("limit") else "")
             + (f"; detectors fitted on {max(s['n_fit_traces'].values())} train traces "
                f"({', '.join(s['n_fit_traces'])})" if s["n_fit_traces"] else "") + "."
             + (f" Commit `{s['commit']}`." if s.get("commit") else "")
             + (f" Command: `{s['command']}`." if s.get("command") else "")]
    if s["detectors"]:
        parts += [f"{h} Window-level detection, AUC-ROC (%) (paper Table 3)",
                  "A window is positive when it overlaps a labelled anomaly interval; "
                  "AUC over the pooled windows of each task's test traces; Avg = mean over tasks.",
                  detection_table(s)]
        for d, f in (s.get("detector_failures") or {}).items():
            parts.append(f"**{_title(d, DETECTOR_TITLES)}: {f['note']}**; its AUC counts "
                         f"those windows as scored 0.")
        parts += [f"{h} Trace level: good vs bad, and false findings on healthy traces",
                  f"Trace score = mean or max of its window scores.  A window is flagged at score "
                  f">= {s['threshold']} (or the detector's own threshold); a finding is a run of "
                  f"consecutive flagged windows.",
                  trace_level_table(s)]
    if s.get("by_source"):
        parts += [f"{h} By source (real-based benchmark)",
                  "Window AUC (%) on planted (`injected`) traces, on unmodified (`natural`) "
                  "traces and on all; trace AUC (%) good vs bad; on healthy traces (unmodified "
                  "and good): findings (runs of flagged windows) per trace and the share of "
                  "windows flagged.",
                  source_table(s)]
    for c in s["classifiers"]:
        m = _middle(s["windows"])
        parts += [f"{h} Pattern classification accuracy (%) of the `{c}` classifier (paper Table 4)",
                  "On truly anomalous windows (true pattern = the anomaly covering most of the "
                  "window); the number of windows in parentheses.",
                  classification_table(s, c)]
        src = s["classification"][c][str(m)].get("sources", {})
        if any("llm" in k or "fallback" in k for k in src):   # an LLM may have fallen back
            parts.append(f"Who answered (N<sub>w</sub> = {m}): " + ", ".join(
                f"{k} {v}" for k, v in src.items()) + " windows.")
        parts += [f"Confusion matrix (windows, N<sub>w</sub> = {m}; rows true, columns "
                  f"predicted; `none` = no pattern named):", confusion_table(s, c, m)]
        det = flagged_detector(s["classification"][c])
        if det is not None:
            parts += [f"{h} Pattern accuracy (%) of the `{c}` classifier on windows `{det}` flags",
                      _FLAGGED_NOTE.format(det=det), flagged_table(s, c)]
            planted = [_planted(s["classification"][c][str(n)]) for n in s["windows"]]
            if any(planted):
                parts += [f"{h} Pattern accuracy (%) of the `{c}` classifier on planted windows "
                          f"`{det}` flags", _PLANTED_NOTE.format(det=det),
                          planted_table([f"N<sub>w</sub> = {n}" for n in s["windows"]],
                                        planted)]
    if s["ablation"]:
        parts += [f"{h} Ablation of the model (paper Table 5)",
                  "Average window AUC over seen and unseen tasks, per variant checkpoint.",
                  ablation_table(s)]
    if s["seconds_per_trace"]:
        parts += [f"{h} Time per trace (s; scoring only, trace load excluded)", timing_table(s)]
    for w in s["warnings"][:20]:
        parts.append(f"- warning: {w}")
    return "\n\n".join(parts) + "\n"


def _fold_columns(f: dict) -> list[tuple[str, dict]]:
    """(column title, eval summary) per held-out fold, then the pooled one."""
    return [(name, fold["eval"]) for name, fold in f["folds"].items()] + [("pooled", f["pooled"])]


def fold_pattern_table(f: dict, n: int, detector: str) -> str:
    """One detector's window AUC (%) per pattern, per held-out fold and pooled; then all
    windows, planted and natural traces, trace AUC and the flagged share of healthy windows."""
    cols = _fold_columns(f)
    present = [p for p in f["pooled"]["by_pattern"][str(n)][detector]]
    header = ["Pattern"] + [c for c, _ in cols]
    rows = []
    for p in present:
        cells = []
        for _, s in cols:
            x = s["by_pattern"][str(n)][detector].get(p)
            cells.append("–" if x is None else f"{pct(x['auc'], 1)} ({x['n_windows']})")
        rows.append([f"`{p}`"] + cells)

    def by_source(s: dict) -> dict:
        return s["by_source"].get(str(n), {}).get(detector, {}).get("unseen", {})
    rows.append(["**all windows**"] + [f"**{pct(by_source(s).get('all', {}).get('auc'), 1)}**"
                                       for _, s in cols])
    for key, title in (("injected", "planted traces"), ("natural", "natural traces")):
        rows.append([title] + [pct(by_source(s).get(key, {}).get("auc"), 1) for _, s in cols])
    rows.append(["trace AUC (max)"] + [pct(by_source(s).get("trace_auc_max"), 1)
                                       for _, s in cols])
    rows.append(["healthy windows flagged"] + [
        pct((by_source(s).get("healthy") or {}).get("flagged_share"), 1) for _, s in cols])
    return _table(header, rows)


def fold_accuracy_table(f: dict, n: int, classifier: str) -> str:
    """A classifier's pattern accuracy (%) on truly anomalous windows per pattern, per
    held-out fold and pooled."""
    cols = _fold_columns(f)
    pooled = f["pooled"]["classification"][classifier][str(n)]
    header = ["Pattern"] + [c for c, _ in cols]
    rows = [[f"`{p}`"] + [_accuracy_cell(s["classification"][classifier][str(n)]["by_pattern"]
                                         .get(p)) for _, s in cols]
            for p in pooled["by_pattern"]]
    rows.append(["**all windows**"] + [
        f"**{pct(s['classification'][classifier][str(n)]['overall'], 1)}**" for _, s in cols])
    return _table(header, rows)


def fold_flagged_table(f: dict, n: int, classifier: str) -> str:
    """A classifier's pattern accuracy (%) on the truly anomalous windows the flagging
    detector flagged, per pattern, per held-out fold and pooled."""
    cols = _fold_columns(f)

    def flagged(s: dict) -> dict:
        return s["classification"][classifier][str(n)].get("flagged") or {}
    header = ["Pattern"] + [c for c, _ in cols]
    rows = [[f"`{p}`"] + [_accuracy_cell(flagged(s).get("by_pattern", {}).get(p))
                          for _, s in cols]
            for p in flagged(f["pooled"]).get("by_pattern", {})]
    rows.append(["**flagged windows**"] + [f"**{_accuracy_cell(flagged(s), 'overall')}**"
                                           for _, s in cols])
    return _table(header, rows)


def folds_markdown(f: dict, heading: str = "##") -> str:
    """`traceap eval --folds`: per held-out fold and pooled, per pattern, per detector."""
    h = heading
    pooled = f["pooled"]
    parts = [f"Dataset `{Path(f['dataset']).name}`, folds of `{f['plan']}`: each fold's traces "
             f"scored by that fold's detectors (fitted without it); pooled = every trace once."
             + (f" Commit `{f['commit']}`." if f.get("commit") else "")
             + (f" Command: `{f['command']}`." if f.get("command") else "")]
    parts.append(_table(["Fold", "bases", "traces"],
                        [[name, str(len(x["bases"])), str(x["n_traces"])]
                         for name, x in f["folds"].items()]))
    for n in pooled["windows"]:
        for d in pooled["detectors"]:
            parts += [f"{h} {_title(d, DETECTOR_TITLES)}: window AUC (%) per pattern, "
                      f"N<sub>w</sub> = {n}",
                      "Each pattern's windows against every clean window of the same traces "
                      "(windows in parentheses).", fold_pattern_table(f, n, d)]
        for c in pooled["classifiers"]:
            parts += [f"{h} Pattern accuracy (%) of the `{c}` classifier, N<sub>w</sub> = {n}",
                      "On truly anomalous windows; windows in parentheses.",
                      fold_accuracy_table(f, n, c)]
            det = flagged_detector(pooled["classification"][c])
            if det is not None:
                parts += [f"{h} Pattern accuracy (%) of the `{c}` classifier on windows "
                          f"`{det}` flags, N<sub>w</sub> = {n}", _FLAGGED_NOTE.format(det=det),
                          fold_flagged_table(f, n, c)]
                planted = [_planted(x["classification"][c][str(n)]) for _, x in _fold_columns(f)]
                if any(planted):
                    parts += [f"{h} Pattern accuracy (%) of the `{c}` classifier on planted "
                              f"windows `{det}` flags, N<sub>w</sub> = {n}",
                              _PLANTED_NOTE.format(det=det),
                              planted_table([t for t, _ in _fold_columns(f)], planted)]
    for w in (f.get("warnings") or [])[:20]:
        parts.append(f"- warning: {w}")
    return "\n\n".join(parts) + "\n"


#: What owns the files of an `eval --out` folder (traceap.outputs): every rerun replaces
#: them (a results folder is rewritten as the code changes); the folder may hold anything
#: else (other eval runs in subfolders), and a file eval did not write is never replaced.
OWNER = Owner("eval", ".traceap-eval.json", "traceap.eval-out/v1", rerun="any", foreign_ok=True)


def out_files(windows: tuple[int, ...], n_plot: int) -> list[str]:
    """The files `traceap eval --out` writes for these window counts."""
    return (["eval.md", "eval.json", "scores.jsonl"] + [f"roc_N{n}.png" for n in windows]
            + [f"timelines_N{n_plot}.png"])


def _legacy_eval_files(planned: list[str]):
    """An eval output written before the stamp (eval.json of schema traceap.eval/v1): its
    files that this run rewrites (nothing else of it is removed: unlisted, unknown)."""
    def files(out: Path) -> set[str] | None:
        try:
            old = orjson.loads((out / "eval.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        if not isinstance(old, dict) or old.get("schema") != "traceap.eval/v1":
            return None
        return {f for f in planned if (out / f).is_file()}
    return files


def prepare_out(out: str | os.PathLike, windows: tuple[int, ...], n_plot: int) -> Claim:
    """Check `out` before the evaluation (one OutputError line, nothing written)."""
    planned = out_files(windows, n_plot)
    return claim(out, OWNER, None, planned, legacy=_legacy_eval_files(planned))


def write(s: dict, out: str | os.PathLike,
          render: Callable[[dict], str] | None = None) -> tuple[Path, Path]:
    """Write OUT/eval.md (`render`, default `markdown`; `folds_markdown` for --folds) and
    OUT/eval.json; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "eval.md"
    js = out / "eval.json"
    md.write_text((render or markdown)(s), encoding="utf-8")
    js.write_bytes(orjson.dumps(s, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return md, js


__all__ = ["OWNER", "fold_accuracy_table", "fold_flagged_table", "flagged_detector",
           "flagged_table", "fold_pattern_table", "folds_markdown", "pattern_short", "out_files", "prepare_out", "TASK_TITLES", "ablation_table", "classification_table", "source_table",
           "planted_table",
           "confusion_table", "detection_table", "markdown", "pct", "timing_table",
           "trace_level_table", "write"]
