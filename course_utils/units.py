"""Units the whole course uses: one gigabyte is 10^9 bytes (as GPU datasheets and ``nvidia-smi`` count)."""
from __future__ import annotations

from typing import Any

from course_utils import checks

#: One gigabyte, as the lessons count it (10^9 bytes, not 2^30).
GB = 1e9


def format_bytes(n: Any) -> str:
    """Bytes in the unit that reads best: ``1.23 GB``, ``45.6 MB``, ``7.8 KB`` or ``12 B`` (powers of 1000)."""
    n = checks.number(n, "n", 0)
    if n >= GB:
        return f"{n / GB:.2f} GB"
    for unit, size in (("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
