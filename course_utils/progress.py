"""Status lines for long cells: a live demo tells the room what it is doing.

The lines are plain, deterministic text on stdout (no timings, no carriage returns), so nbval compares them like
any other output and they read the same on every machine. One line a step:

    with steps("Training the network in 6 formats", total=6) as step:
        for name in formats:
            step(name)           # prints "Training the network in 6 formats: 1/6 float32 …"
"""

import itertools
from contextlib import contextmanager
from typing import Callable, Iterator

from course_utils import checks


def status(message: str) -> None:
    """Print one status line now (flushed, so it shows before the slow work that follows)."""
    print(message, flush=True)


@contextmanager
def steps(what: str, total: int) -> Iterator[Callable[[str], None]]:
    """Yield ``step(label)``, which prints ``"<what>: i/total label …"``; prints ``"<what>: done"`` at the end."""
    total = checks.integer(total, "total", 1)
    numbers = itertools.count(1)

    def step(label: str = "") -> None:
        status(f"{what}: {next(numbers)}/{total}{' ' + label if label else ''} …")

    yield step
    status(f"{what}: done")
