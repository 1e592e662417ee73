"""The report: the run's verdict (exit status, what --strict fails on, what was not checked, one summary line) and
its output (gpu_check.json, and gpu_check.md with a table per section)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from .settings import ESTIMATE_LIMIT_PCT, EXIT_FAILED, EXIT_OK, EXIT_STRICT


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


# --------------------------------------------------------------------------------------------
# The verdict
# --------------------------------------------------------------------------------------------
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
            problems.append(
                f"{e['section']}: estimate error {e['error_pct']:+.1f} % for {e['case']} (over {limit_pct:g} %)"
            )
    if not errors and any(r["key"] == "step_memory" for r in records):
        problems.append("step_memory: no estimate was checked against a measured peak")
    for r in records:
        for miss in r.get("data", {}).get("attention_mismatches", []):
            problems.append(
                f"{r['key']}: {miss['case']}: the estimate assumed {miss['assumed']} attention, {miss['ran']} ran"
            )
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
    finished = ("passed", "not checked")
    if not all(r["status"] in finished or (r["status"] == "skipped" and r.get("reason")) for r in records):
        return EXIT_FAILED
    if strict and strict_problems(records):
        return EXIT_STRICT
    return EXIT_OK


def complete(records: Sequence[dict[str, Any]]) -> bool:
    """Whether every section passed and nothing in them was skipped, but for paths this GPU does not have."""
    return bool(records) and all(
        r["status"] == "passed" and all(part_of(p)["kind"] == "n/a" for p in r.get("partial", [])) for r in records
    )


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
    line = (
        f"gpu_check: {word}: {len(by['passed'])} passed, {len(by['failed'])} failed, {len(by['skipped'])} "
        f"skipped, {len(by['not checked'])} not checked of {len(records)} sections"
    )
    if by["failed"]:
        line += f"; failed: {', '.join(by['failed'])}"
    if by["skipped"]:
        line += f"; skipped: {', '.join(by['skipped'])}"
    if gaps:
        line += f"; {len(gaps)} not checked for a missing library"
    if problems:
        line += f"; {len(problems)} {'--strict problem(s)' if strict else 'problem(s) --strict would fail on'}"
    line += (
        f"; {format_cell(results.get('elapsed_s'))} s of a {format_cell(results.get('budget_s'))} s budget; "
        f"exit status {status}"
    )
    return {
        "word": word,
        "exit_status": status,
        "strict": strict,
        "passed": by["passed"],
        "failed": by["failed"],
        "skipped": by["skipped"],
        "not_checked_sections": by["not checked"],
        "not_checked": gaps,
        "strict_problems": problems,
        "line": line,
    }


def close_results(results: dict[str, Any], elapsed_s: float) -> None:
    """Elapsed time, exit status and summary into ``results`` (the watchdog's exit status is always 1)."""
    results["elapsed_s"] = round(elapsed_s, 1)
    status = exit_status(results["sections"], bool(results.get("strict")))
    results["exit_status"] = EXIT_FAILED if results.get("stopped_by_watchdog") else status
    results["summary"] = summarize(results)


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------
def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines: header, rule, one line per row."""
    lines = ["| " + " | ".join(format_cell(c) for c in columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(format_cell(c) for c in row) + " |" for row in rows]
    return lines


def render_head(results: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """The summary's head: the GPU, the overall result and summary line, one line per section, what was not
    checked and what --strict found."""
    records = results.get("sections", [])
    machine = results.get("machine", {})
    lines = ["# GPU check of the course's CUDA paths", ""]
    if machine:
        lines.append(
            f"GPU: {machine.get('gpu', 'n/a')} (compute capability {machine.get('capability', 'n/a')}, "
            f"{format_cell(machine.get('memory_gb'))} GB); torch {machine.get('torch', 'n/a')}, "
            f"CUDA {machine.get('cuda', 'n/a')}; {results.get('started_utc', '')}"
        )
        lines.append("")
    counts = {s: sum(r["status"] == s for r in records) for s in ("passed", "failed", "skipped", "not checked")}
    lines.append(
        f"Result: **{summary['word']}** ({counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['skipped']} skipped, {counts['not checked']} not checked) in "
        f"{format_cell(results.get('elapsed_s'))} s of a {format_cell(results.get('budget_s'))} s budget; "
        f"exit status {summary['exit_status']}{' (--strict)' if summary['strict'] else ''}."
    )
    lines += ["", f"`{summary['line']}`"]
    if results.get("stopped_by_watchdog"):
        lines += ["", "**The run was stopped by the watchdog when the time budget ran out.**"]
    if results.get("ended_children"):
        lines += ["", f"Child processes ended with the run: {', '.join(map(str, results['ended_children']))}."]
    rows = [[r["number"], r["key"], r["status"], r["seconds"], r.get("reason") or ""] for r in records]
    lines += ["", *markdown_table(["#", "section", "status", "seconds", "reason"], rows)]
    if summary["not_checked"]:
        lines += ["", "**Not checked (a missing optional library; not a failure, not a pass):**", ""]
        lines += [f"- {line}" for line in summary["not_checked"]]
    if summary["strict_problems"]:
        title = "Fails --strict" if summary["strict"] else "Would fail --strict"
        lines += ["", f"**{title}:**", ""] + [f"- {p}" for p in summary["strict_problems"]]
    return lines


def render_section(r: dict[str, Any]) -> list[str]:
    """One section's part of the summary: its status and reason, its error, checks, tables, texts and notes."""
    lines = ["", f"## {r['number']}. {r['title']}: {r['status']}"]
    if r.get("reason"):
        lines += ["", f"{'Reason' if r['status'] != 'passed' else 'Note'}: {r['reason']}"]
    if r.get("error"):
        err = r["error"]
        first = err["message"].splitlines()[0] if err["message"] else ""
        lines += ["", f"Error: `{err['type']}: {first}`", "", "```", err["traceback"], "```"]
    if r.get("checks"):
        rows = [[c["check"], c["ok"], c.get("detail", "")] for c in r["checks"]]
        lines += ["", *markdown_table(["check", "ok", "detail"], rows)]
    for table in r.get("tables", []):
        lines += ["", f"**{table['title']}**", "", *markdown_table(table["columns"], table["rows"])]
    for block in r.get("texts", []):
        lines += ["", f"**{block['title']}**", "", "```", block["text"], "```"]
    for note in r.get("notes", []):
        lines += ["", f"- {note}"]
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    """The summary: overall result and summary line, one line per section, what was not checked, what --strict
    found, then each section's checks, tables and notes."""
    lines = render_head(results, summarize(results))
    for record in results.get("sections", []):
        lines += render_section(record)
    return "\n".join(lines) + "\n"


def write_outputs(results: dict[str, Any], out_dir: Path) -> tuple[Path, Path, str]:
    """Write gpu_check.json and gpu_check.md into ``out_dir``; return both paths and the markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "gpu_check.json", out_dir / "gpu_check.md"
    results["summary"] = summarize(results)
    json_path.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    markdown = render_markdown(results)
    md_path.write_text(markdown, encoding="utf-8")
    return json_path, md_path, markdown
