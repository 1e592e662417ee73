"""The check's shared pieces: its constants, the pure arithmetic, the section runner (what a section returns, its
budget and its errors) and the small GPU helpers every section uses.

Part of ``scripts/gpu_check.py`` (its module doc describes the whole check).
"""
from __future__ import annotations

import dataclasses
import gc
import importlib
import importlib.util
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # course_utils from this clone, installed or not

NO_CUDA_MESSAGE = "gpu_check: needs an NVIDIA GPU with CUDA ({why}); nothing was run."
DEFAULT_BUDGET_S = 300.0
#: Seconds kept back from the budget for writing the results (sections stop planning work past it).
RESERVE_S = 8.0
MATMUL_SIZES = (4096, 8192)
MATMUL_DTYPES = ("float32", "float16", "bfloat16")
#: ``blocked_autorange(min_run_time=...)`` per matmul case, seconds.
MATMUL_MIN_RUN_S = 0.3
#: Measured training steps per case and per trick (``steps=`` of measure_training_step), after the warm-up step.
MEASURED_STEPS = 3
STEP_SEQ = 128
#: --strict fails when |estimate - measured| / measured is above this, in percent.
ESTIMATE_LIMIT_PCT = 10.0
#: A section or case skipped for one of these missing is "not checked", and does not fail --strict.
OPTIONAL_LIBRARIES = ("transformers", "peft", "accelerate", "bitsandbytes")
#: What TrainingArguments get on a T4 (``precision.training_arguments_kwargs`` there), forced on newer GPUs.
FP16_TRAINING_KWARGS = {"bf16": False, "fp16": True}
QLORA_STEPS = 8
STANDIN_CONFIG = "smollm2-135m"
PROMPT = "The capital of France is"
EXIT_OK, EXIT_FAILED, EXIT_NO_CUDA, EXIT_STRICT = 0, 1, 2, 3
#: Kinds of a skipped part of a section: "time" and "other" fail --strict, "library" is "not checked",
#: "n/a" is a path this GPU does not have (bfloat16 on a T4).
SKIP_KINDS = ("time", "library", "n/a", "other")
#: Environment every part of the run (and every child process) gets: offline, quiet, no experiment trackers.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "disabled",
    "WANDB_DISABLED": "true",
}

# --------------------------------------------------------------------------------------------
# Pure arithmetic (unit-tested without a GPU)
# --------------------------------------------------------------------------------------------
def tflops(n: int, seconds: float) -> float:
    """Achieved TFLOP/s of one n x n by n x n matmul that took ``seconds``: 2 n^3 / seconds / 1e12."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return 2 * n ** 3 / seconds / 1e12


def peak_tflops(dtype: str, sheet: Any, bf16_native: bool) -> float | None:
    """The datasheet figure to compare a ``dtype`` matmul with: fp32_tflops for float32, tensor16_tflops for
    float16 and (native only) bfloat16; None when the GPU is not in the table or bfloat16 is emulated."""
    if sheet is None:
        return None
    if dtype == "float32":
        return float(sheet.fp32_tflops)
    if dtype == "bfloat16" and not bf16_native:
        return None
    return float(sheet.tensor16_tflops)


def percent_of_peak(achieved: float, peak: float | None) -> float | None:
    """``achieved`` as a percentage of ``peak`` (None when there is no peak to compare with)."""
    if peak is None or peak <= 0:
        return None
    return 100.0 * achieved / peak


def error_pct(estimate: float, measured: float) -> float:
    """(estimate - measured) / measured in percent: positive when the estimate is too high."""
    if measured <= 0:
        raise ValueError(f"measured must be positive, got {measured}")
    return 100.0 * (estimate - measured) / measured


def gb(n_bytes: float | None) -> float | None:
    """Bytes in GB (10^9), None stays None."""
    return None if n_bytes is None else n_bytes / 1e9


def matmul_stats(size: int, times: Sequence[float]) -> dict[str, Any]:
    """Median, quartiles, min and max (ms) of per-matmul ``times`` (s), and TFLOP/s at the median and the best."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive integer, got {size!r}")
    values = [float(t) for t in times]
    if not values or any(not math.isfinite(t) or t <= 0 for t in values):
        raise ValueError(f"times must be positive seconds, at least one, got {list(times)!r}")
    median = statistics.median(values)
    q1, q3 = (statistics.quantiles(values, n=4, method="inclusive")[::2] if len(values) > 1 else (median, median))
    return {"size": size, "runs": len(values), "median_ms": median * 1e3, "q1_ms": q1 * 1e3, "q3_ms": q3 * 1e3,
            "iqr_ms": (q3 - q1) * 1e3, "min_ms": min(values) * 1e3, "max_ms": max(values) * 1e3,
            "tflops": tflops(size, median), "best_tflops": tflops(size, min(values))}

# --------------------------------------------------------------------------------------------
# Sections: what they return, and the runner
# --------------------------------------------------------------------------------------------
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
    return {"number": section.number, "key": section.key, "title": section.title, "status": "pending",
            "reason": None, "missing": [], "seconds": 0.0, "error": None, "data": {}, "tables": [], "texts": [],
            "notes": [], "checks": [], "partial": []}


def section_seconds(cap_s: float, left_s: float, after_s: float | None) -> float:
    """Seconds a section may take: its cap, or more when the sections after it (planned at ``after_s`` seconds)
    keep theirs; never more than what is left. ``after_s`` None: the cap, within what is left."""
    if after_s is None:
        return min(cap_s, left_s)
    return min(left_s, max(cap_s, left_s - after_s))


def run_section(section: Section, ctx: Context, record: dict[str, Any] | None = None,
                problem: Callable[[str], str | None] | None = None, after_s: float | None = None) -> dict[str, Any]:
    """Run one section inside try/except and fill its record: passed, failed (with the error or the failed
    checks), skipped (time budget, or the section's own reason) or not checked (a missing optional library).
    ``after_s``: the caps of the sections still to run, so that this one may use the time earlier ones left."""
    rec = new_record(section) if record is None else record
    problem = requirement_problem if problem is None else problem
    found = [(name, problem(name)) for name in section.needs]
    missing = [(name, why) for name, why in found if why]
    if missing:
        rec.update(status="not checked", missing=[name for name, _ in missing],
                   reason=not_checked_reason([n for n, _ in missing], [w for _, w in missing]))
        return rec
    left = ctx.clock.left()
    if left < section.min_s:
        rec.update(status="skipped", reason=(f"time budget nearly spent: {max(left, 0):.0f} s left of the "
                                             f"{ctx.clock.budget_s:.0f} s budget, this section needs about "
                                             f"{section.min_s:.0f} s"))
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
        rec.update(data=out.data, tables=out.tables, texts=out.texts, notes=out.notes, checks=out.checks,
                   partial=out.partial)
    return rec


def part_of(item: Any) -> dict[str, Any]:
    """A partial-skip entry as a dict (a bare string, as older results hold, is of kind 'other')."""
    return item if isinstance(item, dict) else {"what": str(item), "kind": "other", "library": None}


def not_checked(records: Sequence[dict[str, Any]]) -> list[str]:
    """'section: not checked: no <library>' for every section or case left out for a missing optional library."""
    lines = []
    for r in records:
        if r["status"] == "not checked":
            lines.append(f"{r['key']}: {r.get('reason') or 'not checked'}")
        for part in map(part_of, r.get("partial", [])):
            if part["kind"] == "library":
                lines.append(f"{r['key']}: {part['what']} (not checked: no {part['library']})")
    return lines


def estimate_errors(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every estimate-vs-measured error the sections recorded (step_memory), with its section."""
    return [{"section": r["key"], **e} for r in records for e in r.get("data", {}).get("estimate_errors", [])]


def strict_problems(records: Sequence[dict[str, Any]], limit_pct: float = ESTIMATE_LIMIT_PCT) -> list[str]:
    """What fails --strict: estimate errors over ``limit_pct`` %, no estimate checked at all in a run that has the
    step_memory section (whatever the reason: a missing library too), an estimate that assumed another attention
    backend than the one that ran, and sections or cases skipped for a reason other than a missing optional library
    (those are "not checked") or a path this GPU does not have."""
    if not isinstance(limit_pct, (int, float)) or isinstance(limit_pct, bool) or limit_pct <= 0:
        raise ValueError(f"limit_pct must be a positive number, got {limit_pct!r}")
    problems = []
    errors = estimate_errors(records)
    for e in errors:
        if e.get("error_pct") is not None and abs(e["error_pct"]) > limit_pct:
            problems.append(f"{e['section']}: estimate error {e['error_pct']:+.1f} % for {e['case']} "
                            f"(over {limit_pct:g} %)")
    if not errors and any(r["key"] == "step_memory" for r in records):
        problems.append("step_memory: no estimate was checked against a measured peak")
    for r in records:
        for miss in r.get("data", {}).get("attention_mismatches", []):
            problems.append(f"{r['key']}: {miss['case']}: the estimate assumed {miss['assumed']} attention, "
                            f"{miss['ran']} ran")
    for r in records:
        if r["status"] in ("skipped", "pending", "running"):
            problems.append(f"{r['key']}: section {r['status']}: {r.get('reason') or 'no reason given'}")
        for part in map(part_of, r.get("partial", [])):
            if part["kind"] in ("time", "other"):
                problems.append(f"{r['key']}: part skipped: {part['what']}")
    return problems


def exit_status(records: Sequence[dict[str, Any]], strict: bool = False) -> int:
    """0 when no section failed (skips need a stated reason), 1 when any failed or never finished, and with
    ``strict`` 3 when nothing failed but :func:`strict_problems` found something."""
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be True or False, got {type(strict).__name__}")
    ok = all(r["status"] in ("passed", "not checked") or (r["status"] == "skipped" and r.get("reason"))
             for r in records)
    if not ok:
        return EXIT_FAILED
    if strict and strict_problems(records):
        return EXIT_STRICT
    return EXIT_OK


def complete(records: Sequence[dict[str, Any]]) -> bool:
    """Whether every section passed and nothing in them was skipped, but for paths this GPU does not have."""
    return bool(records) and all(r["status"] == "passed" and all(part_of(p)["kind"] == "n/a"
                                                                for p in r.get("partial", [])) for r in records)


def verdict_word(status: int, records: Sequence[dict[str, Any]]) -> str:
    """FAILED (any non-zero exit), PASSED (every section passed in full), otherwise INCOMPLETE."""
    if status == EXIT_STRICT:
        return "FAILED (--strict)"
    if status != EXIT_OK:
        return "FAILED"
    return "PASSED" if complete(records) else "INCOMPLETE"


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """The run's verdict: sections by status, not checked, strict problems, and one summary line."""
    records = results.get("sections", [])
    strict = bool(results.get("strict"))
    status = results.get("exit_status", exit_status(records, strict))
    by = {s: [r["key"] for r in records if r["status"] == s] for s in ("passed", "failed", "skipped", "not checked")}
    problems = strict_problems(records)
    gaps = not_checked(records)
    word = verdict_word(status, records)
    line = (f"gpu_check: {word}: {len(by['passed'])} passed, {len(by['failed'])} failed, {len(by['skipped'])} "
            f"skipped, {len(by['not checked'])} not checked of {len(records)} sections")
    if by["failed"]:
        line += f"; failed: {', '.join(by['failed'])}"
    if by["skipped"]:
        line += f"; skipped: {', '.join(by['skipped'])}"
    if gaps:
        line += f"; {len(gaps)} not checked for a missing library"
    if problems:
        line += f"; {len(problems)} {'--strict problem(s)' if strict else 'problem(s) --strict would fail on'}"
    line += (f"; {format_cell(results.get('elapsed_s'))} s of a {format_cell(results.get('budget_s'))} s budget; "
             f"exit status {status}")
    return {"word": word, "exit_status": status, "strict": strict, "passed": by["passed"], "failed": by["failed"],
            "skipped": by["skipped"], "not_checked_sections": by["not checked"], "not_checked": gaps,
            "strict_problems": problems, "line": line}

# --------------------------------------------------------------------------------------------
# Small GPU helpers
# --------------------------------------------------------------------------------------------
def free_memory(torch: Any) -> None:
    """Drop what the last section left behind, so the next one measures from a clean allocator."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def reset_peak(ctx: Context) -> None:
    """Start a new allocator peak (CUDA only)."""
    if ctx.device.startswith("cuda"):
        ctx.torch.cuda.synchronize()
        ctx.torch.cuda.reset_peak_memory_stats()


def peak_allocated(ctx: Context) -> int | None:
    """The allocator's peak since the last reset, in bytes (None off CUDA)."""
    if ctx.device.startswith("cuda"):
        ctx.torch.cuda.synchronize()
        return int(ctx.torch.cuda.max_memory_allocated())
    return None


def package_versions(torch: Any) -> dict[str, str]:
    """Versions of Python, torch (and its CUDA) and the optional packages, read from their metadata."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "torch.version.cuda": str(torch.version.cuda)}
    for name in ("transformers", "peft", "accelerate", "bitsandbytes", "triton"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def as_plain(obj: Any) -> Any:
    """A datasheet entry (NamedTuple or dataclass) as a dict for the JSON; None stays None, anything else text."""
    if obj is None:
        return None
    if hasattr(obj, "_asdict"):
        return dict(obj._asdict())
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else str(obj)


def _call(module: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """``module.name(*args)``, or a marker string when the function does not exist (the module is being changed)."""
    fn = getattr(module, name, None)
    if not callable(fn):
        return f"<{module.__name__}.{name} not found>"
    return fn(*args, **kwargs)


def format_cell(value: Any) -> str:
    """A table cell: floats with sensible digits, None as n/a, no pipes or newlines."""
    if value is None:
        text = "n/a"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        if not math.isfinite(value):
            text = str(value)
        elif value == 0:
            text = "0"
        elif abs(value) >= 100:
            text = f"{value:,.0f}"
        elif abs(value) >= 1:
            text = f"{value:.2f}"
        elif abs(value) >= 0.01:
            text = f"{value:.3f}"
        else:
            text = f"{value:.2e}"
    elif isinstance(value, int):
        text = f"{value:,}" if abs(value) >= 10_000 else str(value)
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")
