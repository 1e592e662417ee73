"""What every lesson module shares: one chart style, the widget wiring, and the exercise checks.

- Charts: :data:`COLORS` and :func:`new_figure`, so that every chart is titled and labelled alike; the notebook
  writes a text description under each one.
- Widgets: :func:`interact_panel` wires ipywidgets controls to a plain callback, which is tested without a
  browser. ipywidgets is imported only when a widget is built.
- Exercises: a checker never raises on a student's answer. It returns a :class:`Feedback` (right; not answered
  yet, for ``...`` or ``None``; or what is wrong, with a hint). :func:`check_number`, :func:`check_choice` and
  :func:`check_function` are the three kinds of check. Worked solutions stay in the notebooks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import matplotlib

matplotlib.rcParams.update({"figure.dpi": 100, "axes.spines.top": False, "axes.spines.right": False,
                            "axes.grid": True, "grid.alpha": 0.3, "font.size": 10})

import matplotlib.pyplot as plt  # noqa: E402 - after the style settings above, which it reads

#: Colours used across the module, so a format keeps its colour from one chart to the next.
COLORS = {"float32": "#4C72B0", "bfloat16": "#55A868", "float16": "#C44E52", "int8": "#8172B2",
          "int4": "#CCB974", "nf4": "#64B5CD", "estimate": "#4C72B0", "measured": "#DD8452"}


def new_figure(title: str, xlabel: str, ylabel: str, figsize: tuple[float, float] = (7.0, 3.6)) -> tuple[Any, Any]:
    """A figure with one axes, titled and labelled. Returns ``(fig, ax)``."""
    for name, value in (("title", title), ("xlabel", xlabel), ("ylabel", ylabel)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-empty string: every chart is titled and labelled")
    fig, ax = plt.subplots(figsize=figsize)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return fig, ax


def interact_panel(callback: Callable[..., Any], **controls: Any) -> Any:
    """Wire ``controls`` (ipywidgets) to ``callback`` and return a box with the controls above its output.

    Uses ``ipywidgets.interactive_output``: the callback's printed text and figures appear in the output
    area and are redrawn whenever a control changes. The initial call happens here, once.
    """
    import ipywidgets as w

    out = w.interactive_output(callback, controls)
    return w.VBox([w.HBox(list(controls.values())), out])


#: What an unanswered exercise holds: the notebooks write ``answer = ...`` (Ellipsis) or ``None``.
PLACEHOLDERS = (Ellipsis, None)


@dataclass(frozen=True)
class Feedback:
    """The verdict on one answer. Shown in Jupyter as its message (``repr``), usable as a bool."""

    correct: bool
    message: str
    hint: str = ""
    answered: bool = True

    def __bool__(self) -> bool:
        return self.correct

    def __str__(self) -> str:
        if self.correct:
            return f"Right: {self.message}"
        if not self.answered:
            return f"Not answered yet: {self.message}"
        text = f"Not yet: {self.message}"
        return f"{text}\nHint: {self.hint}" if self.hint else text

    def __repr__(self) -> str:  # what a notebook cell shows when a check is its last line
        return str(self)


def right(message: str) -> Feedback:
    """A correct answer, with a line saying why it is right."""
    return Feedback(True, message)


def wrong(message: str, hint: str = "") -> Feedback:
    """A wrong answer: what is wrong, and a hint towards the right one."""
    return Feedback(False, message, hint)


def unanswered(name: str, what: str) -> Feedback:
    """Feedback for an answer still at its placeholder."""
    return Feedback(False, f"replace the ... in {name} with {what}, then run this cell again.", answered=False)


def is_placeholder(value: Any) -> bool:
    """True for ``...`` and ``None``, the placeholders of an unanswered exercise."""
    return any(value is p for p in PLACEHOLDERS)


def close(value: float, expected: float, rel_tol: float, abs_tol: float = 0.0) -> bool:
    """``math.isclose`` with the tolerances said."""
    return math.isclose(value, expected, rel_tol=rel_tol, abs_tol=abs_tol)


def check_number(value: Any, expected: float, *, name: str, what: str, rel_tol: float = 0.02, abs_tol: float = 0.0,
                 mistakes: Sequence[tuple[float, str]] = (), hint: str = "", unit: str = "") -> Feedback:
    """Check a numeric answer against ``expected`` within ``rel_tol`` (relative) or ``abs_tol`` (absolute).

    ``mistakes`` lists typical wrong values with the hint each one earns (matched with the same tolerance);
    any other wrong value earns ``hint``. ``what`` says what the answer should be, for the placeholder message.
    """
    if is_placeholder(value):
        return unanswered(name, what)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        got = type(value).__name__ if not isinstance(value, (int, float)) or isinstance(value, bool) else value
        return wrong(f"{name} should be a finite number, got {got!r}.", f"Write {what}, as a plain number.")
    value = float(value)
    suffix = f" {unit}" if unit else ""
    if close(value, expected, rel_tol, abs_tol):
        return right(f"{name} = {value:g}{suffix} (expected {expected:g}{suffix}).")
    for mistake, why in mistakes:
        if close(value, mistake, rel_tol, abs_tol):
            return wrong(f"{name} = {value:g}{suffix} is a common slip.", why)
    return wrong(f"{name} = {value:g}{suffix} is not it.", hint)


def check_choice(value: Any, expected: Any, *, name: str, options: Iterable[Any],
                 hints: Mapping[Any, str] | None = None, why: str = "") -> Feedback:
    """Check an answer that must be one of ``options`` (strings compare case-insensitively, trimmed)."""
    options = tuple(options)
    if is_placeholder(value):
        return unanswered(name, "one of " + ", ".join(repr(o) for o in options))

    def norm(v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    by_norm = {norm(o): o for o in options}
    if norm(value) not in by_norm:
        return wrong(f"{name} = {value!r} is not one of the options.",
                     "Choose one of " + ", ".join(repr(o) for o in options) + ".")
    picked = by_norm[norm(value)]
    if picked == expected:
        return right(f"{name} = {picked!r}." + (f" {why}" if why else ""))
    return wrong(f"{name} = {picked!r} is not it.", (hints or {}).get(picked, ""))


def check_function(fn: Any, cases: Sequence[tuple[tuple, Any]], *, name: str, rel_tol: float = 1e-6,
                   hint: str = "", compare: Callable[[Any, Any], bool] | None = None) -> Feedback:
    """Call the student's ``fn`` on each ``(args, expected)`` case; report the first case it gets wrong.

    A function that raises ``NotImplementedError``, or returns ``...``/``None``, is "not written yet". Any other
    exception is reported in one line (its type and message), not as a traceback.
    """
    if is_placeholder(fn) or not callable(fn):
        return unanswered(name, "your function") if is_placeholder(fn) else wrong(
            f"{name} should be a function, got {type(fn).__name__}.", hint)
    same = compare or (lambda got, want: _same(got, want, rel_tol))
    for args, expected in cases:
        shown = ", ".join(repr(a) for a in args)
        try:
            got = fn(*args)
        except NotImplementedError:
            return unanswered(name, "your code (the function body still raises NotImplementedError)")
        except Exception as err:  # noqa: BLE001 - a student's bug is reported in one line, never a traceback
            return wrong(f"{name}({shown}) raised {type(err).__name__}: {err}", hint)
        if is_placeholder(got):
            return unanswered(name, "a return statement (the function returns nothing yet)")
        if not same(got, expected):
            return wrong(f"{name}({shown}) returned {got!r}; expected {expected!r}.", hint)
    return right(f"{name} gives the expected result on all {len(cases)} test cases.")


def _same(got: Any, want: Any, rel_tol: float) -> bool:
    if isinstance(want, float) or isinstance(got, float):
        try:
            return math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return got == want
