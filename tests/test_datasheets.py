"""course_utils.datasheets: one meaning of "usable" for every card, the card's memory less the CUDA context."""

from __future__ import annotations

import pytest

from course_utils import datasheets, memory
from course_utils.datasheets import DATASHEETS, T4_EXPOSED_GB


@pytest.mark.parametrize("key", list(DATASHEETS))
def test_a_step_on_every_card_gets_its_memory_less_the_cuda_context(key: str) -> None:
    """The planners budget a named card (memory.gpu_budget) and hand a step its usable memory (step_limit_gb):
    the card's memory, as measured where it was (Colab's T4), less 0.5 GB; the same as the datasheet's usable."""
    sheet, budget = DATASHEETS[key], memory.gpu_budget(key)
    assert budget.gb == (T4_EXPOSED_GB if key == "T4" else sheet.memory_gb)
    assert memory.step_limit_gb(budget.gb) == pytest.approx(budget.gb - 0.5, abs=1e-12)
    assert sheet.usable_gb == pytest.approx(budget.gb - 0.5, abs=1e-12)


def test_the_lessons_cards_by_their_usable_memory() -> None:
    usable = {key: round(DATASHEETS[key].usable_gb, 2) for key in ("T4", "L4", "A100-40GB", "A100", "H100")}
    assert usable == {"T4": 15.33, "L4": 23.5, "A100-40GB": 39.5, "A100": 79.5, "H100": 79.5}
    assert round(T4_EXPOSED_GB, 2) == 15.83
    assert [k for k, s in DATASHEETS.items() if s.exposed_gb is not None] == ["T4"]  # measured: Colab's T4 only


def test_a_typed_card_memory_loses_the_context_too() -> None:
    assert datasheets.usable_gb(24) == 23.5 and datasheets.usable_gb(8.0) == 7.5
    assert datasheets.usable_gb(0.75) == 0.25


@pytest.mark.parametrize(
    "memory,error",
    [
        (0.5, ValueError),
        (0.0, ValueError),
        (-24, ValueError),
        (float("nan"), ValueError),
        ("24", TypeError),
        (True, TypeError),
    ],
)
def test_usable_needs_more_memory_than_the_context(memory, error) -> None:
    with pytest.raises(error, match="memory_gb"):
        datasheets.usable_gb(memory)
    with pytest.raises(error, match="budget_gb"):
        datasheets.usable_gb(memory, "budget_gb")  # named as the caller's argument
