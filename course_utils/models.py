"""Loading language models in 16, 8 or 4 bits, and generating text with them.

The same ``from_pretrained`` call, ``BitsAndBytesConfig`` and arguments serve the lesson's real model (a Hub
id) and the course's stand-in (a folder, see :mod:`course_utils.standin`). Architectures too big to load
here are built on PyTorch's meta device (shapes, no data) by :func:`meta_model`, from a config shipped in
``data/configs``.

The neighbouring modules: :mod:`course_utils.hub` (real model or stand-in?), :mod:`course_utils.standin`
(the stand-in), :mod:`course_utils.footprint` (sizes part by part) and :mod:`course_utils.lora` (adapters).
"""

import os
from pathlib import Path
from typing import Any, Mapping

import torch

from course_utils import checks
from course_utils.configs import config_name, read_config
from course_utils.hardware import as_device, autocast_dtype
from course_utils.hub import ModelChoice
from course_utils.quiet import import_bitsandbytes, quiet_libraries

#: Architecture configs of the lesson's real models, shipped in ``data/configs`` (file names).
QWEN25_CONFIG = "qwen2.5-1.5b-instruct.json"
QWEN3_CONFIG = "qwen3-4b-instruct-2507.json"
#: The widths a model loads at: 16 (no quantization), 8 (LLM.int8) and 4 (NF4).
_LOAD_BITS = (16, 8, 4)


def dtype_kwargs(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """The keyword that sets a model's dtype in ``from_pretrained``/``from_config``: ``{"dtype": dtype}``.

    ``dtype=`` since transformers 4.56 (``torch_dtype=`` before; the course supports 4.57 and newer).
    """
    return {"dtype": checks.instance(dtype, "dtype", torch.dtype, "a torch.dtype such as torch.float16")}


# --------------------------------------------------------------------------------------------
# Configs and the meta device
# --------------------------------------------------------------------------------------------
def transformers_config(config: str | os.PathLike | Mapping[str, Any] | Any) -> Any:
    """A transformers config from a preset in ``data/configs``, a ``config.json`` path or a dict; a transformers
    config is returned as it is.

    Read by :func:`course_utils.configs.read_config` (keys starting with "_" are notes and are dropped).
    """
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(config, PretrainedConfig):
        return config
    fields = read_config(config)
    if "model_type" not in fields:
        raise ValueError(f"config {config_name(config)!r} has no 'model_type': not a transformers architecture config")
    return AutoConfig.for_model(**fields)


def meta_model(config: Any) -> Any:
    """The architecture of ``config`` on the meta device (a config, or what :func:`transformers_config` reads).

    Shapes without data: a 4-billion-parameter model costs no memory. Built under ``torch.device("meta")``,
    which keeps tied weights tied (accelerate's ``init_empty_weights`` unties the lm_head and over-counts).
    """
    from transformers import AutoModelForCausalLM

    with quiet_libraries(), torch.device("meta"):
        return AutoModelForCausalLM.from_config(transformers_config(config))


# --------------------------------------------------------------------------------------------
# Loading in 16, 8 or 4 bits
# --------------------------------------------------------------------------------------------
def check_load_bits(bits: Any) -> int:
    """``bits`` if it is a width a model loads at (16, 8 or 4); a TypeError or ValueError naming ``bits`` otherwise.

    Not the bits check of :func:`course_utils.quant.level_range`: that one checks the 2 to 8 bits of the hand-made
    codes of notebook 01, while a model loads at 16 (no quantization), 8 (LLM.int8) or 4 bits (NF4).
    """
    return checks.choice(checks.integer(bits, "bits", None), "bits", _LOAD_BITS)


def quantization_config(bits: int, compute_dtype: torch.dtype | None = None) -> Any:
    """The ``BitsAndBytesConfig`` for ``bits`` (None for 16), as in the lesson.

    4-bit: NF4, the format QLoRA uses, unpacked to ``compute_dtype`` for the maths; by default the 16-bit
    dtype :func:`course_utils.hardware.autocast_dtype` picks for this machine's device (bfloat16 on Ampere+
    and on CPUs, float16 on a T4; :func:`load_settings` passes the loading device's). 8-bit: LLM.int8.

    8 and 4 bits need bitsandbytes (transformers 4.x checks its version in the config itself): without it,
    a RuntimeError says so; :func:`bitsandbytes_missing` asks first.
    """
    check_load_bits(bits)
    if bits == 16:
        return None
    dtype = compute_dtype if compute_dtype is not None else autocast_dtype()
    checks.choice(dtype, "compute_dtype", (torch.bfloat16, torch.float16, torch.float32))
    missing = bitsandbytes_missing()
    if missing is not None:
        raise RuntimeError(f"loading in {bits} bits needs bitsandbytes: {missing}")
    from transformers import BitsAndBytesConfig

    if bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,  # store the weights in 4 bits
        bnb_4bit_quant_type="nf4",  # the 4-bit format QLoRA uses
        bnb_4bit_compute_dtype=dtype,  # unpacked to 16-bit for the maths
    )


def bitsandbytes_missing() -> str | None:
    """None when bitsandbytes loads here; otherwise why 8- and 4-bit steps cannot run (one sentence).

    bitsandbytes does not install everywhere (for instance on some Macs). A notebook asks this once and
    prints, in each 4-bit cell, what it skipped and this reason, instead of stopping.
    """
    if import_bitsandbytes() is not None:
        return None
    why = "bitsandbytes is not installed here (or cannot load on this machine), and 8- and 4-bit weights need it"
    return f"{why}: pip install bitsandbytes, then restart the kernel"


def _name_of(choice: ModelChoice | str | Path) -> str:
    name = choice.name if isinstance(choice, ModelChoice) else choice
    return str(checks.instance(name, "model", (str, Path), "a ModelChoice, a Hub id or a folder"))


def load_settings(bits: int = 16, device: torch.device | str | None = None) -> dict[str, Any]:
    """The keyword arguments :func:`load_model` passes to ``from_pretrained`` for ``bits`` on ``device``.

    dtype: :func:`course_utils.hardware.autocast_dtype` of the device (float16 on a T4, bfloat16 from
    compute capability 8.0 and on CPUs), for the model at 16 bits and for the non-quantized parts and the
    NF4 maths at 4 bits. device_map: :func:`device_map`, the whole model on that one device.
    ``quantization_config``: :func:`quantization_config`'s, which checks ``bits``.
    """
    dev = as_device(device)
    dtype = autocast_dtype(dev)
    quantization = quantization_config(bits, dtype)
    return {**dtype_kwargs(dtype), "device_map": device_map(dev), "quantization_config": quantization}


def device_map(device: torch.device | str | None = None) -> dict[str, int] | str:
    """``from_pretrained``'s ``device_map`` that puts the whole model on ``device``: ``{"": index}`` or ``"cpu"``.

    Never ``"auto"``: on a machine with two GPUs (Kaggle's 2 x T4) that spreads the layers over both, while the
    lessons read the peak memory of one device.
    """
    dev = as_device(device)
    if dev.type != "cuda":
        return "cpu"
    return {"": dev.index if dev.index is not None else torch.cuda.current_device()}


def load_model(choice: ModelChoice | str | Path, bits: int = 16, *, device: torch.device | str | None = None) -> Any:
    """Load a causal LM in 16 bits, or quantized to 8 or 4 bits on the fly, with one ``from_pretrained`` call.

    The same call serves the real model (a Hub id) and the stand-in (its cache folder); the arguments
    come from :func:`load_settings` (the device decides the 16-bit dtype). 8 and 4 bits without
    bitsandbytes raise a RuntimeError that says so. A 4-bit model also gets :func:`keep_4bit_trainable_on_cpu`,
    so that generating text before QLoRA training cannot break the training on a CPU with AVX-512-bf16
    (elsewhere it changes nothing).
    """
    name = _name_of(choice)
    settings = load_settings(bits, device)  # checks bits before anything is loaded
    from transformers import AutoModelForCausalLM

    with quiet_libraries():
        model = AutoModelForCausalLM.from_pretrained(name, **settings)
    model.eval()
    if bits == 4 and isinstance(model, torch.nn.Module):
        keep_4bit_trainable_on_cpu(model)
    return model


def load_tokenizer(choice: ModelChoice | str | Path) -> Any:
    """The model's tokenizer: the Hub's for the real model, the offline byte-level BPE for the stand-in."""
    from transformers import AutoTokenizer

    with quiet_libraries():
        return AutoTokenizer.from_pretrained(_name_of(choice))


def keep_4bit_trainable_on_cpu(model: torch.nn.Module) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for CPU inference; return how many layers were changed.

    On CPUs with AVX-512-bf16, the first no-grad forward (a ``generate``) of a ``Linear4bit`` repacks its
    weights into a faster inference layout, and a later training step then fails ("a view of a leaf
    Variable that requires grad..."). Switching the repack off keeps the layers trainable, at the cost of
    a slower CPU ``generate``. Harmless elsewhere (the flag only matters on CPU).
    """
    bnb = import_bitsandbytes()
    if bnb is None:
        return 0
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    if any(getattr(getattr(m.weight, "quant_state", None), "packing_format_for_cpu", False) for m in layers):
        raise RuntimeError(
            "these 4-bit weights were repacked for CPU inference by an earlier no-grad forward (a generate) and can "
            "no longer be trained: load the model again and call keep_4bit_trainable_on_cpu first, or train first"
        )
    for module in layers:
        module.support_avx512bf16_for_cpu = False
    return len(layers)


# --------------------------------------------------------------------------------------------
# Text generation
# --------------------------------------------------------------------------------------------
def generate_text(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int = 10) -> str:
    """Greedy continuation of ``prompt`` (prompt included), as in the lesson.

    When the tokenizer knows fewer tokens than the model's vocabulary (the stand-in's small offline
    tokenizer), ids it cannot spell are suppressed (never chosen), so the noise at least prints as text.
    """
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    checks.integer(max_new_tokens, "max_new_tokens", 1, 200)
    vocab, spellable = int(model.config.vocab_size), len(tokenizer)
    extra = {"suppress_tokens": list(range(spellable, vocab))} if 0 < spellable < vocab else {}
    # Only ids and mask: some tokenizers add token_type_ids, which generate rejects for decoder-only
    # models on transformers 4.x ("model_kwargs are not used by the model").
    inputs = tokenizer(prompt, return_tensors="pt", return_token_type_ids=False).to(model.device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with quiet_libraries(), torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad, **extra)
    return tokenizer.decode(out[0], skip_special_tokens=True)
