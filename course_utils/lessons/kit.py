"""What every lesson module shares: one chart style, the widget wiring, and the exercise checks.

- Charts: :data:`COLORS`, :func:`new_figure` and :func:`finish`, so that every chart is titled, labelled and laid
  out alike; the notebook writes a text description under each one.
- Widgets: :func:`interact_panel` wires ipywidgets controls to a plain callback, and :func:`view_panel` to a view
  that returns its text (and figure); both are tested without a browser. ipywidgets is imported only when a
  widget is built.
- Exercises: a checker never raises on a student's answer. It returns a :class:`Feedback` (right; not answered
  yet, for ``...`` or ``None``; or what is wrong, with a hint). :func:`check_number`, :func:`check_choice` and
  :func:`check_function` are the three kinds of check (an answer in GB gets the hints for the unit slips
  every such answer can make); :func:`call_answer` calls a student's function for a checker of its own.
  Worked solutions stay in the notebooks.
"""

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import matplotlib

from course_utils.units import GB

matplotlib.rc("figure", dpi=100)
matplotlib.rc("axes", grid=True)
matplotlib.rc("axes.spines", top=False, right=False)
matplotlib.rc("grid", alpha=0.3)
matplotlib.rc("font", size=10)

import matplotlib.pyplot as plt  # noqa: E402 - after the style settings above, which it reads

#: Colours used across the module, so a format keeps its colour from one chart to the next.
COLORS = {
    "float32": "#4C72B0",
    "bfloat16": "#55A868",
    "float16": "#C44E52",
    "int8": "#8172B2",
    "int4": "#CCB974",
    "nf4": "#64B5CD",
    "estimate": "#4C72B0",
    "measured": "#DD8452",
}


def new_figure(title: str, xlabel: str, ylabel: str, figsize: tuple[float, float] = (7.0, 3.6)) -> tuple[Any, Any]:
    """A figure with one axes, titled and labelled. Returns ``(fig, ax)``."""
    fig, ax = plt.subplots(figsize=figsize)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return fig, ax


def finish(fig: Any, ax: Any = None, **legend: Any) -> Any:
    """Lay ``fig`` out and return it; with ``ax``, first give ``ax`` a frameless legend (``legend``: its options)."""
    if ax is not None:
        ax.legend(frameon=False, **legend)
    fig.tight_layout()
    return fig


def interact_panel(callback: Callable[..., Any], *, first_row: Sequence[str] = (), **controls: Any) -> Any:
    """Wire ``controls`` (ipywidgets) to ``callback`` and return a box with the controls above its output.

    Uses ``ipywidgets.interactive_output``: the callback's printed text and figures appear in the output
    area and are redrawn whenever a control changes. The initial call happens here, once. The controls named in
    ``first_row`` get a row of their own, above the others.
    """
    import ipywidgets as w

    out = w.interactive_output(callback, controls)
    rows = [[c for k, c in controls.items() if (k in first_row) == top] for top in (True, False)]
    return w.VBox([*(w.HBox(row) for row in rows if row), out])


def view_panel(view: Callable[..., Any], *, first_row: Sequence[str] = (), **controls: Any) -> Any:
    """:func:`interact_panel` for a view that returns its text, or ``(text, figure)``: each change prints the text
    and shows the figure (then closes it, so that it is not drawn twice)."""
    from IPython.display import display

    def redraw(**values: Any) -> None:
        shown = view(**values)
        text, fig = shown if isinstance(shown, tuple) else (shown, None)
        print(text)
        if fig is not None:
            display(fig)
            plt.close(fig)

    return interact_panel(redraw, first_row=first_row, **controls)


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
        return f"Not yet: {self.message}" + (f"\nHint: {self.hint}" if self.hint else "")

    __repr__ = __str__  # what a notebook cell shows when a check is its last line


def right(message: str) -> Feedback:
    """A correct answer, with a line saying why it is right."""
    return Feedback(True, message)


def wrong(message: str, hint: str = "") -> Feedback:
    """A wrong answer: what is wrong, and a hint towards the right one."""
    return Feedback(False, message, hint)


def unanswered(name: str, what: str) -> Feedback:
    """Feedback for an answer still at its placeholder."""
    return Feedback(False, f"replace the ... in {name} with {what}, then run this cell again.", answered=False)


def unwritten(todo: str) -> Feedback:
    """Feedback for a function the learner has not written yet: ``todo`` says what to do next."""
    return Feedback(False, f"{todo}, then run this cell again.", answered=False)


def is_placeholder(value: Any) -> bool:
    """True for ``...`` and ``None``, the placeholders of an unanswered exercise (``answer = ...``)."""
    return value is ... or value is None


def one_number(value: Any) -> Any:
    """A one-value answer (int, float, numpy number, one-value tensor) as a float; anything else (a bool, a string, a
    list, a tensor of several values) unchanged."""
    if isinstance(value, (str, bytes, bool)):
        return value
    try:
        return float(value.detach() if hasattr(value, "detach") else value)  # a tensor: without its graph
    except (TypeError, ValueError, RuntimeError):  # a tensor of several values raises RuntimeError
        return value


def check_number(
    value: Any,
    expected: float,
    *,
    name: str,
    what: str,
    rel_tol: float = 0.02,
    abs_tol: float = 0.0,
    mistakes: Sequence[tuple[float, str]] = (),
    hint: str = "",
    unit: str = "",
    why: str = "",
) -> Feedback:
    """Check a numeric answer (any :func:`one_number`) against ``expected`` within ``rel_tol`` or ``abs_tol``.

    ``mistakes`` lists typical wrong values with the hint each one earns (matched with the same tolerance, in
    order); any other wrong value earns ``hint``. An answer in GB (``unit="GB"``) also gets a hint for the two
    unit slips every such answer can make: the size in GiB, and in bytes. ``what`` says what the answer should
    be, for the placeholder message; ``why`` follows a right answer. Numbers from 1,000 up are written as whole
    numbers with thousands separators (25,362,432), smaller ones as ``:g`` writes them.
    """
    if unit == "GB":
        mistakes = [
            *mistakes,
            (expected * GB / 2**30, "That is in GiB (2^30 bytes); the course writes GB = 10^9 bytes."),
            (expected * GB, "That looks like bytes: divide by 1e9 to write it in GB."),
        ]
    if is_placeholder(value):
        return unanswered(name, what)
    value = one_number(value)
    if not isinstance(value, float) or not math.isfinite(value):
        got = value if isinstance(value, float) else type(value).__name__
        return wrong(f"{name} should be a finite number, got {got!r}.", f"Write {what}, as a plain number.")
    shown = _shown(value, unit)
    if math.isclose(value, expected, rel_tol=rel_tol, abs_tol=abs_tol):
        return right(f"{name} = {shown} (expected {_shown(expected, unit)}). {why}".rstrip())
    for mistake, slip in mistakes:
        if math.isclose(value, mistake, rel_tol=rel_tol, abs_tol=abs_tol):
            return wrong(f"{name} = {shown} is a common slip.", slip)
    return wrong(f"{name} = {shown} is not it.", hint)


def _shown(value: float, unit: str) -> str:
    """A number for a message, then its ``unit``: see :func:`check_number`."""
    number = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:g}"
    return f"{number} {unit}" if unit else number


def check_choice(
    value: Any,
    expected: Any,
    *,
    name: str,
    options: Iterable[Any],
    hints: Mapping[Any, str] | None = None,
    why: str = "",
) -> Feedback:
    """Check an answer that must be one of ``options`` (strings compare case-insensitively, trimmed)."""
    options = tuple(options)
    listed = ", ".join(repr(o) for o in options)
    if is_placeholder(value):
        return unanswered(name, f"one of {listed}")

    def norm(v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    picked = next((o for o in options if norm(o) == norm(value)), None)  # an option is never None (a placeholder)
    if picked is None:
        return wrong(f"{name} = {value!r} is not one of the options.", f"Choose one of {listed}.")
    if picked == expected:
        return right(f"{name} = {picked!r}. {why}".rstrip())
    return wrong(f"{name} = {picked!r} is not it.", (hints or {}).get(picked, ""))


def check_function(
    fn: Any,
    cases: Sequence[tuple[tuple, Any]],
    *,
    name: str,
    rel_tol: float = 1e-6,
    hint: str = "",
    mistakes: Sequence[tuple[Callable[..., Any], str]] = (),
) -> Feedback:
    """Call the student's ``fn`` on each ``(args, expected)`` case; report the first case it gets wrong.

    A function that raises ``NotImplementedError``, or returns ``...``/``None``, is "not written yet". Any other
    exception is reported in one line (its type and message), not as a traceback. ``mistakes`` lists typical
    wrong formulas with the hint each one earns: a wrong ``fn`` that agrees with one on every case earns its hint;
    any other wrong ``fn`` earns ``hint``.
    """
    for args, expected in cases:
        shown = ", ".join(repr(a) for a in args)
        got, feedback = call_answer(fn, args, name=name, call=f"{name}({shown})", hint=hint)
        if feedback is not None:
            return feedback
        if not _same(got, expected, rel_tol):
            why = next(
                (why for mistake, why in mistakes if all(_gives(fn, a, mistake(*a), rel_tol) for a, _ in cases)), hint
            )
            return wrong(f"{name}({shown}) returned {got!r}; expected {expected!r}.", why)
    return right(f"{name} gives the expected result on all {len(cases)} test cases.")


def call_answer(fn: Any, args: tuple, *, name: str, call: str, hint: str) -> tuple[Any, Feedback | None]:
    """Call a student's ``fn(*args)``: ``(result, None)``, or ``(None, feedback)`` when there is no result to check.

    That is "not answered" for ``fn`` still at its placeholder (``...``/``None``), for a body that raises
    ``NotImplementedError`` and for one that returns ``...``/``None``; and "wrong", with ``hint``, for an ``fn`` that
    is not a function, or a one-line report for any other exception (``call`` raised: its type and message).
    """
    if is_placeholder(fn):
        return None, unwritten(f"define {name} as a function")
    if not callable(fn):
        return None, wrong(f"{name} should be a function, got {type(fn).__name__}.", hint)
    try:
        got = fn(*args)
    except NotImplementedError:
        return None, unwritten(f"replace the `raise NotImplementedError` line in {name} with your code")
    except Exception as err:  # noqa: BLE001 - a student's bug is reported in one line, never a traceback
        return None, wrong(f"{call} raised {type(err).__name__}: {err}", hint)
    if is_placeholder(got):
        return None, unwritten(f"end {name} with a return statement (it returns nothing yet)")
    return got, None


def _gives(fn: Callable[..., Any], args: tuple, want: Any, rel_tol: float) -> bool:
    """True when ``fn`` returns ``want`` on (copies of) ``args``; False when it returns something else or raises."""
    try:
        return _same(fn(*copy.deepcopy(args)), want, rel_tol)
    except Exception:  # noqa: BLE001 - any error means "not this mistake"
        return False


def _same(got: Any, want: Any, rel_tol: float) -> bool:
    if isinstance(want, float) or isinstance(got, float):
        try:
            return math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return got == want
