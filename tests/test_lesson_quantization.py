"""course_utils.lessons.quantization: its charts, widgets and exercises.

- Charts and widget callbacks of notebook 01, without a browser: content, labels, speed, bad input.
- Notebook 01's exercise checkers: the right answer passes, the placeholder is "not answered", slips get hints.
"""

from __future__ import annotations

import time
from pathlib import Path

import matplotlib
import torch

from course_utils import quant

matplotlib.use("Agg")

import pytest
from matplotlib.collections import PathCollection

from course_utils import digits
from course_utils.lessons import quantization as lesson
from course_utils.lessons.kit import plt

NOTEBOOK_SRC = Path(__file__).resolve().parents[1] / "notebooks" / "src" / "01_quantization.py"
#: A widget redraw should take well under a second; the lesson aims for ~0.5 s. The bound is loose because
#: this machine's CPUs are shared while tests run.
REDRAW_LIMIT_S = 1.5

DOT_CHART_DESCRIPTION = (
    "Two rows of 8 dots on an axis from \u22120.4 to 0.4. The float32 row has the original weights: \u22120.35, "
    "\u22120.22, \u22120.05, 0.02, 0.07, 0.12, 0.18 and 0.31. The 4-bit row has the rounded values: \u22120.35, "
    "\u22120.20, \u22120.05, 0, 0.05, 0.10, 0.20 and 0.30. Every rounded value is a multiple of 0.05, and each dot "
    "is at most 0.02 from its original."
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _labelled(ax) -> bool:
    return bool(ax.get_title() and ax.get_xlabel() and ax.get_ylabel())


# --------------------------------------------------------------------------------------------
# Eight numbers
# --------------------------------------------------------------------------------------------
def test_dot_chart_has_two_rows_of_eight() -> None:
    fig = lesson.plot_eight_numbers(4)
    (ax,) = fig.axes
    assert _labelled(ax) and "4-bit" in ax.get_title()
    assert ax.get_xlim() == (-0.4, 0.4)
    rows = [c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)]  # the dots, not the level lines
    assert len(rows) == 2 and all(len(r) == 8 for r in rows)
    assert sorted(round(float(v), 2) for v in rows[0][:, 0]) == sorted(quant.EIGHT_WEIGHTS)
    read_back = [-0.35, -0.2, -0.05, 0.0, 0.05, 0.1, 0.2, 0.3]  # the lesson's 4-bit row (its description)
    assert sorted(round(float(v), 2) + 0.0 for v in rows[1][:, 0]) == read_back


def test_dot_chart_description_is_the_lessons_at_4_bits() -> None:
    assert lesson.describe_eight_numbers(4) == DOT_CHART_DESCRIPTION


def test_notebook_quotes_the_description() -> None:
    src = " ".join(line.lstrip("# ").strip() for line in NOTEBOOK_SRC.read_text(encoding="utf-8").splitlines())
    assert DOT_CHART_DESCRIPTION in src


def test_dot_chart_description_at_2_bits_says_levels_are_shared() -> None:
    text = lesson.describe_eight_numbers(2)
    assert "\u22120.35, \u22120.35, 0, 0, 0, 0, 0.35 and 0.35" in text
    assert "Only 3 different values are left" in text


@pytest.mark.parametrize("bits", range(2, 9))
def test_eight_numbers_view_at_every_width(bits: int) -> None:
    start = time.perf_counter()
    text, fig = lesson.eight_numbers_view(bits)
    elapsed = time.perf_counter() - start
    assert elapsed < REDRAW_LIMIT_S
    assert f"Stored step ({bits}-bit)" in text
    assert f"{bits}-bit: 8 x {bits} bits = {bits} bytes + 4 bytes for the step = {bits + 4} bytes" in text
    assert "Text description of the chart" in text
    assert _labelled(fig.axes[0])


def test_eight_numbers_view_rejects_bad_bits() -> None:
    with pytest.raises(ValueError, match="bits"):
        lesson.eight_numbers_view(9)
    with pytest.raises(TypeError, match="bits"):
        lesson.eight_numbers_view("4")


# --------------------------------------------------------------------------------------------
# Error, size and histograms
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bits, block_size, symmetric", [(4, 0, True), (4, 64, True), (2, 16, False), (8, 1024, False), (3, None, True)]
)
def test_error_view_reports_error_size_and_draws_histograms(bits, block_size, symmetric) -> None:
    lesson.demo_matrix()  # built once, cached: not part of a redraw
    start = time.perf_counter()
    text, fig = lesson.error_view(bits, block_size, symmetric)
    elapsed = time.perf_counter() - start
    assert elapsed < REDRAW_LIMIT_S, f"redraw took {elapsed:.2f} s"
    n = lesson.DEMO_SIDE**2
    blocks = 1 if not block_size else n // block_size
    codes = n * bits // 8
    zero_points = 0 if symmetric else blocks * bits // 8
    assert f"{n:,} values" in text
    assert f"codes {codes:,} + scales {4 * blocks:,} + zero-points {zero_points:,}" in text
    assert "average error" in text and "largest error" in text
    assert len(fig.axes) == 2 and all(_labelled(ax) for ax in fig.axes)


def test_error_view_numbers_match_quant() -> None:
    x = lesson.demo_matrix()
    text, _ = lesson.error_view(4, 64, True)
    q = quant.quantize(x, 4, 64)
    assert f"average error {quant.mean_abs_error(x, q):.4f}" in text
    assert f"size {quant.storage(q).total:,} bytes" in text
    assert "4.500 bits per value" in text


def test_error_view_bad_input() -> None:
    with pytest.raises(TypeError, match="block_size"):
        lesson.error_view(4, "64", True)
    with pytest.raises(ValueError, match="bits"):
        lesson.error_view(1, None, True)


def test_demo_matrix_is_fixed_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    lesson.demo_matrix.cache_clear()
    m = lesson.demo_matrix()
    assert torch.equal(torch.rand(2), expected)
    assert m.shape == (lesson.DEMO_SIDE, lesson.DEMO_SIDE)
    side = lesson.DEMO_SIDE
    assert torch.equal(m, torch.randn(side, side, generator=torch.Generator().manual_seed(0)))


def test_histograms_subsample_big_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.axes import Axes

    drawn, hist = [], Axes.hist

    def counting_hist(ax, values, *args, **kwargs):
        drawn.append(len(values))
        return hist(ax, values, *args, **kwargs)

    monkeypatch.setattr(Axes, "hist", counting_hist)
    x = torch.randn(1000, 1000)
    start = time.perf_counter()
    fig = lesson.plot_value_histograms(x, quant.dequantize(quant.quantize(x, 4)), "int4")
    assert time.perf_counter() - start < REDRAW_LIMIT_S
    left, right = fig.axes
    assert _labelled(left) and _labelled(right)
    assert drawn == [200_000] * 3  # original, read back, errors: an even stride through the 1,000,000 values
    drawn.clear()
    lesson.plot_value_histograms(x[:10], x[:10], "int4")
    assert drawn == [10_000] * 3  # a small tensor is drawn whole


def test_histograms_bad_input() -> None:
    with pytest.raises(ValueError, match="same shape"):
        lesson.plot_value_histograms(torch.ones(4), torch.ones(5), "int4")


# --------------------------------------------------------------------------------------------
# Quality vs bits
# --------------------------------------------------------------------------------------------
def _fake_rows(offset: float) -> list[digits.FormatResult]:
    accs = [0.98, 0.98, 0.98, 0.978, 0.976, 0.931, 0.329]
    return [
        digits.FormatResult(f, digits.FORMAT_BITS[f], a - offset, 0.1 + i, 100)
        for i, (f, a) in enumerate(zip(digits.FORMATS, accs))
    ]


def test_quality_chart_and_description() -> None:
    series = {"one scale per tensor": _fake_rows(0.0), "one scale per row": _fake_rows(0.01)}
    fig = lesson.plot_quality_vs_bits(series)
    acc_ax, loss_ax = fig.axes
    assert _labelled(acc_ax) and _labelled(loss_ax)
    assert len(acc_ax.lines) == 2 and len(loss_ax.lines) == 2
    assert [t.get_text() for t in acc_ax.get_xticklabels()] == list(digits.FORMATS)
    assert loss_ax.get_yscale() == "log"
    assert [line.get_label() for line in acc_ax.lines] == list(series)
    assert [round(y, 1) for y in acc_ax.lines[1].get_ydata()] == [97.0, 97.0, 97.0, 96.8, 96.6, 92.1, 31.9]


def test_quality_chart_places_each_point_at_its_format() -> None:
    """A series that lists fewer formats draws each point above its own format, not shifted to the left."""
    fig = lesson.plot_quality_vs_bits({"all": _fake_rows(0), "int formats": _fake_rows(0)[3:]})
    acc_ax = fig.axes[0]
    assert [t.get_text() for t in acc_ax.get_xticklabels()] == list(digits.FORMATS)
    assert list(acc_ax.lines[1].get_xydata()[:, 0]) == [3, 4, 5, 6]
    assert list(acc_ax.lines[1].get_xydata()[:, 1]) == list(acc_ax.lines[0].get_xydata()[3:, 1])


# --------------------------------------------------------------------------------------------
# The widgets themselves (constructed without a front end)
# --------------------------------------------------------------------------------------------
def test_widgets_wire_the_right_controls(capsys: pytest.CaptureFixture) -> None:
    import ipywidgets as w

    box = lesson.eight_numbers_widget()
    (slider,) = box.children[0].children
    assert isinstance(slider, w.IntSlider) and (slider.min, slider.max, slider.value) == (2, 8, 4)
    box = lesson.error_widget()
    bits, block, symmetric = box.children[0].children
    assert (bits.min, bits.max) == (2, 8)
    assert [v for _, v in block.options] == [v for _, v in lesson.BLOCK_CHOICES] and block.value == 0
    assert isinstance(symmetric, w.Checkbox) and symmetric.value is True
    capsys.readouterr()


# --------------------------------------------------------------------------------------------
# Same model, any format (the "same model, four formats" widget)
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits_model() -> tuple[torch.nn.Module, digits.DigitsData]:
    """The course's digits split and the network notebook 01 trains on it (training seed 0)."""
    data = digits.load_digits_data()
    return digits.train_digits_mlp(data, seed=0), data


def test_format_view_int4_per_row_prints_the_tables_figures(digits_model) -> None:
    model, data = digits_model
    text, fig = lesson.format_view("int4", "row", model, data)
    (row,) = [r for r in digits.quality_by_format(model, data, block_size="row") if r.fmt == "int4"]
    base = digits.evaluate(model, data)
    assert f"{100 * base.accuracy:.1f}%" in text and f"{100 * row.accuracy:.1f}%" in text
    assert f"{row.loss:.3f}" in text and f"{row.weight_bytes:,}" in text
    assert "int4, one scale per row" in text and "18,944" in text
    # 74 scales (64 + 10 rows) of 4 bytes, and 4,736 codes of 4 bits
    assert "4,736 codes of 4 bits (2,368 bytes) and 74 float32 scales (296 bytes)" in text
    assert "Text description of the chart" in text
    acc_ax, loss_ax, bytes_ax = fig.axes
    assert all(_labelled(ax) for ax in fig.axes)
    assert [round(p.get_height(), 6) for p in bytes_ax.patches] == [18944, row.weight_bytes]
    assert [t.get_text() for t in acc_ax.get_xticklabels()] == ["float32", "int4"]


@pytest.mark.parametrize("fmt", digits.FORMATS)
@pytest.mark.parametrize("scales", [value for _, value in lesson.SCALE_CHOICES])
def test_format_view_every_setting_matches_model_in_format(digits_model, fmt: str, scales) -> None:
    model, data = digits_model
    score = lesson.format_score(model, data, fmt, scales)
    block = None if scales == "tensor" or not fmt.startswith("int") else scales
    converted, size = digits.model_in_format(model, fmt, block)
    assert (score.accuracy, score.loss) == tuple(digits.evaluate(converted, data))
    assert score.weight_bytes == size
    if fmt.startswith("int"):
        layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert score.weight_bytes - score.scale_bytes == sum(
            quant.packed_storage(m.weight.numel(), digits.FORMAT_BITS[fmt]).codes for m in layers
        )
    else:
        assert score.scale_bytes == 0
    text, _ = lesson.format_view(fmt, scales, model, data)
    assert f"{score.weight_bytes:,}" in text


def test_format_view_is_fast_and_floats_ignore_the_scales(digits_model) -> None:
    model, data = digits_model
    lesson.format_view("int3", 16, model, data)
    start = time.perf_counter()
    lesson.format_view("int3", 16, model, data)
    elapsed = time.perf_counter() - start
    assert elapsed < REDRAW_LIMIT_S, f"redraw took {elapsed:.2f} s"
    assert lesson.format_score(model, data, "int3", 16) != lesson.format_score(model, data, "int3", "tensor")
    assert lesson.format_score(model, data, "bfloat16", 16) == lesson.format_score(model, data, "bfloat16")
    assert "no scales" in lesson.format_view("float16", 64, model, data)[0]


def test_format_score_bad_settings(digits_model) -> None:
    model, data = digits_model
    with pytest.raises(ValueError, match="fmt"):
        lesson.format_score(model, data, "int5")
    with pytest.raises(ValueError, match="scales"):
        lesson.format_score(model, data, "int4", 48)


def test_format_score_follows_the_model(digits_model) -> None:
    model, data = digits_model
    other = digits.train_digits_mlp(data, seed=3)
    assert lesson.format_score(other, data, "int4") != lesson.format_score(model, data, "int4")


def test_format_labels(digits_model) -> None:
    model, data = digits_model
    for fmt, scales, label in (
        ("int4", "row", "in int4, one scale per row,"),
        ("int8", 64, "in int8, one scale per 64 weights,"),
        ("int2", "tensor", "in int2, one scale per tensor,"),
        ("bfloat16", 16, "in bfloat16, next"),
    ):
        assert label in lesson.format_view(fmt, scales, model, data)[0], label


def test_format_chart_and_description(digits_model) -> None:
    model, data = digits_model
    base, row = lesson.format_score(model, data, "float32"), lesson.format_score(model, data, "int4", "row")
    text, fig = lesson.format_view("int4", "row", model, data)
    assert len(fig.axes) == 3 and all(_labelled(ax) for ax in fig.axes)
    assert "int4, one scale per row" in fig._suptitle.get_text()
    description = " ".join(text.split("Text description of the chart: ")[1].split())
    assert f"test accuracy {100 * base.accuracy:.1f}% and {100 * row.accuracy:.1f}%" in description
    assert f"test loss {base.loss:.3f} and {row.loss:.3f}" in description
    assert f"weight bytes {base.weight_bytes:,} and {row.weight_bytes:,}" in description


def test_format_widget_controls(digits_model, capsys: pytest.CaptureFixture) -> None:
    import ipywidgets as w

    model, data = digits_model
    box = lesson.format_widget(model, data)
    fmt, scales = box.children[0].children
    assert isinstance(fmt, w.Dropdown) and list(fmt.options) == list(digits.FORMATS) and fmt.value == "int4"
    assert [v for _, v in scales.options] == [v for _, v in lesson.SCALE_CHOICES] and scales.value == "row"
    fmt.value = "bfloat16"
    assert scales.disabled  # a 16-bit float has no scales
    fmt.value = "int2"
    assert not scales.disabled
    with pytest.raises(TypeError, match="model"):
        lesson.format_widget("model", data)
    with pytest.raises(TypeError, match="data"):
        lesson.format_widget(model, "data")
    capsys.readouterr()


N = 11008 * 4096  # the exercise's matrix


# --------------------------------------------------------------------------------------------
# Bytes of an int4 matrix with a scale per 64 weights
# --------------------------------------------------------------------------------------------
def test_bytes_right_answer() -> None:
    assert quant.packed_storage(N, 4, 64).total == 25_362_432
    feedback = lesson.check_int4_block_bytes(N * 4 // 8 + N // 64 * 4)
    assert feedback.correct and feedback.answered
    assert "25,362,432 bytes" in str(feedback) and "4.5 bits per weight" in str(feedback)
    assert lesson.check_int4_block_bytes(25_362_432.0).correct


def test_bytes_placeholder() -> None:
    for placeholder in (..., None):
        feedback = lesson.check_int4_block_bytes(placeholder)
        assert not feedback.correct and not feedback.answered
        assert str(feedback).startswith("Not answered yet")


def _hint(answer: object) -> str:
    feedback = lesson.check_int4_block_bytes(answer)
    assert not feedback.correct and feedback.answered
    return feedback.hint


def test_bytes_typical_slips_get_their_hint() -> None:
    assert "codes alone" in _hint(N // 2)  # forgot the scales
    assert "half a byte" in _hint(N * 4 + N // 64 * 4)  # 4 bytes a weight / bits as bytes
    assert "add the scales" in _hint(N * 4)  # both slips at once
    assert "in bits" in _hint(N * 4 + N // 64 * 32)  # the whole total in bits
    assert "not 2" in _hint(N // 2 + N // 64 * 2)  # 16-bit scales
    assert "one scale for the whole matrix" in _hint(N // 2 + 4)  # one scale only
    assert "two to a byte" in _hint(N + N // 64 * 4)  # a byte per code
    assert "MB" in _hint(25.362432)
    assert "Codes:" in _hint(12345)  # anything else: the general hint


def test_bytes_wrong_types() -> None:
    for answer in ("25362432", True, float("nan")):
        feedback = lesson.check_int4_block_bytes(answer)
        assert not feedback.correct and feedback.answered and "number" in feedback.message


# --------------------------------------------------------------------------------------------
# quantize_int8 by hand
# --------------------------------------------------------------------------------------------
# fmt: off
def quantize_int8(x):
    """Notebook 01's worked solution, as its <details> block writes it (unformatted: the notebook's layout)."""
    s = x.abs().max() / 127   # the largest |x| lands on level ±127
    q = torch.round(x / s)    # the nearest level; |x / s| <= 127, so no clamp is needed
    return q, s
# fmt: on


def test_the_worked_solution_is_the_notebooks() -> None:
    """The function above is the notebook's worked solution, line for line (its docstring aside)."""
    import inspect

    lines = [line for line in inspect.getsource(quantize_int8).splitlines() if '"""' not in line]
    source = NOTEBOOK_SRC.read_text(encoding="utf-8")
    assert "\n".join(f"# {line}".rstrip() for line in lines) in source


def test_int8_worked_solution_passes_and_the_cases_are_quant_quantize() -> None:
    feedback = lesson.check_quantize_int8(quantize_int8)
    assert feedback.correct and feedback.answered and "all 4 test tensors" in str(feedback)
    for x in lesson.int8_cases():  # the expected codes and scale are quant.quantize's on every case
        codes, scale = quantize_int8(x)
        q = quant.quantize(x, 8)
        assert torch.equal(codes.to(torch.int8), q.codes) and float(scale) == float(q.scales)


def _s(x):
    return x.abs().max() / 127


#: Other correct ways to write it: each must pass.
INT8_RIGHT_FORMS = {
    "int8 codes, a float scale": lambda x: (torch.round(x / _s(x)).to(torch.int8), _s(x).item()),
    "a scale of shape (1,)": lambda x: (torch.round(x / _s(x)).char(), _s(x).reshape(1)),
    "a clamp added": lambda x: (torch.clamp(torch.round(x / _s(x)), -127, 127), _s(x)),
    "int8's full range as the clamp": lambda x: (torch.round(x / _s(x)).clamp(-128, 127).long(), float(_s(x))),
    "multiplied by the inverse scale": lambda x: (torch.round(x * (127 / x.abs().max())), _s(x)),
    "in float64": lambda x: (torch.round(x.double() / _s(x.double())), _s(x.double())),
    "the codes as a list": lambda x: (torch.round(x / _s(x)).tolist(), _s(x)),
}


@pytest.mark.parametrize("form", INT8_RIGHT_FORMS)
def test_int8_other_correct_forms_pass(form: str) -> None:
    feedback = lesson.check_quantize_int8(INT8_RIGHT_FORMS[form])
    assert feedback.correct, feedback


def test_int8_placeholder() -> None:
    def not_written(x):
        raise NotImplementedError  # your code: s = ..., q = ..., return q, s

    def no_return(x):
        s = x.abs().max() / 127  # noqa: F841 - a student's unfinished function

    for fn in (..., None, not_written, no_return):
        feedback = lesson.check_quantize_int8(fn)
        assert not feedback.correct and not feedback.answered, fn
    assert "replace the `raise NotImplementedError` line in quantize_int8" in str(
        lesson.check_quantize_int8(not_written)
    )


def _int8_hint(fn) -> str:
    feedback = lesson.check_quantize_int8(fn)
    assert not feedback.correct and feedback.answered
    return feedback.hint


#: Each typical slip, and a phrase of its own hint (each hint differs from every other slip's).
INT8_SLIPS = {
    "q_max 128": (lambda x: (torch.round(x / (x.abs().max() / 128)), x.abs().max() / 128), "127, not 128"),
    "divided by 255": (lambda x: (torch.round(x / (x.abs().max() / 255)), x.abs().max() / 255), "not by 255"),
    "int4's q_max 7": (lambda x: (torch.round(x / (x.abs().max() / 7)), x.abs().max() / 7), "int4's q_max"),
    "x.max()": (lambda x: (torch.round(x / (x.max() / 127)), x.max() / 127), "extreme is negative"),
    "-x.min()": (lambda x: (torch.round(x / (-x.min() / 127)), -x.min() / 127), "extreme is positive"),
    "inverted scale": (lambda x: (torch.round(x * (127 / x.abs().max())), 127 / x.abs().max()), "not its inverse"),
    "no division": (lambda x: (torch.round(x / x.abs().max()), x.abs().max()), "not the largest |x|"),
    "zero-point scale": (
        lambda x: (torch.round(x / ((x.max() - x.min()) / 255)), (x.max() - x.min()) / 255),
        "with a zero-point",
    ),
    "truncated": (lambda x: ((x / _s(x)).int(), _s(x)), "cut the fraction off"),
    "truncated to int8": (lambda x: ((x / _s(x)).to(torch.int8), _s(x)), "cut the fraction off"),
    "floor": (lambda x: (torch.floor(x / _s(x)), _s(x)), "not floor"),
    "not rounded": (lambda x: (x / _s(x), _s(x)), "whole numbers"),
    "read-back": (lambda x: (torch.round(x / _s(x)) * _s(x), _s(x)), "not the read-back"),
    "multiplied": (lambda x: (torch.round(x * _s(x)), _s(x)), "not x * s"),
    "a scale per row": (
        lambda x: (torch.round(x / (x.abs().amax(-1, keepdim=True) / 127)), x.abs().amax(-1, keepdim=True) / 127),
        "One scale for the whole tensor",
    ),
    "scale first": (lambda x: (_s(x), torch.round(x / _s(x))), "codes first"),
}


@pytest.mark.parametrize("slip", INT8_SLIPS)
def test_int8_each_named_slip_gets_its_own_hint(slip: str) -> None:
    fn, phrase = INT8_SLIPS[slip]
    hint = _int8_hint(fn)
    assert phrase in hint, hint
    others = {p for name, (_, p) in INT8_SLIPS.items() if p != phrase}
    assert not any(other in hint for other in others), hint


def test_int8_wrong_shapes_and_errors_are_one_line() -> None:
    assert "return q, s" in _int8_hint(lambda x: x)
    assert "shape" in lesson.check_quantize_int8(lambda x: (x[:1], x.abs().max() / 127)).message
    assert "not a tensor" in lesson.check_quantize_int8(lambda x: ("codes", x.abs().max() / 127)).message
    feedback = lesson.check_quantize_int8(lambda x: 1 / 0)
    assert not feedback.correct and "ZeroDivisionError" in feedback.message and "\n" not in feedback.message
    assert "should be a function" in lesson.check_quantize_int8(42).message
    assert "The codes are q = torch.round(x / s)" in _int8_hint(lambda x: (torch.ceil(x / _s(x)), _s(x)))


def _plotted_numbers(series: dict[str, list[digits.FormatResult]]) -> str:
    """The numbers plot_quality_vs_bits draws, as a description writes them: every series' accuracies, then every
    series' losses (each in the order of the formats)."""
    rows = [r for rows in series.values() for r in rows]
    return " ".join([f"{100 * r.accuracy:.1f}%" for r in rows] + [f"{r.loss:.3f}" for r in rows])


def test_01s_hand_written_chart_description_has_the_charts_numbers() -> None:
    """01 describes its quality chart in its own words: every number there is one the chart draws, in order."""
    import json
    import re

    nb = json.loads((NOTEBOOK_SRC.parents[1] / "01_quantization.ipynb").read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]

    def table(name: str) -> list[digits.FormatResult]:
        cell = next(c for c in code if f"print(format_quality_table({name}))" in "".join(c["source"]))
        lines = "".join("".join(o.get("text", "")) for o in cell["outputs"]).splitlines()[1:]
        return [
            digits.FormatResult(f, int(b), float(a.rstrip("%")) / 100, float(loss), int(n.replace(",", "")))
            for f, b, a, loss, n in (line.split() for line in lines if line.strip())
        ]

    said = _plotted_numbers({"one scale per tensor": table("per_tensor"), "one scale per row": table("per_row")})
    markdown = next(
        "".join(c["source"])
        for c in nb["cells"]
        if c["cell_type"] == "markdown" and "Two line charts" in "".join(c["source"])
    )
    for pattern in (r"\d+\.\d%", r"\b\d\.\d{3}\b"):  # accuracies, then losses, in the same order
        assert re.findall(pattern, markdown) == re.findall(pattern, said), pattern
