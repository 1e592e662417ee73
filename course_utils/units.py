"""Units the whole course uses: one gigabyte is 10^9 bytes, as GPU datasheets count (``nvidia-smi`` reports MiB,
2^20 bytes: 15,360 MiB are 16.1 GB)."""

from typing import Any

from course_utils import checks

#: One gigabyte, as the lessons count it (10^9 bytes, not 2^30).
GB = 1e9


def format_bytes(n: Any) -> str:
    """Bytes in the unit that reads best: ``1.23 GB``, ``45.6 MB``, ``7.8 KB`` or ``12 B`` (powers of 1000)."""
    n = checks.number(n, "n", 0)
    for unit, size, spec in (("GB", GB, ".2f"), ("MB", 1e6, ".1f"), ("KB", 1e3, ".1f")):
        if n >= size:
            return f"{n / size:{spec}} {unit}"
    return f"{int(n)} B"


def format_seconds(seconds: Any) -> str:
    """A duration in the unit that reads best, never rounded to zero: ``2.4 s``, ``38 ms``, ``0.52 ms``, ``41 µs``.

    A GPU step takes milliseconds, a CPU step seconds: one ``:.1f} s`` format would print a GPU's as ``0.0 s``.
    """
    s = checks.number(seconds, "seconds", 0)
    for unit, value in (("s", s), ("ms", s * 1e3)):
        if value >= 1:  # whole units from 10 up, one decimal below
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{s * 1e3:.2g} ms" if s * 1e3 >= 0.1 else f"{s * 1e6:.2g} µs"


def printable(text: str) -> str:
    """``text`` with every unprintable character written as its escape: ``\\x12``, ``\\n``, ``\\ufffd``.

    Control characters would move the cursor, ring a bell or break a notebook's output; the replacement
    character U+FFFD (what a decoder writes for bytes that are not UTF-8) is escaped too, so it reads as
    what it is. Ordinary text, spaces included, is unchanged.
    """
    checks.instance(text, "text", str, "a string")
    return "".join(
        ch if ch == " " or (ch.isprintable() and ch != "\ufffd") else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )
