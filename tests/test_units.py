"""The one duration format: what the terminal, JSON evidence, HTML and the LLM digest show."""

import math

import pytest

from traceap.units import fmt_us


@pytest.mark.parametrize("us, shown, fine", [
    (3.44, "3 us", "3.4us"),
    (999.4, "999 us", "999.4us"),
    (1234.5, "1.2 ms", "1.23ms"),
    (2_500_000, "2.50 s", "2.50s"),
    (-1500, "-1.5 ms", "-1.50ms"),
])
def test_one_scale_rule_two_precisions(us, shown, fine):
    assert fmt_us(us) == shown
    assert fmt_us(us, fine=True) == fine


@pytest.mark.parametrize("unknown", [None, math.nan, math.inf])
def test_unknown_durations_are_a_dash(unknown):
    assert fmt_us(unknown) == "-" and fmt_us(unknown, fine=True) == "-"
