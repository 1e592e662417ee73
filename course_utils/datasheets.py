"""GPU datasheets: peak throughput and memory of the GPUs learners meet most, by short name.

No torch here, so the command line can budget by GPU name (``--gpu T4,L4``) instantly;
:mod:`course_utils.hardware` uses the same table for the GPU it finds.
"""
from __future__ import annotations

from typing import NamedTuple


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


def lookup(name: str) -> Datasheet:
    """The datasheet for a short key or a device name ('T4', 'a100-40gb', 'NVIDIA L4').

    ValueError naming the known keys for a GPU that is not in the table."""
    if not isinstance(name, str):
        raise TypeError(f"gpu must be a name such as 'T4', got {type(name).__name__}")
    for key in DATASHEETS:
        if key.upper() == name.strip().upper():
            return DATASHEETS[key]
    key = datasheet_key(name)
    if key is None:
        raise ValueError(f"gpu {name!r} is not in the datasheet table (known: {', '.join(DATASHEETS)})")
    return DATASHEETS[key]
