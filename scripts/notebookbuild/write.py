"""The build without executing: a notebook without outputs (never over an executed one unless asked), or
``--restamp``: prose, header and slide types rebuilt from the source, the executed outputs kept."""

from __future__ import annotations

import nbformat

from . import paths
from .notebook import build, committed_and_rebuilt, has_outputs


def write_unexecuted(stem: str, no_outputs: bool) -> int:
    """Build without executing; never over an executed notebook unless ``no_outputs``."""
    target = paths.notebook(stem)
    if not no_outputs and target.exists() and has_outputs(target):
        print(
            f"kept {paths.shown(target)}: it holds executed outputs, which nbval compares. "
            f"Use --execute to rebuild it with fresh outputs (or --no-outputs to drop them)"
        )
        return 1
    nbformat.write(build(stem), target)
    print(f"wrote {paths.shown(target)}")
    return 0


def restamp(stem: str) -> int:
    """Rebuild the notebook keeping its outputs; 1 (nothing written) when it is missing or a code cell changed."""
    target = paths.notebook(stem)
    _, rebuilt = committed_and_rebuilt(stem)
    if rebuilt is None:
        print(f"not restamped {paths.shown(target)}: a code cell changed; use --execute")
        return 1
    nbformat.write(rebuilt, target)
    print(f"restamped {paths.shown(target)} (outputs kept)")
    return 0
