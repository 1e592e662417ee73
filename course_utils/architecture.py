"""One reader of a decoder's architecture, and one parameter counter, for every module of the course.

:class:`Architecture` holds the numbers of a Llama-family ``config.json`` (Llama, Mistral, Qwen2, Qwen3) that
decide its memory: vocabulary, widths, layers, attention heads and key/value heads, tied or untied head,
biases. Its parameter and LoRA counts are exact arithmetic, checked against transformers and peft on the
meta device in the tests. :func:`count_parameters` and :func:`lora_adapter_params` accept any config: other
architectures are built on PyTorch's meta device (shapes, no memory) and counted there.

SmolLM2-135M at LoRA rank 8 on q_proj (576 -> 576) and v_proj (576 -> 192): 30 x 8 x (1152 + 768) = 460,800
of its 134,515,008 parameters.
"""

import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from course_utils import checks
from course_utils.configs import config_name, read_config

#: The seven linear projections of a Llama-family decoder layer (attention, then MLP).
PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: The course's default LoRA targets: the query and value projections.
DEFAULT_TARGETS: tuple[str, ...] = ("q_proj", "v_proj")
#: The largest LoRA rank the counts accept.
MAX_LORA_RANK = 65_536
#: Architectures counted by arithmetic (others are built on the meta device).
_SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3")

Config = str | os.PathLike | Mapping[str, Any]
#: LoRA targets as :func:`normalize_targets` reads them: 'q_proj,v_proj', a list of names, or 'all-linear'.
Targets = str | Iterable[str]


def normalize_targets(targets: Targets) -> tuple[str, ...]:
    """LoRA target names as a tuple: accepts 'q_proj,v_proj', a list, or 'all-linear' (every projection)."""
    if isinstance(targets, str):
        targets = targets.split(",")
    checks.instance(targets, "targets", Iterable, "names of projections")
    items = [name for name in (str(t).strip() for t in targets) if name]
    if items == ["all-linear"]:
        return PROJECTIONS
    unknown = [t for t in items if t not in PROJECTIONS]
    if unknown or not items:
        named = f"unknown module name(s) {', '.join(unknown)}" if unknown else "no module named"
        raise ValueError(f"targets: {named}; allowed: {', '.join(PROJECTIONS)} or all-linear")
    return tuple(dict.fromkeys(items))  # keep order, drop repeats


@dataclass(frozen=True)
class Architecture:
    """The numbers of a decoder config that decide its memory."""

    model_type: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    max_positions: int | None = None
    name: str = "model"

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear layer of one decoder layer."""
        h, i, q, kv = self.hidden, self.intermediate, self.q_width, self.kv_width
        return dict(zip(PROJECTIONS, [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]))

    def param_tensors(self) -> list[tuple[str, int, bool]]:
        """Every parameter tensor as (name, numel, is a linear weight of a layer), tied head counted once."""
        out: list[tuple[str, int, bool]] = [("embed_tokens", self.vocab * self.hidden, False)]
        bias = dict(zip(PROJECTIONS, [self.qkv_bias] * 3 + [self.o_bias] + [self.mlp_bias] * 3))
        for _ in range(self.layers):
            for name, (fan_in, fan_out) in self.projection_shapes().items():
                out.append((name, fan_in * fan_out, True))
                if bias[name]:
                    out.append((name + ".bias", fan_out, False))
            out += [("input_layernorm", self.hidden, False), ("post_attention_layernorm", self.hidden, False)]
            if self.qk_norm:
                out += [("q_norm", self.head_dim, False), ("k_norm", self.head_dim, False)]
        out.append(("norm", self.hidden, False))
        if not self.tied:
            out.append(("lm_head", self.vocab * self.hidden, False))
        return out

    @property
    def params(self) -> int:
        """Exact parameter count (tied embeddings once)."""
        return sum(n for _, n, _ in self.param_tensors())

    def adapter_tensors(self, rank: int, targets: Targets) -> list[int]:
        """Sizes of the LoRA tensors (A: rank x in, B: out x rank) for every targeted projection of every layer."""
        rank = checks.integer(rank, "lora_rank", 1, MAX_LORA_RANK)
        return [rank * n for t in normalize_targets(targets) for n in self.projection_shapes()[t]] * self.layers

    def adapter_params(self, rank: int, targets: Targets = DEFAULT_TARGETS) -> int:
        """Exact number of LoRA numbers: rank x (in + out) for every targeted projection of every layer."""
        return sum(self.adapter_tensors(rank, targets))

    @classmethod
    def from_config(cls, config: Config) -> "Architecture":
        """Read the numbers from a preset name in ``data/configs``, a ``config.json`` path, or a dict."""
        cfg = read_config(config, sizes=("intermediate_size",))
        model_type = checks.choice(cfg.get("model_type"), "config's model_type", _SUPPORTED_MODEL_TYPES)
        heads = cfg["num_attention_heads"]
        return cls(
            model_type=model_type,
            vocab=cfg["vocab_size"],
            hidden=cfg["hidden_size"],
            intermediate=cfg["intermediate_size"],
            layers=cfg["num_hidden_layers"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            tied=bool(cfg.get("tie_word_embeddings", model_type != "mistral")),
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            o_bias=model_type != "qwen2" and bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            max_positions=cfg.get("max_position_embeddings"),
            name=config_name(config),
        )


def count_parameters(config: Config) -> int:
    """Exact parameter count of a decoder from its config (tied embeddings counted once)."""
    cfg = read_config(config)
    if cfg.get("model_type") in _SUPPORTED_MODEL_TYPES:
        return Architecture.from_config(cfg).params
    return count_on_meta(cfg)[0]


def lora_adapter_params(config: Config, lora_rank: int = 8, targets: Targets = DEFAULT_TARGETS) -> int:
    """Exact number of numbers LoRA of rank ``lora_rank`` on ``targets`` trains."""
    cfg = read_config(config)
    if cfg.get("model_type") in _SUPPORTED_MODEL_TYPES:
        return Architecture.from_config(cfg).adapter_params(lora_rank, targets)
    return int(count_on_meta(cfg, lora_rank, targets)[1] or 0)


def count_on_meta(
    config: Config, lora_rank: int | None = None, targets: Targets = DEFAULT_TARGETS
) -> tuple[int, int | None]:
    """Count parameters (and LoRA numbers, when ``lora_rank`` is given) with transformers and peft on the meta device.

    The model is :func:`course_utils.models.meta_model`'s: built on the meta device, every tensor has a shape
    and no storage, so a 70B config costs no memory.
    """
    import torch

    from course_utils.models import meta_model
    from course_utils.quiet import quiet_libraries

    if lora_rank is not None:
        targets = list(normalize_targets(targets))
        checks.integer(lora_rank, "lora_rank", 1, MAX_LORA_RANK)
    model = meta_model(read_config(config))
    total = sum(p.numel() for p in model.parameters())
    if lora_rank is None:
        return total, None
    import peft

    with quiet_libraries(), torch.device("meta"):
        lora = peft.get_peft_model(model, peft.LoraConfig(r=lora_rank, target_modules=targets))
    return total, sum(p.numel() for p in lora.parameters() if p.requires_grad)
