"""What machine is this? Device, 16-bit support, datasheet speeds and peak memory.

Every notebook asks these questions before it measures anything, so the answers live here,
in one tested place.

bfloat16 detection needs care: on a T4 (compute capability 7.5), ``torch.cuda.is_bf16_supported()``
answers True because bfloat16 can be *emulated*; it has no bfloat16 tensor cores. A lesson that
wants the fast native path must ask for compute capability >= 8.0 (Ampere and newer), which is what
:func:`bf16_native` does.
"""
from __future__ import annotations

import logging
import os
import platform
import resource
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import torch


# --------------------------------------------------------------------------------------------
# Device and dtype
# --------------------------------------------------------------------------------------------
def pick_device() -> torch.device:
    """The device a lesson should use: the first CUDA GPU if there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def as_device(device: torch.device | str | None) -> torch.device:
    """``device`` as a torch.device; None means :func:`pick_device`. Bad values raise ValueError/TypeError."""
    if device is None:
        return pick_device()
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as err:
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from err
    if isinstance(device, torch.device):
        return device
    raise TypeError(f"device must be a torch.device, a string or None, got {type(device).__name__}")


_as_device = as_device  # the older private name, kept for callers


def compute_capability(device: torch.device | str | None = None) -> tuple[int, int] | None:
    """CUDA compute capability (major, minor) of ``device``, or None for a non-CUDA device."""
    dev = _as_device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(dev)


def bf16_native(device: torch.device | str | None = None) -> bool:
    """True when ``device`` is a CUDA GPU with native bfloat16 tensor cores (compute capability >= 8.0).

    A T4 (7.5) gives False even though ``torch.cuda.is_bf16_supported()`` says True there: that
    answer includes emulation. A CPU gives False: bfloat16 runs there (see :func:`autocast_dtype`),
    but that is not the GPU fast path this question is about.
    """
    cap = compute_capability(device)
    return cap is not None and cap >= (8, 0)


def autocast_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """The 16-bit dtype a lesson should autocast to on ``device``.

    CUDA Ampere or newer -> bfloat16; older CUDA (T4, V100) -> float16, with loss scaling;
    CPU -> bfloat16 (CPU autocast supports it, and float16 matmuls are very slow on CPUs).
    """
    dev = _as_device(device)
    if dev.type == "cuda":
        return torch.bfloat16 if bf16_native(dev) else torch.float16
    return torch.bfloat16


def needs_loss_scaling(dtype: torch.dtype) -> bool:
    """Loss scaling is needed for float16 only: bfloat16 keeps float32's range."""
    return dtype == torch.float16


# --------------------------------------------------------------------------------------------
# Datasheet speeds
# --------------------------------------------------------------------------------------------
class Datasheet(NamedTuple):
    """Peak dense throughput from NVIDIA's datasheets, in TFLOP/s (no sparsity)."""

    name: str
    fp32_tflops: float
    tensor16_tflops: float  # fp16/bf16 on tensor cores (the T4 has fp16 only)
    memory_gb: float


#: Datasheet figures for the GPUs learners meet most. Keys are matched against the CUDA device name.
DATASHEETS: dict[str, Datasheet] = {
    "T4": Datasheet("NVIDIA T4", 8.1, 65.0, 16.0),
    "L4": Datasheet("NVIDIA L4", 30.3, 121.0, 24.0),
    "A100": Datasheet("NVIDIA A100 SXM", 19.5, 312.0, 80.0),
    "H100": Datasheet("NVIDIA H100 SXM", 67.0, 989.0, 80.0),
    "H200": Datasheet("NVIDIA H200 SXM", 67.0, 989.0, 141.0),
}


def datasheet_for(name: str) -> Datasheet | None:
    """The datasheet entry whose key appears in a GPU name such as 'Tesla T4' or 'NVIDIA H100 80GB HBM3'."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    tokens = name.upper().replace("-", " ").replace("_", " ").split()
    for key, sheet in DATASHEETS.items():
        if key in tokens:  # exact token: 'L4' matches 'NVIDIA L4' but not 'NVIDIA L40S'
            return sheet
    return None


def current_datasheet() -> Datasheet | None:
    """The datasheet of the CUDA GPU in use, or None (CPU, or a GPU not in :data:`DATASHEETS`)."""
    if not torch.cuda.is_available():
        return None
    return datasheet_for(torch.cuda.get_device_name(0))


def gpu_memory_gb(device: torch.device | str | None = None) -> float | None:
    """Total memory of a CUDA device in GB (10^9 bytes), or None on a machine without CUDA."""
    dev = _as_device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(dev).total_memory / 1e9


# --------------------------------------------------------------------------------------------
# Peak memory
# --------------------------------------------------------------------------------------------
@dataclass
class PeakMemory:
    """A peak-memory reading, with what it measured.

    ``bytes`` is the number; ``what`` says which counter it came from, because a CUDA allocator peak and
    a CPU process's resident-set peak are different things and should never be compared silently.
    """

    bytes: int = 0
    reserved_bytes: int | None = None
    what: str = ""

    @property
    def gb(self) -> float:
        """The peak in GB (10^9 bytes)."""
        return self.bytes / 1e9


def process_peak_rss_bytes() -> int:
    """This process's peak resident memory since it started (Linux reports ru_maxrss in KiB, macOS in bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


@contextmanager
def track_peak_memory(device: torch.device | str | None = None) -> Iterator[PeakMemory]:
    """Measure the peak memory of the work inside a ``with`` block.

    On CUDA: the allocator's peak of allocated (and reserved) bytes during the block, counted from a
    fresh reset. On CPU there is no resettable counter, so the reading is the process's peak resident
    memory (a high-water mark since the process started): exact for the block only when the block runs
    in a fresh process, an upper bound otherwise. ``what`` says which you got.
    """
    dev = _as_device(device)
    reading = PeakMemory()
    if dev.type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        yield reading
        torch.cuda.synchronize(dev)
        reading.bytes = torch.cuda.max_memory_allocated(dev)
        reading.reserved_bytes = torch.cuda.max_memory_reserved(dev)
        reading.what = "CUDA peak allocated by PyTorch during the block (reserved shown separately)"
    else:
        yield reading
        reading.bytes = process_peak_rss_bytes()
        reading.what = "CPU process peak resident memory since the process started (no CUDA here)"


# --------------------------------------------------------------------------------------------
# Optional packages
# --------------------------------------------------------------------------------------------
def import_bitsandbytes():
    """Import bitsandbytes quietly, or return None when it is not installed or cannot load.

    On CPUs with AVX-512-bf16, bitsandbytes logs a warning on import about an optional kernel package
    ("kernels") that would download from the Hugging Face Hub. It is harmless, but it lands on stderr,
    which nbval compares, so the logger is silenced below warnings-that-matter first.
    """
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    try:
        import bitsandbytes  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - missing, or a build without a backend for this machine
        return None
    return bitsandbytes


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    """Versions of Python and the course's main packages (those that are installed).

    Read from the installed package metadata, so nothing heavy is imported just to print a version.
    """
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "bitsandbytes", "peft", "accelerate", "numpy", "matplotlib", "ipywidgets"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def hardware_summary() -> str:
    """One line describing the compute this notebook runs on and the 16-bit dtype lessons will use."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        mem = gpu_memory_gb(0) or 0.0
        native = "native bf16" if bf16_native(0) else "no native bf16 (T4-class): lessons use float16 + loss scaling"
        return f"GPU: {name}, {mem:.1f} GB, compute capability {major}.{minor}, {native}"
    cores = os.cpu_count() or 1
    return (f"CPU only: {platform.machine()}, {cores} cores, no CUDA GPU; "
            "GPU-only steps will say they were skipped; lessons autocast to bfloat16")


def setup_report() -> str:
    """The text the setup cell of every notebook prints: versions, then the hardware line."""
    vers = ", ".join(f"{k} {v}" for k, v in versions().items())
    return f"{vers}\n{hardware_summary()}"
