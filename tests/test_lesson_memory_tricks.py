"""Notebook 05's auto-checked exercises: the right answer, the placeholder, and the typical slips with their hints."""
from __future__ import annotations

import math

import pytest

from course_utils.architecture import Architecture
from course_utils.lessons import memory_tricks as ex
from course_utils.units import GB

SMOL = Architecture.from_config("smollm2-135m")


def test_checkpointed_inputs_is_each_layers_float32_input() -> None:
    # by hand: 30 layers x batch 8 x 512 tokens x hidden 576, 4 bytes each - the estimator agrees exactly
    assert ex.checkpointed_inputs_gb() * GB == 30 * 8 * 512 * 576 * 4


def test_check_checkpointed_inputs() -> None:
    assert ex.check_checkpointed_inputs(30 * 8 * 512 * 576 * 4 / 1e9)
    assert ex.check_checkpointed_inputs(0.283)
    placeholder = ex.check_checkpointed_inputs(...)
    assert not placeholder and not placeholder.answered and str(placeholder).startswith("Not answered yet")
    for value, hint in ((0.0708, "4 bytes"), (0.1416, "not 2"), (0.00944, "each of the 30 layers"),
                        (0.2637, "GiB"), (283_115_520, "bytes"), (6.31, "without")):
        fb = ex.check_checkpointed_inputs(value)
        assert not fb and fb.answered and hint in fb.hint, (value, fb)
    assert "batch x tokens x hidden" in ex.check_checkpointed_inputs(0.5).hint
    assert "finite number" in ex.check_checkpointed_inputs("0.28").message


def test_adamw8bit_state_counts_bytes_and_block_scales() -> None:
    n = SMOL.params
    simple = (2 * n + 2 * 4 * math.ceil(n / 256)) / GB  # the formula the notebook asks for
    assert ex.adamw8bit_state_gb() == pytest.approx(simple, rel=0.002)
    assert ex.check_adamw8bit_state(simple)


def test_check_adamw8bit_state() -> None:
    n = SMOL.params
    assert ex.check_adamw8bit_state(0.2734)
    assert not ex.check_adamw8bit_state(None).answered
    for value, hint in ((2 * n / GB, "block of 256"), (8 * n / GB, "float32"), (n / GB, "two states"),
                        (4 * n / GB, "not 2"), (6 * n / GB, "saves"), (0.2547, "GiB")):
        fb = ex.check_adamw8bit_state(value)
        assert not fb and fb.answered and hint in fb.hint, (value, fb)
    assert ex.check_adamw8bit_state(0.5).hint.startswith("Per trained number")


def test_kwame_has_one_fitting_choice() -> None:
    gb = ex.kwame_estimates_gb()
    assert [k for k, v in gb.items() if v <= 24.0] == ["checkpointing + 8-bit AdamW"]
    assert ex.kwame_answer() == "checkpointing + 8-bit AdamW"


def test_check_kwame_choice() -> None:
    right = ex.check_kwame_choice("Checkpointing + 8-bit AdamW ")  # case and spaces do not matter
    assert right and "1.33x" in str(right)
    assert not ex.check_kwame_choice(...).answered
    for wrong, says in (("checkpointing", "states"), ("8-bit AdamW", "activations"),
                        ("bf16 autocast", "16-bit copy"), ("accumulation", "gradients stay")):
        fb = ex.check_kwame_choice(wrong)
        assert not fb and fb.answered and "still over 24 GB" in fb.hint and says in fb.hint, (wrong, fb)
    other = ex.check_kwame_choice("LoRA")
    assert not other and "not one of the options" in other.message


def test_every_checker_has_a_one_line_docstring() -> None:
    for name in ("check_checkpointed_inputs", "check_adamw8bit_state", "check_kwame_choice"):
        doc = getattr(ex, name).__doc__
        assert doc and "\n" not in doc.strip(), name
