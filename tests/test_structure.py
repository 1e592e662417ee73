"""The package's shape: estimators never import measuring code, and the command line starts without torch."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "course_utils"
#: Modules that predict memory from arithmetic: they must never import what measures.
ESTIMATORS = ("architecture", "bottleneck", "checks", "configs", "datasheets", "memory", "step_memory", "units")
#: Modules that measure (run steps, read peak counters, time kernels).
MEASURING = {"course_utils.measure", "course_utils.peak", "course_utils.tricks"}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("module", ESTIMATORS)
def test_estimators_never_import_measuring_code(module: str) -> None:
    assert not imported_modules(PACKAGE / f"{module}.py") & MEASURING


def test_estimates_and_the_table_need_no_torch() -> None:
    code = ("import sys; from course_utils import memory, step_memory, bottleneck, cli; "
            "step_memory.estimate_step('smollm2-135m', batch=2, seq=64); cli.main(['memory']); "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("False")
