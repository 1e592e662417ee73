"""course_utils.lessons.kit: the shared checks behind every notebook's auto-checked exercises."""

from __future__ import annotations

import pytest

from course_utils.lessons.kit import Feedback, check_choice, check_function, check_number, one_number


def test_feedback_reads_as_one_message_and_as_a_bool() -> None:
    assert str(Feedback(True, "x = 3.")) == "Right: x = 3." and Feedback(True, "x")
    assert repr(Feedback(False, "x = 4 is not it.", "Count the scales.")) == (
        "Not yet: x = 4 is not it.\nHint: Count the scales."
    )
    assert not Feedback(False, "x")


def test_a_number_is_right_within_tolerance_and_a_known_slip_gets_its_hint() -> None:
    assert check_number(12.1, 12, name="gb", what="the size in GB", unit="GB").correct
    slip = check_number(48, 12, name="gb", what="the size in GB", mistakes=[(48, "4 bytes, not 1")])
    assert not slip.correct and slip.hint == "4 bytes, not 1"
    other = check_number(7, 12, name="gb", what="x", hint="Bytes per weight times weights.")
    assert not other.correct and other.hint == "Bytes per weight times weights."


def test_a_number_is_written_with_thousands_separators_and_a_right_one_with_its_why() -> None:
    feedback = check_number(25_362_432, 25_362_432, name="b", what="bytes", unit="bytes", why="Codes + scales.")
    assert str(feedback) == "Right: b = 25,362,432 bytes (expected 25,362,432 bytes). Codes + scales."
    assert check_number(2.5, 3, name="gb", what="x").message == "gb = 2.5 is not it."


def test_an_answer_in_gb_gets_the_gib_and_bytes_slips_named() -> None:
    gib = check_number(12e9 / 2**30, 12, name="gb", what="the size in GB", unit="GB")
    assert not gib and "GiB" in gib.hint
    in_bytes = check_number(12e9, 12, name="gb", what="the size in GB", unit="GB")
    assert not in_bytes and "bytes" in in_bytes.hint and "12,000,000,000 GB" in in_bytes.message
    assert check_number(12e9, 12, name="gb", what="x").hint == ""  # without the unit, no unit slips


def test_one_value_answers_count_as_numbers_and_others_stay_as_they_are() -> None:
    import numpy as np
    import torch

    for value in (3, 3.0, np.float32(3), np.array(3.0), torch.tensor([3.0], requires_grad=True)):
        assert one_number(value) == pytest.approx(3.0) and isinstance(one_number(value), float), value
    several = torch.tensor([1.0, 2.0])
    for value in (True, "3", [3], several):
        assert one_number(value) is value
    assert check_number(torch.tensor(12.1), 12, name="gb", what="x").correct
    assert "finite number, got 'Tensor'" in check_number(several, 12, name="gb", what="x").message


def test_placeholders_and_wrong_kinds_never_raise() -> None:
    for value in (..., None):
        feedback = check_number(value, 12, name="gb", what="the size in GB")
        assert not feedback.correct and not feedback.answered and "replace the ..." in str(feedback)
    for value in ("12", True, float("nan"), [12]):
        feedback = check_number(value, 12, name="gb", what="the size in GB")
        assert not feedback.correct and feedback.answered and "finite number" in feedback.message


def test_a_choice_ignores_case_and_spaces_and_hints_per_option() -> None:
    options = ("full", "lora", "qlora")
    assert check_choice(" QLoRA ", "qlora", name="m", options=options).correct
    lora = check_choice("lora", "qlora", name="m", options=options, hints={"lora": "16-bit base too big"})
    assert not lora.correct and lora.hint == "16-bit base too big"
    assert "one of the options" in check_choice("adapter", "qlora", name="m", options=options).message
    assert "one of the options" in check_choice(["qlora"], "qlora", name="m", options=options).message  # unhashable
    assert not check_choice(..., "qlora", name="m", options=options).answered


def test_a_function_is_tried_on_each_case_and_errors_become_one_line() -> None:
    cases = [((2,), 4), ((3,), 9)]
    assert check_function(lambda x: x * x, cases, name="square").correct
    wrong = check_function(lambda x: x + 2, cases, name="square", hint="Multiply.")
    assert not wrong.correct and "square(3) returned 5; expected 9." in wrong.message and wrong.hint == "Multiply."

    def not_written(x: int) -> int:
        raise NotImplementedError

    def crashes(x: int) -> int:
        return 1 // 0

    assert not check_function(not_written, cases, name="square").answered
    assert not check_function(lambda x: None, cases, name="square").answered
    assert not check_function(..., cases, name="square").answered
    assert "ZeroDivisionError" in check_function(crashes, cases, name="square").message
    assert "should be a function" in check_function(3, cases, name="square").message
