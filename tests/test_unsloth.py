"""course_utils.unsloth: the Unsloth cell runs only with Unsloth, a CUDA GPU and the Hub; never pip-installed."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from course_utils import unsloth
from course_utils.hub import REAL_MODEL
from course_utils.hub import ModelChoice


def _cuda(monkeypatch: pytest.MonkeyPatch, present: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: present)


def test_unsloth_plan(monkeypatch) -> None:
    real = ModelChoice(REAL_MODEL, False, "gpu and hub")
    standin = ModelChoice("/tmp/x", True, "HF_HUB_OFFLINE is set")
    _cuda(monkeypatch, False)
    plan = unsloth.unsloth_plan(real)
    assert not plan.run and "skipped" in plan.reason and "CUDA GPU" in plan.reason
    assert "peft cells above did the same job" in plan.message() and "pip install unsloth" in plan.message()
    _cuda(monkeypatch, True)
    plan = unsloth.unsloth_plan(standin)
    assert not plan.run and "Hub" in plan.reason and "HF_HUB_OFFLINE" in plan.reason
    monkeypatch.setattr(unsloth, "unsloth_importable", lambda: True)
    plan = unsloth.unsloth_plan(real)
    assert plan.run and plan.command is None and "same job" not in plan.message()
    with pytest.raises(TypeError, match="choice"):
        unsloth.unsloth_plan("Qwen/Qwen2.5-1.5B-Instruct")  # type: ignore[arg-type]


@pytest.mark.parametrize("colab", [True, False])
def test_unsloth_is_never_installed_into_a_running_kernel(monkeypatch, colab: bool) -> None:
    """Missing Unsloth on a GPU with the Hub: skip, and print the command for a *fresh* runtime."""
    real = ModelChoice(REAL_MODEL, False, "gpu and hub")
    _cuda(monkeypatch, True)
    monkeypatch.setattr(unsloth, "unsloth_importable", lambda: False)
    monkeypatch.setattr(unsloth, "on_colab", lambda: colab)
    plan = unsloth.unsloth_plan(real)
    assert not plan.run and not hasattr(plan, "install")
    text = plan.message()
    assert "restart" in text.lower() or "new kernel" in text
    if colab:
        expected = "In a fresh Colab runtime, run `!pip install unsloth` in the first cell"
        assert expected in text.replace("To run it: in", "In")
    else:
        assert "`pip install unsloth` in a fresh environment" in text
    assert "peft cells above did the same job" in text


def test_unsloth_importable_reads_the_spec(monkeypatch) -> None:
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "unsloth" else find(name))
    assert unsloth.unsloth_importable() is True
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "unsloth" else find(name))
    assert unsloth.unsloth_importable() is False


def test_notebook_never_pip_installs_into_its_kernel() -> None:
    source = (Path(__file__).resolve().parents[1] / "notebooks" / "src" / "01b_real_models_qlora.py").read_text(
        encoding="utf-8")
    code = "\n".join(line for line in source.splitlines() if not line.startswith("#"))
    assert "pip" not in code and "subprocess" not in code
