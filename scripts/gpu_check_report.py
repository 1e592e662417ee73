"""Output: the results as Markdown tables, and the JSON and Markdown files.

Part of ``scripts/gpu_check.py`` (its module doc describes the whole check).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from gpu_check_core import format_cell, summarize


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------
def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines: header, rule, one line per row."""
    lines = ["| " + " | ".join(format_cell(c) for c in columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(format_cell(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    """The summary: overall result and summary line, one line per section, what was not checked, what --strict
    found, then each section's checks, tables and notes."""
    records = results.get("sections", [])
    machine = results.get("machine", {})
    summary = summarize(results)
    lines = ["# GPU check of the course's CUDA paths", ""]
    if machine:
        lines.append(f"GPU: {machine.get('gpu', 'n/a')} (compute capability {machine.get('capability', 'n/a')}, "
                     f"{format_cell(machine.get('memory_gb'))} GB); torch {machine.get('torch', 'n/a')}, "
                     f"CUDA {machine.get('cuda', 'n/a')}; {results.get('started_utc', '')}")
        lines.append("")
    counts = {s: sum(r["status"] == s for r in records) for s in ("passed", "failed", "skipped", "not checked")}
    lines.append(f"Result: **{summary['word']}** ({counts['passed']} passed, {counts['failed']} failed, "
                 f"{counts['skipped']} skipped, {counts['not checked']} not checked) in "
                 f"{format_cell(results.get('elapsed_s'))} s of a {format_cell(results.get('budget_s'))} s budget; "
                 f"exit status {summary['exit_status']}{' (--strict)' if summary['strict'] else ''}.")
    lines += ["", f"`{summary['line']}`"]
    if results.get("stopped_by_watchdog"):
        lines += ["", "**The run was stopped by the watchdog when the time budget ran out.**"]
    if results.get("ended_children"):
        lines += ["", f"Child processes ended with the run: {', '.join(map(str, results['ended_children']))}."]
    lines += ["", *markdown_table(["#", "section", "status", "seconds", "reason"],
                                  [[r["number"], r["key"], r["status"], r["seconds"], r.get("reason") or ""]
                                   for r in records])]
    if summary["not_checked"]:
        lines += ["", "**Not checked (a missing optional library; not a failure, not a pass):**", ""]
        lines += [f"- {line}" for line in summary["not_checked"]]
    if summary["strict_problems"]:
        title = "Fails --strict" if summary["strict"] else "Would fail --strict"
        lines += ["", f"**{title}:**", ""] + [f"- {p}" for p in summary["strict_problems"]]
    for r in records:
        lines += ["", f"## {r['number']}. {r['title']}: {r['status']}"]
        if r.get("reason"):
            lines += ["", f"{'Reason' if r['status'] != 'passed' else 'Note'}: {r['reason']}"]
        if r.get("error"):
            err = r["error"]
            lines += ["", f"Error: `{err['type']}: {err['message'].splitlines()[0] if err['message'] else ''}`", "",
                      "```", err["traceback"], "```"]
        if r.get("checks"):
            lines += ["", *markdown_table(["check", "ok", "detail"],
                                          [[c["check"], c["ok"], c.get("detail", "")] for c in r["checks"]])]
        for table in r.get("tables", []):
            lines += ["", f"**{table['title']}**", "", *markdown_table(table["columns"], table["rows"])]
        for block in r.get("texts", []):
            lines += ["", f"**{block['title']}**", "", "```", block["text"], "```"]
        for note in r.get("notes", []):
            lines += ["", f"- {note}"]
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
