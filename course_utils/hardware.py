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
def mps_available() -> bool:
    """True on an Apple-silicon Mac whose torch build can use the Metal (MPS) GPU."""
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


#: Why the lessons run on the CPU on an Apple-silicon Mac, even where the MPS GPU is available.
MPS_REASON = ("an Apple MPS GPU is present, but the lessons run on the CPU: bitsandbytes, CUDA's memory counters "
              "and float16 loss scaling are CUDA features, and CPU results match the stored outputs")


def pick_device() -> torch.device:
    """The device a lesson should use: the first CUDA GPU if there is one, else the CPU.

    An Apple MPS GPU is deliberately *not* picked (see :data:`MPS_REASON`); :func:`hardware_summary`
    says so on such a Mac, so the choice is explicit.
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def as_device(device: torch.device | str | int | None) -> torch.device:
    """``device`` as a torch.device; None means :func:`pick_device`, an int N means ``cuda:N``.

    Bad values raise ValueError/TypeError naming the argument.
    """
    if device is None:
        return pick_device()
    if isinstance(device, bool):
        raise TypeError("device must be a torch.device, a string, a CUDA index or None, got bool")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device as an int is a CUDA index and must be >= 0, got {device}")
        return torch.device("cuda", device)
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as err:
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from err
    if isinstance(device, torch.device):
        return device
    raise TypeError(f"device must be a torch.device, a string, a CUDA index or None, got {type(device).__name__}")


def compute_capability(device: torch.device | str | int | None = None) -> tuple[int, int] | None:
    """CUDA compute capability (major, minor) of ``device``, or None for a non-CUDA device."""
    dev = as_device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(dev)


def bf16_native(device: torch.device | str | int | None = None) -> bool:
    """True when ``device`` is a CUDA GPU with native bfloat16 tensor cores (compute capability >= 8.0).

    A T4 (7.5) gives False even though ``torch.cuda.is_bf16_supported()`` says True there: that
    answer includes emulation. A CPU gives False: bfloat16 runs there (see :func:`autocast_dtype`),
    but that is not the GPU fast path this question is about.
    """
    cap = compute_capability(device)
    return cap is not None and cap >= (8, 0)


def autocast_dtype(device: torch.device | str | int | None = None) -> torch.dtype:
    """The 16-bit dtype a lesson should autocast to on ``device``.

    CUDA Ampere or newer -> bfloat16; older CUDA (T4, V100) -> float16, with loss scaling;
    CPU -> bfloat16 (CPU autocast supports it, and float16 matmuls are very slow on CPUs).
    """
    dev = as_device(device)
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
    """Peak dense throughput from NVIDIA's datasheets and whitepapers, in TFLOP/s (no sparsity)."""

    name: str
    fp32_tflops: float
    tensor16_tflops: float  # 16-bit matrix peak: tensor cores (fp16/bf16, FP32 accumulate) where the GPU has them
    memory_gb: float


#: Datasheet figures for the GPUs learners meet most, by short key. Consumer GeForce cards are listed at their
#: FP32-accumulate tensor rate (what PyTorch's 16-bit matmuls use), half their FP16-accumulate headline figure.
#: The P100 has no tensor cores: its 16-bit figure is plain FP16 at twice the FP32 rate.
DATASHEETS: dict[str, Datasheet] = {
    "T4": Datasheet("NVIDIA T4", 8.1, 65.0, 16.0),
    "P100": Datasheet("NVIDIA P100 PCIe", 9.3, 18.7, 16.0),
    "V100": Datasheet("NVIDIA V100 SXM2", 15.7, 125.0, 16.0),
    "V100-PCIe": Datasheet("NVIDIA V100 PCIe", 14.0, 112.0, 16.0),
    "L4": Datasheet("NVIDIA L4", 30.3, 121.0, 24.0),
    "A10": Datasheet("NVIDIA A10", 31.2, 125.0, 24.0),
    "L40S": Datasheet("NVIDIA L40S", 91.6, 362.0, 48.0),
    "A100": Datasheet("NVIDIA A100 SXM", 19.5, 312.0, 80.0),
    "A100-40GB": Datasheet("NVIDIA A100 40GB", 19.5, 312.0, 40.0),
    "H100": Datasheet("NVIDIA H100 SXM", 67.0, 989.0, 80.0),
    "H100-PCIe": Datasheet("NVIDIA H100 PCIe", 51.0, 756.0, 80.0),
    "H100-NVL": Datasheet("NVIDIA H100 NVL", 60.0, 835.0, 94.0),
    "H200": Datasheet("NVIDIA H200 SXM", 67.0, 989.0, 141.0),
    "H200-NVL": Datasheet("NVIDIA H200 NVL", 60.0, 835.0, 141.0),
    "RTX-3080": Datasheet("NVIDIA GeForce RTX 3080", 29.8, 59.5, 10.0),
    "RTX-3090": Datasheet("NVIDIA GeForce RTX 3090", 35.6, 71.0, 24.0),
    "RTX-4080": Datasheet("NVIDIA GeForce RTX 4080", 48.7, 97.5, 16.0),
    "RTX-4090": Datasheet("NVIDIA GeForce RTX 4090", 82.6, 165.2, 24.0),
}

#: How a CUDA device name maps to a key above: every token of the pattern must appear in the name, first
#: match wins, so variants come before the plain model. An A10G (AWS) has no NVIDIA datasheet of its own:
#: it is matched to the A10's, and the name says so.
_NAME_PATTERNS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("H100", "NVL"), "H100-NVL"), (("H100", "PCIE"), "H100-PCIe"), (("H100",), "H100"),
    (("H200", "NVL"), "H200-NVL"), (("H200",), "H200"),
    (("A100", "40GB"), "A100-40GB"), (("A100",), "A100"),
    (("V100", "PCIE"), "V100-PCIe"), (("V100",), "V100"),
    (("P100",), "P100"), (("T4",), "T4"), (("L4",), "L4"), (("L40S",), "L40S"),
    (("A10",), "A10"), (("A10G",), "A10"),
    (("RTX", "3080"), "RTX-3080"), (("RTX", "3090"), "RTX-3090"),
    (("RTX", "4080"), "RTX-4080"), (("RTX", "4090"), "RTX-4090"),
)


def datasheet_key(name: str) -> str | None:
    """The :data:`DATASHEETS` key for a CUDA device name such as 'Tesla T4' or 'NVIDIA H100 PCIe', or None.

    Names are split into tokens, so 'L4' matches 'NVIDIA L4' but not 'NVIDIA L40S', and 'RTX 3090' does
    not match 'RTX 3090 Ti' (a different card: None).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    tokens = set(name.upper().replace("-", " ").replace("_", " ").split())
    if "TI" in tokens or "SUPER" in tokens:
        return None  # Ti/SUPER cards have their own figures, not listed here
    for pattern, key in _NAME_PATTERNS:
        if all(part in tokens for part in pattern):
            return key
    return None


def datasheet_for(name: str) -> Datasheet | None:
    """The datasheet entry for a GPU name such as 'Tesla T4' or 'NVIDIA H100 80GB HBM3' (None if not listed)."""
    key = datasheet_key(name)
    if key is None:
        return None
    sheet = DATASHEETS[key]
    if "A10G" in name.upper():
        return sheet._replace(name="NVIDIA A10G (A10 datasheet; AWS publishes no separate one)")
    return sheet


def current_datasheet() -> Datasheet | None:
    """The datasheet of the CUDA GPU in use, or None (CPU, or a GPU not in :data:`DATASHEETS`)."""
    if not torch.cuda.is_available():
        return None
    return datasheet_for(torch.cuda.get_device_name(0))


def gpu_memory_gb(device: torch.device | str | int | None = None) -> float | None:
    """Total memory of a CUDA device in GB (10^9 bytes), or None on a machine without CUDA."""
    dev = as_device(device)
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
    dev = as_device(device)
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
    dev = pick_device()
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
        mem = gpu_memory_gb(index) or 0.0
        if bf16_native(index):
            precision = "native bf16: lessons autocast to bfloat16"
        else:
            precision = "no native bf16 (bf16 is only emulated here): lessons use float16 + loss scaling"
        sheet = datasheet_for(name)
        peak = (f"datasheet {sheet.tensor16_tflops:g} TFLOP/s 16-bit" if sheet is not None
                else "no datasheet entry, so no % of peak")
        return f"GPU: {name}, {mem:.1f} GB, compute capability {major}.{minor}, {precision}; {peak}"
    cores = os.cpu_count() or 1
    where = f"{MPS_REASON}; " if mps_available() else "no CUDA GPU; "
    return (f"CPU only: {platform.machine()}, {cores} cores, {where}"
            "GPU-only steps will say they were skipped; lessons autocast to bfloat16")


def version_notes(installed: dict[str, str] | None = None) -> list[str]:
    """One line per course library outside the supported range (:data:`course_utils.about.SUPPORTED`)."""
    from course_utils import about  # noqa: PLC0415 - about is tiny; imported here to keep this module's top light

    have = versions() if installed is None else installed
    notes = [about.version_status(name, have.get(name)) for name in about.SUPPORTED]
    return [note for note in notes if note is not None]


def setup_report() -> str:
    """The text the setup cell of every notebook prints: versions, the hardware line, then any version notes."""
    have = versions()
    lines = [", ".join(f"{k} {v}" for k, v in have.items()), hardware_summary()]
    return "\n".join(lines + version_notes(have))
