"""GPU datasheets: peak throughput and memory of the GPUs learners meet most, by short name.

No torch here, so the command line can budget by GPU name (``--gpu T4,L4``) instantly;
:mod:`course_utils.hardware` uses the same table for the GPU it finds.

Two sizes per GPU, one meaning each, for every card alike:

* **the card's memory** (:attr:`Datasheet.total_gb`): what the driver exposes to a process where it has been
  measured (Colab's T4: 15,095 MiB = 15.83 GB of its 16 GB), the datasheet's figure otherwise;
* **usable** (:attr:`Datasheet.usable_gb`, :func:`usable_gb`): what PyTorch's allocator can hand out, on the
  counter the step estimates predict: the card's memory less the CUDA context (:data:`CUDA_CONTEXT_GB`), which
  lives outside that counter. A T4: 15.83 - 0.5 = 15.33 GB; an L4: 23.5 GB; an A100 40 GB: 39.5 GB; an A100 or
  H100: 79.5 GB. A memory size someone types for a GPU (``budget_gb=24``) is the card's memory: usable 23.5 GB.

A whole-step estimate (activations included) is judged against *usable* by
:func:`course_utils.memory.step_verdict` ("fits" up to 90 % of it, "tight" up to 100 %); the weights-only table
of :mod:`course_utils.memory` uses its own "70 % line" of the card's memory instead.
"""

from typing import NamedTuple

from course_utils import checks

#: What the CUDA context takes on a GPU (driver state, kernel images, cuBLAS workspace), outside PyTorch's
#: allocator counter: about 0.5 GB. Usable memory is the card's memory less this, on every card.
CUDA_CONTEXT_GB = 0.5
#: What ``torch.cuda.get_device_properties(0).total_memory`` reports on Colab's T4: 15,095 MiB = 15.83 GB.
T4_EXPOSED_GB = 15_095 * 2**20 / 1e9


#: The compute capability from which a GPU has bfloat16 tensor cores (Ampere); older cards emulate bfloat16.
BF16_CAPABILITY = (8, 0)


def bf16_capable(capability: tuple[int, int]) -> bool:
    """The course's one 16-bit rule: a GPU of this compute capability runs bfloat16 natively (8.0 or newer);
    an older one (a T4, 7.5) uses float16 with loss scaling instead."""
    return tuple(capability) >= BF16_CAPABILITY


class Datasheet(NamedTuple):
    """Peak dense throughput from NVIDIA's datasheets and whitepapers, in TFLOP/s (no sparsity), and memory in GB.

    ``exposed_gb``: the memory the driver exposes to a process (``total_memory``), where measured; None otherwise.
    """

    name: str
    fp32_tflops: float
    tensor16_tflops: float  # 16-bit matrix peak: tensor cores (fp16/bf16, FP32 accumulate) where the GPU has them
    memory_gb: float
    exposed_gb: float | None = None
    capability: tuple[int, int] = (0, 0)  # CUDA compute capability: (7, 5) for a T4, (8, 0) for an A100

    @property
    def total_gb(self) -> float:
        """The card's memory in GB: the exposed memory where measured, the datasheet's figure otherwise."""
        return self.memory_gb if self.exposed_gb is None else self.exposed_gb

    @property
    def usable_gb(self) -> float:
        """What PyTorch's allocator can hand out on this card, in GB: :attr:`total_gb` less the CUDA context."""
        return usable_gb(self.total_gb)


def usable_gb(memory_gb: float, name: str = "memory_gb") -> float:
    """What PyTorch's allocator can hand out on a GPU of ``memory_gb`` GB: that less :data:`CUDA_CONTEXT_GB`.

    ``memory_gb`` is the card's memory (the driver's ``total_memory``, or a size someone typed for the GPU);
    ValueError, naming ``name``, unless it is more than the context.
    """
    return checks.number(memory_gb, name, CUDA_CONTEXT_GB, low_open=True) - CUDA_CONTEXT_GB


#: Datasheet figures for the GPUs learners meet most, by short key. Consumer GeForce cards are listed at their
#: FP32-accumulate tensor rate (what PyTorch's 16-bit matmuls use), half their FP16-accumulate headline figure.
#: The P100 has no tensor cores: its 16-bit figure is plain FP16 at twice the FP32 rate.
DATASHEETS: dict[str, Datasheet] = {
    "T4": Datasheet("NVIDIA T4", 8.1, 65.0, 16.0, T4_EXPOSED_GB, capability=(7, 5)),
    "P100": Datasheet("NVIDIA P100 PCIe", 9.3, 18.7, 16.0, capability=(6, 0)),
    "V100": Datasheet("NVIDIA V100 SXM2", 15.7, 125.0, 16.0, capability=(7, 0)),
    "V100-PCIe": Datasheet("NVIDIA V100 PCIe", 14.0, 112.0, 16.0, capability=(7, 0)),
    "L4": Datasheet("NVIDIA L4", 30.3, 121.0, 24.0, capability=(8, 9)),
    "A10": Datasheet("NVIDIA A10", 31.2, 125.0, 24.0, capability=(8, 6)),
    "L40S": Datasheet("NVIDIA L40S", 91.6, 362.0, 48.0, capability=(8, 9)),
    "A100": Datasheet("NVIDIA A100 SXM", 19.5, 312.0, 80.0, capability=(8, 0)),
    "A100-40GB": Datasheet("NVIDIA A100 40GB", 19.5, 312.0, 40.0, capability=(8, 0)),
    "H100": Datasheet("NVIDIA H100 SXM", 67.0, 989.0, 80.0, capability=(9, 0)),
    "H100-PCIe": Datasheet("NVIDIA H100 PCIe", 51.0, 756.0, 80.0, capability=(9, 0)),
    "H100-NVL": Datasheet("NVIDIA H100 NVL", 60.0, 835.0, 94.0, capability=(9, 0)),
    "H200": Datasheet("NVIDIA H200 SXM", 67.0, 989.0, 141.0, capability=(9, 0)),
    "H200-NVL": Datasheet("NVIDIA H200 NVL", 60.0, 835.0, 141.0, capability=(9, 0)),
    "RTX-3080": Datasheet("NVIDIA GeForce RTX 3080", 29.8, 59.5, 10.0, capability=(8, 6)),
    "RTX-3090": Datasheet("NVIDIA GeForce RTX 3090", 35.6, 71.0, 24.0, capability=(8, 6)),
    "RTX-4080": Datasheet("NVIDIA GeForce RTX 4080", 48.7, 97.5, 16.0, capability=(8, 9)),
    "RTX-4090": Datasheet("NVIDIA GeForce RTX 4090", 82.6, 165.2, 24.0, capability=(8, 9)),
}


def datasheet_key(name: str) -> str | None:
    """The :data:`DATASHEETS` key for a CUDA device name such as 'Tesla T4' or 'NVIDIA H100 PCIe', or None.

    Names are split into tokens, so 'L4' matches 'NVIDIA L4' but not 'NVIDIA L40S', and 'RTX 3090' does
    not match 'RTX 3090 Ti' (a different card: None). A key matches when every part of it ('H100-PCIe':
    H100 and PCIe) is a token of the name; the most specific match wins, so 'NVIDIA H100 PCIe' is the
    H100-PCIe and 'NVIDIA H100 80GB HBM3' the H100. An A10G (AWS) has no NVIDIA datasheet of its own: it is
    matched to the A10's. A MIG slice ('NVIDIA A100-SXM4-40GB MIG 1g.5gb') has a fraction of the card's compute
    and memory: None, never the whole card's figures.
    """
    checks.instance(name, "name", str, "a string")
    tokens = {"A10" if t == "A10G" else t for t in name.upper().replace("-", " ").replace("_", " ").split()}
    if tokens & {"TI", "SUPER", "MIG"}:
        return None  # Ti/SUPER cards have their own figures, not listed here; a MIG slice is a share of the card
    matches = [key for key in DATASHEETS if set(key.upper().split("-")) <= tokens]
    return max(matches, key=lambda key: key.count("-"), default=None)


def lookup(name: str) -> Datasheet:
    """The datasheet for a short key or a device name ('T4', 'a100-40gb', 'NVIDIA L4').

    ValueError naming the known keys for a GPU that is not in the table."""
    key = datasheet_key(name)  # a short key is a device name whose tokens are the key's parts
    if key is None:
        raise ValueError(f"gpu {name!r} is not in the datasheet table (known: {', '.join(DATASHEETS)})")
    return DATASHEETS[key]
