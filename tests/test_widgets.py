"""Every widget of the course, built and driven under the installed ipywidgets: each control moved, each redraw checked.

The course runs on ipywidgets 8 (requirements.txt) and on Colab's ipywidgets 7.7.1 (requirements-colab.txt;
scripts/test_colab.sh runs this file there). Outside a notebook an Output widget passes printed text through, so
each redraw shows up in captured stdout, and an exception in a callback reaches the test. This checks the kernel
side only: no browser front end runs ipywidgets 7 on JupyterLab 4, whose widget manager is the 8.x one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

w = pytest.importorskip("ipywidgets")

from course_utils import digits  # noqa: E402 - after the importorskip above
from course_utils.accumulation import MicroBatchRow  # noqa: E402
from course_utils.lessons.kit import plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
IPYWIDGETS_MAJOR = int(w.__version__.split(".")[0])

#: Micro-batch rows as measured by the notebook (shape only: numbers made up, as in tests/test_accumulation.py).
ROWS = [MicroBatchRow(s, 64 // s, True, 1e-8, 1000 * s, 0.001 * 64 / s, "test") for s in (1, 8, 16, 64)]


def _tiny_digits() -> tuple[torch.nn.Module, digits.DigitsData]:
    """An untrained digits network and 40 random 'images': the format widget's wiring, not its numbers."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(40, 64, generator=g), torch.randint(0, 10, (40,), generator=g)
    return digits.make_mlp(seed=0), digits.DigitsData(x[:30], y[:30], x[30:], y[30:])


def _build(module: str, name: str, *args: Any, **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        import importlib

        return getattr(importlib.import_module(f"course_utils.lessons.{module}"), name)(*args, **kwargs)

    return build


#: Every widget builder the notebooks call, with cheap arguments. ``only``: for a control (by description), the
#: option indices to try (the matmul sizes above 512 would time real matmuls of seconds each).
BUILDERS: dict[str, tuple[Callable[[], Any], dict[str, list[int]]]] = {
    "gradient_accumulation.micro_batch_widget": (
        _build("gradient_accumulation", "micro_batch_widget", ROWS, 8000, 16),
        {},
    ),
    "mixed_precision.tiny_update_widget": (_build("mixed_precision", "tiny_update_widget", 1e-4), {}),
    "mixed_precision.matmul_widget": (_build("mixed_precision", "matmul_widget", "cpu"), {"matrix side": [1, 0]}),
    "quantization.eight_numbers_widget": (_build("quantization", "eight_numbers_widget"), {}),
    "quantization.error_widget": (_build("quantization", "error_widget"), {}),
    "quantization.format_widget": (lambda: _build("quantization", "format_widget", *_tiny_digits())(), {}),
    "real_models_qlora.four_bit_ratio_panel": (_build("real_models_qlora", "four_bit_ratio_panel"), {}),
    "memory_tricks.bottleneck_planner": (_build("memory_tricks", "bottleneck_planner"), {}),
    "memory_budget.budget_planner": (_build("memory_budget", "budget_planner"), {}),
    "memory_budget.step_planner": (_build("memory_budget", "step_planner", "smollm2-135m", "lora", 8, 512), {}),
}


def _parts(box: Any) -> tuple[list[Any], list[Any]]:
    """The value controls and the Output widgets inside ``box``, depth first."""
    controls, outputs = [], []

    def walk(widget: Any) -> None:
        if isinstance(widget, w.Output):
            outputs.append(widget)
        elif isinstance(widget, w.Box):
            for child in widget.children:
                walk(child)
        elif hasattr(widget, "value"):
            controls.append(widget)

    walk(box)
    return controls, outputs


def _moves(control: Any, only: dict[str, list[int]]) -> list[tuple[str, Any]]:
    """(trait, value) settings that move ``control`` away from its value and through its range."""
    if hasattr(control, "options"):  # Dropdown, SelectionSlider, ...: by index, labels and (label, value) alike
        indices = only.get(control.description, range(len(control.options)))
        return [("index", i) for i in indices if i != control.index]
    if isinstance(control, w.Checkbox):
        return [("value", not control.value), ("value", control.value)]
    if isinstance(control, w.FloatLogSlider):
        return [("value", control.base**control.max), ("value", control.base**control.min)]
    if hasattr(control, "min") and hasattr(control, "max"):
        return [("value", control.max), ("value", control.min)]
    raise AssertionError(f"no test moves for {type(control).__name__} {control.description!r}: add them here")


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_control_redraws_its_output(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    build, only = BUILDERS[name]
    box = build()
    assert isinstance(box, w.Box)
    controls, outputs = _parts(box)
    assert len(outputs) == 1 and controls, f"{name}: expected controls above one output area"
    assert capsys.readouterr().out.strip(), f"{name}: the first drawing printed nothing"
    moved = 0
    for control in controls:
        for trait, value in _moves(control, only):
            if getattr(control, "disabled", False):
                continue  # e.g. the scales menu while a float format is chosen
            setattr(control, trait, value)
            moved += 1
            printed = capsys.readouterr().out
            assert printed.strip(), f"{name}: setting {control.description!r}.{trait} = {value!r} printed nothing"
            assert "Traceback" not in printed
            plt.close("all")
    assert moved >= len(controls)


def test_every_widget_builder_is_covered() -> None:
    """A new widget builder in course_utils/lessons must be added to BUILDERS (so it runs under ipywidgets 7 too)."""
    found = set()
    for path in sorted(p for p in (ROOT / "course_utils" / "lessons").glob("[!_]*.py") if p.stem != "kit"):
        for fn in re.findall(r"^def (\w+_(?:widget|panel|planner))\(", path.read_text(encoding="utf-8"), re.M):
            found.add(f"{path.stem}.{fn}")
    assert found == set(BUILDERS)


def test_controls_the_course_uses_behave_alike_in_ipywidgets_7_and_8() -> None:
    """The few API points the widgets rely on, checked on whichever major version is installed."""
    drop = w.Dropdown(
        options=[("one scale", 0), ("16", 16)],
        value=0,
        description="block size",
        style={"description_width": "initial"},
    )
    drop.index = 1
    assert drop.value == 16 and drop.label == "16"
    log = w.FloatLogSlider(value=1e-4, base=10, min=-9, max=-1, step=0.05, readout_format=".2e")
    assert log.value == pytest.approx(1e-4)
    assert w.IntSlider(576, min=256, max=8192, step=64).value == 576  # value as the first positional argument
    assert w.Checkbox(True, description="tied lm_head").value is True
    sizes = w.SelectionSlider(options=(256, 512), value=512, continuous_update=False)
    assert sizes.value == 512 and sizes.index == 1
    assert IPYWIDGETS_MAJOR in (7, 8)


#: Names and keywords that exist only in ipywidgets 8 (Colab has 7.7.1). ``tooltip`` is 8's name for 7's
#: ``description_tooltip``; ``titles`` replaced 7's ``set_title``/``_titles`` on Tab and Accordion.
IPYWIDGETS_8_ONLY = re.compile(
    r"\b(TagsInput|ColorsInput|FloatsInput|IntsInput|Stack|NaiveDatetimePicker|"
    r"DatetimePicker|TimePicker)\s*\(|\b(titles|tooltip|description_allow_html)\s*="
)


@pytest.mark.parametrize(
    "path",
    sorted([*(ROOT / "course_utils" / "lessons").glob("*.py"), *(ROOT / "notebooks" / "src").glob("*.py")]),
    ids=lambda p: p.name,
)
def test_no_ipywidgets_8_only_api(path: Path) -> None:
    hits = [
        f"line {i}: {line.strip()}"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if IPYWIDGETS_8_ONLY.search(line)
    ]
    assert not hits, f"{path.name} uses an ipywidgets-8-only name (Colab has ipywidgets 7.7.1): {hits}"
