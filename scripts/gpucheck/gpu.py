"""The GPU in hand: whether there is one (decided before any heavy import), what it is, and clearing its allocator."""

from __future__ import annotations

import gc
import os
import warnings
from typing import Any


def gpus_hidden(environ: dict[str, str] | None = None) -> bool:
    """True when CUDA_VISIBLE_DEVICES hides every GPU ("" or "-1"): no CUDA, known without importing torch."""
    env = os.environ if environ is None else environ
    value = env.get("CUDA_VISIBLE_DEVICES")
    return value is not None and value.split(",")[0].strip() in ("", "-1")


def cuda_torch() -> tuple[Any | None, str]:
    """(torch, "") when torch is installed and sees a CUDA GPU; (None, why not) otherwise.

    Decided before any heavy import (transformers, peft, bitsandbytes), and without importing torch at all
    when CUDA_VISIBLE_DEVICES hides every GPU.
    """
    if gpus_hidden():
        return None, f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} hides every GPU"
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if torch.cuda.is_available():
            return torch, ""
    return None, f"torch {torch.__version__} sees no CUDA GPU: torch.cuda.is_available() is False"


def machine_summary(torch: Any) -> dict[str, Any]:
    """GPU name, compute capability, memory (GB), torch and CUDA versions."""
    cap = torch.cuda.get_device_capability(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "capability": f"{cap[0]}.{cap[1]}",
        "memory_gb": torch.cuda.get_device_properties(0).total_memory / 1e9,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def free_memory(torch: Any) -> None:
    """Drop what the last section left behind, so the next one measures from a clean allocator."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def gb(n_bytes: float | None) -> float | None:
    """Bytes in GB (10^9), None stays None."""
    return None if n_bytes is None else n_bytes / 1e9
