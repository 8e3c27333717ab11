"""Durations and sizes for humans: one formatting for the terminal, reports and evidence."""

from __future__ import annotations

import math


def fmt_us(us: float | None) -> str:
    """A duration given in microseconds ("-" when unknown)."""
    if us is None or not math.isfinite(float(us)):
        return "-"
    us = float(us)
    if abs(us) >= 1e6:
        return f"{us / 1e6:.2f} s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.1f} ms"
    return f"{us:.0f} us"


def fmt_bytes(b: float) -> str:
    """A size in bytes."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(b) < 1024 or unit == "GB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GB"
