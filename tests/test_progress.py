"""course_utils.progress: deterministic status lines for long cells."""

from __future__ import annotations

import pytest

from course_utils.progress import status, steps


def test_steps_print_one_line_each_and_a_last_line(capsys: pytest.CaptureFixture) -> None:
    with steps("Measuring", total=2) as step:
        step("full")
        step()
    status("ready")
    assert capsys.readouterr().out == "Measuring: 1/2 full …\nMeasuring: 2/2 …\nMeasuring: done\nready\n"


def test_a_bad_total_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="total must be"):
        with steps("x", total=0):
            pass
    with pytest.raises(TypeError, match="total must be an integer"):
        with steps("x", total=2.5):
            pass
