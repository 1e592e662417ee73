"""Input checks shared by every module: bad input gets a clear error that names the argument and the range.

Each check returns the value (converted where said) or raises ``TypeError`` (wrong kind: ``True`` is not a
number here) or ``ValueError`` (right kind, out of range). Messages read ``"<name> must be ..., got ..."``.
"""

import math
from typing import Any, Iterable


def integer(value: Any, name: str, low: int | None = 1, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]`` (either bound None: open). Booleans are rejected."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {_range_text(low, high)}, got {value}")
    return int(value)


def number(value: Any, name: str, low: float | None = None, high: float | None = None, low_open: bool = False) -> float:
    """``value`` as a finite float in ``[low, high]`` (``(low, high]`` with ``low_open``). Booleans are rejected."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    too_low = low is not None and (value <= low if low_open else value < low)
    if not math.isfinite(value) or too_low or (high is not None and value > high):
        bounds = _range_text(low, high, low_open)
        raise ValueError(f"{name} must be a finite number{' ' + bounds if bounds else ''}, got {value!r}")
    return value


def positive(value: Any, name: str, high: float | None = None) -> float:
    """A finite number > 0 (and at most ``high``)."""
    return number(value, name, 0, high, low_open=True)


def flag(value: Any, name: str) -> bool:
    """``value`` when it is a bool (1 and 0 are not accepted: a flag must say True or False)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def instance(value: Any, name: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``value`` when it is a ``kind``; else a TypeError saying it must be ``what`` (``"a torch.Tensor"``)."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    return value


def choice(value: Any, name: str, allowed: Iterable[Any]) -> Any:
    """``value`` when it is one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}; got {value!r}")
    return value


def _range_text(low: float | None, high: float | None, low_open: bool = False) -> str:
    if low is not None and high is not None and not low_open:
        return f"between {low:g} and {high:g}"
    parts = [f"{'>' if low_open else '>='} {low:g}"] if low is not None else []
    if high is not None:
        parts.append(f"<= {high:g}")
    return " and ".join(parts)
