"""course_utils.lessons.mixed_precision: its charts, widgets and exercises.

- Charts and widgets of the mixed-precision notebook: callbacks print the right text, charts are labelled.
- Exercises of notebook 02: each checker accepts the right answer, waits on the placeholder, explains slips.
"""

from __future__ import annotations

import math
import warnings

import matplotlib
import pytest

from course_utils import precision
from course_utils.lessons import mixed_precision as lesson

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F


def _labelled(fig) -> None:
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    plt.close(fig)


def test_gradient_histogram_shifts_the_scaled_gradients_by_log10_of_the_scale() -> None:
    grads = torch.tensor([1e-9, -1e-7, 1e-5, 0.0])  # a zero has no log: left out
    fig = lesson.gradient_histogram(grads, scale=1024.0)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[-2:] == ["gradients as computed", "gradients × 1,024"] and "float16 stores 0" in labels[0]
    before, after = (p.get_path().vertices for p in ax.patches[-2:])  # the two step histograms
    assert before[:, 1].sum() == after[:, 1].sum()  # the same three gradients, moved
    shift = after[after[:, 1] > 0][0, 0] - before[before[:, 1] > 0][0, 0]  # the first bar's left edge
    assert shift == pytest.approx(math.log10(1024.0), abs=(ax.get_xlim()[1] - ax.get_xlim()[0]) / 80)
    assert ax.get_xlim()[1] > math.log10(65504)  # the overflow band is in view
    _labelled(fig)


@pytest.mark.parametrize("kwargs", [{"grads": torch.tensor([])}, {"scale": 0.0}, {"scale": -1.0}])
def test_gradient_histogram_bad_input(kwargs) -> None:
    kwargs = {"grads": precision.synthetic_gradients(100), **kwargs}
    with pytest.raises(ValueError):
        lesson.gradient_histogram(**kwargs)


def test_loss_curves_draw_the_running_mean_of_10_steps() -> None:
    fig = lesson.loss_curves({"float32": [float(i) for i in range(12)], "bfloat16": [2.0, 1.0, 0.5]})
    long, short = fig.axes[0].get_lines()
    assert list(long.get_xdata()) == [10, 11, 12] and list(long.get_ydata()) == pytest.approx([4.5, 5.5, 6.5])
    assert list(short.get_xdata()) == [3] and list(short.get_ydata()) == pytest.approx([3.5 / 3])  # all of it
    assert (long.get_linestyle(), short.get_linestyle()) == ("-", "--")
    _labelled(fig)
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


def test_matmul_sizes_are_bounded() -> None:
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


@pytest.mark.parametrize(
    "answer, hint",
    [("neither", "50 times smaller"), ("both", "at least 6.1e-05"), ("bfloat16 only", "range, not precision")],
)
def test_small_weight_typical_slips(answer, hint) -> None:
    feedback = lesson.check_small_weight_update(answer)
    assert not feedback.correct and feedback.answered and hint in feedback.hint


def test_small_weight_answer_outside_the_options() -> None:
    feedback = lesson.check_small_weight_update("float32")
    assert not feedback.correct and "not one of the options" in feedback.message


# ------------------------------------------------------------------------------ 2. the float16 step with a GradScaler
def fp16_step(model, optimizer, scaler, x, y):
    """One float16 training step with a GradScaler; returns the loss."""
    with torch.autocast("cpu", dtype=torch.float16):  # matrix multiplies in float16
        loss = F.cross_entropy(model(x), y)  # the loss in float32
    scaler.scale(loss).backward()  # scaled gradients: tiny ones are not flushed to zero
    scaler.step(optimizer)  # divides them by the scale; skips the step if one is inf or nan
    scaler.update()  # halves the scale after an overflow
    optimizer.zero_grad()
    return loss


def _step(
    *,
    scale=True,
    backward_scaled=True,
    step="scaler",
    update=True,
    zero="end",
    dtype=torch.float16,
    unscale=False,
    returns="loss",
):
    """A float16 step with the given choices: the worked solution by default, a slip or another correct form else."""

    def fn(model, optimizer, scaler, x, y):
        if zero == "start":
            optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        scaled = scaler.scale(loss) if scale else loss
        (scaled if backward_scaled else loss).backward()
        if zero == "middle":
            optimizer.zero_grad()
        if unscale:
            scaler.unscale_(optimizer)
        if step in ("scaler", "both"):
            scaler.step(optimizer)
        if step in ("optimizer", "both"):
            optimizer.step()
        if update:
            scaler.update()
        if zero == "end":
            optimizer.zero_grad()
        return {"loss": loss, "item": loss.item(), "scaled": scaled, "list": [loss.item()]}[returns]

    return fn


def _own_scaler(model, optimizer, scaler, x, y):
    """A slip: a new GradScaler inside the step, so the one passed in never changes."""
    return fp16_step(model, optimizer, torch.amp.GradScaler("cpu"), x, y)


def test_fp16_step_worked_solution_passes_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a notebook cell's stderr is compared: the check must stay quiet
        verdict = lesson.check_fp16_step(fp16_step)
    assert verdict.correct, verdict
    assert "skips step 2" in str(verdict) and "65,536 to 32,768" in str(verdict)


@pytest.mark.parametrize(
    "form",
    [
        _step(zero="start"),  # zero_grad before the forward pass
        _step(returns="item"),  # the loss as a float
        _step(unscale=True),  # unscale_ first (as before clipping), then step
        _step(zero="start", returns="item", unscale=True),
    ],
)
def test_fp16_step_other_correct_forms_pass(form) -> None:
    verdict = lesson.check_fp16_step(form)
    assert verdict.correct, verdict


def test_fp16_step_placeholders() -> None:
    def not_written(model, optimizer, scaler, x, y):
        raise NotImplementedError

    def returns_nothing(model, optimizer, scaler, x, y):
        fp16_step(model, optimizer, scaler, x, y)

    for fn in (not_written, returns_nothing, ..., None):
        verdict = lesson.check_fp16_step(fn)
        assert not verdict.correct and not verdict.answered, fn
    assert str(lesson.check_fp16_step(not_written)) == (
        "Not answered yet: replace the `raise NotImplementedError` line in fp16_step with your code, then run this "
        "cell again."
    )


@pytest.mark.parametrize(
    "fn, hint",
    [
        (_step(scale=False), "not loss.backward()"),  # scaler.step raises: no scale
        (_step(backward_scaled=False), "65,536 times too little"),  # scaled, but the backward unscaled
        (_step(step="optimizer"), "scaler.step(optimizer), not optimizer.step()"),  # update then raises
        (_step(step="optimizer", update=False), "65,536 times too far"),
        (_step(step="both"), "moved the weights twice"),
        (_step(update=False), "refuses a second step"),
        (_own_scaler, "on the scaler you are given"),
        (_step(zero=None), "overflowed gradients of step 2 were still in .grad"),
        (_step(zero="middle"), "never between the two"),
        (_step(dtype=None), "Here the weights moved"),  # no autocast: float32 never overflows
        (_step(dtype=torch.bfloat16), "Here the weights moved"),  # bfloat16 has float32's range
        (_step(returns="scaled"), "returned the scaled loss"),
        (_step(returns="list"), "return loss"),
        (lambda model, optimizer, scaler, x, y: 1 / 0, "In order: the forward pass"),
    ],
)
def test_fp16_step_slips_are_named(fn, hint) -> None:
    verdict = lesson.check_fp16_step(fn)
    assert not verdict.correct and verdict.answered
    assert hint in verdict.hint, verdict
    assert "Traceback" not in str(verdict) and "\n" not in verdict.message


def test_fp16_step_check_overflows_at_step_2_on_any_cpu() -> None:
    """In exact arithmetic (float64), batches 1 and 3 stay far below float16's 65,504 once scaled; batch 2 far above.

    Every partial sum a float16 kernel may form is at most the sum of the absolute terms, so bounding those sums
    holds on any CPU, whatever order its kernels add in.
    """
    model, _, scaler, batches = lesson._step_case()
    model = model.double()
    scale, largest = scaler.get_scale(), torch.finfo(torch.float16).max
    with torch.no_grad():
        for i, (x, y) in enumerate(batches, 1):
            x = x.double()
            hidden = model[0](x)
            logits = model[2](model[1](hidden))
            d_logits = (torch.softmax(logits, -1) - F.one_hot(y, 4)) / len(x) * scale
            d_hidden = (d_logits @ model[2].weight) * (hidden > 0)
            bound = max(
                float((d_logits.abs().T @ model[1](hidden).abs()).max()),
                float(d_logits.abs().sum(0).max()),
                float((d_hidden.abs().T @ x.abs()).max()),
                float(d_hidden.abs().sum(0).max()),
            )
            true_max = max(float((d_logits.T @ model[1](hidden)).abs().max()), float((d_hidden.T @ x).abs().max()))
            if i == 2:
                assert true_max > 100 * largest and float(logits.abs().max()) < largest / 10
            else:
                assert bound < largest / 1.5
    steps, _ = lesson._run_steps(lesson._reference_step)
    assert [s.scale for s in steps] == [65536.0, 32768.0, 32768.0]
    assert float(steps[1].delta.abs().max()) == 0 and all(float(steps[i].delta.norm()) > 0 for i in (0, 2))


def test_fp16_step_check_leaves_the_random_stream_alone() -> None:
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    lesson.check_fp16_step(fp16_step)
    assert torch.equal(torch.random.get_rng_state(), before)
