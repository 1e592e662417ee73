"""The command line: which notebooks, which mode (one per run), then README.md and INSTRUCTORS.md stamped."""

from __future__ import annotations

import argparse
from pathlib import Path

from course_utils import about

from . import paths
from .check import check
from .docs import stamp_or_check_docs
from .execute import execute_in_own_process, execute_one
from .slides import export_slides
from .write import restamp, write_unexecuted

DESCRIPTION = "Build the course notebooks from their sources, stamp them, and (re-)execute them."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see scripts/build_notebooks.py's module doc)."""
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("names", nargs="*", help="notebook stems, e.g. 01_quantization (default: all)")
    parser.add_argument("--execute", action="store_true", help="execute and save outputs")
    parser.add_argument("--check", action="store_true", help="fail if a notebook drifted from its source")
    parser.add_argument(
        "--no-outputs",
        action="store_true",
        help="write notebooks without outputs even over executed ones (nbval will then fail)",
    )
    parser.add_argument(
        "--restamp",
        action="store_true",
        help="rebuild prose, header and slide metadata, keeping the outputs (code must be unchanged)",
    )
    parser.add_argument(
        "--slides", metavar="DIR", type=Path, help="export static HTML slides of the committed notebooks into DIR"
    )
    parser.add_argument("--reveal-prefix", help="with --slides: where reveal.js is (default: a CDN)")
    parser.add_argument("--timeout", type=int, default=600, help="per-cell timeout in seconds")
    return parser.parse_args(argv)


def stems_with_sources() -> list[str]:
    """Every notebook of :data:`about.NOTEBOOKS` that has a source, in teaching order."""
    stems = [Path(nb.filename).stem for nb in about.NOTEBOOKS]
    return [stem for stem in stems if (paths.SRC / f"{stem}.py").exists()]


def run_one(args: argparse.Namespace, stem: str, alone: bool) -> int:
    """The mode the command line asks for, on one notebook; its exit status (``alone``: the only one named)."""
    if args.restamp:
        return restamp(stem)
    if args.check:
        return check(stem)
    if not args.execute:
        return write_unexecuted(stem, args.no_outputs)
    if alone:
        return execute_one(stem, args.timeout)
    return execute_in_own_process(stem, args.timeout)


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv``; the exit status: 0, or 1 when a notebook or a stamped part failed or drifted."""
    args = parse_args(argv)
    stems = [Path(name).stem for name in args.names] or stems_with_sources()
    if args.slides:
        export_slides([paths.notebook(stem) for stem in stems], args.slides, args.reveal_prefix)
        return 0
    status = 0
    for stem in stems:
        status = max(status, run_one(args, stem, alone=len(stems) == 1))
    return max(status, stamp_or_check_docs(args.check))
