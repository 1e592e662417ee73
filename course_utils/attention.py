"""Which attention kernel a training step gets, and so whether it keeps the s x s attention scores.

``F.scaled_dot_product_attention`` (SDPA), which transformers uses by default, picks one of several backends at
every call. Three are fused, and none of them keeps an s x s tensor for backward:

* **flash** (FlashAttention-2): 16-bit inputs only, on Ampere-or-newer cards (compute capability 8.0+), head size
  up to 256, no explicit mask. It takes grouped-query attention (fewer K/V heads) as it is.
* **efficient** (memory-efficient attention): float32 or float16 from compute capability 5.0, bfloat16 from
  8.0, with or without a mask, but (up to torch 2.13, whose own documentation says so) not grouped-query
  attention: "GQA ... works only for Flash_attention and math kernel on CUDA tensor".
* **cudnn** (cuDNN's fused attention): 16-bit inputs, head size a multiple of 8 up to 128 (256 on an sm90 card),
  grouped-query heads and masks alike. It saves what flash saves. PyTorch (2.10 and newer, with cuDNN 9.15.1 or
  newer, as its CUDA wheels ship) tries it **first** on the data-centre Hopper and Blackwell chips (compute
  capability 9.0 and 10.0: H100, H200, B200), unless ``TORCH_CUDNN_SDPA_DEPRIORITIZED`` is set; an H200 with
  torch 2.11 ran it for every 16-bit step (``docs/gpu/h200.md``).

The fallback, **math**, is plain PyTorch: it keeps the softmax of the scores, ``batch x heads x seq x seq``
numbers per layer, in float32 even for 16-bit inputs ("all intermediates are kept in torch.float"), plus float32
copies of Q, K and V (K and V expanded to every query head). At 128 tokens that is a few percent of a step; at
1,024 it can be gigabytes.

So the same model falls back to math on a T4 (compute capability 7.5: no flash; SmolLM2 and Qwen use
grouped-query attention: no memory-efficient kernel), and on any card for float32 attention with grouped-query
heads. On a CPU, PyTorch's flash kernel takes every dtype and head layout the course uses. Both rules are
written out here, so that an estimate needs no torch; tests/test_attention.py checks the CPU rule against
PyTorch's own choice (``torch._fused_sdp_choice``), which cannot be asked about a GPU without one, and
``scripts/gpu_check.py`` records the backend that really ran on a card.
"""

import os
from dataclasses import dataclass

from course_utils.datasheets import bf16_capable

#: Every backend a step estimate can assume; "auto" asks :func:`choose_backend`.
BACKENDS = ("flash", "efficient", "cudnn", "math")
#: Compute capability from which flash attention runs (Ampere).
AMPERE = (8, 0)
#: Compute capability from which the memory-efficient kernel runs.
EFFICIENT_MIN_CAPABILITY = (5, 0)
#: The largest head size the fused kernels take.
MAX_FUSED_HEAD_DIM = 256
#: The capability a CUDA estimate assumes when no card is named and none is present: an Ampere-or-newer one.
ASSUMED_CAPABILITY = AMPERE
#: The newest torch whose documentation this module's CUDA rules were read from.
RULES_TORCH = "2.13"
#: The compute capabilities on which PyTorch tries cuDNN attention before flash (sm90 and sm100).
CUDNN_FIRST = ((9, 0), (10, 0))
#: The environment variable that puts cuDNN attention back behind flash.
CUDNN_DEPRIORITIZED = "TORCH_CUDNN_SDPA_DEPRIORITIZED"


@dataclass(frozen=True)
class AttentionChoice:
    """The SDPA backend a step gets (one of :data:`BACKENDS`) and why, in a few words."""

    backend: str
    reason: str

    @property
    def keeps_scores(self) -> bool:
        """Whether the backend keeps the s x s softmax for backward (math does; the fused ones recompute it)."""
        return self.backend == "math"

    def line(self) -> str:
        """One printable line: ``attention: math (why)``."""
        return f"attention: {self.backend} ({self.reason})"


def sixteen_bit(device: str, capability: tuple[int, int] | None) -> str:
    """The 16-bit dtype a step uses on a device: float16 on a CUDA card without bfloat16 tensor cores (the one
    rule, :func:`course_utils.datasheets.bf16_capable`), else bfloat16."""
    return "float16" if device == "cuda" and not bf16_capable(capability or ASSUMED_CAPABILITY) else "bfloat16"


def cudnn_first(capability: tuple[int, int]) -> bool:
    """Whether PyTorch tries cuDNN attention first on a card of this compute capability (sm90 and sm100, unless
    :data:`CUDNN_DEPRIORITIZED` is set to anything but 0 or false)."""
    deprioritized = os.environ.get(CUDNN_DEPRIORITIZED, "").strip().lower() not in ("", "0", "false", "off", "no")
    return tuple(capability) in CUDNN_FIRST and not deprioritized


def cudnn_takes(capability: tuple[int, int], dtype: str, head_dim: int) -> bool:
    """Whether cuDNN attention takes Q, K and V of this dtype and head size on this card."""
    limit = 256 if tuple(capability) == (9, 0) else 128
    return dtype != "float32" and head_dim % 8 == 0 and head_dim <= limit


def cuda_backend(
    capability: tuple[int, int], dtype: str, *, gqa: bool, head_dim: int, mask: bool = False
) -> AttentionChoice:
    """The backend CUDA SDPA picks, from the documented conditions (module doc): cuDNN first on sm90 and sm100,
    else flash, else efficient, else math.

    ``capability``: the card's compute capability, e.g. (7, 5) for a T4; ``dtype``: of Q, K and V at the call
    ("float32", "bfloat16" or "float16"); ``gqa``: fewer K/V heads than query heads, passed with
    ``enable_gqa=True`` (transformers does so when there is no mask); ``mask``: an explicit attention mask (padding).
    """
    cap = tuple(capability)
    sm = "sm{}{}".format(*cap)
    if head_dim > MAX_FUSED_HEAD_DIM:
        return AttentionChoice("math", f"head size {head_dim} > {MAX_FUSED_HEAD_DIM}: no fused kernel")
    if cudnn_first(cap) and cudnn_takes(cap, dtype, head_dim):
        return AttentionChoice("cudnn", f"{dtype} on {sm}: PyTorch tries cuDNN attention first there")
    if dtype != "float32" and cap >= AMPERE and not mask:
        return AttentionChoice("flash", f"{dtype} on {sm}")
    if dtype == "float32":
        why_not_flash = "flash needs 16-bit inputs"
    else:
        why_not_flash = "flash takes no mask" if mask else f"flash needs sm80+, this is {sm}"
    if gqa:
        no_gqa = f"the memory-efficient kernel takes no grouped-query heads (torch {RULES_TORCH})"
        return AttentionChoice("math", f"{dtype}, grouped-query heads: {why_not_flash}, and {no_gqa}")
    # no bfloat16 kernel on a card without bfloat16
    if cap >= EFFICIENT_MIN_CAPABILITY and (dtype != "bfloat16" or bf16_capable(cap)):
        return AttentionChoice("efficient", f"{dtype} on {sm}: {why_not_flash}")
    return AttentionChoice("math", f"{dtype} on {sm}: no fused kernel takes it")


def choose_backend(
    *,
    device: str,
    dtype_bytes: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    capability: tuple[int, int] | None = None,
) -> AttentionChoice:
    """The backend a step's attention gets on ``device`` ("cpu" or "cuda"), for Q/K/V of ``dtype_bytes`` per number.

    On CUDA, ``capability`` is the card's (None: an Ampere-or-newer card is assumed, and the reason says so).
    """
    dtype = "float32" if dtype_bytes == 4 else sixteen_bit(device, capability)
    if device == "cpu":  # a causal call without a mask: PyTorch's CPU flash kernel takes every dtype and head
        # layout (torch 2.5+); tests/test_attention.py checks this rule against torch._fused_sdp_choice
        return AttentionChoice("flash", f"{dtype} on a CPU: PyTorch's CPU flash kernel")
    choice = cuda_backend(capability or ASSUMED_CAPABILITY, dtype, gqa=kv_heads != heads, head_dim=head_dim)
    if capability is None:
        return AttentionChoice(choice.backend, choice.reason + "; no card named: sm80+ assumed")
    return choice
