"""Exercises of notebook 02: each checker accepts the right answer, waits on the placeholder, explains slips."""
from __future__ import annotations

import pytest

from course_utils import precision
from course_utils.exercises import precision as ex


# ------------------------------------------------------------------------------ 1. a tiny update on a small weight
def test_the_small_weight_answer_comes_from_real_arithmetic() -> None:
    assert ex.survival_answer() == "float16 only"
    assert precision.survives(ex.WEIGHT, ex.UPDATE, "float16")
    assert not precision.survives(ex.WEIGHT, ex.UPDATE, "bfloat16")
    assert ex.survival_answer(1.0, 1e-4) == "neither" and ex.survival_answer(1.0, 1e-2) == "both"


@pytest.mark.parametrize("answer", ["float16 only", "Float16 Only", "  float16 only "])
def test_small_weight_right(answer) -> None:
    feedback = ex.check_small_weight_update(answer)
    assert feedback.correct and str(feedback).startswith("Right:") and "6.1e-05" in str(feedback)


@pytest.mark.parametrize("placeholder", [..., None])
def test_small_weight_unanswered(placeholder) -> None:
    feedback = ex.check_small_weight_update(placeholder)
    assert not feedback.correct and not feedback.answered
    assert str(feedback).startswith("Not answered yet: replace the ... in answer")


@pytest.mark.parametrize("answer, hint", [
    ("neither", "50 times smaller"),
    ("both", "at least 6.1e-05"),
    ("bfloat16 only", "range, not precision"),
])
def test_small_weight_typical_slips(answer, hint) -> None:
    feedback = ex.check_small_weight_update(answer)
    assert not feedback.correct and feedback.answered and hint in feedback.hint


def test_small_weight_answer_outside_the_options() -> None:
    feedback = ex.check_small_weight_update("float32")
    assert not feedback.correct and "not one of the options" in feedback.message


# ------------------------------------------------------------------------------ 2. a loss scale for float16
def test_exactly_one_scale_fits() -> None:
    assert ex.scale_answer() == 8192
    assert [ex.scale_fits(s) for s in ex.SCALE_OPTIONS] == [False, True, False, False]
    assert ex.scale_fits(16384) and not ex.scale_fits(4096)  # the window is 2**13 to 2**15


@pytest.mark.parametrize("answer", [8192, 2 ** 13, 8192.0])
def test_loss_scale_right(answer) -> None:
    feedback = ex.check_loss_scale(answer)
    assert feedback.correct and "8.2e-05" in str(feedback)


def test_loss_scale_unanswered() -> None:
    feedback = ex.check_loss_scale(...)
    assert not feedback.answered and "one of 1024, 8192, 65536, 1048576" in feedback.message


@pytest.mark.parametrize("answer, hint", [
    (1024, "still subnormal"),
    (65536, "becomes 65,536"),
    (2 ** 20, "overflows to inf"),
])
def test_loss_scale_typical_slips(answer, hint) -> None:
    feedback = ex.check_loss_scale(answer)
    assert not feedback.correct and feedback.answered and hint in feedback.hint


@pytest.mark.parametrize("answer", [4096, "8192", True])
def test_loss_scale_outside_the_options(answer) -> None:
    feedback = ex.check_loss_scale(answer)
    assert not feedback.correct and "not one of the options" in feedback.message
