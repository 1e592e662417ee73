"""Notebook 01 (quantization): its charts, widgets and auto-checked exercises.

The arithmetic is in :mod:`course_utils.quant` and :mod:`course_utils.digits`; this module formats, draws and
wires. The dot chart and the format view write their text descriptions (the notebook describes the quality chart
in its own words, with the numbers it prints); each widget is a plain ``*_view`` callback
(tested without a browser) wired by a ``*_widget`` function. Expected answers come from ``quant``, never
retyped.
"""

import itertools
import math
import textwrap
from functools import lru_cache, partial
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from matplotlib.ticker import MaxNLocator

from course_utils import checks, digits, quant
from course_utils.lessons import kit
from course_utils.lessons.kit import COLORS, Feedback, plt

#: Histograms draw at most this many values (an even stride through the tensor), to stay fast.
_HISTOGRAM_MAX_POINTS = 200_000


def _num(value: float, decimals: int) -> str:
    """A value for prose: '0' for zero, else ``decimals`` digits, with a typographic minus (the tables keep '-')."""
    if abs(value) < 0.5 * 10**-decimals:
        return "0"
    return f"{value:.{decimals}f}".replace("-", "\u2212")


def _join(items: Sequence[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


# --------------------------------------------------------------------------------------------
# The eight numbers: a two-row dot chart
# --------------------------------------------------------------------------------------------
def plot_eight_numbers(bits: int = 4):
    """Two rows of dots: the eight float32 weights, and the same weights after ``bits``-bit rounding.

    Faint vertical lines mark the levels (multiples of the step); a grey segment joins each weight to
    the value it is read back as.
    """
    table = quant.eight_numbers(bits)
    fig, ax = kit.new_figure(
        f"The same 8 weights before and after {bits}-bit rounding", "weight value", "format", figsize=(7.0, 2.8)
    )
    q_min, q_max = quant.level_range(bits)
    levels = [k * table.step for k in range(q_min, q_max + 1) if abs(k * table.step) <= 0.4]
    ax.vlines(levels, -0.5, 1.5, color="0.85", lw=0.8, zorder=0)  # one artist for all levels: fast at 8 bits
    ax.plot([table.weights, table.read_back], [[1] * 8, [0] * 8], color="0.6", lw=1, zorder=1)  # one line a weight
    ax.scatter(table.weights, [1] * 8, s=45, color=COLORS["float32"], zorder=2, label="float32 (original)")
    ax.scatter(table.read_back, [0] * 8, s=45, color=COLORS["int4"], zorder=2, label=f"{bits}-bit (read back)")
    ax.set(xlim=(-0.4, 0.4), ylim=(-0.5, 1.5))
    ax.set_yticks([0, 1], [f"{bits}-bit", "float32"])
    ax.grid(False, axis="y")
    ax.legend(loc="upper left", fontsize=8, ncols=2, frameon=False)
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.2, top=0.88)  # fixed margins: no layout pass per redraw
    return fig


def describe_eight_numbers(bits: int = 4) -> str:
    """The text description of :func:`plot_eight_numbers` (at 4 bits: the lesson's own description)."""
    table = quant.eight_numbers(bits)
    d = table.decimals
    originals = [_num(w, 2) for w in sorted(table.weights)]
    rounded = [_num(r, d) for r in sorted(table.read_back)]
    worst = max(abs(e) for e in table.errors)
    distinct = len({round(r, 6) for r in table.read_back})
    text = (
        f"Two rows of 8 dots on an axis from \u22120.4 to 0.4. The float32 row has the original weights: "
        f"{_join(originals)}. The {bits}-bit row has the rounded values: {_join(rounded)}. "
        f"Every rounded value is a multiple of {_num(table.step, d)}, and each dot is at most "
        f"{_num(worst, d)} from its original."
    )
    if distinct < 8:
        text += f" Only {distinct} different values are left: several weights share a level."
    return text


# --------------------------------------------------------------------------------------------
# Histograms of values and errors
# --------------------------------------------------------------------------------------------
def plot_value_histograms(x: torch.Tensor, x_hat: torch.Tensor, label: str, bins: int = 120):
    """Left: histogram of the original values and of their read-back; right: histogram of the errors.

    At most 200,000 values are drawn (an even stride through the tensor), so this stays fast for a 4096 x 4096
    matrix.
    """
    if not isinstance(x, torch.Tensor) or not isinstance(x_hat, torch.Tensor) or x.shape != x_hat.shape:
        raise ValueError("x and x_hat must be tensors of the same shape")
    stride = max(1, x.numel() // _HISTOGRAM_MAX_POINTS)
    orig, back = (t.detach().reshape(-1)[::stride][:_HISTOGRAM_MAX_POINTS].float().cpu().numpy() for t in (x, x_hat))
    err = back - orig
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.0, 3.4))
    edges = np.linspace(float(min(orig.min(), back.min())), float(max(orig.max(), back.max())), bins + 1)
    ax1.hist(orig, edges, histtype="stepfilled", alpha=0.45, color=COLORS["float32"], label="original (float32)")
    ax1.hist(back, edges, histtype="step", color=COLORS["measured"], lw=1.2, label=f"read back ({label})")
    ax1.set(title="Values before and after quantization", xlabel="value", ylabel="count")
    ax1.legend(fontsize=8, frameon=False, loc="upper left")
    span = float(np.abs(err).max()) or 1e-12
    ax2.hist(err, np.linspace(-span, span, bins + 1), histtype="stepfilled", color=COLORS["int4"])
    ax2.set(title="Quantization error (read back \u2212 original)", xlabel="error", ylabel="count")
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.15, top=0.9, wspace=0.3)  # fixed: fast redraws
    return fig


# --------------------------------------------------------------------------------------------
# Same model, several formats
# --------------------------------------------------------------------------------------------
def plot_quality_vs_bits(series: Mapping[str, Sequence]):
    """Test accuracy (left) and test loss (right, log scale) of one model in every format.

    ``series`` maps a label (e.g. "one scale per tensor") to the rows of
    :func:`course_utils.digits.quality_by_format`. The x axis names the formats, in the order they first appear.
    """
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10.0, 3.8))
    for marker, (name, rows) in zip(itertools.cycle("osd^v"), series.items()):
        formats = [r.fmt for r in rows]
        ax1.plot(formats, [100 * r.accuracy for r in rows], marker=marker, label=name)
        ax2.plot(formats, [r.loss for r in rows], marker=marker, label=name)
    for ax in (ax1, ax2):
        ax.set_xlabel("weight format (fewer bits to the right)")
    ax1.set(title="Test accuracy by weight format", ylabel="test accuracy (%)", ylim=(0, 100))
    ax2.set(title="Test loss by weight format (log scale)", ylabel="test cross-entropy loss", yscale="log")
    return kit.finish(fig, ax1, fontsize=8, loc="lower left")


# --------------------------------------------------------------------------------------------
# One format next to float32 (the "same model, four formats" demo)
# --------------------------------------------------------------------------------------------
def _plot_format_comparison(base: digits.FormatResult, other: digits.FormatResult, label: str):
    """Three small bar charts, ``base`` (float32) next to ``other`` (in the format ``label`` names): test accuracy,
    test loss, weight bytes.

    Fixed margins and no layout pass, so a widget redraw stays fast.
    """
    fig, axes = plt.subplots(1, 3, figsize=(10.0, 2.9))
    panels = (
        ("Test accuracy", "test accuracy (%)", [100 * base.accuracy, 100 * other.accuracy], "{:.1f}%"),
        ("Test loss", "test cross-entropy loss", [base.loss, other.loss], "{:.3f}"),
        ("Weight bytes (scales included)", "bytes", [base.weight_bytes, other.weight_bytes], "{:,.0f}"),
    )
    for ax, (title, ylabel, values, fmt) in zip(axes, panels):
        bars = ax.bar([0, 1], values, color=[COLORS["float32"], COLORS["measured"]], width=0.6)
        ax.set_xticks([0, 1], ["float32", label.split(",")[0]])  # 'int4, one scale per row': 'int4'; rest above
        ax.set_title(title, fontsize=10, y=1.02)  # a fixed position skips matplotlib's title layout pass
        ax.yaxis.set_major_locator(MaxNLocator(4))
        ax.set(xlabel="weight format", ylabel=ylabel, ylim=(0, max(values) * 1.25 or 1))
        ax.grid(False, axis="x")
        ax.bar_label(bars, [fmt.format(value) for value in values], fontsize=8)
    axes[0].set_ylim(0, 110)
    fig.suptitle(f"The same network: float32 next to {label}", fontsize=11)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.2, top=0.8, wspace=0.45)  # fixed: fast redraws
    return fig


#: Block sizes the error demo offers; 0 stands for "one scale for the whole matrix".
BLOCK_CHOICES: tuple[tuple[str, int], ...] = (("one scale", 0), *((str(n), n) for n in (16, 32, 64, 128, 256, 1024)))
#: Side of the random matrix the error demo quantizes (1024 x 1024 = 1M values: one redraw stays under a second).
DEMO_SIDE = 1024
#: Scale granularities the format demo offers (label, value): int formats only; a 16-bit float needs no scale.
SCALE_CHOICES: tuple[tuple[str, str | int], ...] = (
    ("one per tensor", "tensor"),
    ("one per row", "row"),
    *((f"one per {n} weights", n) for n in (64, 32, 16)),
)
#: Each scale setting as the format's label writes it: "one scale per row".
_SCALE_LABELS = {value: label.replace("one per", "one scale per") for label, value in SCALE_CHOICES}


def eight_numbers_view(bits: int = 4) -> tuple[str, Any]:
    """The eight-number table at ``bits`` bits, the bytes it takes, and the dot chart."""
    table = quant.eight_numbers(bits)
    parts = quant.packed_storage(len(table.weights), bits)
    sizes = f"float32: 8 x 4 = 32 bytes.  {bits}-bit: 8 x {bits} bits = {parts.codes} bytes + 4 bytes for the step"
    description = textwrap.fill("Text description of the chart: " + describe_eight_numbers(bits), width=100)
    text = f"{quant.format_eight_numbers(table)}\n\n{sizes} = {parts.total} bytes.\n\n{description}"
    return text, plot_eight_numbers(bits)


@lru_cache(maxsize=1)
def demo_matrix() -> torch.Tensor:
    """A :data:`DEMO_SIDE` x :data:`DEMO_SIDE` matrix of standard normal 'weights' from seed 0 (cached; the global
    RNG is untouched)."""
    return torch.randn(DEMO_SIDE, DEMO_SIDE, generator=torch.Generator().manual_seed(0))


def error_view(bits: int = 4, block_size: int | None = None, symmetric: bool = True) -> tuple[str, Any]:
    """Quantize :func:`demo_matrix` and report average/max error, size incl. overhead, histograms.

    ``block_size`` 0 (the dropdown's 'one scale') or None: one scale for the whole matrix.
    """
    x = demo_matrix()
    q = quant.quantize(x, bits, block_size or None, symmetric)
    x_hat = quant.dequantize(q)
    p = quant.storage(q)
    errors = f"average error {quant.mean_abs_error(x, x_hat):.4f}, largest error {quant.max_abs_error(x, x_hat):.4f}"
    size = f"size {p.total:,} bytes = codes {p.codes:,} + scales {p.scales:,} + zero-points {p.zero_points:,}"
    share = f"{quant.bits_per_weight(q):.3f} bits per value, {100 * p.total / (x.numel() * 4):.1f}% of float32"
    return f"{q.name}: {x.numel():,} values\n{errors}\n{size}  ({share})", plot_value_histograms(x, x_hat, label=q.name)


# --------------------------------------------------------------------------------------------
# Same model, any format
# --------------------------------------------------------------------------------------------
def format_score(
    model: torch.nn.Module, data: digits.DigitsData, fmt: str, scales: str | int = "tensor"
) -> digits.FormatResult:
    """Score ``model`` with its Linear weights in ``fmt``, and ``scales`` for an int format (the menus' values).

    :func:`course_utils.digits.score_in_format` takes a millisecond or two on the digits network: no cache needed.
    """
    checks.choice(fmt, "fmt", digits.FORMATS)
    if not fmt.startswith("int"):
        return digits.score_in_format(model, data, fmt)  # a 16-bit float rounds each weight: no scales
    checks.choice(scales, "scales", _SCALE_LABELS)
    return digits.score_in_format(model, data, fmt, None if scales == "tensor" else scales)


def format_view(fmt: str, scales: str | int, model: torch.nn.Module, data: digits.DigitsData) -> tuple[str, Any]:
    """The digits network in weight format ``fmt`` next to float32: accuracy, loss and bytes, as text and bars.

    ``fmt`` is one of :data:`course_utils.digits.FORMATS`; ``scales`` one of :data:`SCALE_CHOICES`' values
    ("tensor", "row", 64, 32, 16), for int formats only: the format widget's menus.
    """
    base, score = format_score(model, data, "float32"), format_score(model, data, fmt, scales)
    label = f"{fmt}, {_SCALE_LABELS[scales]}" if fmt.startswith("int") else fmt  # 'int4, one scale per row'
    n_weights = digits.linear_weight_count(model)
    shapes = [tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    width = max(len(label), 9)
    acc_change = round(100 * (score.accuracy - base.accuracy), 1) + 0.0  # + 0.0: -0.0 prints as +0.0
    loss_change = round(score.loss - base.loss, 3) + 0.0
    share = 100 * score.weight_bytes / base.weight_bytes
    rows = (
        ("test accuracy", f"{100 * base.accuracy:.1f}%", f"{100 * score.accuracy:.1f}%", f"{acc_change:+.1f} points"),
        ("test loss", f"{base.loss:.3f}", f"{score.loss:.3f}", f"{loss_change:+.3f}"),
        ("weight bytes", f"{base.weight_bytes:,}", f"{score.weight_bytes:,}", f"{share:.1f}% of float32"),
    )
    lines = [
        f"The digits network ({n_weights:,} weights in {len(shapes)} Linear layers: "
        f"{' and '.join(f'{r} x {c}' for r, c in shapes)}) in {label}, next to float32:",
        f"{'':<15}{'float32':>10}   {label:<{width}}",
        *(f"{name:<15}{ours:>10}   {theirs:<{width}}  ({change})" for name, ours, theirs, change in rows),
    ]
    if fmt.startswith("int"):
        lines.append(
            f"The {score.weight_bytes:,} bytes hold {n_weights:,} codes of {digits.FORMAT_BITS[fmt]} bits "
            f"({score.weight_bytes - score.scale_bytes:,} bytes) and "
            f"{score.scale_bytes // quant.SCALE_BYTES:,} float32 scales ({score.scale_bytes:,} bytes)."
        )
    elif fmt != "float32":
        lines.append("A 16-bit float rounds each weight on its own: no scales (the scales menu is for int formats).")
    bars = "; ".join(f"{name} {ours} and {theirs}" for name, ours, theirs, _ in rows)  # the table's numbers
    description = f"Three bar charts, float32 (left bar) next to {label} (right bar): {bars}."
    text = "\n".join(lines) + "\n\n" + textwrap.fill("Text description of the chart: " + description, width=100)
    return text, _plot_format_comparison(base, score, label)


def eight_numbers_widget() -> Any:
    """A slider for bits (2-8) that redraws the eight-number table and the dot chart."""
    import ipywidgets as w

    return kit.view_panel(
        eight_numbers_view, bits=w.IntSlider(value=4, min=quant.MIN_BITS, max=quant.MAX_BITS, description="bits")
    )


def error_widget() -> Any:
    """Bits, block size and symmetric/zero-point controls; shows error, size (with overhead) and histograms."""
    import ipywidgets as w

    return kit.view_panel(
        error_view,
        bits=w.IntSlider(value=4, min=quant.MIN_BITS, max=quant.MAX_BITS, description="bits"),
        block_size=w.Dropdown(options=list(BLOCK_CHOICES), value=0, description="block size"),
        symmetric=w.Checkbox(value=True, description="symmetric (no zero-point)"),
    )


def format_widget(model: torch.nn.Module, data: digits.DigitsData) -> Any:
    """A weight-format menu and a scales menu (int formats only) that redraw :func:`format_view` for ``model``
    (the digits network) on ``data``."""
    import ipywidgets as w

    checks.instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    checks.instance(data, "data", digits.DigitsData, "a DigitsData (from load_digits_data)")
    fmt = w.Dropdown(options=list(digits.FORMATS), value="int4", description="format")
    scales = w.Dropdown(options=list(SCALE_CHOICES), value="row", description="scales")
    w.dlink((fmt, "value"), (scales, "disabled"), lambda value: not value.startswith("int"))  # floats have no scales
    return kit.view_panel(partial(format_view, model=model, data=data), fmt=fmt, scales=scales)


# --------------------------------------------------------------------------------------------
# Exercise 1: how many bytes does an int4 matrix with a scale per 64 weights take?
# --------------------------------------------------------------------------------------------
def check_int4_block_bytes(answer: Any) -> Feedback:
    """Check the bytes of an 11008 x 4096 matrix in int4 with one float32 scale per block of 64 weights."""
    n = 11008 * 4096  # one MLP matrix of a 7-billion-parameter model (hidden 4096, MLP 11008)
    parts = quant.packed_storage(n, 4, 64)
    blocks = parts.scales // quant.SCALE_BYTES
    as_bytes = "weights x 4 counts bits, or float32's 4 bytes a weight. A 4-bit code is half a byte: weights / 2 bytes."
    mistakes = [
        (parts.codes, "That is the codes alone: add one 4-byte scale for every block of 64 weights."),
        (n * 4 + parts.scales, as_bytes),
        (n * 4, as_bytes + " Then add the scales."),
        (n * 4 + blocks * 32, "That is the total in bits: divide by 8 to get bytes."),
        (parts.codes + blocks * 2, "The scales are float32: 4 bytes each, not 2."),
        (parts.codes + 4, "That is one scale for the whole matrix: here every block of 64 weights has its own."),
        (n + parts.scales, "The codes are packed at 4 bits, two to a byte, not one byte each."),
        (parts.total / 1e6, "That is in MB: give the answer in bytes."),
        (parts.total / 2**20, "That is in MiB: give the answer in bytes."),
    ]
    return kit.check_number(
        answer,
        parts.total,
        name="answer_bytes",
        what="a number of bytes",
        rel_tol=0,
        abs_tol=0.5,
        mistakes=mistakes,
        unit="bytes",
        hint="Codes: weights x 4 bits / 8. Scales: (weights / 64) blocks x 4 bytes. Add both.",
        why=f"{parts.codes:,} bytes of codes + {parts.scales:,} of scales, {parts.total * 8 / n:g} bits per weight.",
    )


# --------------------------------------------------------------------------------------------
# Exercise 2: write symmetric int8 quantization with one scale
# --------------------------------------------------------------------------------------------
def int8_cases() -> list[torch.Tensor]:
    """The tensors the int8 exercise is tried on: the notebook's numbers, negative extremes, a positive one in 2-D."""
    return [
        torch.tensor([0.5, -1.27, 0.02, 1.0]),
        torch.tensor(quant.EIGHT_WEIGHTS),
        torch.tensor([-2.0, 0.3, 1.1, -0.7]),
        torch.randn(16, 16, generator=torch.Generator().manual_seed(2)),
    ]


def _first(t: torch.Tensor, k: int = 4) -> str:
    """The first ``k`` values of ``t`` as '[0.5, -1.27, ...]' (whole numbers without '.0')."""
    values = ", ".join(f"{v + 0.0:.4g}" for v in t.reshape(-1)[:k].tolist())  # + 0.0: -0 shows as 0
    return f"[{values}{', ...' if t.numel() > k else ''}]"


def _scale_slip(x: torch.Tensor, scale: float) -> str:
    """The hint for a wrong scale of ``x`` (float32): the typical slip that gives it, or the rule."""
    absmax, high, low = float(x.abs().max()), float(x.max()), float(x.min())
    slips = [
        (absmax / 128, "int8 keeps the symmetric levels -127..127, so q_max is 127, not 128."),
        (absmax / 255, "The levels run from -127 to 127: divide max|x| by q_max = 127, not by 255."),
        (absmax / 7, "7 is int4's q_max (the eight numbers above); int8's is 127."),
        (high / 127, "Use the largest absolute value, x.abs().max(): here the extreme is negative."),
        (-low / 127, "Use the largest absolute value, x.abs().max(): here the extreme is positive."),
        (127 / absmax, "The scale is max|x| / 127 (the gap between two levels), not its inverse."),
        (absmax, "Divide max|x| by q_max = 127: the scale is the gap between two levels, not the largest |x|."),
        ((high - low) / 255, "That is the scale with a zero-point (0..255); here s = max|x| / 127 (levels -127..127)."),
    ]
    return next(
        (hint for value, hint in slips if math.isclose(scale, value, rel_tol=1e-6)),
        "The scale is s = max|x| / 127, with max|x| = x.abs().max().",
    )


def _codes_slip(cases: list[torch.Tensor], codes: list[torch.Tensor]) -> str:
    """The hint for wrong codes with right scales: the typical slip that gives them on every case, or the rule."""
    scales = [x.abs().max() / 127 for x in cases]  # float32, as a student's code computes them
    slips = [
        (
            lambda x, s: torch.trunc(x / s),
            "Round to the nearest level with torch.round: .int(), .long() or .to(torch.int8) cut the fraction off.",
        ),
        (lambda x, s: torch.floor(x / s), "Round to the nearest level with torch.round, not floor."),
        (lambda x, s: torch.round(x / s) * s, "Return the codes q = torch.round(x / s), not the read-back q * s."),
        (lambda x, s: torch.round(x * s), "Divide by the scale: q = torch.round(x / s), not x * s."),
    ]
    for slip, hint in slips:
        if all(torch.allclose(c, slip(x, s).double(), rtol=1e-6, atol=0) for c, x, s in zip(codes, cases, scales)):
            return hint
    if not all(torch.equal(c, c.round()) for c in codes):
        return "The codes must be whole numbers: q = torch.round(x / s)."
    return "The codes are q = torch.round(x / s), with the scale s = max|x| / 127."


def _answer_int8(got: Any, x: torch.Tensor, case: int) -> tuple[torch.Tensor, float] | Feedback:
    """A student's ``(codes, scale)`` for test tensor ``x`` (number ``case``) as (float64 codes, float), or what is
    wrong with it."""

    def wrong(problem: str, hint: str) -> Feedback:
        return kit.wrong(f"quantize_int8 on test tensor {case}: {problem}", hint)

    if not isinstance(got, tuple) or len(got) != 2:
        return wrong(f"it returns a {type(got).__name__}, not two things (codes, scale).", "End with: return q, s")
    codes, scale = got[0], kit.one_number(got[1])
    if isinstance(kit.one_number(codes), float) and isinstance(scale, torch.Tensor) and scale.shape == x.shape:
        return wrong("it returns the scale first.", "Return the codes first, then the scale: return q, s")
    if not isinstance(scale, float):  # a tensor of several values, or not a number
        return wrong(
            "its scale should be one number (a float or a one-value tensor).",
            "One scale for the whole tensor: s = x.abs().max() / 127.",
        )
    try:
        codes = torch.as_tensor(codes).detach().double()  # int8 or float codes, a tensor or a list
    except (TypeError, ValueError, RuntimeError):
        return wrong(f"its codes are a {type(codes).__name__}, not a tensor.", "q = torch.round(x / s) is a tensor.")
    if codes.shape != x.shape:
        return wrong(
            f"its codes have shape {tuple(codes.shape)}, not x's {tuple(x.shape)}.",
            "q = torch.round(x / s) keeps the shape of x.",
        )
    return codes, scale


def check_quantize_int8(fn: Any) -> Feedback:
    """Check ``fn(x) -> (codes, scale)``, symmetric int8 with one scale, against ``quant.quantize(x, 8)``."""
    name = "quantize_int8"
    hint = "Write def quantize_int8(x) with torch operations on the whole tensor: x.abs().max(), torch.round(x / s)."
    cases, answers = int8_cases(), []
    for i, x in enumerate(cases, 1):
        got, feedback = kit.call_answer(fn, (x.clone(),), name=name, call=f"{name} on test tensor {i}", hint=hint)
        answer = _answer_int8(got, x, i) if feedback is None else feedback
        if isinstance(answer, Feedback):
            return answer
        answers.append(answer)
    for i, (x, (codes, scale)) in enumerate(zip(cases, answers), 1):
        expected = quant.quantize(x, 8)
        want, right_scale = expected.codes.double(), float(expected.scales)
        scale_ok = math.isclose(scale, right_scale, rel_tol=1e-6)
        if not scale_ok or not torch.equal(codes, want):
            return kit.wrong(
                f"on test tensor {i} ({_first(x)}) {name} gives scale {scale:.6g} and codes {_first(codes)};"
                f" quant.quantize gives scale {right_scale:.6g} and codes {_first(want)}.",
                _codes_slip(cases, [c for c, _ in answers]) if scale_ok else _scale_slip(x, scale),
            )
    return kit.right(f"{name} gives the same codes and scale as quant.quantize(x, 8) on all {len(cases)} test tensors.")
