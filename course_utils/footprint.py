"""Where a model's memory goes: what ``get_memory_footprint()`` counts, part by part, at 16, 8 or 4 bits.

:func:`footprint_parts` prices a model's parts with the rules bitsandbytes and transformers apply when
loading in 8 or 4 bits: every ``nn.Linear`` except the output head is quantized; the embedding table, the
norms and the biases stay 16-bit. It works on a loaded model and on a meta-device one
(:func:`course_utils.models.meta_model`), so the sizes of models too big to load here are *computed* from
their architecture alone. :func:`llama_like` is a Llama-shaped model's :class:`Architecture`, counted in closed form.
"""

import math
from dataclasses import dataclass
from typing import Any

import torch

from course_utils import checks
from course_utils.architecture import Architecture
from course_utils.configs import config_name
from course_utils.models import check_load_bits, meta_model
from course_utils.units import format_bytes

#: NF4 block size used by bitsandbytes: one float32 scale ("absmax") per 64 weights.
_NF4_BLOCKSIZE = 64
#: The parts bitsandbytes quantizes (every nn.Linear but the output head).
_QUANTIZED_PARTS = ("attention linears (q, k, v, o)", "MLP linears (gate, up, down)", "other linears")
#: The parts of a model, in the order tables and charts show them.
_PART_NAMES = ("embedding table", *_QUANTIZED_PARTS, "linear biases", "norms", "lm_head", "other parameters", "buffers")


@dataclass(frozen=True)
class Part:
    """One part of a model: how many parameters it has and how many bytes they take at a given width."""

    name: str
    params: int
    bytes: int
    quantized: bool


def true_numel(param: torch.Tensor) -> int:
    """Number of weights a parameter stands for: a packed 4-bit ``Params4bit`` holds two per byte."""
    shape = getattr(getattr(param, "quant_state", None), "shape", None)
    return param.numel() if shape is None else math.prod(shape)


def count_model_parameters(model: torch.nn.Module) -> int:
    """Parameters of a model, each shared (tied) tensor counted once; 4-bit packed weights at their true size."""
    return sum(true_numel(p) for p in model.parameters())


def footprint_parts(model: torch.nn.Module, bits: int = 16) -> list[Part]:
    """The model's memory by part, as ``get_memory_footprint()`` would count it when loaded at ``bits``.

    Works on a meta-device model (computed), a 16-bit model (predicting its 4-bit size) or an already
    quantized one. The rules are those of transformers + bitsandbytes: every ``nn.Linear`` is quantized
    except the output head; embeddings, norms and biases stay 16-bit; a tied lm_head adds nothing.
    ``get_memory_footprint()`` counts parameters and buffers only, so quantization scales are not in
    these bytes (see :func:`measured_scale_bytes` and :attr:`ComputedSizes.scales4`).
    """
    quant_bytes = {16: 2.0, 8: 1.0, 4: 0.5}[check_load_bits(bits)]
    head = getattr(model, "get_output_embeddings", lambda: None)()
    params = dict.fromkeys(_PART_NAMES, 0)
    # a tied tensor is stored (and counted) once, under the embedding, which comes first: a tied lm_head adds nothing
    for name, param in model.named_parameters():
        mod_name, _, p_name = name.rpartition(".")
        module, path = model.get_submodule(mod_name), f".{mod_name}."
        if isinstance(module, torch.nn.Embedding):
            part = "embedding table"
        elif module is head:
            part = "lm_head"
        elif isinstance(module, torch.nn.Linear) and p_name == "bias":
            part = "linear biases"
        elif isinstance(module, torch.nn.Linear) and (".self_attn." in path or ".attn." in path):
            part = "attention linears (q, k, v, o)"
        elif isinstance(module, torch.nn.Linear):
            part = "MLP linears (gate, up, down)" if ".mlp." in path else "other linears"
        elif "norm" in type(module).__name__.lower() or "norm" in mod_name.rsplit(".", 1)[-1].lower():
            part = "norms"
        else:
            part = "other parameters"
        params[part] += true_numel(param)
    params["buffers"] = sum(buf.numel() for buf in model.buffers())
    nbytes = {part: n * (quant_bytes if part in _QUANTIZED_PARTS else 2) for part, n in params.items()}
    nbytes["buffers"] = sum(buf.nbytes for buf in model.buffers())
    return [Part(n, params[n], int(round(nbytes[n])), bits != 16 and n in _QUANTIZED_PARTS) for n in _PART_NAMES]


def footprint_bytes(model: torch.nn.Module, bits: int = 16) -> int:
    """Total of :func:`footprint_parts`: ``get_memory_footprint()``'s answer for the model loaded at ``bits``."""
    return sum(p.bytes for p in footprint_parts(model, bits))


def measured_scale_bytes(model: torch.nn.Module) -> int:
    """Bytes of the scales the 4-bit layers of a loaded model store beside their weights (0 if none).

    Plain NF4: one float32 absmax per block of 64 weights. With double quantization those absmax are stored in
    8 bits, plus one float32 scale per 256 of them, the 8-bit code table and a float32 offset: all counted.
    """
    checks.instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    states = (getattr(getattr(module, "weight", None), "quant_state", None) for module in model.modules())
    return sum(_scale_bytes(state) for state in states if getattr(state, "absmax", None) is not None)


def _scale_bytes(state: Any) -> int:
    """Bytes of one 4-bit layer's scales: its absmax, plus the second level when it is double-quantized."""
    if not getattr(state, "nested", False):
        return state.absmax.nbytes
    return state.absmax.nbytes + state.state2.absmax.nbytes + state.state2.code.nbytes + 4  # + the float32 offset


#: A row of :func:`breakdown_table`: part, parameters, share, 16-bit bytes, low-bit bytes, mark.
_TABLE_ROW = "{:32}{:>15}{:>8}{:>11}{:>11}{}"


def breakdown_table(model: torch.nn.Module, low_bits: int = 4) -> str:
    """A text table: each part's parameters and bytes at 16 bits and at ``low_bits``, with totals."""
    p16, plow = footprint_parts(model, 16), footprint_parts(model, low_bits)
    total_params = sum(p.params for p in p16 if p.name != "buffers")
    t16, tlow = sum(p.bytes for p in p16), sum(p.bytes for p in plow)
    cells = [("part", "parameters", "share", "16-bit", f"{low_bits}-bit", "")]
    for a, b in zip(p16, plow):
        if a.params == 0 and a.name != "lm_head":
            continue
        label = "lm_head (tied: shares the table)" if a.name == "lm_head" and a.params == 0 else a.name
        count = "(not params)" if a.name == "buffers" else f"{a.params:,}"
        share = "" if a.name == "buffers" else f"{100 * a.params / total_params:.1f}%"
        mark = "" if b.quantized or low_bits == 16 else " *"
        cells.append((label, count, share, format_bytes(a.bytes), format_bytes(b.bytes), mark))
    cells.append(("total", f"{total_params:,}", "100%", format_bytes(t16), format_bytes(tlow), ""))
    rows = [_TABLE_ROW.format(*row) for row in cells]
    ratio = f"{low_bits}-bit / 16-bit = {100 * tlow / t16:.0f} %"
    return "\n".join([*rows, f"* stays 16-bit when the linears go to {low_bits} bits.   {ratio}"])


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
        return (
            f"{self.name} (COMPUTED from its architecture on the meta device, not loaded): {self.params:,} parameters\n"
            f"  16-bit {format_bytes(self.bytes16)}, 8-bit {format_bytes(self.bytes8)}, "
            f"4-bit {format_bytes(self.bytes4)} ({100 * self.bytes4 / self.bytes16:.0f} % of 16-bit; "
            f"embedding table {100 * self.embedding_share:.0f} % of the parameters)"
        )


def computed_sizes(config: Any, name: str | None = None) -> ComputedSizes:
    """Sizes at 16, 8 and 4 bits of the architecture ``config`` (a preset in ``data/configs``, a path or a dict).

    ``scales4``: the NF4 scales ``get_memory_footprint()`` leaves out, one float32 absmax per block of 64
    quantized weights (0.5 bit per weight). ``name``: by default :func:`course_utils.configs.config_name`'s.
    """
    model = meta_model(config)
    parts = {bits: footprint_parts(model, bits) for bits in (16, 8, 4)}
    total = {bits: sum(p.bytes for p in bits_parts) for bits, bits_parts in parts.items()}
    params = sum(p.params for p in parts[16] if p.name != "buffers")
    emb = next(p.params for p in parts[16] if p.name == "embedding table")
    scales4 = math.ceil(sum(p.params for p in parts[4] if p.quantized) / _NF4_BLOCKSIZE) * 4
    return ComputedSizes(name or config_name(config), params, total[16], total[8], total[4], scales4, emb / params)


# --------------------------------------------------------------------------------------------
# A Llama-shaped model by formula (for the interactive demo), and Llama 3's real shapes
# --------------------------------------------------------------------------------------------
#: Meta's Llama 3 8B, the fields of its ``config.json`` that decide its size (meta-llama/Meta-Llama-3-8B; no
#: biases, as transformers assumes): 32 query heads share 8 key/value heads (grouped-query attention), so k and v
#: are a quarter as wide as q.
LLAMA3_8B: dict[str, Any] = {
    "_name_or_path": "meta-llama/Meta-Llama-3-8B",
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
#: Meta's Llama 3 70B (meta-llama/Meta-Llama-3-70B): 64 query heads share 8 key/value heads, an eighth of q.
LLAMA3_70B: dict[str, Any] = {
    **LLAMA3_8B,
    "_name_or_path": "meta-llama/Meta-Llama-3-70B",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
}


def llama_like(
    hidden_size: int, num_layers: int, vocab_size: int, *, kv_fraction: float = 1 / 3, tied: bool = True
) -> Architecture:
    """A Llama-shaped decoder (no torch), its MLP 8/3 x as wide as hidden, as the demo's sliders leave it.

    Per layer: q and o are hidden x hidden, k and v hidden x (kv_fraction * hidden), gate/up/down 8/3 x hidden
    wide, plus two norms. SmolLM2-135M is hidden 576, 30 layers, vocab 49,152, kv_fraction 1/3, tied: exactly
    134,515,008 parameters.
    """
    checks.integer(hidden_size, "hidden_size", 64, 16384)
    checks.integer(num_layers, "num_layers", 1, 200)
    checks.integer(vocab_size, "vocab_size", 256, 1_000_000)
    kv_fraction = checks.number(kv_fraction, "kv_fraction", 0, 1, low_open=True)
    checks.flag(tied, "tied")
    kv_width = max(1, round(kv_fraction * hidden_size))
    head_dim = math.gcd(hidden_size, kv_width)  # heads of this width give q exactly hidden wide and k, v kv_width wide
    mlp = round(8 / 3 * hidden_size)
    sizes = {"vocab": vocab_size, "hidden": hidden_size, "intermediate": mlp, "layers": num_layers}
    heads = {"heads": hidden_size // head_dim, "kv_heads": kv_width // head_dim, "head_dim": head_dim}
    return Architecture("llama", **sizes, **heads, tied=tied)


def _report_tail(arch: Architecture) -> str:
    """How both reports end: whether the lm_head is tied, then the sizes and the 16-bit share of the model (the
    linears go to 4 bits, the rest stays)."""
    tensors = arch.param_tensors()
    total = arch.params
    linears = sum(n for _, n, linear in tensors if linear)
    embedding, head = (sum(n for name, n, _ in tensors if name == part) for part in ("embed_tokens", "lm_head"))
    b16, b4 = 2 * total, 0.5 * linears + 2 * (total - linears)
    short = f"{total / 1e9:.2f} B" if total >= 1e9 else f"{total / 1e6:.0f} M"
    head_share = f", lm_head {100 * head / total:.0f} %" if head else ""
    return (
        f"{'tied' if arch.tied else 'untied'} lm_head\n"
        f"{total:,} parameters ({short}): 16-bit {format_bytes(b16)} -> 4-bit {format_bytes(b4)}: "
        f"{100 * b4 / b16:.0f} % (25 % would need every weight in a linear layer)\n"
        f"stays 16-bit: {100 * (total - linears) / total:.0f} % of the parameters "
        f"(embedding table {100 * embedding / total:.0f} %{head_share})"
    )


def four_bit_ratio_report(
    hidden_size: int, num_layers: int, vocab_size: int, tied: bool = True, kv_fraction: float = 1 / 3
) -> str:
    """Text for the demo: a Llama-shaped model's (:func:`llama_like`) 16-bit and 4-bit sizes and why the ratio is
    not 25 %."""
    arch = llama_like(hidden_size, num_layers, vocab_size, kv_fraction=kv_fraction, tied=tied)
    return f"hidden {hidden_size}, {num_layers} layers, vocabulary {vocab_size:,}, {_report_tail(arch)}"


def config_ratio_report(config: Any, name: str | None = None) -> str:
    """The same report for a real architecture (a preset in ``data/configs``, a path or a dict such as
    :data:`LLAMA3_8B`), read by :class:`Architecture`: its own head counts and MLP width, exact counts."""
    arch = Architecture.from_config(config)
    label = name if name is not None else arch.name
    if not isinstance(label, str) or not label:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    return (
        f"{label}: hidden {arch.hidden}, {arch.layers} layers, {arch.heads} query heads sharing {arch.kv_heads} "
        f"key/value heads, MLP {arch.intermediate:,} wide, vocabulary {arch.vocab:,}, {_report_tail(arch)}"
    )
