"""Durations and sizes for humans: one formatting for the terminal, reports and evidence."""

from __future__ import annotations

import math


def fmt_us(us: float | None, *, fine: bool = False) -> str:
    """A duration given in microseconds: "12 us", "3.4 ms", "1.20 s" ("-" when unknown).

    The one duration format of traceap: the terminal, the JSON's evidence text, the HTML
    report, the cross-rank view and the re-detection notes all show this.  `fine=True` keeps
    one more digit below a second and no space before the unit ("4.2us", "1.23ms"): the LLM's
    window digest, where tokens are scarce and a 3 us kernel is not a 4 us one.
    """
    if us is None or not math.isfinite(float(us)):
        return "-"
    us = float(us)
    sep, ms_digits, us_digits = ("", 2, 1) if fine else (" ", 1, 0)
    if abs(us) >= 1e6:
        return f"{us / 1e6:.2f}{sep}s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.{ms_digits}f}{sep}ms"
    return f"{us:.{us_digits}f}{sep}us"


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 finding', '3 findings' ('1 more place', '2 more places' with word='more place')."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def fmt_bytes(b: float) -> str:
    """A size in bytes."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(b) < 1024 or unit == "GB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GB"
