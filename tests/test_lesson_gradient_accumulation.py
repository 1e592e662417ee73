"""Notebook 03's exercises (course_utils.lessons.gradient_accumulation): right, unanswered, typical slips."""
from __future__ import annotations

import pytest
import torch

from course_utils import accumulation as acc
from course_utils.lessons import gradient_accumulation as ex


# ---------------------------------------------------------------------------------------------
# Exercise 1: how many trips?
# ---------------------------------------------------------------------------------------------
def test_expected_values_come_from_the_course_functions() -> None:
    assert acc.accumulation_steps_for(48, 8) == 6  # what check_trips expects for steps and last_trip_weight
    assert acc.weight_per_item(acc.trip_sizes(48, 10), "micro_mean")[-1] == pytest.approx(1 / 40)


@pytest.mark.parametrize("steps, weight", [(6, 1 / 40), (6.0, 0.025), (6, 0.0251)])
def test_trips_right(steps, weight) -> None:
    verdict = ex.check_trips(steps, weight)
    assert verdict.correct, verdict
    assert "1/40" in str(verdict) and "1.25x" in str(verdict)


def test_trips_placeholders() -> None:
    verdict = ex.check_trips(..., ...)
    assert not verdict.correct and not verdict.answered
    assert str(verdict).startswith("Not answered yet: replace the ... in steps")
    verdict = ex.check_trips(6, ...)
    assert not verdict.answered
    assert "steps = 6 is right" in str(verdict) and "last_trip_weight" in str(verdict)
    assert not ex.check_trips(None, None).answered


@pytest.mark.parametrize("steps, hint", [
    (384, "so divide"),
    (8 / 48, "Upside down"),
    (8, "8 is the micro-batch size"),
    (48, "48 is the effective batch"),
    (7, "steps = effective batch / micro-batch"),
])
def test_trips_wrong_steps(steps, hint) -> None:
    verdict = ex.check_trips(steps, 1 / 40)
    assert not verdict.correct and verdict.answered
    assert hint in verdict.hint


@pytest.mark.parametrize("weight, hint", [
    (1 / 48, "what every example gets in the big batch"),
    (1 / 50, "full trip of 10"),
    (1 / 8, "also divides by the 5 trips"),
    (1 / 5, "weight of the whole trip"),
    (1 / 32, "5 trips, not 4"),
    (0.3, "(1 / n) x (1 / 5)"),
])
def test_trips_wrong_weight(weight, hint) -> None:
    verdict = ex.check_trips(6, weight)
    assert not verdict.correct and verdict.answered
    assert hint in verdict.hint


@pytest.mark.parametrize("steps", ["6", True, float("nan")])
def test_trips_not_a_number(steps) -> None:
    verdict = ex.check_trips(steps, 1 / 40)
    assert not verdict.correct and verdict.answered
    assert "finite number" in verdict.message


# ---------------------------------------------------------------------------------------------
# Exercise 2: the batch's loss from its micro-batches
# ---------------------------------------------------------------------------------------------
def right_batch_loss(mean_losses, token_counts):
    return sum(m * n for m, n in zip(mean_losses, token_counts)) / sum(token_counts)


def test_token_case_is_the_notebooks_batch_and_leaves_the_generator_alone() -> None:
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    means, counts, full = ex.token_case()
    assert torch.equal(torch.random.get_rng_state(), before)
    assert counts == [int((lb != acc.IGNORE_INDEX).sum()) for lb in acc.padded_token_batch()[1].split(2)] == [58, 6]
    assert right_batch_loss(means, counts) == pytest.approx(full, rel=1e-6)
    assert sum(means) / len(means) != pytest.approx(full, rel=1e-4)  # the trap shows on this batch


def test_batch_loss_right() -> None:
    verdict = ex.check_batch_loss(right_batch_loss)
    assert verdict.correct, verdict
    assert "[58, 6]" in str(verdict)


def test_batch_loss_right_with_torch() -> None:
    def with_torch(mean_losses, token_counts):
        m, n = torch.tensor(mean_losses, dtype=torch.float64), torch.tensor(token_counts, dtype=torch.float64)
        return (m * n).sum() / n.sum()

    assert ex.check_batch_loss(with_torch).correct


def test_batch_loss_placeholders() -> None:
    def not_written(mean_losses, token_counts):
        raise NotImplementedError

    def returns_nothing(mean_losses, token_counts):
        pass

    for fn in (not_written, returns_nothing, ..., None):
        verdict = ex.check_batch_loss(fn)
        assert not verdict.correct and not verdict.answered, fn
    assert str(ex.check_batch_loss(not_written)).startswith("Not answered yet: replace the ... in batch_loss")


@pytest.mark.parametrize("fn, hint", [
    (lambda m, n: sum(m) / len(m), "the padding trap"),
    (lambda m, n: sum(m), "forgetting `/ accumulation_steps`"),
    (lambda m, n: sum(a * b for a, b in zip(m, n)), "Divide it by the total number of real tokens"),
    (lambda m, n: sum(a * b for a, b in zip(m, n)) / len(m), "not by the number of micro-batches"),
    (lambda m, n: sum(m) / sum(n), "multiply it back"),
    (lambda m, n: max(m), "add those up and divide by all the real tokens"),
])
def test_batch_loss_typical_mistakes(fn, hint) -> None:
    verdict = ex.check_batch_loss(fn)
    assert not verdict.correct and verdict.answered
    assert hint in verdict.hint


def test_batch_loss_errors_are_one_line() -> None:
    verdict = ex.check_batch_loss(lambda m, n: m / n)
    assert not verdict.correct and verdict.answered
    assert "raised TypeError" in verdict.message
    verdict = ex.check_batch_loss(42)
    assert not verdict.correct and "should be a function" in verdict.message


def test_every_checker_has_a_one_line_docstring() -> None:
    for fn in (ex.check_trips, ex.check_batch_loss):
        assert fn.__doc__ and "\n" not in fn.__doc__.strip()
