"""Simulated devices for testing CUDA (and Apple MPS) code paths on a machine without a GPU.

``simulate(monkeypatch, "T4")`` patches ``torch.cuda``'s *query* functions (availability, count, name,
capability, properties, free/total memory, bf16 support) to answer like a real GPU; ``count=2`` makes a machine
with two of them (Kaggle's 2xT4). The simulated machine starts with every GPU visible (``CUDA_VISIBLE_DEVICES`` is
cleared for the test), and ``device_count()`` honours ``CUDA_VISIBLE_DEVICES`` set afterwards, as CUDA does when it
starts: ``"0"`` leaves one GPU, ``""`` none. Nothing can be
computed on the simulated GPU: this CPU build of torch raises at the first CUDA allocation, which is
exactly where a simulated test must stop. Tests use it to check *decisions* (device, dtype, loss
scaling, which estimate is compared with which measurement), never results.

The profiles are real: names as ``torch.cuda.get_device_name`` prints them, compute capabilities and
total memory as ``get_device_properties`` reports them on Colab/cloud machines.
"""

from __future__ import annotations

import os
import functools
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch


@dataclass(frozen=True)
class Profile:
    """A device as torch reports it."""

    key: str
    name: str
    capability: tuple[int, int]
    total_memory: int  # bytes, as get_device_properties(...).total_memory
    multi_processor_count: int

    @property
    def is_cuda(self) -> bool:
        return self.capability != (0, 0)


GiB = 1024**3

#: Real devices the course meets. "CPU" and "MPS" have no CUDA device.
PROFILES: dict[str, Profile] = {
    # Colab's free GPU: 15,095 MiB exposed of 16 GB (usable: that less the 0.5 GB CUDA context); bf16 only by emulation.
    "T4": Profile("T4", "Tesla T4", (7, 5), 15_828_320_256, 40),
    "L4": Profile("L4", "NVIDIA L4", (8, 9), 23_580_639_232, 58),
    "A100": Profile("A100", "NVIDIA A100-SXM4-40GB", (8, 0), 42_505_273_344, 108),
    "H100": Profile("H100", "NVIDIA H100 80GB HBM3", (9, 0), 85_045_231_616, 132),
    "CPU": Profile("CPU", "", (0, 0), 0, 0),
    "MPS": Profile("MPS", "", (0, 0), 0, 0),
}

CUDA_PROFILES = ("T4", "L4", "A100", "H100")

#: Real devices that ``simulate`` knows but the ``any_device`` / ``cuda_device`` fixtures do not run (the
#: per-profile expectation tables of tests/test_gpu_paths*.py list the profiles above, one by one).
EXTRA_PROFILES: dict[str, Profile] = {
    # H200 SXM, 141 GB HBM3e: get_device_properties reports 143,771 MiB; 132 SMs like the H100.
    "H200": Profile("H200", "NVIDIA H200", (9, 0), 143_771 * 1024**2, 132)
}


def visible_count(count: int) -> int:
    """How many of ``count`` GPUs CUDA would show under the current ``CUDA_VISIBLE_DEVICES`` (unset: all of them)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return count
    shown = 0
    for entry in value.split(","):  # CUDA stops at the first entry that names no device
        if not entry.strip().isdigit() or int(entry) >= count:
            break
        shown += 1
    return shown


def _check_index(device: object = None, count: int = 1) -> int:
    """Accept None, an index below ``count``, 'cuda', 'cuda:N' or torch.device('cuda', N); raise like torch else."""
    if device is None:
        return 0
    if isinstance(device, int):
        index = device
    else:
        dev = torch.device(device) if isinstance(device, str) else device
        if not isinstance(dev, torch.device):
            raise TypeError(f"invalid device {device!r}")
        if dev.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {dev}")
        index = 0 if dev.index is None else dev.index
    if not 0 <= index < count:
        raise AssertionError(f"Invalid device id {index}: the simulated machine shows {count} GPU(s)")
    return index


@functools.cache
def _import_cuda_probing_libraries() -> None:
    """Import, on the real CPU, the libraries that probe CUDA while they import (bitsandbytes, and transformers'
    TrainingArguments, which pulls in accelerate). Imported first under a simulated GPU, they call CUDA internals
    this CPU build lacks and stay half-imported for every later test of the session, so that a test's result
    would depend on which tests ran before it."""
    from course_utils.quiet import import_bitsandbytes, quiet_libraries

    import_bitsandbytes()
    with quiet_libraries():
        import transformers

        transformers.TrainingArguments  # noqa: B018 - the lazy import happens here


def simulate(monkeypatch: pytest.MonkeyPatch, key: str, *, free_fraction: float = 0.97, count: int = 1) -> Profile:
    """Make ``torch.cuda`` (and ``torch.backends.mps``) answer like ``count`` devices ``key`` of :data:`PROFILES`
    (or :data:`EXTRA_PROFILES`)."""
    _import_cuda_probing_libraries()
    prof = PROFILES[key] if key in PROFILES else EXTRA_PROFILES[key]
    cuda = prof.is_cuda
    if count < 1 or (count > 1 and not cuda):
        raise ValueError(f"count must be 1, or more for a CUDA profile; got {count} for {key}")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: key == "MPS")
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: key == "MPS")
    if cuda:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # recorded, so that the test's end restores the value
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda and visible_count(count) > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible_count(count) if cuda else 0)
    if not cuda:
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
        return prof

    def name(device: object = None) -> str:
        _check_index(device, visible_count(count))
        return prof.name

    def capability(device: object = None) -> tuple[int, int]:
        _check_index(device, visible_count(count))
        return prof.capability

    def properties(device: object = None) -> SimpleNamespace:
        _check_index(device, visible_count(count))
        return SimpleNamespace(
            name=prof.name,
            major=prof.capability[0],
            minor=prof.capability[1],
            total_memory=prof.total_memory,
            multi_processor_count=prof.multi_processor_count,
        )

    def mem_get_info(device: object = None) -> tuple[int, int]:
        _check_index(device, visible_count(count))
        return int(prof.total_memory * free_fraction), prof.total_memory

    def select(device: object) -> None:  # torch.cuda.set_device: checks the index, allocates nothing
        _check_index(device, visible_count(count))

    monkeypatch.setattr(torch.cuda, "get_device_name", name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", select)
    # Every CUDA GPU answers True here, a T4 included (emulation): the course must not rely on it.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    return prof


@pytest.fixture(params=list(PROFILES))
def any_device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Profile:
    """Run the test once per profile, CPU and MPS included."""
    return simulate(monkeypatch, request.param)


@pytest.fixture(params=list(CUDA_PROFILES))
def cuda_device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Profile:
    """Run the test once per simulated CUDA GPU."""
    return simulate(monkeypatch, request.param)
