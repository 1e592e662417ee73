"""The device and dtype decisions of course_utils.hardware, and every notebook's setup cell, on simulated devices.

Each test runs under a simulated profile from gpu_sim.py (T4, L4, A100, H100, CPU, Apple MPS): torch.cuda's
query functions answer like that device, and nothing is computed on it. Module-specific CUDA paths are in
test_gpu_paths_*.py beside this file.
"""

from __future__ import annotations

import io
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

from course_utils import about, hardware
from gpu_sim import CUDA_PROFILES, PROFILES, Profile, simulate
from test_setup_cell import FakePip, run_cell

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import build_notebooks  # noqa: E402 - the generator of every notebook's setup cell

#: What the course must decide on each device: (device type, autocast dtype, loss scaling, native bf16).
EXPECTED = {
    "T4": ("cuda", torch.float16, True, False),
    "L4": ("cuda", torch.bfloat16, False, True),
    "A100": ("cuda", torch.bfloat16, False, True),
    "H100": ("cuda", torch.bfloat16, False, True),
    "CPU": ("cpu", torch.bfloat16, False, False),
    "MPS": ("cpu", torch.bfloat16, False, False),  # lessons run on the CPU on a Mac, and say why
}


def test_every_profile_has_an_expectation() -> None:
    assert set(EXPECTED) == set(PROFILES)


def test_device_and_dtype_decisions(any_device: Profile) -> None:
    kind, dtype, scaling, native = EXPECTED[any_device.key]
    dev = hardware.pick_device()
    assert dev.type == kind
    assert hardware.autocast_dtype() == dtype
    assert hardware.autocast_dtype(dev) == dtype
    assert hardware.needs_loss_scaling(hardware.autocast_dtype()) is scaling
    assert hardware.bf16_native() is native
    # a T4 says bf16 is supported (emulation): the course decides by compute capability instead
    if any_device.is_cuda:
        assert torch.cuda.is_bf16_supported() is True


@pytest.mark.parametrize("device", [0, "cuda", "cuda:0", torch.device("cuda", 0), None])
def test_cuda_device_given_every_way(cuda_device: Profile, device: object) -> None:
    # finding 1: the integer 0 used to raise TypeError in every notebook's first cell on a GPU
    assert hardware.gpu_memory_gb(device) == pytest.approx(cuda_device.total_memory / 1e9)
    assert hardware.bf16_native(device) is (cuda_device.capability >= (8, 0))


def test_as_device_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="CUDA index"):
        hardware.as_device(-1)
    with pytest.raises(TypeError, match="device"):
        hardware.as_device(True)
    with pytest.raises(TypeError, match="device"):
        hardware.as_device(1.5)  # type: ignore[arg-type]
    assert hardware.as_device(1) == torch.device("cuda", 1)


def test_hardware_summary_on_each_gpu(cuda_device: Profile) -> None:
    line = hardware.hardware_summary()
    assert line.startswith(f"GPU: {cuda_device.name}")
    assert f"compute capability {cuda_device.capability[0]}.{cuda_device.capability[1]}" in line
    if cuda_device.key == "T4":
        assert "float16 + loss scaling" in line
    else:
        assert "native bf16" in line
    assert "TFLOP/s" in line  # all four have a datasheet entry


def test_hardware_summary_on_a_mac_says_cpu_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    simulate(monkeypatch, "MPS")
    line = hardware.hardware_summary()
    assert line.startswith("CPU only") and "MPS" in line and "run on the CPU" in line


def test_track_peak_reads_the_cuda_counters_on_a_gpu(cuda_device: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    from course_utils.peak import track_peak

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 123)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 456)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 7)
    with track_peak() as peak:
        calls.append("work")
    assert calls == ["sync", "reset", "work", "sync"]
    assert (peak.bytes, peak.start_bytes, peak.reserved_bytes) == (123, 7, 456) and "CUDA" in peak.what


def test_simulated_gpu_stops_at_the_first_allocation(cuda_device: Profile) -> None:
    # the simulation answers questions only: an allocation fails, so no test can pretend to compute
    with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
        torch.zeros(1, device="cuda")


# --------------------------------------------------------------------------------------------
# Datasheets: the right peak for each variant
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, key",
    [
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200-NVL"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("Tesla V100-PCIE-32GB", "V100-PCIe"),
        ("Tesla P100-PCIE-16GB", "P100"),
        ("NVIDIA A10G", "A10"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ],
)
def test_datasheet_variants(name: str, key: str) -> None:
    assert hardware.datasheet_key(name) == key
    assert hardware.datasheet_for(name).tensor16_tflops == hardware.DATASHEETS[key].tensor16_tflops


def test_variants_get_their_own_peak() -> None:
    sxm, pcie, nvl = (hardware.DATASHEETS[k] for k in ("H100", "H100-PCIe", "H100-NVL"))
    assert sxm.tensor16_tflops > nvl.tensor16_tflops > pcie.tensor16_tflops
    assert "A10G" in hardware.datasheet_for("NVIDIA A10G").name  # says which card it stands for


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA GeForce RTX 4090 Ti",
        "NVIDIA GeForce RTX 3090 Ti",
        "AMD Instinct MI300X",
        "NVIDIA L40",
        "",
        "NVIDIA GeForce GTX 1080",
    ],
)
def test_unlisted_gpus_get_no_peak(name: str) -> None:
    assert hardware.datasheet_for(name) is None


# --------------------------------------------------------------------------------------------
# Supported library versions
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "package, version, expect",
    [
        ("transformers", "4.57.6", None),
        ("transformers", "5.24.0", None),
        ("transformers", "4.46.3", "older"),
        ("transformers", "5.30.1", "newer"),
        ("torch", "2.13.0+cpu", None),
        ("torch", "2.9.0+cu126", None),
        ("torch", "2.1.2", "older"),
        ("peft", None, "not installed"),
        ("bitsandbytes", "0.49.0", None),
    ],
)
def test_version_status(package: str, version: str | None, expect: str | None) -> None:
    status = about.version_status(package, version)
    assert (status is None) if expect is None else (expect in status)


def test_version_status_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="package"):
        about.version_status("tensorflow", "2.0")
    with pytest.raises(ValueError, match="version"):
        about.version_status("torch", "latest")


def test_package_version_matches_about() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'version = "{about.VERSION}"' in text
    assert about.install_spec().endswith(f"@v{about.VERSION}")


# --------------------------------------------------------------------------------------------
# The generated setup cell: Colab or not, install ok or failing, every device
# --------------------------------------------------------------------------------------------
def test_setup_cell_installs_nothing_off_colab(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pip = FakePip()
    printed = run_cell(monkeypatch, tmp_path, pip, colab=False)
    assert pip.calls == []
    assert "torch" in printed and ("CPU only" in printed or "GPU:" in printed)


@pytest.mark.parametrize("profile", list(PROFILES))
def test_setup_cell_on_every_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, profile: str) -> None:
    simulate(monkeypatch, profile)
    printed = run_cell(monkeypatch, tmp_path, FakePip(), colab=profile == "T4")
    kind = EXPECTED[profile][0]
    assert ("GPU: " if kind == "cuda" else "CPU only") in printed
    if profile == "T4":
        assert "float16 + loss scaling" in printed


def test_setup_cell_on_colab_pins_helpers_and_never_touches_torch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pip = FakePip()
    installed = {"bitsandbytes": None, "accelerate": "1.2.0", "peft": "0.17.1"}
    run_cell(monkeypatch, tmp_path, pip, colab=True, installed=installed)
    helpers, extras = pip.calls
    assert "--no-deps" in helpers and about.install_spec() in helpers
    assert "bitsandbytes>=0.48.2,<=0.50.2" in extras and "accelerate>=1.10.1" in extras  # bitsandbytes capped
    assert not any(part.startswith("peft") for part in extras)  # new enough already
    for call in pip.calls:
        assert not any(part.split(">=")[0] in ("torch", "transformers") for part in call[5:])
        assert "-c" in call  # torch and transformers held at their installed versions
    keep = (tmp_path / ".cache" / "course_utils" / "pip-constraints.txt").read_text()
    assert "torch==" in keep and "transformers==" in keep


def test_setup_cell_source_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pip = FakePip()
    fork = "git+https://github.com/someone/fork@main"
    run_cell(monkeypatch, tmp_path, pip, colab=True, source=fork)
    assert fork in pip.calls[0]


def test_setup_cell_fails_with_one_clear_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pip = FakePip(fail_on="git+https://")
    with pytest.raises(Exception) as info:
        run_cell(monkeypatch, tmp_path, pip, colab=True)
    err = info.value
    assert type(err).__name__ == "SetupFailed"
    (message,) = err._render_traceback_()  # what Jupyter shows: one message, no traceback
    assert "could not install the course helpers" in message and about.SOURCE_ENV in message
    assert "Could not find a version" in message
    assert len(pip.calls) == 2  # the tag, then the main branch; stopped: nothing else was attempted


def test_setup_cell_reports_versions_out_of_range(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    printed = run_cell(monkeypatch, tmp_path, FakePip(), colab=False, installed={"transformers": "4.40.0"})
    # the report reads versions through course_utils (metadata), patched above
    assert "transformers 4.40.0 is older than the course supports" in printed


def test_every_notebook_uses_the_generated_setup_cell() -> None:
    for nb in about.NOTEBOOKS:
        src = (ROOT / "notebooks" / "src" / nb.filename.replace(".ipynb", ".py")).read_text(encoding="utf-8")
        assert "# %% [setup]" in src, nb.filename


@pytest.mark.parametrize("profile", CUDA_PROFILES)
def test_notebook_setup_cells_run_on_simulated_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, profile: str
) -> None:
    simulate(monkeypatch, profile)
    for nb in about.NOTEBOOKS:
        built = build_notebooks.build(nb.filename.replace(".ipynb", ""))
        setup = next(c for c in built.cells if c.cell_type == "code")
        pip = FakePip()
        monkeypatch.setattr(subprocess, "run", pip)
        monkeypatch.setenv("HOME", str(tmp_path))
        out = io.StringIO()
        with redirect_stdout(out):
            exec(compile(setup.source, f"<{nb.filename} setup>", "exec"), {})
        assert f"GPU: {PROFILES[profile].name}" in out.getvalue(), nb.filename
