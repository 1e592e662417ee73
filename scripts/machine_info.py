"""This machine in a few fields (CPU model, cores, bfloat16 instructions, OS, torch), as ``notebooks/cell_times.json``
records it next to the cell times of a notebook run, and in words for the README and the instructor guide.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path


def cpu_info(path: Path = Path("/proc/cpuinfo")) -> tuple[str, set[str] | None]:
    """This CPU's model name and feature flags from ``path`` (Linux); the platform's name and None elsewhere."""
    model = platform.processor() or platform.machine()
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return model, None
    fields: dict[str, str] = {}
    for line in lines:  # the first processor's fields
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags", fields.get("Features"))
    return fields.get("model name") or model, None if flags is None else set(flags.split())


def machine_record() -> dict[str, object]:
    """This machine, as ``notebooks/cell_times.json`` records it next to the cell times of an ``--execute`` run.

    ``avx512_bf16`` and ``amx_bf16`` (bfloat16 instructions, and Intel's bfloat16 matrix units) decide how fast
    the 16-bit cells run on a CPU; None where the flags cannot be read (not Linux). The build runs the
    notebooks on the CPU (it hides any GPU).
    """
    model, flags = cpu_info()
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "avx512_bf16": None if flags is None else "avx512_bf16" in flags,
        "amx_bf16": None if flags is None else "amx_bf16" in flags,
        "os": f"{platform.system()} {platform.release()}",
        "torch": torch_version,
    }


def describe_machine(machine: dict | str) -> str:
    """A :func:`machine_record` in words; a record written before the build kept one (a plain string) as it is."""
    if isinstance(machine, str):
        return machine
    if machine["avx512_bf16"] is None:
        units = "bfloat16 flags unknown"
    else:
        units = ", ".join(
            ("" if machine[key] else "no ") + name
            for key, name in (("avx512_bf16", "AVX-512-bf16"), ("amx_bf16", "AMX"))
        )
    return f"{machine['cores']}-core {machine['cpu']} ({units}), {machine['os']}, torch {machine['torch']}, CPU only"
