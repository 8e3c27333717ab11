"""One colour per pattern id, shared by the HTML report and the terminal.

A pattern's colours are part of its declaration (`AntiPattern.color`, `.terminal_color`);
these functions read them from the registry, so a newly registered pattern has its colour in
every report without an edit here.
"""

from ..idle import CAUSES, MECHANISMS, pattern_of
from ..patterns import patterns

#: Colours for the cross-rank findings, which only the terminal colours by name.
CROSSRANK_TERMINAL_COLORS = {"straggler": "#FF5555", "rank_imbalance": "#FF8888"}
#: The GPU's busy time, drawn beside the idle causes.
BUSY_COLOR = "#3B4A5A"


def pattern_colors() -> dict[str, str]:
    """Pattern id -> its HTML colour (Okabe-Ito first: readable by colour-blind readers)."""
    return {p.id: p.color for p in patterns()}


def terminal_colors() -> dict[str, str]:
    """Pattern id -> its terminal colour (a lighter one of the same hue where the pattern
    declares one: terminals draw dark hues too dim on a dark background), and the cross-rank
    findings' colours."""
    return {**{p.id: p.terminal_color or p.color for p in patterns()},
            **CROSSRANK_TERMINAL_COLORS}


def cause_pattern(cause: str) -> str | None:
    """The pattern whose hue a GPU idle cause takes: the last of the cause's mechanisms that a
    pattern owns (its catch-all: exposed collectives, host copies and syncs)."""
    owners = [pattern_of(m.id) for m in MECHANISMS if m.cause == cause]
    return next((p for p in reversed(owners) if p), None)


def _cause_colors(colors: dict[str, str], warmup: str, not_explained: str) -> dict[str, str]:
    out = {"warmup": warmup}
    for c in CAUSES:
        p = cause_pattern(c)
        if p is not None:
            out[c] = colors[p]
    out["not_explained"] = not_explained
    return out


def cause_colors() -> dict[str, str]:
    """One colour per GPU idle cause (`traceap.idle.CAUSES`): the hue of the pattern that owns
    the cause, grey for warm-up, pale for what no cause explains."""
    return _cause_colors(pattern_colors(), "#9AA5B1", "#D9DEE4")


def terminal_cause_colors() -> dict[str, str]:
    """`cause_colors` for a dark terminal, and the busy time's colour."""
    return {**_cause_colors(terminal_colors(), "#9AA5B1", "#8A939C"), "busy": "#5F7A94"}
