"""What machine is this? Device, 16-bit support, datasheet speeds and peak memory.

Every notebook asks these questions before it measures anything, so the answers live here,
in one tested place.

bfloat16 detection needs care: on a T4 (compute capability 7.5), ``torch.cuda.is_bf16_supported()``
answers True because bfloat16 can be *emulated*; it has no bfloat16 tensor cores. A lesson that
wants the fast native path must ask for compute capability >= 8.0 (Ampere and newer), which is what
:func:`bf16_native` does.
"""

import os
import platform
from contextlib import contextmanager, suppress
from typing import Iterator

import torch

from course_utils import checks
from course_utils.datasheets import DATASHEETS, Datasheet, bf16_capable, datasheet_key
from course_utils.units import GB


# --------------------------------------------------------------------------------------------
# Device and dtype
# --------------------------------------------------------------------------------------------
#: Why the lessons run on the CPU on an Apple-silicon Mac, even where the MPS GPU is available.
_MPS_REASON = (
    "an Apple MPS GPU is present, but the lessons run on the CPU: bitsandbytes, CUDA's memory counters "
    "and float16 loss scaling are CUDA features, and CPU results match the stored outputs"
)


def pick_device() -> torch.device:
    """The device a lesson should use: the first CUDA GPU if there is one, else the CPU.

    An Apple MPS GPU is deliberately *not* picked (see ``_MPS_REASON``); :func:`hardware_summary`
    says so on such a Mac, so the choice is explicit.
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def as_device(device: torch.device | str | int | None) -> torch.device:
    """``device`` as a torch.device; None means :func:`pick_device`, an int N means ``cuda:N``.

    Bad values raise ValueError/TypeError naming the argument.
    """
    if device is None:
        return pick_device()
    if isinstance(device, bool) or not isinstance(device, (torch.device, str, int)):
        raise TypeError(f"device must be a torch.device, a string, a CUDA index or None, got {type(device).__name__}")
    try:
        return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or a CUDA index >= 0, got {device!r}") from err


def bf16_native(device: torch.device | str | int | None = None) -> bool:
    """True when ``device`` is a CUDA GPU with native bfloat16 tensor cores (compute capability >= 8.0).

    A T4 (7.5) gives False even though ``torch.cuda.is_bf16_supported()`` says True there: that
    answer includes emulation. A CPU gives False: bfloat16 runs there (see :func:`autocast_dtype`),
    but that is not the GPU fast path this question is about.
    """
    dev = as_device(device)
    return dev.type == "cuda" and torch.cuda.is_available() and bf16_capable(torch.cuda.get_device_capability(dev))


def autocast_dtype(device: torch.device | str | int | None = None) -> torch.dtype:
    """The 16-bit dtype a lesson should autocast to on ``device``.

    CUDA Ampere or newer -> bfloat16; older CUDA (T4, V100) -> float16, with loss scaling;
    CPU -> bfloat16 (CPU autocast supports it, and float16 matmuls are very slow on CPUs).
    """
    dev = as_device(device)
    return torch.float16 if dev.type == "cuda" and not bf16_native(dev) else torch.bfloat16


def needs_loss_scaling(dtype: torch.dtype) -> bool:
    """Loss scaling is needed for float16 only: bfloat16 keeps float32's range."""
    return dtype == torch.float16


# --------------------------------------------------------------------------------------------
# Datasheet speeds
# --------------------------------------------------------------------------------------------
def datasheet_for(name: str) -> Datasheet | None:
    """The datasheet entry for a GPU name such as 'Tesla T4' or 'NVIDIA H100 80GB HBM3' (None if not listed)."""
    key = datasheet_key(name)
    if key is not None and "A10G" in name.upper():  # matched to the A10's datasheet
        return DATASHEETS[key]._replace(name="NVIDIA A10G (A10 datasheet; AWS publishes no separate one)")
    return None if key is None else DATASHEETS[key]


def current_datasheet() -> Datasheet | None:
    """The datasheet of the CUDA GPU in use, or None (CPU, or a GPU not in :data:`DATASHEETS`)."""
    return datasheet_for(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None


def gpu_memory_gb(device: torch.device | str | int | None = None) -> float | None:
    """Total memory of a CUDA device in GB (10^9 bytes), or None on a machine without CUDA."""
    dev = as_device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(dev).total_memory / GB


# --------------------------------------------------------------------------------------------
# CPU threads
# --------------------------------------------------------------------------------------------
@contextmanager
def cpu_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` CPU threads for PyTorch's operations (None: leave as is), then restore.

    Timing tiny operations on a CPU shared with other work is fragile: with several threads, every
    operation waits for all of them to be scheduled. One thread gives steadier, comparable numbers.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(before if n is None else checks.integer(n, "num_threads", 1, 1024))
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    """Versions of Python and the course's main packages (those that are installed).

    Read from the installed package metadata, so nothing heavy is imported just to print a version.
    """
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "bitsandbytes", "peft", "accelerate", "numpy", "matplotlib", "ipywidgets"):
        with suppress(PackageNotFoundError):  # not installed: left out
            out[name] = version(name)
    return out


def hardware_summary() -> str:
    """One line describing the compute this notebook runs on and the 16-bit dtype lessons will use."""
    if pick_device().type == "cuda":
        index = torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
        precision = "native bf16: 16-bit steps use bfloat16"
        if not bf16_native(index):
            precision = "no native bf16 (bf16 is only emulated here): 16-bit steps use float16 + loss scaling"
        sheet = datasheet_for(name)
        peak = "no datasheet entry, so no % of peak"
        if sheet is not None:
            peak = f"datasheet {sheet.tensor16_tflops:g} TFLOP/s 16-bit"
        return f"GPU: {name}, {gpu_memory_gb(index):.1f} GB, compute capability {major}.{minor}, {precision}; {peak}"
    why = _MPS_REASON if torch.backends.mps.is_available() else "no CUDA GPU"
    then = "GPU-only steps say they were skipped; 16-bit steps use bfloat16"
    return f"CPU only: {platform.machine()}, {os.cpu_count() or 1} cores, {why}; {then}"


def version_notes(installed: dict[str, str] | None = None) -> list[str]:
    """One line per course library outside the supported range (:data:`course_utils.about.SUPPORTED`)."""
    from course_utils import about

    have = versions() if installed is None else installed
    notes = [about.version_status(name, have.get(name)) for name in about.SUPPORTED]
    return [note for note in notes if note is not None]


def setup_report() -> str:
    """What the setup cell of every notebook prints: one line (hardware, main versions), then any version notes.

    A note is a line only for a library outside the supported range, so a working setup prints one line.
    """
    have = versions()
    # The setup line names these versions (all of them: :func:`versions`)
    named = ", ".join(f"{k} {have[k]}" for k in ("torch", "transformers", "bitsandbytes", "peft") if k in have)
    return "\n".join([f"Ready. {hardware_summary()}. {named}."] + version_notes(have))
