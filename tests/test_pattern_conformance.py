"""Every registered anti-pattern has every piece, checked one piece per test (the spirit of
scikit-learn's `check_estimator`): a pattern that lacks one fails the test named
`test_pattern_piece[<pattern>-<piece>]`, whose message names the pattern and the piece.

The toy-pattern tests register `tests/toy_pattern.py` (one module, nothing else edited) and
find it in the terminal report, the HTML, the analysis JSON, the eval tables, the LLM prompt
and `traceap inject --help`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import traceap
import traceap.inject  # noqa: F401 - registers the inject pieces
import traceap.inject.natural  # noqa: F401 - registers the label pieces
from traceap import idle
from traceap.patterns import BUILTIN, BusyInefficient, IdleCause, NotApplicable, pattern_ids, \
    patterns
from traceap.patterns._registry import PIECES, MissingPiece, piece_of
from traceap.patterns.base import AntiPattern
from traceap.windows import Windows

from . import toy_pattern
from .conftest import CNN, REPO

HEX = re.compile(r"^#[0-9A-Fa-f]{6}$")
#: Idle mechanisms no pattern may claim: one-off start-up and what nothing explains.
UNCLAIMABLE = {"warmup", "not_explained"}


def _one_line(text) -> bool:
    return isinstance(text, str) and bool(text.strip()) and "\n" not in text


def _others(rule, attr: str) -> list:
    return [getattr(p, attr) for p in patterns() if p.id != rule.id]


def _overridden(rule, method: str) -> bool:
    return getattr(type(rule), method) is not getattr(AntiPattern, method)


def _run_rule(rule) -> str | None:
    """measure / describe / evidence / proof_events on a real trace: what is wrong, or None."""
    w = Windows(_trace(), 50)
    m = rule.measures(w)
    for key in ("score", "lost_us"):
        if np.shape(m.get(key)) != (w.n,):
            return f"measure must return per-window {key!r} (shape ({w.n},))"
    text, numbers = rule.describe(w, np.arange(w.n), m)
    if not (_one_line(text) and isinstance(numbers, dict)):
        return "describe must return (one-line sentence, dict of numbers)"
    json.dumps(numbers)  # the numbers go to the analysis JSON
    caption, rows = rule.proof_events(w.trace, [(w.edges[0], w.edges[-1])], 5)
    if not (_one_line(caption) and isinstance(rows, list)):
        return "proof_events must return (caption, rows)"
    return None


_TRACE = []


def _trace():
    if not _TRACE:
        _TRACE.append(traceap.load(CNN))
    return _TRACE[0]


def _piece(piece: str):
    def check(rule) -> str | None:
        try:
            value = piece_of(piece, rule.id)
        except MissingPiece as e:
            return str(e)
        if isinstance(value, NotApplicable):
            return None if _one_line(value.reason) else "NotApplicable needs a one-line reason"
        return None if callable(value) else f"the {piece} piece must be callable"
    return check


def _account(rule) -> str | None:
    a = rule.account
    if isinstance(a, BusyInefficient):
        return None
    if not isinstance(a, IdleCause):
        return "set account = IdleCause(mechanism) or BusyInefficient()"
    if a.mechanism not in idle.MECHANISM_IDS or a.mechanism in UNCLAIMABLE:
        claimable = [m for m in idle.MECHANISM_IDS if m not in UNCLAIMABLE]
        return f"IdleCause({a.mechanism!r}) is not a mechanism of traceap.idle ({claimable})"
    if a.mechanism in [o.mechanism for o in _others(rule, "account") if isinstance(o, IdleCause)]:
        return f"another pattern already accounts for idle mechanism {a.mechanism!r}"
    return None


#: piece -> check(rule) returning what is wrong, or None.
CHECKS = {
    "id": lambda r: None if isinstance(r.id, str) and re.fullmatch(r"[a-z][a-z0-9_]*", r.id)
    else "id must be snake_case",
    "title": lambda r: None if _one_line(r.title) else "title must be one non-empty line",
    "mechanism": lambda r: None if _one_line(r.mechanism) else "mechanism: one sentence, one line",
    "fix": lambda r: None if isinstance(r.fix, str) and r.fix.strip() else "fix is empty",
    "letter": lambda r: ("letter must be one capital letter" if not re.fullmatch(r"[A-Z]", r.letter or "")
                         else f"letter {r.letter!r} is taken" if r.letter in _others(r, "letter")
                         else None),
    "color": lambda r: ("color must be '#RRGGBB'" if not HEX.match(r.color or "")
                        else f"color {r.color} is taken" if r.color.lower() in
                        [c.lower() for c in _others(r, "color")] else None),
    "terminal_color": lambda r: None if r.terminal_color is None or HEX.match(r.terminal_color)
    else "terminal_color must be None or '#RRGGBB'",
    "short": lambda r: ("short must be 2-4 capitals" if not re.fullmatch(r"[A-Z]{2,4}", r.short or "")
                        else f"short {r.short!r} is taken" if r.short in _others(r, "short")
                        else None),
    "signature": lambda r: None if isinstance(r.signature, str) and len(r.signature) > 20
    else "signature: what the pattern looks like in a window, for the LLM",
    "account": _account,
    "measure/describe": lambda r: (None if _overridden(r, "measure") and _overridden(r, "describe")
                                   else "implement measure and describe"),
    "measure/describe/proof_events on a real trace": _run_rule,
    **{p: _piece(p) for p in PIECES},
}


def problems(rule) -> dict[str, str]:
    """piece -> what is wrong with it (empty when the pattern conforms)."""
    out = {}
    for piece, check in CHECKS.items():
        try:
            wrong = check(rule)
        except Exception as e:  # a piece that crashes is a broken piece
            wrong = f"{type(e).__name__}: {e}"
        if wrong:
            out[piece] = wrong
    return out


@pytest.mark.parametrize("pattern", pattern_ids())
@pytest.mark.parametrize("piece", list(CHECKS))
def test_pattern_piece(pattern, piece):
    rule = traceap.patterns.get_pattern(pattern)
    wrong = problems(rule).get(piece)
    assert wrong is None, f"pattern {pattern!r}, piece {piece!r}: {wrong}"


def test_builtin_patterns_are_registered_in_order():
    assert pattern_ids()[:len(BUILTIN)] == BUILTIN
    for pid in BUILTIN:  # module name == pattern id
        assert sys.modules[f"traceap.patterns.{pid}"].PATTERN.id == pid


def test_the_shared_piece_tables_name_registered_patterns():
    # The simulator's switches and the recorder's causes are optional pieces kept in shared
    # modules; an id there that no pattern registers is a stale or misspelt one.
    from traceap.collect import causes
    from traceap.synth import switches

    for name, ids in [("synth.switches.TABLE2_WEIGHTS", switches.TABLE2_WEIGHTS),
                      ("synth.switches.MULTI_GPU", switches.MULTI_GPU),
                      ("collect.causes.GPU_ONLY", causes.GPU_ONLY),
                      ("collect.causes.DISTRIBUTED", causes.DISTRIBUTED)]:
        assert set(ids) <= set(pattern_ids()), f"{name} names unregistered ids"


def test_a_pattern_missing_a_piece_is_named():
    class Half(toy_pattern.ToyPattern):
        id = "half_pattern"
        letter = ""
        color = toy_pattern.ToyPattern.color
        account = IdleCause("data_loading")  # already single_process_dataloading's

    wrong = problems(Half())
    assert set(wrong) == {"letter", "account", "inject", "label"}, wrong
    assert "half_pattern" in wrong["inject"] and "'inject'" in wrong["inject"]
    assert "single" not in wrong["account"] and "data_loading" in wrong["account"]


def test_a_piece_registered_twice_is_refused(toy):
    from traceap.patterns import register_piece

    register_piece("inject", toy.id, NotApplicable("a toy has no mechanism to plant"))  # same
    with pytest.raises(ValueError, match="registered twice"):
        register_piece("inject", toy.id, lambda base, rng: None)


# -- the toy pattern: one module, every output --------------------------------------------------
@pytest.fixture
def toy():
    rule = toy_pattern.register()
    try:
        yield rule
    finally:
        toy_pattern.unregister()
    assert toy_pattern.ID not in pattern_ids()


def test_the_toy_pattern_conforms(toy):
    assert problems(toy) == {}


def test_the_toy_pattern_reaches_the_llm_prompt_and_the_eval_tables(toy):
    from traceap.eval import metrics, tables
    from traceap.llm.prompt import answer_schema, parse_answer, score_system, system_prompt

    assert f"- toy_pattern: {toy.signature}" in system_prompt()
    assert toy.signature in score_system()
    assert "toy_pattern" in answer_schema()["properties"]["pattern"]["enum"]
    assert parse_answer('{"evidence": "x", "pattern": "toy pattern", "confidence": 0.5, '
                        '"false_alarm": false, "fix": "y"}').pattern == "toy_pattern"
    labels = [*pattern_ids(), metrics.NO_PATTERN]
    matrix = np.eye(len(labels), dtype=int).tolist()
    summary = {"classification": {"offline": {"100": {"confusion": {"labels": labels,
                                                                    "matrix": matrix}}}}}
    table = tables.confusion_table(summary, "offline", 100)
    assert "| TOY `toy_pattern` |" in table and " TOY |" in table.splitlines()[0] + " "


def _cli_with_toy(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`traceap ARGS` in a fresh process that registered the toy pattern first."""
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import toy_pattern; "
              "toy_pattern.register(); from traceap.cli import main; "
              "sys.argv = ['traceap', *sys.argv[2:]]; main()")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-c", script, str(REPO / "tests"), *args],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_the_toy_pattern_reaches_terminal_html_and_json(tmp_path):
    # the rules' flags: where the toy's windows are flagged is its own rule's doing, not the
    # shipped model's opinion of a pattern it was never trained on
    out = _cli_with_toy("analyze", str(CNN), "--detector", "expert", "--json", "a.json",
                        "--html", "a.html", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    term = out.stdout
    assert "[Z] Toy pattern (a test registers it) (toy_pattern)" in term
    assert "Z toy_pattern" in term  # the timeline's legend
    assert "GPU time spent inefficiently" in term  # its account, not GPU idle time
    a = json.loads((tmp_path / "a.json").read_text())
    finding = next(f for f in a["findings"] if f["pattern"] == "toy_pattern")
    # the sample's own patterns (its NCHW layout transposes) may win a window of the ten
    assert set(finding["windows"]) <= set(range(40, 50)) and len(finding["windows"]) >= 8
    assert {w["pattern"] for w in a["windows"][40:50]} >= {"toy_pattern"}
    assert all("toy_pattern" in w["patterns"] for w in a["windows"][40:50])
    assert not any("toy_pattern" in w["patterns"] for w in a["windows"][:40])
    # The busy side of the account, beside the idle one: the finding's own time lost, a part
    # of the busy time (busy + idle still the GPU span).
    slow = a["gpu_inefficient"]
    assert slow["by_pattern"]["toy_pattern"] == pytest.approx(finding["time_lost_us"], abs=0.1)
    assert slow["busy_us"] == a["gpu_idle"]["busy_us"] and 0 < slow["total_us"] <= slow["busy_us"]
    assert "spent inefficiently: Toy pattern (a test registers it)" in " ".join(term.split())
    html = (tmp_path / "a.html").read_text()
    assert "Toy pattern (a test registers it)" in html and toy_pattern.ToyPattern.color in html
    assert "GPU time spent inefficiently</h2>" in html


def test_the_busy_inefficient_account_reaches_diff(tmp_path):
    out = _cli_with_toy("analyze", str(CNN), "--json", "a.json", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    out = _cli_with_toy("diff", "a.json", "a.json", "--json", "d.json", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "inefficient: toy_pattern" in out.stdout
    d = json.loads((tmp_path / "d.json").read_text())
    lost = next(f for f in d["before"]["findings"] if f["pattern"] == "toy_pattern")
    slow = d["before"]["gpu_inefficient"]
    assert slow["by_pattern_per_step_us"]["toy_pattern"] == pytest.approx(
        lost["time_lost_per_step_us"], rel=0.01)
    assert d["change"]["gpu_inefficient_per_step_pct"] == 0.0


def test_the_toy_pattern_reaches_inject_help(tmp_path):
    out = _cli_with_toy("inject", "--help", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "toy_pattern" in re.sub(r"[\s│]+", "", out.stdout)
