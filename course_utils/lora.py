"""LoRA adapters: counted from scratch, set up with peft, and counted by peft on the meta device.

LoRA leaves a weight matrix W (d_out x d_in) frozen and trains a low-rank change beside it, B·A with A of
size r x d_in and B of size d_out x r: r x (d_in + d_out) numbers per targeted matrix. With QLoRA, W is the
4-bit weight. The lesson's adapter: rank 16, alpha 16, on the seven projections of every decoder layer
(:data:`course_utils.architecture.PROJECTIONS`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from course_utils import checks
from course_utils.architecture import PROJECTIONS
from course_utils.footprint import count_model_parameters, true_numel
from course_utils.models import keep_4bit_trainable_on_cpu, meta_model
from course_utils.quiet import quiet_libraries

#: How QLoRA's gradient checkpointing recomputes: the non-reentrant variant, which torch recommends and which
#: works with frozen inputs. Without it, torch warns on every run that the default will change.
CHECKPOINTING_KWARGS: dict[str, bool] = {"use_reentrant": False}


def _check_lora_args(r: Any, alpha: Any, targets: Any) -> tuple[str, ...]:
    checks.integer(r, "r", 1, 1024)
    checks.positive(alpha, "alpha")
    if isinstance(targets, str) or not isinstance(targets, Iterable):
        raise TypeError("targets must be a list of module names such as ['q_proj', 'v_proj'], not a string")
    targets = tuple(targets)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"targets must be a non-empty list of module names, got {targets!r}")
    return targets


def lora_params_by_hand(model: torch.nn.Module, r: int = 16, targets: Sequence[str] = PROJECTIONS) -> int:
    """LoRA's trainable count from scratch: r x (d_in + d_out) per targeted linear (A is r x d_in, B d_out x r)."""
    targets = _check_lora_args(r, 1, targets)
    total, matched = 0, 0
    for name, module in model.named_modules():
        layer = getattr(module, "base_layer", module)  # a layer peft already wrapped: count its base
        if isinstance(layer, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            total += r * (layer.in_features + layer.out_features)
            matched += 1
    if matched == 0:
        raise ValueError(f"none of targets {targets} names a linear layer of this model")
    return total


def lora_config(r: int = 16, alpha: float = 16, targets: Sequence[str] = PROJECTIONS) -> Any:
    """The peft ``LoraConfig`` of the lesson's QLoRA cell: rank r, lora_alpha, no dropout, the given modules."""
    targets = _check_lora_args(r, alpha, targets)
    with quiet_libraries():  # peft imports bitsandbytes, whose import may log a notice
        from peft import LoraConfig

        return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets),
                          task_type="CAUSAL_LM")


def add_lora(model: torch.nn.Module, r: int = 16, alpha: float = 16, targets: Sequence[str] = PROJECTIONS,
             *, prepare_kbit: bool | None = None, seed: int | None = 0) -> Any:
    """Freeze ``model`` and wrap it with LoRA adapters (peft). Returns the peft model.

    The adapters' A matrices start random (B starts at zero); ``seed`` makes that start reproducible
    without touching the global random state (None: use the global state as it is).

    For a 4- or 8-bit model, ``prepare_kbit`` (default: when the model is quantized) first runs peft's
    ``prepare_model_for_kbit_training``, the standard QLoRA step: the non-quantized parts go to float32
    for stable training, and on a GPU gradient checkpointing trades compute for activation memory.
    A quantized model also gets :func:`course_utils.models.keep_4bit_trainable_on_cpu`, so evaluating or
    generating between training steps on an AVX-512-bf16 CPU cannot break the next step.
    """
    cfg = lora_config(r, alpha, targets)
    if seed is not None:
        checks.integer(seed, "seed", 0)
    if prepare_kbit is not None:
        checks.flag(prepare_kbit, "prepare_kbit")
    quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
    if quantized:
        keep_4bit_trainable_on_cpu(model)  # the CPU repack pitfall: see keep_4bit_trainable_on_cpu
    where = next(model.parameters()).device
    on_gpu = where.type == "cuda"
    with quiet_libraries():
        from peft import get_peft_model, prepare_model_for_kbit_training

        if quantized if prepare_kbit is None else prepare_kbit:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=on_gpu,
                                                    gradient_checkpointing_kwargs=CHECKPOINTING_KWARGS)
            if on_gpu:
                model.config.use_cache = False  # the generation cache is useless (and warned about) with checkpointing
        if seed is None:
            return get_peft_model(model, cfg)
        devices = [where.index if where.index is not None else torch.cuda.current_device()] if on_gpu else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return get_peft_model(model, cfg)


@dataclass(frozen=True)
class LoraCount:
    """Trainable adapter parameters against the base model (peft's "all params" includes the adapter)."""

    name: str
    trainable: int
    base: int

    @property
    def all_params(self) -> int:
        """What peft's ``print_trainable_parameters`` calls "all params": base + adapter."""
        return self.base + self.trainable

    @property
    def percent(self) -> float:
        """peft's "trainable%": adapter / (base + adapter) x 100."""
        return 100 * self.trainable / self.all_params

    @property
    def percent_of_base(self) -> float:
        """Adapter / base model x 100."""
        return 100 * self.trainable / self.base

    def summary(self) -> str:
        """peft's line (trainable% = trainable / all params, base + adapter), plus the share of the base alone."""
        return (f"{self.name}: trainable params: {self.trainable:,} || all params: {self.all_params:,} || "
                f"trainable%: {self.percent:.2f}  (of the base alone, {self.base:,}: {self.percent_of_base:.2f} %)")


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA tensors of a peft model by name (``...lora_A.default.weight``, ``...lora_B...``)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a peft model), got {type(model).__name__}")
    return {name: p for name, p in model.named_parameters() if ".lora_A." in name or ".lora_B." in name}


def trainable_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, all) parameters of a model, as peft counts them (4-bit weights at their true count)."""
    trainable = sum(true_numel(p) for p in model.parameters() if p.requires_grad)
    return trainable, count_model_parameters(model)


def lora_count(config: Any, r: int = 16, alpha: float = 16, targets: Sequence[str] = PROJECTIONS,
               name: str | None = None) -> LoraCount:
    """Count the lesson's LoRA adapter on the architecture ``config``, on the meta device (no memory, no download)."""
    targets = _check_lora_args(r, alpha, targets)
    if name is None:
        name = Path(str(config)).stem if isinstance(config, (str, Path)) else type(config).__name__
    model = meta_model(config)
    base = count_model_parameters(model)
    with torch.device("meta"):
        peft_model = add_lora(model, r, alpha, targets, prepare_kbit=False)
    trainable, total = trainable_counts(peft_model)
    if total != base + trainable:  # peft's "all params" includes the adapter: anything else is a counting bug
        raise RuntimeError(f"peft counted {total:,} parameters; expected the base {base:,} + the adapter {trainable:,}")
    return LoraCount(name, trainable, base)
