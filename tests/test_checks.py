"""course_utils.checks: the one place that checks arguments, and the messages students read."""

from __future__ import annotations

import math

import pytest

from course_utils import checks


def test_values_that_pass_come_back() -> None:
    assert checks.integer(3, "n", 1, 5) == 3 and checks.integer(-2, "n", None) == -2
    assert checks.number(2, "x", 0, 2) == 2.0 and isinstance(checks.number(2, "x"), float)
    assert checks.positive(0.5, "p") == 0.5 and checks.flag(False, "f") is False
    assert checks.choice("b", "c", ("a", "b")) == "b"
    assert checks.instance("s", "t", str, "a string") == "s" and checks.instance(2, "t", (str, int), "a key") == 2


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda: checks.integer(True, "n"), TypeError, "n must be an integer, got bool"),
        (lambda: checks.integer(2.0, "n"), TypeError, "n must be an integer, got float"),
        (lambda: checks.integer(0, "n", 1, 5), ValueError, "n must be between 1 and 5, got 0"),
        (lambda: checks.integer(9, "n", None, 5), ValueError, "n must be <= 5, got 9"),
        (lambda: checks.number("1", "x"), TypeError, "x must be a number, got str"),
        (lambda: checks.number(math.inf, "x"), ValueError, "x must be a finite number, got inf"),
        (lambda: checks.number(math.nan, "x", 0, 1), ValueError, "x must be a finite number between 0 and 1, got nan"),
        (lambda: checks.positive(0, "p"), ValueError, "p must be a finite number > 0, got 0.0"),
        (lambda: checks.flag(1, "f"), TypeError, "f must be True or False, got 1"),
        (lambda: checks.choice("z", "c", ("a", "b")), ValueError, "c must be one of a, b; got 'z'"),
        (lambda: checks.instance(3, "t", str, "a string"), TypeError, "t must be a string, got int"),
    ],
)
def test_bad_values_name_the_argument_and_the_range(call, error, message: str) -> None:
    with pytest.raises(error) as info:
        call()
    assert str(info.value) == message


def test_format_seconds_never_rounds_to_zero() -> None:
    from course_utils.units import format_seconds

    assert [format_seconds(s) for s in (125.0, 2.44, 0.5, 0.038, 0.0012, 0.00052, 4.1e-5)] == [
        "125 s",
        "2.4 s",
        "500 ms",
        "38 ms",
        "1.2 ms",
        "0.52 ms",
        "41 µs",
    ]
    with pytest.raises(ValueError, match="seconds"):
        format_seconds(-1)
    with pytest.raises(TypeError, match="seconds"):
        format_seconds("1 s")
