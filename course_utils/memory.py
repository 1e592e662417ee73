"""Memory budgets: will a training run fit before you start it?

The lesson's estimator counts what a training step must keep in memory *besides* activations:

* **full fine-tuning in float32**: every weight is trained, so each parameter carries 4 bytes of
  weight, 4 bytes of gradient and 8 bytes of AdamW state (two running averages): **16 bytes**;
* **LoRA**: the base model is frozen and stored at 4 bytes (float32), 2 bytes (bfloat16) or half a
  byte (4 bits, QLoRA) per weight; gradients and AdamW states exist only for the adapter's numbers:
  **12 bytes** each (4 gradient + 8 AdamW). As in the lesson, the adapter's own float32 copy (4 bytes
  per number) is left out: it is 0.0018 GB for SmolLM2-135M at rank 8.

GB here means 10^9 bytes. A run "fits" a memory budget when the estimate uses at most 70 % of it: the
rest is for activations (which grow with batch and text length), the framework and the system.

Without an architecture config the adapter's size is an **assumption**: LoRA rank 8 on ``q_proj`` and
``v_proj`` trains 460,800 of SmolLM2-135M's 134,515,008 numbers (0.34 %), and the table assumes the same
share for every model (scaled linearly with the rank). With a ``config.json`` the counts are exact:
:func:`count_parameters` and :func:`lora_adapter_params` compute them by arithmetic for Llama, Mistral and
Qwen2/3 architectures (checked against transformers and peft on the meta device in the tests), and fall
back to building the model on the meta device for other architectures.

The command line (``python -m course_utils memory``) lives here too: :func:`configure_parser` and
:func:`run_cli` are wired up by ``course_utils/__main__.py``. This module imports neither torch nor
transformers at import time, so the command starts instantly.
"""
from __future__ import annotations

import argparse
import importlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

#: One gigabyte, as the lesson counts it (10^9 bytes, not 2^30).
GB = 1e9
#: Share of a memory budget the estimate may use; the rest is for activations, the framework, the system.
USABLE_SHARE = 0.70
#: SmolLM2-135M's parameter count (its architecture config, counted on the meta device).
SMOLLM2_PARAMS = 134_515_008
#: Numbers trained by LoRA rank 8 on q_proj and v_proj of SmolLM2-135M.
SMOLLM2_ADAPTER = 460_800
#: The rank behind :data:`SMOLLM2_ADAPTER`.
REFERENCE_RANK = 8
#: The lesson's assumption for models without a config: LoRA trains this share of the model (0.34 %).
ADAPTER_SHARE = SMOLLM2_ADAPTER / SMOLLM2_PARAMS
#: Bytes per trained number in float32 with AdamW: weight 4 + gradient 4 + two running averages 8.
FULL_BYTES_PER_PARAM = 16
#: Bytes per trained adapter number counted by the lesson's LoRA estimate: gradient 4 + AdamW 8.
ADAPTER_BYTES_PER_PARAM = 12
#: Default LoRA targets of the course: the query and value projections.
DEFAULT_TARGETS: tuple[str, ...] = ("q_proj", "v_proj")
#: Projection names whose shapes :func:`lora_adapter_params` knows (Llama/Mistral/Qwen naming).
KNOWN_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: Architectures whose parameters :func:`count_parameters` counts by arithmetic.
ARITHMETIC_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3")


# --------------------------------------------------------------------------------------------
# Methods, models and budgets of the lesson's table
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Method:
    """A way to train: its command-line key, its label, and bytes per frozen base weight (None: all trained)."""

    key: str
    label: str
    base_bytes: float | None

    @property
    def trains_all(self) -> bool:
        """True for full fine-tuning: every weight gets a gradient and optimizer states."""
        return self.base_bytes is None


#: The four methods of the lesson, in the table's order.
METHODS: dict[str, Method] = {
    "full": Method("full", "full fine-tuning (float32)", None),
    "lora": Method("lora", "LoRA, base in float32", 4.0),
    "lora-bf16": Method("lora-bf16", "LoRA, base in bfloat16", 2.0),
    "qlora": Method("qlora", "QLoRA, base in 4 bits", 0.5),
}


@dataclass(frozen=True)
class ModelSize:
    """A model by its name and parameter count; ``adapter`` is its exact LoRA count, or None (assume the share)."""

    name: str
    params: int
    adapter: int | None = None


#: The lesson's four models. The sizes other than SmolLM2 are round sizes of common families (an assumption).
MODELS: tuple[ModelSize, ...] = (
    ModelSize("SmolLM2-135M", SMOLLM2_PARAMS),
    ModelSize("a 1.7B model", 1_700_000_000),
    ModelSize("a 7B model", 7_000_000_000),
    ModelSize("a 70B model", 70_000_000_000),
)


@dataclass(frozen=True)
class Budget:
    """A memory budget: a label for the table and its size in GB."""

    label: str
    gb: float

    @property
    def usable_gb(self) -> float:
        """The part an estimate may use (70 %)."""
        return usable_gb(self.gb)


#: The lesson's three budgets: the course laptop and two rentable GPUs.
BUDGETS: tuple[Budget, ...] = (Budget("laptop 16 GB", 16.0), Budget("GPU 24 GB", 24.0), Budget("GPU 80 GB", 80.0))


def usable_gb(budget_gb: float) -> float:
    """The memory an estimate may use on a budget of ``budget_gb`` GB: 70 % of it."""
    budget_gb = _positive_number(budget_gb, "budget_gb")
    return round(budget_gb * USABLE_SHARE, 10)  # 16 * 0.7 is 11.2, not 11.200000000000001


def fits(estimate_gb: float, budget_gb: float) -> bool:
    """True when an estimate uses at most 70 % of the budget (both in GB)."""
    estimate_gb = _non_negative_number(estimate_gb, "estimate_gb")
    return estimate_gb <= usable_gb(budget_gb) + 1e-12


# --------------------------------------------------------------------------------------------
# The estimate
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryEstimate:
    """What a training step keeps in memory besides activations, split in three parts (bytes).

    ``trained`` is the number of trained numbers (all parameters for full tuning, the adapter for LoRA;
    a float when it comes from the 0.34 % assumption).
    """

    model: str
    method: str
    params: int
    trained: float
    weights_bytes: float
    gradient_bytes: float
    optimizer_bytes: float
    adapter_assumed: bool = False

    @property
    def total_bytes(self) -> float:
        """Weights + gradients + optimizer states, in bytes."""
        return self.weights_bytes + self.gradient_bytes + self.optimizer_bytes

    @property
    def gb(self) -> float:
        """The estimate in GB (10^9 bytes)."""
        return self.total_bytes / GB

    @property
    def label(self) -> str:
        """The method's label, e.g. 'LoRA, base in float32'."""
        return METHODS[self.method].label

    def parts_gb(self) -> dict[str, float]:
        """The three parts in GB, in the order a stacked bar draws them."""
        return {"weights": self.weights_bytes / GB, "gradients": self.gradient_bytes / GB,
                "AdamW states": self.optimizer_bytes / GB}

    def fits(self, budget_gb: float) -> bool:
        """True when this estimate uses at most 70 % of ``budget_gb``."""
        return fits(self.gb, budget_gb)


def assumed_adapter_params(params: float, lora_rank: int = REFERENCE_RANK) -> float:
    """The lesson's assumption: LoRA trains 460,800 / 134,515,008 of a model at rank 8, linear in the rank."""
    params = _positive_number(params, "params")
    lora_rank = _positive_int(lora_rank, "lora_rank")
    return params * ADAPTER_SHARE * lora_rank / REFERENCE_RANK


def estimate(params: float, method: str = "lora", *, adapter: float | None = None,
             lora_rank: int = REFERENCE_RANK, name: str = "") -> MemoryEstimate:
    """Estimate weights + gradients + AdamW states for training a model of ``params`` parameters.

    ``method`` is one of :data:`METHODS` (``full``, ``lora``, ``lora-bf16``, ``qlora``). ``adapter`` is the
    exact number of LoRA numbers if you know it (see :func:`lora_adapter_params`); without it the lesson's
    0.34 % share is assumed, scaled by ``lora_rank`` / 8. Activations are not included.
    """
    params_n = _positive_number(params, "params")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    meth = METHODS[method]
    if meth.trains_all:
        return MemoryEstimate(name, method, int(params_n), params_n, 4.0 * params_n, 4.0 * params_n,
                              8.0 * params_n)
    assumed = adapter is None
    trained = assumed_adapter_params(params_n, lora_rank) if assumed else _positive_number(adapter, "adapter")
    return MemoryEstimate(name, method, int(params_n), trained, meth.base_bytes * params_n, 4.0 * trained,
                          8.0 * trained, adapter_assumed=assumed)


def estimate_model(model: ModelSize, method: str, lora_rank: int = REFERENCE_RANK) -> MemoryEstimate:
    """:func:`estimate` for a :class:`ModelSize` (its exact adapter count when it has one)."""
    return estimate(model.params, method, adapter=model.adapter, lora_rank=lora_rank, name=model.name)


def estimate_table(models: Sequence[ModelSize] = MODELS, methods: Iterable[str] = tuple(METHODS),
                   lora_rank: int = REFERENCE_RANK) -> list[MemoryEstimate]:
    """One estimate per model and method, models outermost: the rows of the lesson's table."""
    methods = list(methods)
    return [estimate_model(m, k, lora_rank) for m in models for k in methods]


def what_fits(budget_gb: float, models: Sequence[ModelSize] = MODELS,
              lora_rank: int = REFERENCE_RANK) -> list[MemoryEstimate]:
    """The rows of the lesson's table that fit ``budget_gb`` (at most 70 % of it)."""
    budget_gb = _positive_number(budget_gb, "budget_gb")
    return [e for e in estimate_table(models, lora_rank=lora_rank) if e.fits(budget_gb)]


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------
HEADER = "ESTIMATE: weights + gradients + AdamW states. Activations are not included (measure them)."
FOOTNOTE_FITS = "fits = the estimate uses at most 70% of the memory (the rest: activations, the system)."
#: The seed said "QLoRA needs a GPU library (bitsandbytes); on a laptop CPU it is not an option." That is out of
#: date: bitsandbytes 0.50 runs its 4-bit layers on x86 CPUs too. What stays true is that a CPU trains a 7B model
#: (the reason to use QLoRA) far too slowly for a first experiment.
FOOTNOTE_QLORA = ("QLoRA uses bitsandbytes: version 0.50 runs 4 bits on x86 CPUs too, but a CPU is slow "
                  "for the large models QLoRA is for.")


def _fmt_budget(gb: float) -> str:
    return f"{gb:g} GB"


def budgets_from_gb(values: Iterable[float]) -> tuple[Budget, ...]:
    """Budgets labelled by their size, e.g. ``[12, 24]`` -> '12 GB', '24 GB'."""
    out = tuple(Budget(_fmt_budget(_positive_number(v, "budget")), float(v)) for v in values)
    if not out:
        raise ValueError("budgets must hold at least one size in GB")
    return out


def format_table(rows: Sequence[MemoryEstimate], budgets: Sequence[Budget] = BUDGETS, *,
                 notes: Sequence[str] | None = None) -> str:
    """The estimator's table: a header line, one row per estimate with fits/no per budget, the footnotes.

    ``notes`` replaces the footnotes after the 'fits =' line (default: the QLoRA note when a QLoRA row is
    shown, and a reminder when adapter sizes were assumed for models other than SmolLM2).
    """
    if not rows:
        raise ValueError("rows must hold at least one estimate")
    if not budgets:
        raise ValueError("budgets must hold at least one budget")
    name_w = max(15, max(len(r.model) for r in rows) + 3)
    method_w = 28
    col_ws = [max(14, len(b.label) + 2) for b in budgets]
    lines = [HEADER, f"{'model':<{name_w}}{'method':<{method_w}}{'GB':>9}"
             + "".join(f"{b.label:>{w}}" for b, w in zip(budgets, col_ws))]
    for r in rows:
        cells = "".join(f"{('fits' if r.fits(b.gb) else 'no'):>{w}}" for b, w in zip(budgets, col_ws))
        lines.append(f"{r.model:<{name_w}}{r.label:<{method_w}}{r.gb:>9.2f}{cells}")
    lines.append(FOOTNOTE_FITS)
    if notes is None:
        notes = [FOOTNOTE_QLORA] if any(r.method == "qlora" for r in rows) else []
    lines.extend(notes)
    return "\n".join(lines)


def seed_table() -> str:
    """The lesson's table: four models x four methods, three budgets (what ``python -m course_utils memory`` prints)."""
    return format_table(estimate_table(), BUDGETS)


# --------------------------------------------------------------------------------------------
# Architecture configs: exact counts
# --------------------------------------------------------------------------------------------
# The config readers live in course_utils.configs; re-exported here for the CLI and older callers.
from course_utils.configs import config_presets, resolve_config  # noqa: E402
from course_utils.configs import read_config as load_config  # noqa: E402


def _dims(cfg: Mapping[str, Any]) -> dict[str, int]:
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    kv_heads = cfg.get("num_key_value_heads") or heads
    inter = cfg.get("intermediate_size") or 4 * hidden
    return {"hidden": hidden, "q": heads * head_dim, "kv": kv_heads * head_dim, "inter": inter, "head_dim": head_dim}


def _projection_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each projection of one decoder layer."""
    d = _dims(cfg)
    h = d["hidden"]
    return {"q_proj": (h, d["q"]), "k_proj": (h, d["kv"]), "v_proj": (h, d["kv"]), "o_proj": (d["q"], h),
            "gate_proj": (h, d["inter"]), "up_proj": (h, d["inter"]), "down_proj": (d["inter"], h)}


def normalize_targets(targets: str | Iterable[str]) -> tuple[str, ...]:
    """LoRA target names as a tuple: accepts 'q_proj,v_proj', a list, or 'all-linear' (every projection)."""
    if isinstance(targets, str):
        items = [t.strip() for t in targets.split(",")]
    else:
        items = [str(t).strip() for t in targets]
    items = [t for t in items if t]
    if items == ["all-linear"]:
        return KNOWN_TARGETS
    if not items:
        raise ValueError(f"targets must name at least one of {', '.join(KNOWN_TARGETS)} (or all-linear)")
    unknown = [t for t in items if t not in KNOWN_TARGETS]
    if unknown:
        raise ValueError(f"targets: unknown module name(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(KNOWN_TARGETS)} or all-linear")
    return tuple(dict.fromkeys(items))  # keep order, drop repeats


def lora_adapter_params(config: str | Path | Mapping[str, Any], lora_rank: int = REFERENCE_RANK,
                        targets: str | Iterable[str] = DEFAULT_TARGETS) -> int:
    """Exact number of LoRA numbers: rank x (in + out) for every targeted projection of every layer.

    A LoRA adapter on a ``in -> out`` linear layer adds A (rank x in) and B (out x rank). SmolLM2-135M at
    rank 8 on q_proj (576 -> 576) and v_proj (576 -> 192): 30 x 8 x (1152 + 768) = 460,800.
    """
    cfg = load_config(config)
    lora_rank = _positive_int(lora_rank, "lora_rank")
    shapes = _projection_shapes(cfg)
    per_layer = sum(lora_rank * sum(shapes[t]) for t in normalize_targets(targets))
    return per_layer * cfg["num_hidden_layers"]


def count_parameters(config: str | Path | Mapping[str, Any]) -> int:
    """Exact parameter count of a decoder from its config (tied embeddings counted once).

    Llama, Mistral, Qwen2 and Qwen3 configs are counted by arithmetic; other architectures are built on the
    meta device with transformers (no memory, no download) and counted there.
    """
    cfg = load_config(config)
    if cfg.get("model_type") not in ARITHMETIC_MODEL_TYPES:
        return count_on_meta(cfg)[0]
    d = _dims(cfg)
    h, vocab = d["hidden"], cfg["vocab_size"]
    model_type = cfg["model_type"]
    attn_bias = model_type == "qwen2" or bool(cfg.get("attention_bias", False))
    attn = 2 * h * d["q"] + 2 * h * d["kv"]
    if attn_bias:  # qwen2 has biases on q, k, v only; llama's attention_bias also covers o_proj
        attn += d["q"] + 2 * d["kv"] + (h if model_type != "qwen2" else 0)
    if model_type == "qwen3":
        attn += 2 * d["head_dim"]  # q_norm and k_norm
    mlp = 3 * h * d["inter"] + ((2 * d["inter"] + h) if cfg.get("mlp_bias", False) else 0)
    layer = attn + mlp + 2 * h  # two RMSNorms
    embed = vocab * h
    head = 0 if cfg.get("tie_word_embeddings", model_type != "mistral") else vocab * h
    return embed + cfg["num_hidden_layers"] * layer + h + head


def count_on_meta(config: str | Path | Mapping[str, Any], lora_rank: int | None = None,
                  targets: str | Iterable[str] = DEFAULT_TARGETS) -> tuple[int, int | None]:
    """Count parameters (and LoRA numbers, when ``lora_rank`` is given) with transformers and peft on the meta device.

    The model is built with ``with torch.device("meta")``: every tensor has a shape and no storage, so a 70B
    config costs no memory. (accelerate's ``init_empty_weights`` unties SmolLM2's tied head and over-counts.)
    """
    import warnings  # noqa: PLC0415

    import torch  # noqa: PLC0415
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415

    cfg = load_config(config)
    if lora_rank is not None:
        lora_rank = _positive_int(lora_rank, "lora_rank")
        target_list = list(normalize_targets(targets))
    hf_config = AutoConfig.for_model(**cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
        total = sum(p.numel() for p in model.parameters())
        if lora_rank is None:
            return total, None
        from course_utils.hardware import import_bitsandbytes  # noqa: PLC0415

        import_bitsandbytes()  # peft imports it; this keeps its harmless CPU-kernel notice off stderr
        import peft  # noqa: PLC0415

        with torch.device("meta"):
            lora = peft.get_peft_model(model, peft.LoraConfig(r=lora_rank, target_modules=target_list))
    trained = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    return total, trained


def model_from_config(config: str | Path | Mapping[str, Any], lora_rank: int = REFERENCE_RANK,
                      targets: str | Iterable[str] = DEFAULT_TARGETS, name: str | None = None) -> ModelSize:
    """A :class:`ModelSize` with exact counts from an architecture config."""
    if name is None:
        name = Path(config).stem if isinstance(config, (str, Path)) else str(config.get("model_type", "model"))
    cfg = load_config(config)
    return ModelSize(name, count_parameters(cfg), lora_adapter_params(cfg, lora_rank, targets))


# --------------------------------------------------------------------------------------------
# Measured peak vs estimate: where the memory went
# --------------------------------------------------------------------------------------------
def account_for_peak(measured: Any, estimate_: MemoryEstimate) -> list[tuple[str, float]]:
    """Split a measured training-step peak into named parts, in GB, biggest known parts first.

    ``measured`` is a ``course_utils.measure.StepMeasurement`` (or anything with ``peak_bytes``,
    ``baseline_bytes``, ``weights_bytes``, ``grads_bytes``, ``optimizer_bytes`` and
    ``saved_activations_bytes``). The last part, 'other (temporaries, allocator)', is what the counted parts
    do not explain; it can be negative when the counted parts were not all alive at the peak.
    """
    fields = ("peak_bytes", "baseline_bytes", "weights_bytes", "grads_bytes", "optimizer_bytes",
              "saved_activations_bytes")
    values = {}
    for f in fields:
        v = getattr(measured, f, None)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise ValueError(f"measured.{f} must be a non-negative number of bytes, got {v!r}")
        values[f] = float(v)
    if not isinstance(estimate_, MemoryEstimate):
        raise TypeError(f"estimate_ must be a MemoryEstimate, got {type(estimate_).__name__}")
    parts = [
        ("framework baseline (Python, torch, transformers, peft)", values["baseline_bytes"]),
        ("weights (frozen base + adapter)", values["weights_bytes"]),
        ("gradients", values["grads_bytes"]),
        ("AdamW states", values["optimizer_bytes"]),
        ("activations saved for backward", values["saved_activations_bytes"]),
    ]
    other = values["peak_bytes"] - sum(v for _, v in parts)
    parts.append(("other (temporaries, allocator)", other))
    return [(name, v / GB) for name, v in parts]


# --------------------------------------------------------------------------------------------
# Is 4-bit slow here? One frozen layer, forward + backward
# --------------------------------------------------------------------------------------------
def frozen_layer_plan(device: Any = None) -> list[tuple[str, Any, Any]]:
    """The ways :func:`time_frozen_layer` stores its layer on ``device``: ``(label, storage dtype, compute dtype)``.

    float32; the 16-bit dtype :func:`course_utils.hardware.autocast_dtype` picks for the device (bfloat16 on a
    CPU and on Ampere-or-newer GPUs, float16 on a T4, which has no native bfloat16); and 4-bit NF4 computing in
    that same 16-bit dtype, as QLoRA does. Decides only: nothing is allocated. ``device`` None means
    :func:`course_utils.hardware.pick_device`.
    """
    import torch  # noqa: PLC0415

    from course_utils.hardware import as_device, autocast_dtype  # noqa: PLC0415

    half = autocast_dtype(as_device(device))
    return [("float32", torch.float32, torch.float32),
            (str(half).replace("torch.", ""), half, half),
            ("4-bit NF4", torch.uint8, half)]


def time_frozen_layer(in_features: int = 576, out_features: int = 1536, tokens: int = 512,
                      min_run_time: float = 0.3, device: Any = None) -> dict[str, float]:
    """Milliseconds of one forward + backward through a *frozen* linear layer stored three ways.

    That is the work a frozen base layer does in every LoRA/QLoRA step: the input's gradient flows through
    it, its own weight gets none. Stored as float32, in the device's 16-bit dtype, and (when bitsandbytes
    can load) as 4-bit NF4 computing in that 16-bit dtype, as QLoRA does (see :func:`frozen_layer_plan`:
    bfloat16 on a CPU or an Ampere-or-newer GPU, float16 on a T4). Timed with ``torch.utils.benchmark`` on
    ``device`` (None: the GPU if there is one, else the CPU). Sizes default to one MLP projection of
    SmolLM2-135M and 512 tokens (batch 8 x 64).
    """
    for name, value, high in (("in_features", in_features, 16384), ("out_features", out_features, 16384),
                              ("tokens", tokens, 65536)):
        value = _positive_int(value, name)
        if value > high:
            raise ValueError(f"{name} must be at most {high}, got {value}")
    min_run_time = _positive_number(min_run_time, "min_run_time")
    if min_run_time > 10:
        raise ValueError(f"min_run_time must be at most 10 seconds, got {min_run_time}")
    import torch  # noqa: PLC0415
    from torch.utils import benchmark  # noqa: PLC0415

    from course_utils.hardware import as_device, import_bitsandbytes  # noqa: PLC0415

    dev = as_device(device)
    plan = frozen_layer_plan(dev)  # every dtype decided in one place, by the device
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=gen) / in_features ** 0.5
    x = torch.randn(tokens, in_features, generator=gen)
    layers: dict[str, tuple[Any, Any]] = {}
    for label, dtype, _ in plan[:2]:
        layer = torch.nn.Linear(in_features, out_features, bias=False, dtype=dtype, device=dev)
        with torch.no_grad():
            layer.weight.copy_(weight)
        layers[label] = (layer.requires_grad_(False), dtype)
    bnb = import_bitsandbytes()
    if bnb is not None:
        label, _, compute = plan[2]
        layer4 = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=compute, quant_type="nf4")
        layer4.load_state_dict({"weight": weight})
        layers[label] = (layer4.to(dev).requires_grad_(False), compute)
    out = {}
    for label, (layer, dtype) in layers.items():
        inp = x.to(device=dev, dtype=dtype).requires_grad_(True)
        timer = benchmark.Timer("layer(inp).float().sum().backward()", globals={"layer": layer, "inp": inp})
        out[label] = timer.blocked_autorange(min_run_time=min_run_time).median * 1e3
    return out


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------
def _positive_number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _non_negative_number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be an integer > 0, got {value}")
    return value


_SIZE = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def parse_count(text: str) -> int:
    """A parameter count from text: '134515008', '7e9', '1.7B', '135M', '70b', '7_000_000_000'."""
    if not isinstance(text, str):
        raise TypeError(f"count must be text, got {type(text).__name__}")
    if text.strip().startswith("-"):
        raise ValueError(f"{text!r} must be a positive count")
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a count (examples: 134515008, 7e9, 1.7B, 135M)")
    value = float(m.group(1).replace("_", "").replace(",", "")) * _SUFFIX[m.group(2).lower()]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"{text!r} must be a count of at least 1")
    return int(round(value))


# --------------------------------------------------------------------------------------------
# Command line: python -m course_utils memory
# --------------------------------------------------------------------------------------------
CLI_HELP = "estimate the memory of training a model (weights, gradients, AdamW)"
CLI_DESCRIPTION = (
    "Estimate the memory a training run needs for weights, gradients and AdamW states (activations not "
    "included), and whether it fits a memory budget (at most 70% of it). Without options: the lesson's table. "
    "With --batch/--seq (or --checkpointing, --optimizer, --measure): a whole training step, activations included.")
STEP_OPTIONS = ("batch", "seq", "checkpointing", "optimizer", "measure")


def _arg_count(text: str) -> int:
    try:
        return parse_count(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _arg_positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a whole number > 0, got {value}")
    return value


def _arg_budgets(text: str) -> list[float]:
    values = []
    for item in text.split(","):
        item = item.strip().upper().removesuffix("GB").strip()
        try:
            value = float(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: budgets are sizes in GB separated by commas, e.g. 12,24") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"every budget must be > 0 GB, got {item}")
        values.append(value)
    return values


def _arg_targets(text: str) -> list[str]:
    try:
        return list(normalize_targets(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("targets: ")) from err


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``memory`` sub-command's options to ``parser``."""
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--params", type=_arg_count, metavar="N",
                      help="parameter count of your model (e.g. 134515008, 7e9, 1.7B)")
    what.add_argument("--config", metavar="PATH",
                      help="an architecture config.json, or a shipped preset: "
                           + ", ".join(config_presets()) + " (exact counts)")
    parser.add_argument("--method", choices=tuple(METHODS), default=None,
                        help="show one method only (table); the method of the step (default lora)")
    parser.add_argument("--lora-rank", type=_arg_positive_int, default=REFERENCE_RANK, metavar="R",
                        help="LoRA rank (default 8)")
    parser.add_argument("--targets", type=_arg_targets, default=None, metavar="NAMES",
                        help="LoRA target modules, comma-separated (default q_proj,v_proj; or all-linear); "
                             "needs --config")
    parser.add_argument("--budgets", type=_arg_budgets, default=None, metavar="GB,GB",
                        help="memory budgets in GB, comma-separated (default: laptop 16, GPU 24, GPU 80)")
    step = parser.add_argument_group("a whole training step, activations included")
    step.add_argument("--batch", type=_arg_positive_int, default=None, metavar="B", help="batch size (default 1)")
    step.add_argument("--seq", type=_arg_positive_int, default=None, metavar="S",
                      help="sequence length in tokens (default 128)")
    step.add_argument("--checkpointing", action="store_true", default=None, help="gradient checkpointing")
    step.add_argument("--optimizer", choices=("adamw", "adamw8bit"), default=None,
                      help="optimizer (default adamw)")
    step.add_argument("--measure", action="store_true", default=None,
                      help="also run the step and measure its peak memory")
    return parser


def _step_namespace(args: argparse.Namespace, config: Path | None) -> argparse.Namespace:
    """The Namespace handed to ``course_utils.step_memory.cli``: every field filled, defaults applied."""
    return argparse.Namespace(
        config=config,
        params=args.params,
        method=args.method or "lora",
        lora_rank=args.lora_rank,
        targets=list(args.targets) if args.targets else list(DEFAULT_TARGETS),
        batch=args.batch or 1,
        seq=args.seq or 128,
        checkpointing=bool(args.checkpointing),
        optimizer=args.optimizer or "adamw",
        measure=bool(args.measure),
        budgets=list(args.budgets) if args.budgets else [b.gb for b in BUDGETS],
    )


def run_cli(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``memory`` with parsed ``args``: print the table (or hand a step estimate to step_memory)."""
    config: Path | None = None
    if args.config is not None:
        try:
            config = resolve_config(args.config)
            cfg = load_config(config)
        except (ValueError, TypeError) as err:
            parser.error(f"argument --config: {err}")
    if args.targets is not None and config is None:
        parser.error("argument --targets: needs --config (the adapter's size depends on the architecture)")

    if any(getattr(args, k) is not None for k in STEP_OPTIONS):
        try:
            step_memory = importlib.import_module("course_utils.step_memory")
        except ImportError as err:
            missing = isinstance(err, ModuleNotFoundError) and err.name == "course_utils.step_memory"
            why = "is not part of this version of course_utils" if missing else f"could not be imported ({err})"
            parser.error(f"argument --batch/--seq: the whole-step estimate (course_utils.step_memory) {why}")
        return int(step_memory.cli(_step_namespace(args, config)) or 0)

    budgets = budgets_from_gb(args.budgets) if args.budgets else BUDGETS
    methods = [args.method] if args.method else list(METHODS)
    targets = args.targets or list(DEFAULT_TARGETS)
    assumed_note = False
    if config is not None:
        name = config.stem
        try:
            model = model_from_config(cfg, args.lora_rank, targets, name=name)
        except (ValueError, TypeError) as err:
            parser.error(f"argument --config: {err}")
        except ImportError as err:  # an architecture outside the arithmetic needs transformers
            parser.error(f"argument --config: counting a {cfg.get('model_type')!r} model needs transformers ({err})")
        print(f"{name}: {model.params:,} parameters; LoRA rank {args.lora_rank} on {', '.join(targets)} "
              f"trains {model.adapter:,} numbers ({100 * model.adapter / model.params:.2f}%), counted from the config.")
        models: tuple[ModelSize, ...] = (model,)
    elif args.params is not None:
        models = (ModelSize(size_name(args.params), args.params),)
        assumed_note = True
    else:  # the lesson's table: its assumption is explained in the lesson, and noted here for another rank
        models = MODELS
        assumed_note = args.lora_rank != REFERENCE_RANK
    rows = estimate_table(models, methods, args.lora_rank)
    notes = [FOOTNOTE_QLORA] if any(r.method == "qlora" for r in rows) else []
    if assumed_note and any(r.adapter_assumed for r in rows):
        notes.append(_assumed_note(args.lora_rank))
    print(format_table(rows, budgets, notes=notes))
    return 0


def _assumed_note(rank: int) -> str:
    share = 100 * ADAPTER_SHARE * rank / REFERENCE_RANK
    return (f"LoRA rank {rank} is assumed to train {share:.2f}% of the model (SmolLM2-135M's share, linear in the "
            "rank); pass --config for an exact count.")


def size_name(params: int) -> str:
    """'a 7B model', 'a 1.7B model', 'a 135M model' for a parameter count."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if params >= scale:
            return f"a {params / scale:.3g}{unit} model"
    return f"a {params}-parameter model"
