"""course_utils.hardware: device, bf16 detection, datasheets and peak memory, without needing a GPU."""

from __future__ import annotations

import pytest
import torch

from course_utils import hardware


def test_pick_device_is_cpu_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hardware.pick_device() == torch.device("cpu")


@pytest.mark.parametrize(
    "capability, native, dtype",
    [
        ((7, 5), False, torch.float16),  # T4: bf16 only through emulation
        ((7, 0), False, torch.float16),  # V100
        ((8, 0), True, torch.bfloat16),  # A100
        ((8, 9), True, torch.bfloat16),  # L4
        ((9, 0), True, torch.bfloat16),  # H100, H200
    ],
)
def test_bf16_native_follows_compute_capability(monkeypatch: pytest.MonkeyPatch, capability, native, dtype) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    # A T4 says True here (emulation); the course must not believe it.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert hardware.bf16_native("cuda") is native
    assert hardware.autocast_dtype("cuda") == dtype
    assert hardware.needs_loss_scaling(dtype) is not native  # without native bfloat16: float16 and loss scaling


def test_cpu_autocasts_to_bf16_and_is_not_native_gpu_bf16() -> None:
    assert hardware.autocast_dtype("cpu") == torch.bfloat16
    assert hardware.bf16_native("cpu") is False


@pytest.mark.parametrize(
    "name, key",
    [
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
    ],
)
def test_datasheet_lookup(name: str, key: str) -> None:
    assert hardware.datasheet_for(name) == hardware.DATASHEETS[key]


def test_datasheet_lookup_does_not_confuse_similar_names() -> None:
    assert hardware.datasheet_key("NVIDIA L40S") == "L40S"  # not the L4
    assert hardware.datasheet_key("NVIDIA L4") == "L4"
    assert hardware.datasheet_for("NVIDIA GeForce RTX 3090 Ti") is None  # not the 3090


def test_seed_h100_figures() -> None:
    sheet = hardware.DATASHEETS["H100"]
    assert round(sheet.tensor16_tflops, -1) == 990 and sheet.fp32_tflops == 67


def test_bad_device_arguments() -> None:
    with pytest.raises(ValueError, match="device"):
        hardware.bf16_native("tpu-ish")
    with pytest.raises(TypeError, match="device"):
        hardware.autocast_dtype(3.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name"):
        hardware.datasheet_for(None)  # type: ignore[arg-type]


def test_gpu_memory_is_none_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hardware.gpu_memory_gb() is None
    assert hardware.current_datasheet() is None
    assert "CPU only" in hardware.hardware_summary()


def test_setup_report_is_one_line_when_all_is_well(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "version_notes", lambda have=None: [])
    report = hardware.setup_report()
    assert report.startswith("Ready. CPU only") and "torch" in report and "\n" not in report
    monkeypatch.setattr(hardware, "version_notes", lambda have=None: ["peft 0.1 is older than 0.17.1"])
    assert hardware.setup_report().splitlines()[1] == "peft 0.1 is older than 0.17.1"
