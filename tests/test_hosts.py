"""Kaggle's free GPUs, one T4 or two, simulated: the setup cell installs as on Colab and leaves the course one GPU.

transformers' ``TrainingArguments`` counts the GPUs it sees (``n_gpu``), and ``Trainer`` wraps the model in
``nn.DataParallel`` when there are two: every batch would then be twice what notebook 05 prints, and its memory
peak read on ``cuda:0`` only. These tests run the real setup cell (``run_cell`` of test_setup_cell.py) on a
simulated machine (gpu_sim.py, ``count=2``), then build the real ``TrainingArguments`` and read ``n_gpu``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from course_utils.quiet import quiet_libraries
from gpu_sim import simulate
from test_setup_cell import FakePip, run_cell

with quiet_libraries():
    # Imported before any simulation: bitsandbytes, which transformers imports on the way, needs the real torch.cuda.
    from accelerate.state import AcceleratorState
    from transformers import TrainingArguments

#: What one line of the setup cell says on a machine with two GPUs.
TWO_GPUS = "2 GPUs found: the course uses one (CUDA_VISIBLE_DEVICES=0)"


@pytest.fixture(autouse=True)
def fresh_accelerate_state() -> Iterator[None]:
    """TrainingArguments leaves accelerate's process-wide state on the simulated cuda:0: clear it afterwards."""
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def effective_batch(tmp_path: Path) -> tuple[int, int]:
    """(n_gpu, effective batch) that transformers' TrainingArguments sees for 8 per device x 2 accumulation steps."""
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, gradient_accumulation_steps=2, report_to=[]
    )
    return args.n_gpu, args.train_batch_size * args.gradient_accumulation_steps


def kaggle(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gpus: int) -> tuple[str, FakePip]:
    """A Kaggle kernel with ``gpus`` T4s: run the setup cell there; return what it printed and the fake pip."""
    simulate(monkeypatch, "T4", count=gpus)
    pip = FakePip(gpus=gpus)
    return run_cell(monkeypatch, tmp_path, pip, colab=False, kaggle=True), pip


def test_kaggle_one_t4(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    printed, pip = kaggle(monkeypatch, tmp_path, 1)
    assert len(pip.calls) == 2 and "GPUs found" not in printed  # helpers and extras installed; one GPU: nothing to say
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and "GPU: Tesla T4" in printed
    assert effective_batch(tmp_path) == (1, 16)


def test_kaggle_two_t4s_use_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    printed, pip = kaggle(monkeypatch, tmp_path, 2)
    assert len(pip.calls) == 2
    (line,) = [line for line in printed.splitlines() if "GPUs found" in line]
    assert line.startswith(TWO_GPUS) and printed.index(TWO_GPUS) < printed.index("Ready.")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0" and torch.cuda.device_count() == 1
    assert effective_batch(tmp_path) == (1, 16)  # what notebook 05 prints is what runs


def test_two_t4s_without_the_setup_cell_train_on_both(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    simulate(monkeypatch, "T4", count=2)
    assert torch.cuda.device_count() == 2
    assert effective_batch(tmp_path) == (2, 32)  # nn.DataParallel: twice the batch the notebook would print


def test_a_choice_already_made_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    simulate(monkeypatch, "T4", count=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    printed = run_cell(monkeypatch, tmp_path, FakePip(gpus=2), colab=False, kaggle=True)
    assert "GPUs found" not in printed and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert effective_batch(tmp_path) == (1, 16)


def test_cuda_already_started_asks_for_a_restart(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    simulate(monkeypatch, "T4", count=2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # torch used both GPUs before the setup cell
    printed = run_cell(monkeypatch, tmp_path, FakePip(gpus=2), colab=False, kaggle=True)
    (line,) = [line for line in printed.splitlines() if "GPUs found" in line]
    assert "torch already started CUDA" in line and line.endswith("Restart the kernel, then run this cell first.")
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # too late to set it: said so instead
    assert effective_batch(tmp_path) == (2, 32)
