"""Notebook 04's auto-checked exercises: the right answer, the placeholder, and the typical slips with their hints."""
from __future__ import annotations

import pytest

from course_utils import memory as mem
from course_utils.lessons import memory_budget as ex


def test_three_ways_expected_values_are_the_bytes_rule() -> None:
    n = 3e9
    adapter = n * 460_800 / 134_515_008  # the lesson's 0.34 % share, rank 8
    assert ex.training_gb("full") == pytest.approx(16 * n / 1e9)
    assert ex.training_gb("lora") == pytest.approx((4 * n + 12 * adapter) / 1e9)
    assert ex.training_gb("qlora") == pytest.approx((0.5 * n + 12 * adapter) / 1e9)


def test_check_three_ways_right_answers() -> None:
    fb = ex.check_three_ways(48, 12.12, 1.62)
    assert fb and fb.answered and str(fb).startswith("Right:")
    assert ex.check_three_ways(48.0, 12.1, 1.6)  # rounded to what the notebook prints is fine
    assert ex.check_three_ways(ex.training_gb("full"), ex.training_gb("lora"), ex.training_gb("qlora"))


def test_check_three_ways_placeholders() -> None:
    fb = ex.check_three_ways(..., ..., ...)
    assert not fb and not fb.answered
    assert str(fb) == ("Not answered yet: replace the ... in full_gb, lora_gb and qlora_gb with numbers of GB, "
                       "then run this cell again.")
    partial = ex.check_three_ways(48, None, ...)
    assert not partial and not partial.answered and "full_gb is right" in partial.message
    assert "lora_gb" in partial.message


@pytest.mark.parametrize("answers,name,hint", [
    ((36, 12.12, 1.62), "full_gb", "one of the four numbers is missing"),        # forgot gradients (or one state)
    ((24, 12.12, 1.62), "full_gb", "AdamW keeps two running averages"),          # forgot Adam's two states
    ((12, 12.12, 1.62), "full_gb", "weights alone"),
    ((44.7, 12.12, 1.62), "full_gb", "GiB"),
    ((48e9, 12.12, 1.62), "full_gb", "bytes"),
    ((48, 12.0, 1.62), "lora_gb", "frozen weights alone"),                       # forgot the adapter
    ((48, 36.0, 1.62), "lora_gb", "AdamW's states for the whole model"),         # adapter's optimizer on everything
    ((48, 48.0, 1.62), "lora_gb", "every weight a gradient"),
    ((48, 0.123, 1.62), "lora_gb", "adapter alone"),
    ((48, 1.62, 1.62), "lora_gb", "4 bits"),
    ((48, 12.12, 37.5), "qlora_gb", "every weight a gradient"),
    ((48, 12.12, 25.5), "qlora_gb", "AdamW's states for the whole model"),
    ((48, 12.12, 1.5), "qlora_gb", "frozen weights alone"),
    ((48, 12.12, 1.541), "qlora_gb", "AdamW's two states for the adapter"),
    ((48, 12.12, 1.582), "qlora_gb", "adapter's gradients"),
    ((48, 12.12, 12.12), "qlora_gb", "float32"),
    ((48, 12.12, 6.12), "qlora_gb", "bfloat16"),
])
def test_check_three_ways_typical_slips(answers: tuple, name: str, hint: str) -> None:
    fb = ex.check_three_ways(*answers)
    assert not fb and fb.answered
    assert name in fb.message and hint in fb.hint, fb


def test_check_three_ways_other_wrong_answers() -> None:
    fb = ex.check_three_ways(100, 12.12, 1.62)
    assert not fb and fb.hint.startswith("Full fine-tuning: 16 bytes per parameter")
    assert "finite number" in ex.check_three_ways("48", 12.12, 1.62).message
    assert "finite number" in ex.check_three_ways(True, 12.12, 1.62).message


def test_slips_never_sit_on_the_right_answer() -> None:
    for method in mem.METHODS:
        expected = ex.training_gb(method)
        for value, _ in ex.memory_mistakes(method):
            assert abs(value - expected) > ex.REL_TOL[method] * expected, (method, value)


def test_check_training_gb_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="method"):
        ex.check_training_gb(1.0, "adapter")
    with pytest.raises(ValueError, match="params"):
        ex.check_training_gb(1.0, "full", params=-1)


def test_best_methods_come_from_the_estimator() -> None:
    assert ex.best_method(1.7e9, 8.0) == "lora-bf16"
    assert ex.best_method(70e9, 48.0) == "none"
    assert ex.best_method(mem.SMOLLM2_PARAMS, 16.0) == "full"
    assert ex.best_method(7e9, 16.0) == "qlora"
    with pytest.raises(ValueError, match="budget_gb"):
        ex.best_method(7e9, 0)


def test_check_best_methods_right_and_placeholder() -> None:
    fb = ex.check_best_methods(" LoRA-bf16", "None")  # case and spaces do not matter
    assert fb and "3.47 GB" in fb.message and "37.88 GB" in fb.message
    placeholder = ex.check_best_methods(..., ...)
    assert not placeholder and not placeholder.answered
    assert str(placeholder).startswith("Not answered yet: replace the ... in method_8gb and method_48gb")
    assert not ex.check_best_methods("lora-bf16", ...).answered


@pytest.mark.parametrize("answers,hint", [
    (("lora", "none"), "over the usable 70 % (5.6 GB)"),           # 6.87 GB fits 8 GB, not its 70 %
    (("full", "none"), "more than the whole 8 GB"),
    (("qlora", "none"), "fits too (3.47 GB)"),                      # fits, but not the first that does
    (("none", "none"), "within the usable 70 % of 8 GB"),
    (("lora-bf16", "qlora"), "over the usable 70 % (33.6 GB)"),     # 37.88 GB under 48 GB, over 33.6 GB
    (("lora-bf16", "lora-bf16"), "more than the whole 48 GB"),
])
def test_check_best_methods_hints(answers: tuple, hint: str) -> None:
    fb = ex.check_best_methods(*answers)
    assert not fb and fb.answered and hint in fb.hint, fb


def test_check_best_methods_unknown_option() -> None:
    fb = ex.check_best_methods("adapter", "none")
    assert not fb and "not one of the options" in fb.message
