"""The stored sweep against today's estimate, and no measurement typed into a notebook by hand.

``data/sweeps/smollm2-135m-cpu.json`` is scripts/memory_sweep.py's file of measured steps; notebook 05 prints its
largest error next to :data:`course_utils.sweeps.TOLERANCE_PCT`, and the tests below recompute it. A measured
figure in a notebook must come from a file or a run, never from a literal: :func:`hand_typed_measurements` finds
the literals that would bring it back.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from course_utils import step_memory, sweeps

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "notebooks" / "src").glob("*.py"))
#: A variable or keyword named like a measurement.
MEASURED_NAME = re.compile(r"measur|observed|peaks?(_|$)|timings?|seconds|_gb$|_mb$", re.IGNORECASE)
#: A Markdown table's header that says its numbers were measured.
MEASURED_HEADER = re.compile(r"measur", re.IGNORECASE)
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")
#: How many decimal numbers make a typed-in table of measurements.
MIN_NUMBERS = 3


def _cells(source: str) -> list[tuple[str, str]]:
    """A percent-format notebook source as ``(kind, text)`` cells; Markdown cells without their ``# `` prefix."""
    cells = []
    for header, body in re.findall(r"^# %%(.*)\n((?:(?!# %%).*\n?)*)", source, re.MULTILINE):
        if "[markdown]" in header:
            body = "\n".join(re.sub(r"^# ?", "", line) for line in body.splitlines())
            cells.append(("markdown", body))
        else:
            cells.append(("code", body))
    return cells


def _decimals(node: ast.AST) -> int:
    """How many float literals ``node`` holds as items, at any depth of nested dicts, lists, tuples and sets
    (``-1.2`` included; a float inside a computation, as in ``n * 4 / 1e9``, is not a typed figure)."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    if isinstance(node, ast.Constant):
        return int(isinstance(node.value, float))
    items = [*node.keys, *node.values] if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return sum(_decimals(item) for item in items if item is not None)


def _named_literals(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """(name, value) of every assignment and keyword argument whose value is a dict, list, tuple or set literal."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id if isinstance(t, ast.Name) else getattr(t, "attr", "") for t in targets]
            found += [(name, node.value) for name in names]
        elif isinstance(node, ast.keyword) and node.arg:
            found.append((node.arg, node.value))
    return [(name, value) for name, value in found if isinstance(value, (ast.Dict, ast.List, ast.Tuple, ast.Set))]


def hand_typed_measurements(source: str) -> list[str]:
    """What in a notebook source looks like measurements typed in by hand: a code cell's dict, list, tuple or set
    literal of 3+ decimal numbers assigned to a name like a measurement (``SWEEP_MEASURED = {...}``), or a
    Markdown table whose header says measured and whose cells hold 3+ decimal numbers. One line per find."""
    finds = []
    for number, (kind, text) in enumerate(_cells(source)):
        if kind == "code":
            try:
                tree = ast.parse(text)
            except SyntaxError:  # a cell with a magic: not Python
                continue
            finds += [
                f"cell {number}: {name} holds {_decimals(value)} typed decimal numbers"
                for name, value in _named_literals(tree)
                if MEASURED_NAME.search(name) and _decimals(value) >= MIN_NUMBERS
            ]
            continue
        for table in re.findall(r"(?:^\|.*\n?)+", text, re.MULTILINE):
            header, *body = table.splitlines()
            count = len(DECIMAL.findall("\n".join(body)))
            if MEASURED_HEADER.search(header) and count >= MIN_NUMBERS:
                finds.append(f"cell {number}: a Markdown table of measurements with {count} typed decimal numbers")
    return finds


# ------------------------------------------------------------------------------------------ the detector
TYPED_DICT = """# %% [markdown]
# Some text.

# %%
SWEEP_MEASURED = {("lora", 1): 1.221, ("lora", 4): 1.838, ("full", 8): -2.625}  # GB
"""
TYPED_KEYWORD = """# %%
plot(cases, measured_gb=[1.2, 1.8, 2.6])
"""
TYPED_TABLE = """# %% [markdown]
# | method | batch | estimate GB | measured GB |
# | --- | ---: | ---: | ---: |
# | LoRA | 1 | 1.225 | 1.221 |
# | LoRA | 4 | 1.816 | 1.838 |
"""
HARMLESS = """# %% [markdown]
# | Korthikanti et al. 2022 | SmolLM2 | why |
# | --- | --- | --- |
# | 2 bytes per number | 4 bytes | float32 |
# A reference: 1.5 and 2.5 and 3.5 GB in a sentence.

# %%
BASE = {"method": "full", "batch": 4, "seq": 256}
weights = [0.1, 0.2, 0.3]
peaks_gb = {"frozen": total * 4 / 1e9, "adapter": trained * 4 / 1e9, "states": trained * 8 / 1e9}
peak = measure(BASE)
%env X=1
"""


@pytest.mark.parametrize("source", [TYPED_DICT, TYPED_KEYWORD, TYPED_TABLE], ids=["dict", "keyword", "table"])
def test_the_detector_finds_typed_measurements(source: str) -> None:
    assert len(hand_typed_measurements(source)) == 1


def test_the_detector_lets_other_literals_pass() -> None:
    assert hand_typed_measurements(HARMLESS) == []


def test_a_table_needs_three_decimal_numbers() -> None:
    two = "# %% [markdown]\n# | case | measured GB |\n# | --- | --- |\n# | a | 1.22 |\n# | b | 1.84 |\n"
    assert hand_typed_measurements(two) == []
    assert len(hand_typed_measurements(two + "# | c | 2.63 |\n")) == 1


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_notebook_types_measurements_by_hand(path: Path) -> None:
    finds = hand_typed_measurements(path.read_text(encoding="utf-8"))
    assert not finds, f"{path.name}: load measured figures from a file or measure them; typed in: {finds}"


# ------------------------------------------------------------------------------------------ the stored sweep
def test_the_stored_sweep_holds_the_stated_tolerance() -> None:
    """The bound notebook 05 prints, recomputed from the file and today's estimator."""
    compared = sweeps.load().compare()
    assert [c.label for c in compared] == ["lora b1", "lora b4", "lora b8", "full b1", "full b4", "full b8"]
    worst = sweeps.largest_error_pct(compared)
    assert abs(worst) <= sweeps.TOLERANCE_PCT, f"largest error {worst:+.2f} % is over {sweeps.TOLERANCE_PCT} %"
    assert all(abs(c.error_pct) <= abs(worst) for c in compared)


def test_the_stored_sweep_says_where_and_what_it_measured() -> None:
    sweep = sweeps.load()
    assert sweep.config == "smollm2-135m" and sweep.machine["device"] == "cpu"
    assert {"cpu", "cores", "cpu_flags", "date", "versions"} <= sweep.machine.keys()
    assert {"python", "torch", "transformers", "peft", "bitsandbytes"} <= sweep.machine["versions"].keys()
    line = sweep.machine_line()
    assert sweep.machine["cpu"] in line and sweep.machine["versions"]["torch"] in line
    for row in sweep.rows:
        assert {"method", "batch", "seq", "lora_rank", "targets", "checkpointing", "optimizer"} <= row["step"].keys()
        assert {"peak_bytes", "start_bytes", "baseline_bytes", "what"} <= row["measured"].keys()
        assert 0 < row["measured"]["start_bytes"] < row["measured"]["peak_bytes"]


def _one_row_sweep(tmp_path: Path, measured_bytes: int, **machine: object) -> Path:
    step = {
        "method": "lora",
        "batch": 1,
        "seq": 16,
        "lora_rank": 8,
        "targets": ["q_proj", "v_proj"],
        "checkpointing": False,
        "optimizer": "adamw",
        "autocast": None,
        "accumulation": 1,
        "steps": 1,
    }
    doc = {
        "config": "smollm2-135m",
        "machine": {
            "device": "cpu",
            "gpu": None,
            "cpu": "Test CPU",
            "cores": 2,
            "cpu_flags": ["avx2"],
            "date": "2026-01-02T00:00:00+00:00",
            **machine,
            "versions": {"python": "3.11", "torch": "2.13", "transformers": "5.24", "peft": "0.21"},
        },
        "rows": [
            {
                "step": step,
                "measured": {
                    "peak_bytes": measured_bytes,
                    "start_bytes": measured_bytes // 2,
                    "baseline_bytes": 400_000_000,
                },
            },
            {"step": {**step, "batch": 2}, "error": "TimeoutError: too slow"},
        ],
    }
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(doc))
    return path


def test_compare_asks_todays_estimator(tmp_path: Path) -> None:
    est = step_memory.estimate_step("smollm2-135m", method="lora", batch=1, seq=16, device="cpu")
    sweep = sweeps.load(_one_row_sweep(tmp_path, round(est.peak_bytes * 1.1)))
    (row,) = sweep.compare()  # the failed row is left out
    assert row.label == "lora b1" and row.estimate_gb == pytest.approx(est.peak_gb)
    assert row.error_pct == pytest.approx(100 * (1 / 1.1 - 1), abs=1e-6)
    assert sweeps.largest_error_pct([row]) == row.error_pct
    assert "Test CPU, 2 cores, bfloat16 instructions: none" in sweep.machine_line()


def test_a_gpu_sweep_is_compared_with_the_allocator_estimate(tmp_path: Path) -> None:
    est = step_memory.estimate_step("smollm2-135m", method="lora", batch=1, seq=16, device="cuda")
    sweep = sweeps.load(_one_row_sweep(tmp_path, est.peak_bytes, device="cuda:0", gpu="NVIDIA L4"))
    assert sweep.compare()[0].error_pct == pytest.approx(0.0)
    assert sweep.machine_line().startswith("NVIDIA L4;")


def test_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a sweep file"):
        sweeps.load(path)
    with pytest.raises(ValueError, match="compared"):
        sweeps.largest_error_pct([])
