"""One peak-memory tracker for any piece of work, on any device; it always says which counter it read.

* **CUDA**: PyTorch's allocator counters, ``torch.cuda.reset_peak_memory_stats`` at the start of the work and
  ``torch.cuda.max_memory_allocated`` (and ``..._reserved``) at its end: the bytes tensors held at their peak.
  The CUDA context itself (a few hundred MB) is outside this counter.
* **CPU**: there is no allocator counter, so the reading is the process's resident-memory high-water mark
  (Linux ``VmHWM``), reset at the start of the work through ``/proc/self/clear_refs``. Where no reset is
  possible (macOS) it is the peak since the process started, and the tracker says so: ``what`` names it, and
  :func:`reset_rss_high_water_mark` warns (:data:`NO_RESET`) when it cannot reset.

The reading also carries the work's wall time; :func:`memory_in_use` reads the same counter once, now.
"""

import resource
import sys
import time
import warnings
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from course_utils.hardware import as_device
from course_utils.units import GB

#: Where Linux keeps this process's memory counters (macOS has none).
PROC = Path("/proc/self")
#: What the CPU's peak is where the high-water mark cannot be reset (macOS: no ``/proc``).
NO_RESET = "the peak resident memory since this process started: this system cannot reset its high-water mark"
#: What the peak of :func:`track_peak` is, on a GPU, and on a CPU that resets its high-water mark.
_CUDA_WHAT = "CUDA: peak bytes of PyTorch tensors during the work (max_memory_allocated; reserved shown apart)"
_CPU_WHAT = "CPU: peak resident memory of this process during the work (its high-water mark, reset at its start)"


@dataclass
class WorkPeak:
    """The peak memory of one piece of work, and what the number is.

    ``bytes`` is the peak; ``start_bytes`` what was already in use when the work began (so
    ``bytes - start_bytes`` is what the work added at its worst moment); ``reserved_bytes`` is the CUDA
    caching allocator's reserved peak (None on CPU); ``what`` names the counter; ``seconds`` is the work's wall
    time.
    """

    bytes: int = 0
    start_bytes: int = 0
    reserved_bytes: int | None = None
    what: str = ""
    seconds: float = 0.0

    @property
    def gb(self) -> float:
        """The peak in GB (10^9 bytes)."""
        return self.bytes / GB


def _status_bytes(key: str) -> int:
    """A memory line of /proc/self/status in bytes; where there is none (macOS), the process's peak since it started
    (``ru_maxrss``, which Linux reports in KiB and macOS in bytes)."""
    with suppress(OSError):
        for line in (PROC / "status").read_text(encoding="ascii").splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def reset_rss_high_water_mark() -> bool:
    """Reset this process's resident-memory high-water mark (Linux >= 4.0, where /proc/self/status has the
    ``VmHWM`` line it resets). True if it worked; where it cannot (macOS), a warning says that every reading of
    :func:`rss_high_water_mark_bytes` is :data:`NO_RESET`, and False."""
    reset = False
    with suppress(OSError):
        (PROC / "clear_refs").write_text("5", encoding="ascii")
        reset = "VmHWM:" in (PROC / "status").read_text(encoding="ascii")
    if not reset:
        warnings.warn(f"the peak memory was not reset: it reads {NO_RESET}", RuntimeWarning, stacklevel=2)
    return reset


def rss_high_water_mark_bytes() -> int:
    """Peak resident memory since the last reset (Linux VmHWM), else since the process started (see
    :func:`reset_rss_high_water_mark`)."""
    return _status_bytes("VmHWM")


def checked_device(device: Any = None) -> Any:
    """``device`` as a torch.device (see :func:`course_utils.hardware.as_device`); ValueError for CUDA where
    there is none."""
    dev = as_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is 'cuda' but torch.cuda.is_available() is False on this machine")
    return dev


def memory_in_use(device: Any) -> int:
    """What the peak counter of ``device`` (a torch.device) reads now: PyTorch's allocated bytes on CUDA, once the
    queued work is done; this process's resident memory on a CPU (Linux /proc; elsewhere the peak so far, an upper
    bound)."""
    if device.type != "cuda":
        return _status_bytes("VmRSS")
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


@contextmanager
def track_peak(device: Any = None) -> Iterator[WorkPeak]:
    """Measure the peak memory (and the wall time) of the work inside a ``with`` block, on any device.

    CUDA: ``reset_peak_memory_stats`` at the start, ``max_memory_allocated`` (and ``..._reserved``) at the
    end - the bytes PyTorch's tensors held at their peak (the CUDA context itself, a few hundred MB, is
    outside this counter). CPU: the process's resident-memory high-water mark, reset at the start of the
    block when the OS allows it (Linux), otherwise the peak since the process started. Resident memory
    includes the Python interpreter and its libraries, and the allocator's free-but-kept pages: run the
    work in a fresh process with ``MALLOC_MMAP_THRESHOLD_=65536`` (what :func:`measure_training_step`
    does) for a number that tracks live tensors. ``seconds`` ends once the GPU's queued work is done.
    """
    dev = checked_device(device)
    reading = WorkPeak(start_bytes=memory_in_use(dev))
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        reading.what = _CUDA_WHAT
    else:
        reading.what = _CPU_WHAT if reset_rss_high_water_mark() else f"CPU: {NO_RESET}"
    start = time.perf_counter()
    yield reading
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        reading.bytes = torch.cuda.max_memory_allocated(dev)
        reading.reserved_bytes = torch.cuda.max_memory_reserved(dev)
    else:
        reading.bytes = rss_high_water_mark_bytes()
    reading.seconds = time.perf_counter() - start


def measure_peak(fn: Callable[[], Any], device: Any = None) -> tuple[Any, WorkPeak]:
    """Run ``fn()`` and return ``(its result, the peak memory of the call)``; see :func:`track_peak`."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with track_peak(device) as peak:
        result = fn()
    return result, peak
