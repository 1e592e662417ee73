"""Tests for course_utils.ddp: the DDP check really runs (2 gloo processes on CPU) and cannot hang."""

from __future__ import annotations

import time

import pytest
import torch

from course_utils import ddp


def test_two_processes_with_no_sync_give_the_big_batch_gradient() -> None:
    result = ddp.run_ddp_check(world_size=2, batch_size=64, accumulation_steps=4, timeout_s=120)
    assert (result.world_size, result.micro_batch_size, result.accumulation_steps) == (2, 8, 4)
    assert result.same_gradient and result.ranks_agree
    assert result.max_difference < 1e-6
    assert result.allreduce_calls == 1  # no_sync: one all-reduce per update
    assert result.allreduce_calls_without_no_sync == 4  # without it: one per micro-batch
    assert result.same_gradient_without_no_sync
    assert "same gradient as one process with a batch of 64: True" in result.report()


def test_a_stuck_launch_is_stopped_by_the_timeout(tmp_path) -> None:
    # one process of a world of two: rank 0 waits (up to 120 s) for a rank 1 that never starts
    args = (2, ddp.free_port(), str(tmp_path), 64, 4, "gloo", 120.0)
    start = time.perf_counter()
    with pytest.raises(TimeoutError, match="timeout_s=0.5"):
        ddp.launch(ddp.ddp_worker, args, nprocs=1, timeout_s=0.5)
    assert time.perf_counter() - start < 30


def test_a_failing_worker_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="a worker process failed"):
        ddp.launch(ddp.check_ddp_args, (64, 4, "mpi", 60.0), nprocs=1, timeout_s=60)  # backend "mpi" raises


def test_start_method() -> None:
    assert ddp.start_method() in ("forkserver", "spawn")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"world_size": 8, "batch_size": 4, "accumulation_steps": 1}, r"batch_size \(4\) must split evenly"),
        ({"world_size": 0}, "world_size must be between 1 and 8"),
        ({"world_size": 9}, "world_size must be between 1 and 8"),
        ({"world_size": 3}, r"batch_size \(64\) must split evenly into world_size \(3\)"),
        ({"accumulation_steps": 0}, "accumulation_steps must be between 1 and 64"),
        ({"accumulation_steps": 5}, "must split evenly"),
        ({"backend": "mpi"}, "backend must be one of"),
        ({"timeout_s": 0}, "timeout_s must be a finite number > 0 and <= 600"),
        ({"batch_size": 0}, "batch_size must be between"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, message) -> None:
    args = {"world_size": 2, "batch_size": 64, "accumulation_steps": 4, "backend": "gloo", "timeout_s": 60.0} | kwargs
    with pytest.raises(ValueError, match=message):
        ddp.check_ddp_args(**args)


def test_nccl_needs_a_gpu_per_process(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="nccl"):
        ddp.check_ddp_args(1, 64, 4, "nccl", 60.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert ddp.check_ddp_args(2, 64, 4, "nccl", 60.0) == 8  # only the backend changes
    with pytest.raises(ValueError, match="world_size must be between 1 and 2"):
        ddp.check_ddp_args(4, 64, 4, "nccl", 60.0)


def test_free_port() -> None:
    port = ddp.free_port()
    assert 0 < port < 65536


def test_accumulate_on_rank_source_shows_no_sync() -> None:
    import inspect

    src = inspect.getsource(ddp.accumulate_on_rank)
    assert "no_sync()" in src and "/ accumulation_steps" in src


def test_pick_backend_and_rank_device_on_this_machine() -> None:
    expected = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "gloo"
    assert ddp.pick_backend(world_size=2) == expected
    assert ddp.rank_device(3, "gloo") == torch.device("cpu")
    with pytest.raises(ValueError, match="world_size"):
        ddp.pick_backend(world_size=0)
