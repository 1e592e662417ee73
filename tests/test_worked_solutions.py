"""Every worked solution a learner copies runs in the notebook: it names nothing the notebook never defined.

A worked solution is what a ``<details>`` block of a Markdown cell shows: its fenced ```python code, and its inline
`code` spans that parse as Python and call something or read an attribute. Each name it reads must be bound by a
code cell above it (assignment, for, with, import, def, class, walrus, except ... as), be a builtin, or be bound by
the solution itself; each ``module.attr`` chain on an imported module must name attributes that exist. Nothing is
run (some solutions take minutes): modules are only imported, to look their attributes up.
"""

from __future__ import annotations

import ast
import builtins
import copy
import importlib
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from course_utils import about

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "notebooks" / "src"
sys.path.insert(0, str(ROOT / "scripts"))
import build_notebooks  # noqa: E402 - after the path line above

DETAILS = re.compile(r"<details\b[^>]*>(.*?)</details>", re.S)
PYTHON_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```", re.S | re.M)
ANY_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
#: What a Jupyter kernel defines besides Python's builtins.
KERNEL_NAMES = frozenset({"display", "get_ipython"})
#: Where an import that fails is a problem; elsewhere (an optional library missing here) the chain is not checked.
OWN_PACKAGE = "course_utils"

#: An imported name's origin: ("a.b", None) for ``import a.b as c``, ("a", "b") for ``from a import b``.
Origin = tuple[str, "str | None"]


def details_blocks(markdown: str) -> list[str]:
    """The inside of each ``<details>`` block of one Markdown cell."""
    return DETAILS.findall(markdown)


def parse(text: str) -> ast.Module | None:
    """``text`` as a Python module, or None when it is not Python."""
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def solution_snippets(block: str) -> list[str]:
    """What a learner can copy from one ``<details>`` block: its python fences, then inline spans that are code."""
    snippets = [m.group(1) for m in PYTHON_FENCE.finditer(block)]
    for span in INLINE.findall(ANY_FENCE.sub("", block)):
        text = re.sub(r"\s*\n\s*", " ", span.strip())  # Markdown reads a line break in a span as a space
        tree = parse(text)
        if tree is not None and any(isinstance(n, (ast.Call, ast.Attribute)) for n in ast.walk(tree)):
            snippets.append(text)
    return snippets


class _Binder(ast.NodeVisitor):
    """The names a module-level piece of code binds in its namespace, in order, with each import's origin."""

    def __init__(self) -> None:
        self.bound: list[tuple[str, Origin | None]] = []

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.bound.append((alias.asname, (alias.name, None)))
            else:
                top = alias.name.split(".")[0]
                self.bound.append((top, (top, None)))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name == "*":
                raise ValueError(f"'from {node.module} import *' hides which names it binds: import them by name")
            self.bound.append((alias.asname or alias.name, (node.module or "", alias.name)))

    def _define(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.bound.append((node.name, None))  # its body runs in its own scope: nothing in it leaks

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _define

    def visit_Lambda(self, node: ast.Lambda) -> None:
        """A lambda's arguments are its own."""

    def _comprehension(self, node: ast.AST) -> None:
        for inner in ast.walk(node):  # its loop variables stay inside; only a walrus binds outside
            if isinstance(inner, ast.NamedExpr) and isinstance(inner.target, ast.Name):
                self.bound.append((inner.target.id, None))

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            self.bound.append((node.id, None))

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bound.append((node.name, None))
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self.bound.append((node.name, None))
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self.bound.append((node.name, None))

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self.bound.append((node.rest, None))
        self.generic_visit(node)


def bound_anywhere(tree: ast.AST) -> set[str]:
    """Every name a snippet binds at any depth: its own variables, parameters and loop variables."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
    return names


def attribute_chain(node: ast.Attribute) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None when the chain does not start at a plain name (``f().x``)."""
    parts: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    return [current.id, *reversed(parts)]


def resolve(origin: Origin) -> object:
    """The object an import binds (imports the module)."""
    module, name = origin
    if name is None:
        return importlib.import_module(module)
    try:
        return importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        return getattr(importlib.import_module(module), name)


def line_of(snippet: str, node: ast.AST) -> str:
    """The snippet's line that holds ``node``, for a message."""
    return snippet.splitlines()[getattr(node, "lineno", 1) - 1].strip()


@dataclass
class Namespace:
    """What a notebook's kernel holds at one point: the bound names, and which of them are imports."""

    names: set[str] = field(default_factory=set)
    imports: dict[str, Origin] = field(default_factory=dict)

    def bind(self, tree: ast.Module) -> None:
        """Add what a cell (or a solution) binds at module level; a name bound again is no longer an import."""
        binder = _Binder()
        binder.visit(tree)
        for name, origin in binder.bound:
            self.names.add(name)
            if origin is None:
                self.imports.pop(name, None)
            else:
                self.imports[name] = origin

    def problems(self, snippet: str, tree: ast.Module, own: set[str]) -> list[str]:
        """Why ``snippet`` would fail here: names nobody bound, attributes a module lacks."""
        known = self.names | own | set(dir(builtins)) | KERNEL_NAMES
        found: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in known:
                found.append(f"uses {node.id!r}, which no code cell above defines, in: {line_of(snippet, node)}")
        chains: dict[tuple[str, ...], ast.Attribute] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and (chain := attribute_chain(node)):
                chains.setdefault(tuple(chain), node)
        for chain, node in sorted(chains.items()):
            if chain[0] in self.imports:
                missing = self._missing_attribute(list(chain))
                if missing:
                    found.append(f"uses {missing}, in: {line_of(snippet, node)}")
        return found

    def _missing_attribute(self, chain: list[str]) -> str | None:
        """The first part of ``chain`` that its module does not have, described; None when all exist."""
        origin = self.imports[chain[0]]
        try:
            obj = resolve(origin)
        except (ImportError, AttributeError) as err:
            if origin[0].split(".")[0] == OWN_PACKAGE:
                return f"{chain[0]!r}, whose import fails: {err}"
            return None  # an optional library that is not installed here
        for i, part in enumerate(chain[1:], start=1):
            if not isinstance(obj, types.ModuleType):
                return None  # past the modules: a class's or an object's attributes are not checked
            if not hasattr(obj, part):
                try:
                    importlib.import_module(f"{obj.__name__}.{part}")
                except ModuleNotFoundError:
                    return f"{'.'.join(chain[: i + 1])!r}: module {obj.__name__} has no {part!r}"
            obj = getattr(obj, part)
        return None


def code_tree(source: str, label: str) -> ast.Module:
    """A code cell as a module; IPython magic lines (``%``, ``!``) are read as ``pass``."""
    tree = parse(source)
    if tree is None:
        tree = parse(re.sub(r"(?m)^(\s*)[%!].*$", r"\1pass", source))
    if tree is None:
        raise AssertionError(f"{label}: a code cell is not Python:\n{source[:300]}")
    return tree


@dataclass
class Report:
    """What checking one notebook source found."""

    snippets: int = 0
    problems: list[str] = field(default_factory=list)


def check_source(text: str, label: str) -> Report:
    """Check every worked solution in a percent-format notebook source against the code cells above it."""
    report = Report()
    namespace = Namespace()
    for cell in build_notebooks.parse_source(text):
        if cell.cell_type == "code":
            namespace.bind(code_tree(cell.source, label))
            continue
        if cell.cell_type != "markdown":
            continue
        for block in details_blocks(cell.source):
            snippets = [(s, parse(s)) for s in solution_snippets(block)]
            broken = [s for s, tree in snippets if tree is None]
            report.problems += [f"{label}: a python fence in a worked solution is not Python:\n{s}" for s in broken]
            snippets = [(s, tree) for s, tree in snippets if tree is not None]
            inside = copy.deepcopy(namespace)  # the solution's own imports and names hold for the whole block
            own: set[str] = set()
            for _, tree in snippets:
                inside.bind(tree)
                own |= bound_anywhere(tree)
            for snippet, tree in snippets:
                report.snippets += 1
                report.problems += [f"{label}: worked solution {p}" for p in inside.problems(snippet, tree, own)]
    return report


# ------------------------------------------------------------------------------------------- the course's notebooks
STEMS = [Path(nb.filename).stem for nb in about.NOTEBOOKS]


@pytest.mark.parametrize("stem", STEMS)
def test_worked_solutions_use_only_what_the_notebook_defines(stem: str) -> None:
    report = check_source((SOURCES / f"{stem}.py").read_text(encoding="utf-8"), stem)
    assert report.snippets >= 1, f"{stem}: no worked solution with code found; did the <details> format change?"
    assert not report.problems, "\n".join(report.problems)


# ---------------------------------------------------------------------------------------------- the checker itself
def _source(code: str, solution: str, later_code: str = "print()") -> str:
    """A percent-format source: a code cell, a Markdown cell holding a worked solution, another code cell."""

    def comment(text: str) -> str:
        return "\n".join(f"# {line}".rstrip() for line in text.splitlines())

    details = f"<details><summary>Worked solution</summary>\n\n{solution}\n\n</details>"
    return (
        f"# %% [markdown]\n# # A title\n\n# %%\n{code}\n\n# %% [markdown]\n{comment(details)}\n\n# %%\n{later_code}\n"
    )


def _problems(code: str, solution: str, later_code: str = "print()") -> list[str]:
    return check_source(_source(code, solution, later_code), "NN_test").problems


def test_an_unknown_alias_is_reported_with_the_notebook_and_the_line() -> None:
    problems = _problems("from course_utils import memory", 'The estimator: `mem.estimate(3e9, "full").gb`.')
    assert len(problems) == 1
    assert problems[0].startswith("NN_test:") and "'mem'" in problems[0]
    assert 'mem.estimate(3e9, "full").gb' in problems[0]


def test_a_defined_module_and_attribute_pass() -> None:
    report = check_source(
        _source("from course_utils import memory", 'The estimator: `memory.estimate(3e9, "full").gb`.'), "NN_test"
    )
    assert report.snippets == 1
    assert report.problems == []


def test_a_missing_module_attribute_is_reported() -> None:
    problems = _problems("from course_utils import memory", "`memory.no_such_estimate(3e9)`")
    assert len(problems) == 1
    assert "memory.no_such_estimate" in problems[0] and "course_utils.memory has no 'no_such_estimate'" in problems[0]


def test_dotted_imports_with_an_alias_check_the_submodule() -> None:
    code = "import xml.etree.ElementTree as ET\nimport os.path"
    assert _problems(code, "`ET.fromstring('<a/>')` and `os.path.join('a', 'b')`") == []
    assert "ET.nope" in _problems(code, "`ET.nope('<a/>')`")[0]
    assert "os.path.nope" in _problems(code, "`os.path.nope('a')`")[0]


def test_every_way_a_cell_binds_a_name_counts() -> None:
    code = "\n".join(
        [
            "a, (b, c) = 1, (2, 3)",
            "for i in range(2):",
            "    pass",
            "with open(__file__) as fh:",
            "    pass",
            "if (w := 3):",
            "    pass",
            "try:",
            "    pass",
            "except ValueError as err:",
            "    pass",
            "def f():",
            "    return 1",
            "class K:",
            "    pass",
            "import json as js",
            "from os import path as p",
            "total: int = 0",
            "total += 1",
        ]
    )
    solution = "```python\nprint(a + b + c + i + w + total, fh, err, f(), K(), js.dumps(1), p.join('x'))\n```"
    assert _problems(code, solution) == []


def test_names_inside_a_function_or_comprehension_do_not_leak() -> None:
    code = "def g():\n    hidden = 1\n    return hidden\nsquares = [k * k for k in range(3)]"
    problems = _problems(code, "```python\nprint(hidden, k, squares)\n```")
    assert len(problems) == 2
    assert "'hidden'" in problems[0] and "'k'" in problems[1]


def test_a_name_defined_only_after_the_solution_is_reported() -> None:
    problems = _problems("x = 1", "`print(later.real)`", later_code="later = 2")
    assert len(problems) == 1 and "'later'" in problems[0]


def test_names_the_solution_binds_hold_across_its_block() -> None:
    solution = (
        "```python\ndef batch_loss(means, counts):\n    return sum(means) / sum(counts)\n```\n\n"
        "`sum(means) / len(means)` is the trap; `batch_loss([1.0], [2])` is right."
    )
    report = check_source(_source("x = 1", solution), "NN_test")
    assert report.snippets == 3
    assert report.problems == []


def test_a_solution_may_import_what_it_needs() -> None:
    solution = "```python\nfrom course_utils import memory as m\nprint(m.estimate(3e9).gb)\n```"
    assert _problems("x = 1", solution) == []
    assert "m.nope" in _problems("x = 1", "```python\nfrom course_utils import memory as m\nm.nope()\n```")[0]


def test_a_name_bound_again_is_no_longer_checked_as_a_module() -> None:
    assert _problems("import json\njson = {'a': 1}", "`json.get('a')`") == []


def test_prose_in_backticks_is_not_a_solution() -> None:
    solution = (
        '`ValueError`, `.int()`, `kept_gb = 0.283`, `q_proj` and `{"team": "billing"}`\n\n'
        "```bash\npython -m course_utils memory --nope\n```"
    )
    report = check_source(_source("x = 1", solution), "NN_test")
    assert report.snippets == 0


def test_a_span_broken_over_two_lines_is_read_as_one() -> None:
    problems = _problems("x = 1", "So `choice =\nunknown_name.pick()`.")
    assert len(problems) == 1 and "'unknown_name'" in problems[0]


def test_a_broken_python_fence_is_reported() -> None:
    problems = _problems("x = 1", "```python\nprint(x\n```")
    assert len(problems) == 1 and "not Python" in problems[0]
