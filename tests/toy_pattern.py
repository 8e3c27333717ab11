"""A toy anti-pattern, declared and registered the way a real one is, in one module.

`tests/test_pattern_conformance.py` registers it to show that a new pattern reaches every
output (terminal, HTML, JSON, eval tables, LLM prompt, `traceap inject --help`) with no edit
anywhere else.  Its measure is trivial on purpose: windows 40-49 of any GPU trace score 0.95
and lose a third of their width.
"""

from __future__ import annotations

import numpy as np

from traceap.patterns import BusyInefficient, NotApplicable, register_pattern, register_piece
from traceap.patterns._registry import unregister_pattern
from traceap.patterns.base import AntiPattern

ID = "toy_pattern"


class ToyPattern(AntiPattern):
    id = ID
    title = "Toy pattern (a test registers it)"
    mechanism = "windows 40-49 of any trace look slow to it"
    letter = "Z"
    color = "#117733"
    short = "TOY"
    signature = "the tenth tenth of nothing in particular: a test pattern, never the answer."
    account = BusyInefficient()
    fix = "Unregister the toy pattern:\n\n    unregister_pattern('toy_pattern')"

    def measure(self, windows):
        score = np.zeros(windows.n)
        score[40:50] = 0.95
        return {"score": score, "lost_us": score / 0.95 * windows.width_us / 3}

    def describe(self, windows, idx, m):
        n = int((m["score"][idx] > 0).sum())
        return f"toy evidence in {n} windows", {"toy_windows": n}


def register() -> ToyPattern:
    """Register the toy pattern and its explicit non-pieces."""
    rule = register_pattern(ToyPattern())
    register_piece("inject", ID, NotApplicable("a toy has no mechanism to plant"))
    register_piece("label", ID, NotApplicable("a toy never shows in a real trace"))
    return rule


def unregister() -> None:
    """Leave the registry as it was."""
    unregister_pattern(ID)
