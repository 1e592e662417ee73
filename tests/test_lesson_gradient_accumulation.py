"""Notebook 03's exercises (course_utils.lessons.gradient_accumulation): right, unanswered, typical slips."""

from __future__ import annotations

import pytest
import torch

from course_utils import accumulation as acc
from course_utils.lessons import gradient_accumulation as ex


# ---------------------------------------------------------------------------------------------
# Exercise 1: the accumulation loop
# ---------------------------------------------------------------------------------------------
loss_fn = torch.nn.MSELoss()  # the notebook's, defined in the cell above the exercise


def accumulation_step(model, optimizer, x, y, micro_batches):
    """One optimizer update on the batch (x, y), run as micro_batches slices; returns the batch's mean loss."""
    optimizer.zero_grad()
    total = 0.0
    for xb, yb in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        loss = loss_fn(model(xb), yb) * len(xb) / len(x)  # each example weighs 1 / len(x)
        loss.backward()  # adds into .grad
        total += loss.item()
    optimizer.step()  # one update for the whole batch
    return total


def _loop(*, weight="size", zero="start", step="after", split="chunk", returns="total"):
    """An accumulation loop with the given choices: the worked solution by default, a slip or another correct form."""

    def fn(model, optimizer, x, y, micro_batches):
        if zero == "start":
            optimizer.zero_grad()
        total = 0.0
        if split == "slices":  # slicing by hand, sizes as tensor_split gives them
            bounds = torch.linspace(0, len(x), micro_batches + 1).round().long().tolist()
            parts = [(x[a:b], y[a:b]) for a, b in zip(bounds, bounds[1:])]
        else:
            parts = zip(getattr(x, split)(micro_batches), getattr(y, split)(micro_batches))
        for xb, yb in parts:
            if zero == "inside":
                optimizer.zero_grad()
            if weight == "sum":
                loss = torch.nn.functional.mse_loss(model(xb), yb, reduction="sum") / len(x)
            else:
                loss = loss_fn(model(xb), yb) * {"size": len(xb) / len(x), "steps": 1 / micro_batches, None: 1}[weight]
            loss.backward()
            total = total + loss.detach()
            if step == "inside":
                optimizer.step()
        if step == "after":
            optimizer.step()
        if zero == "end":
            model.zero_grad()
        return {"total": total, "float": float(total), "last": loss, "list": [float(total)]}[returns]

    return fn


def test_accumulation_step_worked_solution_passes() -> None:
    verdict = ex.check_accumulation_step(accumulation_step)
    assert verdict.correct, verdict
    assert "all 3 updates" in str(verdict) and "10 examples in 4 micro-batches" in str(verdict)


@pytest.mark.parametrize(
    "form",
    [
        _loop(),  # a tensor total
        _loop(returns="float"),
        _loop(zero="end"),  # zero after the step instead of before the loop
        _loop(split="tensor_split"),  # 3, 3, 2, 2
        _loop(split="slices"),
        _loop(weight="sum"),  # summed loss over all the batch's examples
    ],
)
def test_accumulation_step_other_correct_forms_pass(form) -> None:
    verdict = ex.check_accumulation_step(form)
    assert verdict.correct, verdict


def test_accumulation_step_placeholders() -> None:
    def not_written(model, optimizer, x, y, micro_batches):
        raise NotImplementedError

    def returns_nothing(model, optimizer, x, y, micro_batches):
        accumulation_step(model, optimizer, x, y, micro_batches)

    for fn in (not_written, returns_nothing, ..., None):
        verdict = ex.check_accumulation_step(fn)
        assert not verdict.correct and not verdict.answered, fn
    assert "`raise NotImplementedError` line in accumulation_step" in str(ex.check_accumulation_step(not_written))


@pytest.mark.parametrize(
    "fn, hint",
    [
        (_loop(weight=None), "4 times too large"),  # forgot to divide
        (_loop(zero="inside"), "Only the last micro-batch's gradient is left: zero_grad() inside the loop"),
        (_loop(zero="inside", weight=None), "Only the last micro-batch's gradient is left, undivided"),
        (_loop(step="inside"), "Step once, after the loop"),
        (_loop(step=None), "Call optimizer.step() once"),
        (_loop(zero=None), "also carried the previous update's gradient"),
        (
            _loop(weight="steps"),
            "x.chunk(4) cuts 10 examples into 3, 3, 3, 1: dividing each mean loss by 4 gives one example 1/12 or 1/4",
        ),  # the uneven split without weighting
        (_loop(weight="steps", split="tensor_split"), "Weight each micro-batch's loss by len(xb) / len(x)"),
        (_loop(returns="last"), "their sum is the batch's loss"),
        (_loop(returns="list"), "Zero the gradients; for each micro-batch"),
        (lambda model, optimizer, x, y, micro_batches: x / 0 + "a", "Zero the gradients; for each micro-batch"),
    ],
)
def test_accumulation_step_slips_are_named(fn, hint) -> None:
    verdict = ex.check_accumulation_step(fn)
    assert not verdict.correct and verdict.answered
    assert hint in verdict.hint, verdict
    assert "\n" not in verdict.message


def test_accumulation_step_check_leaves_the_random_stream_alone() -> None:
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    ex.check_accumulation_step(accumulation_step)
    assert torch.equal(torch.random.get_rng_state(), before)


# ---------------------------------------------------------------------------------------------
# Exercise 2: the batch's loss from its micro-batches
# ---------------------------------------------------------------------------------------------
def batch_loss(mean_losses, token_counts):
    summed = sum(mean * n for mean, n in zip(mean_losses, token_counts))  # each micro-batch's summed loss
    return summed / sum(token_counts)  # divided by all the real tokens


def test_token_case_is_the_notebooks_batch_and_leaves_the_generator_alone() -> None:
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    means, counts, full = ex.token_case()
    assert torch.equal(torch.random.get_rng_state(), before)
    assert counts == [int((lb != acc.IGNORE_INDEX).sum()) for lb in acc.padded_token_batch()[1].split(2)] == [58, 6]
    assert batch_loss(means, counts) == pytest.approx(full, rel=1e-6)
    assert sum(means) / len(means) != pytest.approx(full, rel=1e-4)  # the trap shows on this batch


def test_batch_loss_right() -> None:
    verdict = ex.check_batch_loss(batch_loss)
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
    assert str(ex.check_batch_loss(not_written)) == (
        "Not answered yet: replace the `raise NotImplementedError` line in batch_loss with your code, then run "
        "this cell again."
    )
    assert "return statement" in str(ex.check_batch_loss(returns_nothing))
    assert "define batch_loss as a function" in str(ex.check_batch_loss(...))


@pytest.mark.parametrize(
    "fn, hint",
    [
        (lambda m, n: sum(m) / len(m), "the padding trap"),
        (lambda m, n: sum(m), "forgetting `/ accumulation_steps`"),
        (lambda m, n: sum(a * b for a, b in zip(m, n)), "Divide it by the total number of real tokens"),
        (lambda m, n: sum(a * b for a, b in zip(m, n)) / len(m), "not by the number of micro-batches"),
        (lambda m, n: sum(m) / sum(n), "multiply it back"),
        (lambda m, n: max(m), "add those up and divide by all the real tokens"),
    ],
)
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
