"""The section runner: what a section gets (its context and clock) and returns (an Outcome), its time and its
errors. One section's fault is recorded and the others still run."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .gpu import free_memory
from .settings import RESERVE_S, SKIP_KINDS


class Skip(Exception):
    """Raised by a section that cannot run here; the message is the stated reason."""


@dataclass
class Outcome:
    """What a section found: data for the JSON, tables and text for the summary, and pass/fail checks."""

    data: dict[str, Any] = field(default_factory=dict)
    tables: list[dict[str, Any]] = field(default_factory=list)
    texts: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    partial: list[dict[str, Any]] = field(default_factory=list)

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Add a table (one row per list)."""
        self.tables.append({"title": title, "columns": list(columns), "rows": [list(r) for r in rows]})

    def text(self, title: str, body: str) -> None:
        """Add a block of verbatim text (printed output of a course helper)."""
        self.texts.append({"title": title, "text": body})

    def note(self, line: str) -> None:
        """Add one observation."""
        self.notes.append(line)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record a check; a False check fails the section."""
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        return bool(ok)

    def skip_part(self, reason: str, kind: str = "time", library: str | None = None) -> None:
        """Record that part of the section was skipped, why, and its kind (see SKIP_KINDS)."""
        if kind not in SKIP_KINDS:
            raise ValueError(f"kind must be one of {', '.join(SKIP_KINDS)}, got {kind!r}")
        if (kind == "library") != (library is not None):
            raise ValueError("library must name the missing library exactly when kind is 'library'")
        self.partial.append({"what": reason, "kind": kind, "library": library})


@dataclass
class Clock:
    """The run's time budget: seconds used, seconds left (before the reserve kept for writing results)."""

    budget_s: float
    start: float = field(default_factory=time.monotonic)
    reserve_s: float = RESERVE_S

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.start

    def left(self) -> float:
        """Seconds left for work: the budget less the reserve, less what was used."""
        return self.budget_s - self.reserve_s - self.elapsed()


@dataclass
class Context:
    """What every section gets: torch, the device, the clock and the section's own deadline."""

    torch: Any
    clock: Clock
    out_dir: Path
    device: str = "cuda"
    deadline: float = math.inf  # time.monotonic() value past which the section starts no new work

    def left(self) -> float:
        """Seconds left for the current section (its own cap and the whole budget both count)."""
        return min(self.deadline - time.monotonic(), self.clock.left())


@dataclass(frozen=True)
class Section:
    """One section: its function, the optional libraries it needs, the least time worth starting it with,
    and the most time it should take (so the later sections keep theirs)."""

    number: int
    key: str
    title: str
    func: Callable[[Context, Outcome], None]
    needs: tuple[str, ...] = ()
    min_s: float = 10.0
    cap_s: float = 60.0


def describe_error(err: BaseException, tail_lines: int = 12) -> dict[str, str]:
    """Type, message (shortened) and the last lines of the traceback of ``err``."""
    lines = "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip().splitlines()
    message = str(err)
    if len(message) > 2000:
        message = message[:2000] + " [...]"
    tail = [line if len(line) <= 500 else line[:500] + " [...]" for line in lines[-tail_lines:]]
    return {"type": type(err).__name__, "message": message, "traceback": "\n".join(tail)}


def requirement_problem(package: str) -> str | None:
    """None when ``package`` imports; otherwise why the sections needing it are not checked."""
    try:
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed"
        if package == "bitsandbytes":
            from course_utils.quiet import import_bitsandbytes

            return None if import_bitsandbytes() is not None else "bitsandbytes is installed but does not import here"
        importlib.import_module(package)
    except Exception as err:  # noqa: BLE001 - a broken or incompatible install: say so and skip
        return f"{package} is installed but does not import ({type(err).__name__}: {str(err)[:200]})"
    return None


def not_checked_reason(libraries: Sequence[str], problems: Sequence[str]) -> str:
    """'not checked: no peft, no bitsandbytes (why)' for the missing optional ``libraries``."""
    return "not checked: " + ", ".join(f"no {name}" for name in libraries) + f" ({'; '.join(problems)})"


def new_record(section: Section) -> dict[str, Any]:
    """The result record of a section before it runs."""
    return {
        "number": section.number,
        "key": section.key,
        "title": section.title,
        "status": "pending",
        "reason": None,
        "missing": [],
        "seconds": 0.0,
        "error": None,
        "data": {},
        "tables": [],
        "texts": [],
        "notes": [],
        "checks": [],
        "partial": [],
    }


def section_seconds(cap_s: float, left_s: float, after_s: float | None) -> float:
    """Seconds a section may take: its cap, or more when the sections after it (planned at ``after_s`` seconds)
    keep theirs; never more than what is left. ``after_s`` None: the cap, within what is left."""
    if after_s is None:
        return min(cap_s, left_s)
    return min(left_s, max(cap_s, left_s - after_s))


def run_section(
    section: Section,
    ctx: Context,
    record: dict[str, Any] | None = None,
    problem: Callable[[str], str | None] | None = None,
    after_s: float | None = None,
) -> dict[str, Any]:
    """Run one section inside try/except and fill its record: passed, failed (with the error or the failed
    checks), skipped (time budget, or the section's own reason) or not checked (a missing optional library).
    ``after_s``: the caps of the sections still to run, so that this one may use the time earlier ones left."""
    rec = new_record(section) if record is None else record
    problem = requirement_problem if problem is None else problem
    found = [(name, problem(name)) for name in section.needs]
    missing = [(name, why) for name, why in found if why]
    if missing:
        names = [name for name, _ in missing]
        rec.update(status="not checked", missing=names, reason=not_checked_reason(names, [why for _, why in missing]))
        return rec
    left = ctx.clock.left()
    if left < section.min_s:
        rec.update(
            status="skipped",
            reason=(
                f"time budget nearly spent: {max(left, 0):.0f} s left of the {ctx.clock.budget_s:.0f} s budget, "
                f"this section needs about {section.min_s:.0f} s"
            ),
        )
        return rec
    rec["status"] = "running"
    ctx.deadline = time.monotonic() + section_seconds(section.cap_s, left, after_s)
    out = Outcome()
    t0 = time.monotonic()
    try:
        section.func(ctx, out)
    except Skip as why:
        rec.update(status="skipped", reason=str(why))
    except Exception as err:  # noqa: BLE001 - record and go on with the next section
        first_line = str(err).splitlines()[0][:300] if str(err) else ""
        rec.update(status="failed", reason=f"{type(err).__name__}: {first_line}", error=describe_error(err))
    else:
        failed = [c["check"] for c in out.checks if not c["ok"]]
        if failed:
            rec.update(status="failed", reason="failed checks: " + "; ".join(failed))
        else:
            rec["status"] = "passed"
            if out.partial:
                rec["reason"] = "partly skipped: " + "; ".join(p["what"] for p in out.partial)
    finally:
        rec["seconds"] = round(time.monotonic() - t0, 2)
        rec.update(
            data=out.data, tables=out.tables, texts=out.texts, notes=out.notes, checks=out.checks, partial=out.partial
        )
    return rec


def run_all(sections: Sequence[Section], ctx: Context, results: dict[str, Any]) -> None:
    """Run the sections in order, each recorded in ``results['sections']`` before it starts."""
    records = [new_record(s) for s in sections]
    results["sections"] = records
    for i, (section, record) in enumerate(zip(sections, records)):
        try:
            run_section(section, ctx, record, after_s=sum(s.cap_s for s in sections[i + 1 :]))
        except KeyboardInterrupt:
            record.update(status="failed", reason="interrupted (Ctrl-C)")
            for later in records:
                if later["status"] == "pending":
                    later.update(status="skipped", reason="not started: the run was interrupted")
            break
        except Exception as err:  # noqa: BLE001 - a fault of the runner itself: record it, go on
            record.update(status="failed", reason=f"gpu_check runner: {type(err).__name__}", error=describe_error(err))
        with contextlib.suppress(Exception):
            free_memory(ctx.torch)
