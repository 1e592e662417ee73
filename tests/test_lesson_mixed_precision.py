"""course_utils.lessons.mixed_precision: its charts, widgets and exercises.

- Charts and widgets of the mixed-precision notebook: callbacks print the right text, charts are labelled.
- Exercises of notebook 02: each checker accepts the right answer, waits on the placeholder, explains slips.
"""
from __future__ import annotations

import matplotlib
import pytest

from course_utils import precision
from course_utils.lessons import mixed_precision as lesson

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import torch


def _labelled(fig) -> None:
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    plt.close(fig)


def test_gradient_histogram_is_labelled() -> None:
    _labelled(lesson.gradient_histogram(precision.synthetic_gradients(2000)))


@pytest.mark.parametrize("kwargs", [{"grads": torch.tensor([])}, {"scale": 0.0}, {"scale": -1.0}])
def test_gradient_histogram_bad_input(kwargs) -> None:
    kwargs = {"grads": precision.synthetic_gradients(100), **kwargs}
    with pytest.raises(ValueError):
        lesson.gradient_histogram(**kwargs)


def test_loss_curves_is_labelled_and_checks_input() -> None:
    _labelled(lesson.loss_curves({"float32": [2.0, 1.0, 0.5], "bfloat16": [2.0, 1.1, 0.4]}))
    with pytest.raises(ValueError, match="curves"):
        lesson.loss_curves({})
    with pytest.raises(ValueError, match="no losses"):
        lesson.loss_curves({"a": []})


def test_tiny_update_widget_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ipywidgets")
    lesson.tiny_update_widget(1e-4)
    out = capsys.readouterr().out
    assert "LOST" in out and "master copy" in out


def test_matmul_widget_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ipywidgets")
    dtype, size = lesson.matmul_widget(device="cpu").children[0].children
    for name in ("float16", "bfloat16"):
        if dtype.value != name:
            dtype.value = name
        out = capsys.readouterr().out
        assert "float32 on cpu" in out and f"{name} on cpu" in out and "TFLOP/s" in out
    dtype.value = "float16"
    capsys.readouterr()
    size.value = 512
    assert "float16 is timed on a CPU only up to 256x256" in capsys.readouterr().out


def test_matmul_sizes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert lesson.matmul_sizes("cpu") == (256, 512, 1024, 2048, 4096)
    assert lesson.matmul_sizes("cuda")[-1] == 8192


def test_widgets_build(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ipywidgets")
    assert lesson.tiny_update_widget(1e-3).children
    assert lesson.matmul_widget(device="cpu").children  # at all_formats_size: 256 on a CPU
    assert "bfloat16 on cpu" in capsys.readouterr().out  # it starts with the lesson's type, bfloat16 on a CPU
    with pytest.raises(ValueError, match="update"):
        lesson.tiny_update_widget(1.0)


# ------------------------------------------------------------------------------ 1. a tiny update on a small weight
def test_the_small_weight_answer_comes_from_real_arithmetic() -> None:
    assert lesson.survival_answer() == "float16 only"
    assert precision.survives(lesson.WEIGHT, lesson.UPDATE, "float16")
    assert not precision.survives(lesson.WEIGHT, lesson.UPDATE, "bfloat16")
    assert lesson.survival_answer(1.0, 1e-4) == "neither" and lesson.survival_answer(1.0, 1e-2) == "both"


@pytest.mark.parametrize("answer", ["float16 only", "Float16 Only", "  float16 only "])
def test_small_weight_right(answer) -> None:
    feedback = lesson.check_small_weight_update(answer)
    assert feedback.correct and str(feedback).startswith("Right:") and "6.1e-05" in str(feedback)


@pytest.mark.parametrize("placeholder", [..., None])
def test_small_weight_unanswered(placeholder) -> None:
    feedback = lesson.check_small_weight_update(placeholder)
    assert not feedback.correct and not feedback.answered
    assert str(feedback).startswith("Not answered yet: replace the ... in answer")


@pytest.mark.parametrize("answer, hint", [
    ("neither", "50 times smaller"),
    ("both", "at least 6.1e-05"),
    ("bfloat16 only", "range, not precision"),
])
def test_small_weight_typical_slips(answer, hint) -> None:
    feedback = lesson.check_small_weight_update(answer)
    assert not feedback.correct and feedback.answered and hint in feedback.hint


def test_small_weight_answer_outside_the_options() -> None:
    feedback = lesson.check_small_weight_update("float32")
    assert not feedback.correct and "not one of the options" in feedback.message


# ------------------------------------------------------------------------------ 2. a loss scale for float16
def test_exactly_one_scale_fits() -> None:
    assert [lesson.scale_fits(s) for s in lesson.SCALE_OPTIONS] == [False, True, False, False]
    assert lesson.scale_fits(16384) and not lesson.scale_fits(4096)  # the window is 2**13 to 2**15


@pytest.mark.parametrize("answer", [8192, 2 ** 13, 8192.0])
def test_loss_scale_right(answer) -> None:
    feedback = lesson.check_loss_scale(answer)
    assert feedback.correct and "8.2e-05" in str(feedback)


def test_loss_scale_unanswered() -> None:
    feedback = lesson.check_loss_scale(...)
    assert not feedback.answered and "one of 1024, 8192, 65536, 1048576" in feedback.message


@pytest.mark.parametrize("answer, hint", [
    (1024, "still subnormal"),
    (65536, "becomes 65,536"),
    (2 ** 20, "overflows to inf"),
])
def test_loss_scale_typical_slips(answer, hint) -> None:
    feedback = lesson.check_loss_scale(answer)
    assert not feedback.correct and feedback.answered and hint in feedback.hint


@pytest.mark.parametrize("answer", [4096, "8192", True])
def test_loss_scale_outside_the_options(answer) -> None:
    feedback = lesson.check_loss_scale(answer)
    assert not feedback.correct and "not one of the options" in feedback.message
