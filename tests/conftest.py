"""Fixtures shared by the unit tests: simulated GPU/MPS profiles (see gpu_sim.py) and a tiny stand-in model."""

import pytest

from gpu_sim import any_device, cuda_device  # noqa: F401 - pytest finds fixtures by name here
from tiny_models import tiny_config


@pytest.fixture(scope="module")
def tiny_standin(tmp_path_factory) -> str:
    """A tiny stand-in checkpoint on disk (built once per test module, then reused): its folder."""
    from course_utils import standin

    folder = tmp_path_factory.mktemp("cache")
    path = standin.ensure_standin(tiny_config(), seed=0, folder=folder)
    assert standin.ensure_standin(tiny_config(), seed=0, folder=folder) == path  # built once, then reused
    assert (path / "STANDIN.txt").exists() and not any(p.name.startswith(".building") for p in folder.iterdir())
    return str(path)
