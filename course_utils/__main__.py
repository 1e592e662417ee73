"""The course's command line: ``python -m course_utils COMMAND ...`` (installed as ``course-utils``).

Each sub-command lives in the module of its topic, which provides three things:

* ``CLI_HELP`` (one line for the command list) and ``CLI_DESCRIPTION`` (the command's own ``--help``),
* ``configure_parser(parser)`` adding the command's options,
* ``run_cli(args, parser) -> int`` doing the work (bad input: ``parser.error(...)``, exit status 2).

To add a command, add one line to :data:`COMMANDS`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

#: Sub-command name -> module that implements it (imported only when the parser is built).
COMMANDS: dict[str, str] = {
    "memory": "course_utils.memory",
}


def _prog() -> str:
    return "python -m course_utils" if os.path.basename(sys.argv[0]) == "__main__.py" else "course-utils"


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per entry of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(prog=_prog(), description="Helpers of the course 'Pack the bag smarter'.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=module.CLI_HELP, description=module.CLI_DESCRIPTION)
        module.configure_parser(command)
        command.set_defaults(_run=module.run_cli, _parser=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``course-utils`` and ``python -m course_utils``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    run, command_parser = args._run, args._parser
    del args._run, args._parser
    return int(run(args, command_parser) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
