"""Unsloth in notebook 01b: shown as the code of a runtime of its own, never imported in the notebook's kernel.

Unsloth patches torch, transformers and peft when it is imported, so it must come first in a fresh kernel. 01b's
kernel imports torch in its setup cell, so no code cell of 01b may import Unsloth (or pip-install anything); its
Unsloth version is a Markdown code block whose first statement imports Unsloth, with the adapter of 01b's peft cells.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

from course_utils import lora

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import build_notebooks  # noqa: E402 - after the path line above

NOTEBOOK = ROOT / "notebooks" / "src" / "01b_real_models_qlora.py"
#: What Unsloth patches on import: none of them may be imported before it.
PATCHED = ("torch", "transformers", "peft")


def _cells(kind: str) -> list[str]:
    """The sources of 01b's cells of one kind ("code" or "markdown"), as the build makes them, but the setup cell
    (which installs the course's packages on Colab before anything is imported)."""
    cells = build_notebooks.parse_source(NOTEBOOK.read_text(encoding="utf-8"))
    setup = build_notebooks.SETUP_CELL_METADATA
    return [cell.source for cell in cells if cell.cell_type == kind and cell.metadata != setup]


def _imports(tree: ast.AST) -> list[str]:
    """The top-level package of every import in ``tree``, in source order."""
    nodes = sorted((n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))), key=lambda n: n.lineno)
    names = [[a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""] for n in nodes]
    return [name.split(".")[0] for group in names for name in group]


def _unsloth_block() -> ast.Module:
    """The Python code block of 01b's Unsloth section, shell lines (``!pip ...``) left out."""
    blocks = [b for cell in _cells("markdown") for b in re.findall(r"```python\n(.*?)```", cell, flags=re.S)]
    (block,) = [b for b in blocks if "FastLanguageModel" in b]
    return ast.parse("\n".join(line for line in block.splitlines() if not line.lstrip().startswith("!")))


def test_no_code_cell_of_the_notebook_imports_unsloth_or_pip_installs() -> None:
    code = _cells("code")
    assert code and all("unsloth" not in _imports(ast.parse(source)) for source in code)
    assert not any("pip" in line for source in code for line in source.splitlines() if not line.startswith("#"))


def test_the_unsloth_block_imports_unsloth_before_what_it_patches() -> None:
    tree = _unsloth_block()
    first = tree.body[0]
    assert isinstance(first, ast.ImportFrom) and first.module == "unsloth"
    assert not set(_imports(tree)) & set(PATCHED)  # the rest comes through Unsloth itself


def test_the_unsloth_adapter_is_the_one_the_peft_cells_train() -> None:
    (call,) = [
        n
        for n in ast.walk(_unsloth_block())
        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "get_peft_model"
    ]
    given = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg != "model"}
    defaults = inspect.signature(lora.add_lora).parameters  # the lesson's adapter: rank 16, alpha 16, 7 projections
    assert given["r"] == defaults["r"].default and given["lora_alpha"] == defaults["alpha"].default
    assert tuple(given["target_modules"]) == tuple(defaults["targets"].default)
