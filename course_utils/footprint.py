"""Where a model's memory goes: what ``get_memory_footprint()`` counts, part by part, at 16, 8 or 4 bits.

:func:`footprint_parts` prices a model's parts with the rules bitsandbytes and transformers apply when
loading in 8 or 4 bits: every ``nn.Linear`` except the output head is quantized; the embedding table, the
norms and the biases stay 16-bit. It works on a loaded model and on a meta-device one
(:func:`course_utils.models.meta_model`), so the sizes of models too big to load here are *computed* from
their architecture alone. :func:`llama_like_parts` does the same for a Llama-shaped model in closed form.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from course_utils import checks
from course_utils.architecture import Architecture
from course_utils.models import check_load_bits, meta_model
from course_utils.units import format_bytes

#: NF4 block size used by bitsandbytes: one float32 scale ("absmax") per 64 weights.
NF4_BLOCKSIZE = 64
#: Double quantization (QLoRA's, ``bnb_4bit_use_double_quant=True``) stores those scales in 8 bits, in blocks of
#: 256 scales that each keep one float32 scale of their own: 8/64 + 32/(64 x 256) = 0.127 bit per weight.
DOUBLE_QUANT_BLOCKSIZE = 256
#: The parts of a model, in the order tables and charts show them.
PART_NAMES = ("embedding table", "attention linears (q, k, v, o)", "MLP linears (gate, up, down)",
              "other linears", "linear biases", "norms", "lm_head", "other parameters", "buffers")
#: The parts bitsandbytes quantizes (every nn.Linear but the output head).
_QUANTIZED_PARTS = frozenset({"attention linears (q, k, v, o)", "MLP linears (gate, up, down)", "other linears"})


@dataclass(frozen=True)
class Part:
    """One part of a model: how many parameters it has and how many bytes they take at a given width."""

    name: str
    params: int
    bytes: int
    quantized: bool


def true_numel(param: torch.Tensor) -> int:
    """Number of weights a parameter stands for: a packed 4-bit ``Params4bit`` holds two per byte."""
    state = getattr(param, "quant_state", None)
    if state is not None and getattr(state, "shape", None) is not None:
        return math.prod(state.shape)
    return param.numel()


def count_model_parameters(model: torch.nn.Module) -> int:
    """Parameters of a model, each shared (tied) tensor counted once; 4-bit packed weights at their true size."""
    return sum(true_numel(p) for p in model.parameters())


def _output_embedding(model: torch.nn.Module) -> torch.nn.Module | None:
    getter = getattr(model, "get_output_embeddings", None)
    return getter() if callable(getter) else None


def is_tied(model: torch.nn.Module) -> bool:
    """True when the lm_head shares its weight tensor with the input embedding table."""
    out, inp = _output_embedding(model), getattr(model, "get_input_embeddings", lambda: None)()
    return out is not None and inp is not None and out.weight is inp.weight


def footprint_parts(model: torch.nn.Module, bits: int = 16) -> list[Part]:
    """The model's memory by part, as ``get_memory_footprint()`` would count it when loaded at ``bits``.

    Works on a meta-device model (computed), a 16-bit model (predicting its 4-bit size) or an already
    quantized one. The rules are those of transformers + bitsandbytes: every ``nn.Linear`` is quantized
    except the output head; embeddings, norms and biases stay 16-bit; a tied lm_head adds nothing.
    ``get_memory_footprint()`` counts parameters and buffers only, so quantization scales are not in
    these bytes (see :func:`scale_bytes`).
    """
    check_load_bits(bits)
    quant_bytes = {16: 2.0, 8: 1.0, 4: 0.5}[bits]
    head = _output_embedding(model)
    seen: set[int] = set()
    params = {n: 0 for n in PART_NAMES}
    nbytes = {n: 0.0 for n in PART_NAMES}

    def add(part: str, count: int, per: float) -> None:
        params[part] += count
        nbytes[part] += count * per

    for mod_name, module in model.named_modules():
        for p_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue  # a tied tensor is stored (and counted) once
            seen.add(id(param))
            n = true_numel(param)
            if isinstance(module, torch.nn.Embedding):
                add("embedding table", n, 2)
            elif module is head:
                add("lm_head", n, 2)
            elif isinstance(module, torch.nn.Linear):
                if p_name == "bias":
                    add("linear biases", n, 2)
                elif ".self_attn." in f".{mod_name}." or ".attn." in f".{mod_name}.":
                    add("attention linears (q, k, v, o)", n, quant_bytes)
                elif ".mlp." in f".{mod_name}.":
                    add("MLP linears (gate, up, down)", n, quant_bytes)
                else:
                    add("other linears", n, quant_bytes)
            elif "norm" in type(module).__name__.lower() or "norm" in mod_name.rsplit(".", 1)[-1].lower():
                add("norms", n, 2)
            else:
                add("other parameters", n, 2)
    for buf in model.buffers():
        add("buffers", buf.numel(), buf.element_size())
    parts = [Part(n, params[n], int(round(nbytes[n])), bits != 16 and n in _QUANTIZED_PARTS) for n in PART_NAMES]
    if head is not None and is_tied(model):
        parts[PART_NAMES.index("lm_head")] = Part("lm_head", 0, 0, False)
    return parts


def footprint_bytes(model: torch.nn.Module, bits: int = 16) -> int:
    """Total of :func:`footprint_parts`: ``get_memory_footprint()``'s answer for the model loaded at ``bits``."""
    return sum(p.bytes for p in footprint_parts(model, bits))


def scale_bytes(model: torch.nn.Module, bits: int) -> int:
    """Bytes of quantization scales that ``get_memory_footprint()`` leaves out.

    4-bit NF4: one float32 absmax per block of 64 weights (0.5 bit per weight); 8-bit: one float32 per
    output row. 16-bit: none.
    """
    check_load_bits(bits)
    if bits == 16:
        return 0
    total = 0
    for part in footprint_parts(model, bits):
        if part.quantized:
            total += part.params
    if bits == 4:
        return math.ceil(total / NF4_BLOCKSIZE) * 4
    head = _output_embedding(model)
    rows = sum(m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    return rows * 4


def nf4_scale_bytes(n_weights: int, double_quant: bool = True) -> float:
    """Bytes of NF4 scales for ``n_weights`` 4-bit weights, by the per-weight rule (no per-tensor rounding up).

    Without double quantization: one float32 per 64 weights (0.5 bit a weight). With it: one byte per 64
    weights plus one float32 per 256 of those bytes (0.127 bit a weight).
    """
    n = checks.integer(n_weights, "n_weights", 0)
    checks.flag(double_quant, "double_quant")
    if not double_quant:
        return n / NF4_BLOCKSIZE * 4
    return n / NF4_BLOCKSIZE + n / (NF4_BLOCKSIZE * DOUBLE_QUANT_BLOCKSIZE) * 4


@dataclass(frozen=True)
class FourBitSize:
    """A model's 4-bit size against the half-byte floor: what stays 16-bit and what the NF4 scales add (bytes)."""

    params: int
    quantized: int
    codes_bytes: float
    scales_bytes: float
    kept_bytes: float

    @property
    def floor_bytes(self) -> float:
        """Every parameter at half a byte: the estimator's QLoRA rule."""
        return self.params * 0.5

    @property
    def total_bytes(self) -> float:
        """4-bit codes + their scales + the parts kept in 16 bits."""
        return self.codes_bytes + self.scales_bytes + self.kept_bytes


def four_bit_size(config: Any, double_quant: bool = True) -> FourBitSize:
    """The 4-bit size of the architecture ``config`` by bitsandbytes' rules, computed on the meta device.

    Every linear layer but the output head goes to NF4 (half a byte a weight, plus :func:`nf4_scale_bytes`);
    the embedding table, an untied lm_head, norms and biases stay 16-bit. Buffers are left out.
    """
    parts = footprint_parts(meta_model(config), 16)
    params = sum(p.params for p in parts if p.name != "buffers")
    quantized = sum(p.params for p in parts if p.name in _QUANTIZED_PARTS)
    return FourBitSize(params, quantized, quantized * 0.5, nf4_scale_bytes(quantized, double_quant),
                       (params - quantized) * 2.0)


def measured_scale_bytes(model: torch.nn.Module) -> int:
    """Bytes of the scales the 4-bit layers of a loaded model store beside their weights (0 if none).

    Plain NF4: one float32 absmax per block of 64 weights. With double quantization those absmax are stored in
    8 bits, plus one float32 scale per 256 of them, the 8-bit code table and a float32 offset: all counted.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    total = 0
    for module in model.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if state is None or getattr(state, "absmax", None) is None:
            continue
        total += state.absmax.nbytes
        if getattr(state, "nested", False):
            total += state.state2.absmax.nbytes + state.state2.code.nbytes + 4  # + the float32 offset
    return total


def breakdown_table(model: torch.nn.Module, low_bits: int = 4) -> str:
    """A text table: each part's parameters and bytes at 16 bits and at ``low_bits``, with totals."""
    check_load_bits(low_bits)
    p16, plow = footprint_parts(model, 16), footprint_parts(model, low_bits)
    total_params = sum(p.params for p in p16 if p.name != "buffers")
    t16, tlow = sum(p.bytes for p in p16), sum(p.bytes for p in plow)
    rows = [f"{'part':32}{'parameters':>15}{'share':>8}{'16-bit':>11}{f'{low_bits}-bit':>11}"]
    for a, b in zip(p16, plow):
        if a.params == 0 and a.name != "lm_head":
            continue
        label = "lm_head (tied: shares the table)" if a.name == "lm_head" and a.params == 0 else a.name
        count = f"{a.params:,}" if a.name != "buffers" else "(not params)"
        share = f"{100 * a.params / total_params:.1f}%" if a.name != "buffers" else ""
        mark = "" if b.quantized or low_bits == 16 else " *"
        rows.append(f"{label:32}{count:>15}{share:>8}{format_bytes(a.bytes):>11}{format_bytes(b.bytes):>11}{mark}")
    rows.append(f"{'total':32}{total_params:>15,}{'100%':>8}{format_bytes(t16):>11}{format_bytes(tlow):>11}")
    ratio = f"{low_bits}-bit / 16-bit = {100 * tlow / t16:.0f} %"
    rows.append(f"* stays 16-bit when the linears go to {low_bits} bits.   {ratio}")
    return "\n".join(rows)


@dataclass(frozen=True)
class ComputedSizes:
    """A model's size from its architecture alone (meta device): nothing was loaded or downloaded."""

    name: str
    params: int
    bytes16: int
    bytes8: int
    bytes4: int
    scales4: int
    embedding_share: float

    def summary(self) -> str:
        """Two lines: the sizes, labelled as computed."""
        return (f"{self.name} (COMPUTED from its architecture on the meta device, not loaded): "
                f"{self.params:,} parameters\n"
                f"  16-bit {format_bytes(self.bytes16)}, 8-bit {format_bytes(self.bytes8)}, "
                f"4-bit {format_bytes(self.bytes4)} ({100 * self.bytes4 / self.bytes16:.0f} % of 16-bit; "
                f"embedding table {100 * self.embedding_share:.0f} % of the parameters)")


def computed_sizes(config: Any, name: str | None = None) -> ComputedSizes:
    """Sizes at 16, 8 and 4 bits of the architecture ``config`` (a config or a file in ``data/configs``)."""
    if name is None:
        name = Path(str(config)).stem if isinstance(config, (str, os.PathLike)) else type(config).__name__
    model = meta_model(config)
    parts16 = footprint_parts(model, 16)
    params = sum(p.params for p in parts16 if p.name != "buffers")
    emb = next(p.params for p in parts16 if p.name == "embedding table")
    return ComputedSizes(name, params, footprint_bytes(model, 16), footprint_bytes(model, 8),
                         footprint_bytes(model, 4), scale_bytes(model, 4), emb / params)


# --------------------------------------------------------------------------------------------
# A Llama-shaped model by formula (for the interactive demo), and Llama 3's real shapes
# --------------------------------------------------------------------------------------------
#: Meta's Llama 3 8B, the fields of its ``config.json`` that decide its size (meta-llama/Meta-Llama-3-8B):
#: 32 query heads share 8 key/value heads (grouped-query attention), so k and v are a quarter as wide as q.
LLAMA3_8B: dict[str, Any] = {
    "_name_or_path": "meta-llama/Meta-Llama-3-8B",
    "_source": "config.json of meta-llama/Meta-Llama-3-8B (the fields that decide its size)",
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "mlp_bias": False,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "torch_dtype": "bfloat16",
}
#: Meta's Llama 3 70B (meta-llama/Meta-Llama-3-70B): 64 query heads share 8 key/value heads, an eighth of q.
LLAMA3_70B: dict[str, Any] = {
    **LLAMA3_8B,
    "_name_or_path": "meta-llama/Meta-Llama-3-70B",
    "_source": "config.json of meta-llama/Meta-Llama-3-70B (the fields that decide its size)",
    "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
}

#: Qwen's Qwen2.5-7B (Qwen/Qwen2.5-7B), the fields of its ``config.json`` that decide its size: 28 query heads
#: share 4 key/value heads of 128, q/k/v carry biases (qwen2), and the lm_head is a separate (untied) table.
QWEN25_7B: dict[str, Any] = {
    "_name_or_path": "Qwen/Qwen2.5-7B",
    "_source": "config.json of Qwen/Qwen2.5-7B (the fields that decide its size)",
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "tie_word_embeddings": False, "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "hidden_act": "silu", "torch_dtype": "bfloat16",
}

#: Which parts of :func:`architecture_parts` each tensor of :meth:`Architecture.param_tensors` belongs to.
_LLAMA_GROUPS = {"embed_tokens": "embedding table", "q_proj": "attention linears", "k_proj": "attention linears",
                 "v_proj": "attention linears", "o_proj": "attention linears", "gate_proj": "MLP linears",
                 "up_proj": "MLP linears", "down_proj": "MLP linears", "input_layernorm": "norms",
                 "post_attention_layernorm": "norms", "norm": "norms", "q_norm": "norms", "k_norm": "norms",
                 "lm_head": "lm_head"}


def architecture_parts(arch: Architecture) -> dict[str, int]:
    """Parameter counts by part of an :class:`Architecture` (no torch): the linears are what 4 bits shrink."""
    if not isinstance(arch, Architecture):
        raise TypeError(f"arch must be a course_utils.architecture.Architecture, got {type(arch).__name__}")
    parts = {"embedding table": 0, "attention linears": 0, "MLP linears": 0, "linear biases": 0, "norms": 0,
             "lm_head": 0}
    for name, numel, _ in arch.param_tensors():
        parts["linear biases" if name.endswith(".bias") else _LLAMA_GROUPS[name]] += numel
    return parts


def llama_like_parts(hidden_size: int, num_layers: int, vocab_size: int, *, mlp_ratio: float = 8 / 3,
                     kv_fraction: float = 1 / 3, tied: bool = True) -> dict[str, int]:
    """Parameter counts of a Llama-shaped decoder by formula (no torch), from :class:`Architecture`.

    Per layer: q and o are hidden x hidden, k and v hidden x (kv_fraction * hidden), gate/up/down use
    an intermediate size of mlp_ratio * hidden, plus two norms. SmolLM2-135M is hidden 576, 30 layers,
    vocab 49,152, mlp_ratio 1536/576, kv_fraction 1/3, tied: exactly 134,515,008. Llama 3 8B is hidden 4096,
    32 layers, vocab 128,256, mlp_ratio 3.5, kv_fraction 1/4 (8 of 32 heads), untied: 8,030,261,248.
    """
    checks.integer(hidden_size, "hidden_size", 64, 16384)
    checks.integer(num_layers, "num_layers", 1, 200)
    checks.integer(vocab_size, "vocab_size", 256, 1_000_000)
    mlp_ratio = checks.number(mlp_ratio, "mlp_ratio", 0.5, 8)
    kv_fraction = checks.number(kv_fraction, "kv_fraction", 0, 1, low_open=True)
    checks.flag(tied, "tied")
    kv_width = max(1, round(kv_fraction * hidden_size))
    head_dim = math.gcd(hidden_size, kv_width)  # heads of this width give q exactly hidden wide and k, v kv_width wide
    arch = Architecture(model_type="llama", vocab=vocab_size, hidden=hidden_size,
                        intermediate=round(mlp_ratio * hidden_size), layers=num_layers,
                        heads=hidden_size // head_dim, kv_heads=kv_width // head_dim, head_dim=head_dim, tied=tied)
    return architecture_parts(arch)


def _ratio_lines(parts: dict[str, int]) -> str:
    """The sizes and the 16-bit share of a model, from its parts (the linears go to 4 bits, the rest stays)."""
    total = sum(parts.values())
    linears = parts["attention linears"] + parts["MLP linears"]
    b16, b4 = 2 * total, 0.5 * linears + 2 * (total - linears)
    short = f"{total / 1e9:.2f} B" if total >= 1e9 else f"{total / 1e6:.0f} M"
    head = f", lm_head {100 * parts['lm_head'] / total:.0f} %" if parts["lm_head"] else ""
    return (f"{total:,} parameters ({short}): 16-bit {format_bytes(b16)} -> 4-bit {format_bytes(b4)}: "
            f"{100 * b4 / b16:.0f} % (25 % would need every weight in a linear layer)\n"
            f"stays 16-bit: {100 * (total - linears) / total:.0f} % of the parameters "
            f"(embedding table {100 * parts['embedding table'] / total:.0f} %{head})")


def four_bit_ratio_report(hidden_size: int, num_layers: int, vocab_size: int, tied: bool = True,
                          mlp_ratio: float = 8 / 3, kv_fraction: float = 1 / 3) -> str:
    """Text for the demo: a Llama-shaped model's 16-bit and 4-bit sizes and why the ratio is not 25 %."""
    parts = llama_like_parts(hidden_size, num_layers, vocab_size, mlp_ratio=mlp_ratio, kv_fraction=kv_fraction,
                             tied=tied)
    return (f"hidden {hidden_size}, {num_layers} layers, vocabulary {vocab_size:,}, "
            f"{'tied' if tied else 'untied'} lm_head\n{_ratio_lines(parts)}")


def config_ratio_report(config: Any, name: str | None = None) -> str:
    """The same report for a real architecture (a preset in ``data/configs``, a path or a dict such as
    :data:`LLAMA3_8B`), read by :class:`Architecture`: its own head counts and MLP width, exact counts."""
    arch = Architecture.from_config(config)
    label = name if name is not None else arch.name
    if not isinstance(label, str) or not label:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    return (f"{label}: hidden {arch.hidden}, {arch.layers} layers, {arch.heads} query heads sharing "
            f"{arch.kv_heads} key/value heads, MLP {arch.intermediate:,} wide, vocabulary {arch.vocab:,}, "
            f"{'tied' if arch.tied else 'untied'} lm_head\n{_ratio_lines(architecture_parts(arch))}")
