"""The model and the optimizer of a measured training step, built from a config with random, seeded weights.

:func:`build_model` builds a decoder by method: full fine-tuning (float32, or pure bfloat16), LoRA, LoRA on a 16-bit
base, or QLoRA with notebook 01b's recipe. :func:`_make_optimizer` gives it torch's AdamW or bitsandbytes' 8-bit AdamW.
Which dtypes a step uses on a device is :func:`_step_precision`'s decision, made by :mod:`course_utils.hardware`.
Running the step is :mod:`course_utils.training_step`'s job.
"""

import functools
import tempfile
from typing import Any, Mapping, NamedTuple

import torch

from course_utils.hardware import as_device, autocast_dtype, needs_loss_scaling
from course_utils.lora import add_lora
from course_utils.memory import ALL_METHODS
from course_utils.quiet import import_bitsandbytes


class _Precision(NamedTuple):
    """The dtypes of a measured step, decided for its device by :mod:`course_utils.hardware`."""

    base: str  # the frozen/trained weights' dtype: "float32", or the 16-bit dtype of lora-bf16 / qlora
    autocast: str | None  # the autocast dtype, None without autocast
    loss_scaling: bool  # True when float16 does the arithmetic (GradScaler on)


def _step_precision(method: str, autocast: str | None, device: Any = None) -> _Precision:
    """Which dtypes a step of ``method`` uses on ``device``, and whether it needs loss scaling.

    The 16-bit dtype is :func:`course_utils.hardware.autocast_dtype`: bfloat16 on a CPU or an Ampere-or-newer
    GPU, float16 on a T4 (it emulates bfloat16 slowly; ``torch.cuda.is_bf16_supported()`` says True there).
    ``lora-bf16`` and ``qlora`` store (or compute) their frozen base in it. ``full-bf16`` is bfloat16 on every
    device, by its name (pure float16 training without a float32 master copy loses small updates; a T4 runs
    bfloat16 by emulation, slowly). ``autocast``: None, ``"auto"`` (that dtype) or an explicit ``"bfloat16"`` /
    ``"float16"`` for a lesson that compares dtypes on purpose.
    Loss scaling (:func:`course_utils.hardware.needs_loss_scaling`) is on when float16 does the arithmetic.
    Decides only: nothing is allocated. ``method`` and ``autocast`` were checked (and spelled out) by
    :func:`course_utils.measure.step_spec`.
    """
    half = str(autocast_dtype(as_device(device))).replace("torch.", "")
    base = {"lora-bf16": half, "qlora": half, "full-bf16": "bfloat16"}.get(method, "float32")
    amp = half if autocast == "auto" else autocast
    return _Precision(base, amp, needs_loss_scaling(getattr(torch, amp or base)))


def build_model(spec: Mapping[str, Any], device: Any = "cpu") -> Any:
    """The model a spec describes, random seeded weights, on ``device``, ready to train.

    The 16-bit base of ``lora-bf16`` and ``qlora`` (and QLoRA's compute dtype) is :func:`_step_precision`'s:
    bfloat16, or float16 on a T4. ``full-bf16`` is the whole model in bfloat16, every parameter trainable.
    LoRA and QLoRA get their adapters (rank ``lora_rank``, alpha twice the rank) and checkpointing from
    :func:`course_utils.lora.add_lora`, so ``qlora`` is notebook 01b's recipe: the 4-bit NF4 load, then peft's
    ``prepare_model_for_kbit_training`` (the embedding, norms and an untied output layer upcast to float32; the
    step's checkpointing, non-reentrant), then LoRA; ``kbit_preparation`` False in the spec skips the middle step.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig

    cfg = {**spec["config"], "use_cache": False}
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(spec.get("seed", 0))
    base_dtype = getattr(torch, _step_precision(spec["method"], None, device).base)
    # dtype must be explicit: from_config otherwise follows the config's "torch_dtype" (bfloat16 for SmolLM2)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=base_dtype)
    if spec["method"] == "qlora":  # saved, then loaded again with its linear layers in 4-bit NF4 (bitsandbytes)
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=base_dtype)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            del model
            model = AutoModelForCausalLM.from_pretrained(
                tmp, quantization_config=quant, dtype=base_dtype, device_map={"": str(device)}
            )
            # from_pretrained memory-maps the safetensors file, and the tensors it does not convert (the embedding,
            # the norms) stay views of that mapping: on a CPU the file's pages would count in the resident memory for
            # as long as the model lives (0.2 GB for SmolLM2), though the step does not need them. Copy them out.
            with torch.no_grad():
                for param in model.parameters():
                    if type(param).__name__ != "Params4bit":
                        param.data = param.data.clone()
    else:
        model = model.to(device)
    if not ALL_METHODS[spec["method"]].trains_all:  # the course's LoRA / QLoRA recipe (notebook 01b)
        rank, checkpointing = spec["lora_rank"], bool(spec.get("checkpointing"))
        kbit = spec.get("kbit_preparation", True)
        model = add_lora(model, rank, 2 * rank, spec["targets"], checkpointing=checkpointing, kbit_preparation=kbit)
    elif spec.get("checkpointing") and hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
        model.activation_checkpointing_enable()
    elif spec.get("checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def _make_optimizer(spec: Mapping[str, Any], params: list[Any]) -> Any:
    """AdamW from torch, or bitsandbytes' 8-bit AdamW, over ``params``."""
    if spec["optimizer"] != "adamw8bit":
        return torch.optim.AdamW(params, lr=1e-4)
    device = torch.device(params[0].device if params else "cpu")
    if not adamw8bit_available(device):
        why = "bitsandbytes is not installed" if import_bitsandbytes() is None else "a CPU one needs bitsandbytes 0.49+"
        raise RuntimeError(f"optimizer='adamw8bit': no 8-bit AdamW for the {device.type.upper()} here ({why})")
    return import_bitsandbytes().optim.AdamW8bit(params, lr=1e-4)


@functools.cache
def adamw8bit_available(device: Any = "cpu") -> bool:
    """Whether bitsandbytes' 8-bit AdamW can take a step on ``device`` here (tried once per device, on a
    4096-number tensor, the smallest that gets 8-bit states). bitsandbytes before 0.49 has no CPU version."""
    try:
        param = torch.nn.Parameter(torch.ones(4096, device=as_device(device)))
        param.grad = torch.ones_like(param)
        import_bitsandbytes().optim.AdamW8bit([param], lr=1e-3).step()
    except Exception:  # noqa: BLE001 - no bitsandbytes, or no backend for this device in this bitsandbytes
        return False
    return bool(torch.isfinite(param).all()) and bool((param < 1).all())
