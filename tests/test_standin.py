"""course_utils.standin: the stand-in model, built once from a shipped config into a cache folder, and the choice.

The tests build a tiny Llama (hidden 64, 2 layers) through the same code path as the 135M stand-in, so they
stay fast; the 135M model itself is exercised by notebook 01b. The tiny config is in
``tiny_models.py``; the ``tiny_standin`` fixture in ``conftest.py``.
"""
from __future__ import annotations

import socket

import pytest
import torch

from course_utils import standin
from course_utils.footprint import count_model_parameters
from course_utils.hub import REAL_MODEL
from course_utils.models import load_model, meta_model
from tiny_models import TINY, tiny_config

def test_choose_model_labels_the_standin(monkeypatch, tmp_path) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("the network was touched")
    monkeypatch.setattr(socket, "create_connection", forbidden)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(standin, "ensure_standin", lambda seed=0: tmp_path)
    choice = standin.choose_model()
    assert choice.is_standin and "STAND-IN" in choice.label and "random weights" in choice.label
    assert choice.name == str(tmp_path)
    assert standin.ModelChoice(REAL_MODEL, False, "gpu").label == f"[{REAL_MODEL}]"


def test_the_standin_architecture_has_the_lessons_count() -> None:
    smol = meta_model(standin.STANDIN_CONFIG)
    assert count_model_parameters(smol) == standin.STANDIN_PARAMS == 134_515_008


def test_standin_is_reproducible(tiny_standin, tmp_path) -> None:
    other = standin.ensure_standin(tiny_config(), seed=0, folder=tmp_path)
    a, b = load_model(tiny_standin, 16, device="cpu"), load_model(other, 16, device="cpu")
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    assert "ensure_standin" in (other / "STANDIN.txt").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="seed"):
        standin.ensure_standin(tiny_config(), seed=-1, folder=tmp_path)


def test_standin_from_a_dict_config(tmp_path) -> None:
    path = standin.ensure_standin(dict(TINY), folder=tmp_path)  # read by configs.read_config
    assert (path / "config.json").exists() and path.name.startswith("standin-llama-")


def test_standin_cache_falls_back_to_the_temp_dir(monkeypatch, tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("COURSE_UTILS_CACHE", str(blocker / "cache"))  # cannot be created
    monkeypatch.setattr(standin.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    path = standin.ensure_standin(tiny_config(), seed=0)
    assert path.parent == tmp_path / "tmp" / "course_utils" and (path / "config.json").exists()
    with pytest.raises(OSError):
        standin.ensure_standin(tiny_config(), seed=0, folder=blocker / "cache")  # an explicit folder is not replaced
