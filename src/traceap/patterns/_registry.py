"""The pattern registry: every anti-pattern registers itself here, and everything else reads it.

A pattern module (`traceap/patterns/<id>.py`) declares everything about its pattern on its rule
class (`traceap.patterns.base.AntiPattern`: id, title, letter, colour, short name, mechanism,
LLM signature, account, fix, `measure` / `describe` / `proof_events`) and registers the rule
with `register_pattern`, as timm's models do with `@register_model`.  The terminal letters,
report colours, eval tables, LLM prompt, manifest validation and idle account read the
declarations through the accessors below; none keeps a table of its own.

Pieces that live in other layers register themselves from their own modules with the pattern
id: how it is planted (`inject`, from `traceap/inject/mechanisms/<id>.py`) and how it is
labelled in a real trace (`label`, from `traceap/inject/natural.py`), or `not_applicable`
with the reason.  `tests/test_pattern_conformance.py` checks every piece of every pattern.

Plumbing (the leading underscore): this module imports nothing of traceap, so every layer can
read it (tests/test_architecture.py places it at the bottom).  The built-in rules are loaded
at the first read, by the names `traceap.patterns.BUILTIN` lists: the registry knows its own
package's modules only by that list, never by import.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

#: The pieces a pattern gets from other layers (`register_piece`), with where each lives.
PIECES = {
    "inject": "traceap/inject/mechanisms/<id>.py: plants the mechanism into a real trace",
    "label": "traceap/inject/natural.py: the natural-label rule for a real trace",
}


@dataclass(frozen=True)
class IdleCause:
    """The pattern's time is GPU idle time: the `traceap.idle` mechanism (an id of
    `traceap.idle.MECHANISMS`) that holds it, one pattern per mechanism."""

    mechanism: str


@dataclass(frozen=True)
class BusyInefficient:
    """The GPU is busy but slow: the pattern's time is GPU time spent inefficiently, measured
    by its own rule (`lost_us`), not by the idle account.  `what`: what the GPU spends that
    time on, a few words for the account's sentence ("FP32 without tensor cores"; the
    pattern's title when empty)."""

    what: str = ""


Account = IdleCause | BusyInefficient


@dataclass(frozen=True)
class NotApplicable:
    """An explicit "this pattern has no such piece", with why."""

    reason: str


class MissingPiece(LookupError):
    """A registered pattern lacks a piece (its message names the pattern and the piece)."""


_PATTERNS: dict[str, Any] = {}          # id -> rule (an AntiPattern), in registration order
_PIECES: dict[str, dict[str, Any]] = {p: {} for p in PIECES}
_builtin: tuple[str, ...] = ()         # traceap.patterns.BUILTIN, once loaded
_loaded = False


def register_pattern(rule):
    """Register a pattern's rule (an `AntiPattern` instance) under its `id`; returns it, so a
    pattern module ends with `PATTERN = register_pattern(MyPattern())`."""
    pid = getattr(rule, "id", "")
    if not pid or not isinstance(pid, str):
        raise ValueError(f"{rule!r}: a pattern needs a string id")
    old = _PATTERNS.get(pid)
    if old is not None and type(old) is not type(rule):
        raise ValueError(f"pattern id {pid!r} is registered twice ({old!r}, {rule!r})")
    _PATTERNS[pid] = rule
    return rule


def unregister_pattern(pattern_id: str) -> None:
    """Remove a pattern and its pieces (for tests that register a toy pattern)."""
    _PATTERNS.pop(pattern_id, None)
    for table in _PIECES.values():
        table.pop(pattern_id, None)


def register_piece(piece: str, pattern_id: str, value: Any) -> Any:
    """Register one piece (`inject` or `label`) of a pattern, from the module that implements
    it; `value` may be `NotApplicable(reason)`.  Returns `value` (usable as a decorator's
    result)."""
    if piece not in _PIECES:
        raise ValueError(f"unknown piece {piece!r}; pieces: {', '.join(PIECES)}")
    old = _PIECES[piece].get(pattern_id)
    if old is not None and old != value and _name(old) != _name(value):
        # Two modules claim one piece (say a mechanism and a NotApplicable left behind in the
        # pattern's module): which one wins must not depend on the import order.
        raise ValueError(f"pattern {pattern_id!r}: the {piece!r} piece is registered twice "
                         f"({_name(old)}, {_name(value)})")
    _PIECES[piece][pattern_id] = value
    return value


def _name(value: Any) -> str:
    """'module.function' of a piece (the same after a module is reloaded), or its repr."""
    qual = getattr(value, "__qualname__", None)
    return f"{value.__module__}.{qual}" if qual else repr(value)


def piece_of(piece: str, pattern_id: str) -> Any:
    """A pattern's piece (maybe a `NotApplicable`); `MissingPiece` when nothing registered it.

    Pieces register when their module is imported: read them from the layer that holds them
    (e.g. `traceap.inject` for `inject`)."""
    try:
        return _PIECES[piece][pattern_id]
    except KeyError:
        raise MissingPiece(f"pattern {pattern_id!r} has no {piece!r} piece "
                           f"({PIECES.get(piece, 'unknown piece')}; or register "
                           f"NotApplicable(reason))") from None


def pieces(piece: str) -> dict[str, Any]:
    """Pattern id -> the piece, for the registered patterns that have it (not `NotApplicable`),
    in pattern order."""
    table = _PIECES[piece]
    return {p: table[p] for p in pattern_ids()
            if p in table and not isinstance(table[p], NotApplicable)}


def _load_builtin() -> None:
    """Import the built-in pattern modules once (each registers itself)."""
    global _loaded, _builtin
    if _loaded:
        return
    _loaded = True
    _builtin = tuple(importlib.import_module(__package__).BUILTIN)
    for name in _builtin:
        importlib.import_module(f"{__package__}.{name}")
    # The live table (`traceap.patterns.REGISTRY`) in the same order as `pattern_ids`.
    ordered = {p: _PATTERNS[p] for p in pattern_ids()}
    _PATTERNS.clear()
    _PATTERNS.update(ordered)


def pattern_ids() -> tuple[str, ...]:
    """Every registered pattern id, in order: the built-in ones in `BUILTIN` order (the ids of
    docs/FORMATS.md), then any registered later, in registration order (a rule module imported
    on its own registers before the others: the order does not depend on that)."""
    _load_builtin()
    return (tuple(p for p in _builtin if p in _PATTERNS)
            + tuple(p for p in _PATTERNS if p not in _builtin))


def patterns() -> tuple:
    """Every registered pattern's rule, in `pattern_ids` order."""
    return tuple(_PATTERNS[p] for p in pattern_ids())


def get_pattern(pattern_id: str):
    """The rule of a pattern id; KeyError naming the known ids when it is not registered."""
    _load_builtin()
    try:
        return _PATTERNS[pattern_id]
    except KeyError:
        raise KeyError(f"unknown pattern {pattern_id!r}; known: {', '.join(_PATTERNS)}") from None


def is_pattern(pattern_id: object) -> bool:
    """Whether `pattern_id` is a registered pattern id."""
    _load_builtin()
    return pattern_id in _PATTERNS


def pattern_of_mechanism() -> dict[str, str]:
    """Idle mechanism id -> the pattern whose account it is (patterns with an `IdleCause`)."""
    return {p.account.mechanism: p.id for p in patterns() if isinstance(p.account, IdleCause)}


def mechanism_of_pattern() -> dict[str, str]:
    """Pattern id -> the idle mechanism that holds its time (patterns with an `IdleCause`)."""
    return {p.id: p.account.mechanism for p in patterns() if isinstance(p.account, IdleCause)}


__all__ = ["Account", "BusyInefficient", "IdleCause", "MissingPiece", "NotApplicable", "PIECES",
           "get_pattern", "is_pattern", "mechanism_of_pattern", "pattern_ids",
           "pattern_of_mechanism", "patterns", "piece_of", "pieces", "register_pattern",
           "register_piece", "unregister_pattern"]
